"""Logits processors against direct computations; bad sampling settings are clear errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.errors import ConfigError
from attnkit.generate import SamplingConfig, make_generator, select_next
from attnkit.generate.sampling import (
    NO_TOKEN,
    NoDistribution,
    RepeatedNgrams,
    SamplingError,
    check_drawn,
    check_sampling,
    hold_back,
    process_logits,
    select_next_in_groups,
    top_k_filter,
    top_p_filter,
)


def _logits(seed=0, batch=3, vocab=11):
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


@pytest.mark.parametrize("k", [1, 3, 11, 50])
def test_top_k_keeps_exactly_the_k_largest(k):
    logits = _logits()
    kept = top_k_filter(logits, k).isfinite()
    for row in range(logits.shape[0]):
        expected = set(logits[row].argsort(descending=True)[:k].tolist())
        assert set(kept[row].nonzero().flatten().tolist()) == expected


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_top_p_keeps_the_smallest_set_reaching_p(p):
    logits = _logits(seed=1)
    kept = top_p_filter(logits, p).isfinite()
    for row in range(logits.shape[0]):
        probs = logits[row].softmax(-1).tolist()
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        expected, mass = set(), 0.0
        for index in order:  # add tokens, most likely first, until their mass reaches p
            expected.add(index)
            mass += probs[index]
            if mass >= p:
                break
        assert set(kept[row].nonzero().flatten().tolist()) == expected


def test_temperature_scales_the_logits_and_zero_is_greedy():
    logits = _logits(seed=2)
    torch.testing.assert_close(process_logits(logits, SamplingConfig(temperature=0.5)), (logits * 2).float())
    assert select_next(logits, SamplingConfig(temperature=0.0)).tolist() == logits.argmax(-1).tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = process_logits(logits, SamplingConfig(temperature=0.0, repetition_penalty=2.0), seen)
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]


def test_samples_follow_the_filtered_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    generator = make_generator(0, "cpu")
    draws = torch.stack([
        select_next(logits, SamplingConfig(top_k=2), generator=generator) for _ in range(4000)
    ]).flatten()
    assert set(draws.tolist()) == {0, 1}  # top-2 only
    share = (draws == 0).double().mean().item()
    assert abs(share - 0.5 / 0.8) < 0.03  # renormalised over the two kept tokens


def test_same_seed_same_draws():
    logits = _logits(seed=3, batch=5)

    def draws(seed):
        generator = make_generator(seed, "cpu")
        return [select_next(logits, SamplingConfig(), generator=generator).tolist() for _ in range(20)]

    assert draws(11) == draws(11)
    assert draws(11) != draws(12)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5), seed=st.integers(0, 10_000),
       config=st.sampled_from([SamplingConfig(temperature=0.0), SamplingConfig(),
                               SamplingConfig(temperature=0.6, top_k=3), SamplingConfig(top_p=0.7)]))
def test_groups_sampled_in_one_call_draw_what_each_draws_alone(sizes, seed, config):
    """A server samples the requests with the same settings together, each from its own generator: every group
    must get the tokens select_next gives its rows alone."""
    logits = _logits(seed=seed, batch=sum(sizes)).float()
    groups = [(n, make_generator(seed + g, "cpu")) for g, n in enumerate(sizes)]
    together = select_next_in_groups(logits, config, groups)
    alone = [select_next(part, config, generator=make_generator(seed + g, "cpu"))
             for g, part in enumerate(logits.split(sizes))]
    assert together.tolist() == torch.cat(alone).tolist()


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 6), vocab=st.integers(2, 300), seed=st.integers(0, 2**32), steps=st.integers(1, 4))
def test_draws_are_torch_multinomials_own(batch, vocab, seed, steps):
    """The draw without multinomial's device reads is multinomial's draw: same generator, same tokens, step after
    step (the generators advance alike)."""
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    ours, theirs = make_generator(seed, "cpu"), make_generator(seed, "cpu")
    for _ in range(steps):
        expected = torch.multinomial(logits.softmax(-1), 1, generator=theirs)[:, 0]
        assert select_next(logits, SamplingConfig(), generator=ours).tolist() == expected.tolist()


@pytest.mark.parametrize("config", [SamplingConfig(), SamplingConfig(temperature=0.0), SamplingConfig(top_k=2)])
def test_a_row_with_no_distribution_draws_no_token_and_only_that_row(config):
    logits = _logits(seed=5, batch=4).float()
    logits[1] = float("nan")
    logits[3] = float("-inf")  # every token forbidden (a grammar that allows nothing)
    drawn = select_next(logits, config, generator=make_generator(0, "cpu")).tolist()
    assert drawn[1] == drawn[3] == NO_TOKEN and NO_TOKEN not in (drawn[0], drawn[2])
    assert drawn[0] == select_next(logits[:1], config, generator=make_generator(0, "cpu")).item()
    with pytest.raises(NoDistribution, match=r"row\(s\) \[1, 3\] are no probability distribution"):
        check_drawn(drawn)
    assert check_drawn([drawn[0], drawn[2]]) == [drawn[0], drawn[2]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_takes_the_first_of_equal_maxima_as_argmax_does(dtype):
    """Ties (common in bf16 logits) go to the lowest id, as `torch.argmax` and transformers' greedy search take them;
    a row's -inf tokens are never chosen while one is finite."""
    logits = torch.zeros(4, 300, dtype=dtype)
    logits[0, [7, 3, 200]] = 2.0  # three equal maxima
    logits[1] = 1.0  # every token equal
    logits[2, :150] = float("-inf")  # the first half forbidden, the rest equal
    logits[3, 299] = 0.5
    expected = [int(row.argmax()) for row in logits.float()]
    assert select_next(logits, SamplingConfig(temperature=0.0)).tolist() == expected == [3, 0, 150, 299]


@pytest.mark.parametrize("where", [0, 7, -1])
def test_greedy_reads_one_nan_anywhere_in_a_row_as_no_distribution(where):
    """Greedy finds a broken row in its one pass (max, which takes a nan's index): a single nan among finite
    logits, at the first, a middle or the last token, spoils that row only; +inf is a choice, not a fault."""
    logits = _logits(seed=6, batch=3).float()
    logits[0, where] = float("nan")
    logits[2, 5] = float("inf")
    drawn = select_next(logits, SamplingConfig(temperature=0.0))
    assert drawn.tolist() == [NO_TOKEN, int(logits[1].argmax()), 5]


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(top_p=0.0), "top_p=0.0 must lie in \\(0, 1\\]"),
        (dict(top_p=1.5), "top_p=1.5 must lie in \\(0, 1\\]"),
        (dict(temperature=-0.1), "temperature=-0.1 must be a finite number >= 0"),
        (dict(temperature=float("nan")), "temperature=nan must be a finite number >= 0"),
        (dict(temperature=float("inf")), "temperature=inf must be a finite number >= 0"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty=inf must be a finite number > 0"),
        (dict(top_k=0), "top_k=0 must be a positive integer"),
        (dict(top_k=2.5), "top_k=2.5 must be a positive integer"),
        (dict(repetition_penalty=0.0), "repetition_penalty=0.0 must be a finite number > 0"),
        (dict(temperature=1e-300), "temperature=1e-300 is below 1e-05, where dividing the logits by it overflows"),
        (dict(temperature=5e-324), "temperature=5e-324 is below"),
        (dict(temperature="hot"), "temperature='hot' must be a number, not str"),
        (dict(top_p=1e-320), "top_p=1e-320 is below 1e-06, where it underflows"),
        (dict(repetition_penalty=1e-300), "repetition_penalty=1e-300 must lie in \\[0.001, 1000\\]"),
        (dict(repetition_penalty=1e300), "repetition_penalty=1e\\+300 must lie in"),
        (dict(seed="x"), "seed='x' must be an integer from 0 to 2\\*\\*64 - 1"),
        (dict(seed=2.5), "seed=2.5 must be an integer"),
        (dict(seed=True), "seed=True must be an integer"),
        (dict(seed=10**29), "seed=100000000000000000000000000000 lies outside 0 to 2\\*\\*64 - 1"),
        (dict(seed=-1), "seed=-1 lies outside"),
        (dict(presence_penalty=2.5), "presence_penalty=2.5 must lie in \\[-2, 2\\]"),
        (dict(frequency_penalty=float("inf")), "frequency_penalty=inf must lie in"),
        (dict(frequency_penalty="x"), "frequency_penalty='x' must lie in"),
        (dict(min_p=1.5), "min_p=1.5 must lie in \\[0, 1\\]"),
        (dict(min_p=-0.1), "min_p=-0.1 must lie in"),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size=-1 must be an integer >= 0"),
        (dict(no_repeat_ngram_size=2.5), "no_repeat_ngram_size=2.5 must be an integer >= 0"),
        (dict(no_repeat_ngram_size=True), "no_repeat_ngram_size=True must be an integer >= 0"),
    ],
)
def test_bad_settings_are_clear_errors(settings, message):
    with pytest.raises(SamplingError, match=message) as refused:
        check_sampling(**settings)
    assert refused.value.field == next(iter(settings))  # the server answers 400 naming this field
    assert isinstance(refused.value, ConfigError)


@pytest.mark.parametrize("settings", [dict(temperature=1e-5), dict(top_p=1e-6), dict(repetition_penalty=1e-3),
                                      dict(repetition_penalty=1e3), dict(seed=2**64 - 1), dict(seed=0),
                                      dict(presence_penalty=-2.0), dict(frequency_penalty=2.0), dict(min_p=1.0)])
def test_the_edges_of_each_range_sample_finite_tokens(settings):
    config, seed = check_sampling(**settings)
    logits = _logits(seed=4, vocab=50).float() * 30  # confident rows: the extremes are where overflow would show
    seen = torch.ones_like(logits, dtype=torch.bool)
    processed = process_logits(logits, config, seen)
    assert not processed.isnan().any() and processed.isfinite().any(dim=-1).all()
    tokens = select_next(logits, config, seen=seen, generator=make_generator(seed, "cpu"))
    assert ((tokens >= 0) & (tokens < 50)).all()


def test_top_p_below_the_first_tokens_probability_keeps_that_token():
    logits = _logits(seed=2)
    kept = top_p_filter(logits, 1e-30).isfinite()
    assert kept.sum(dim=-1).tolist() == [1] * logits.shape[0]
    assert kept.float().argmax(dim=-1).tolist() == logits.argmax(dim=-1).tolist()


def test_logit_bias_is_added_first_and_its_bad_values_are_refused_naming_the_field():
    logits = _logits()
    biased = process_logits(logits, SamplingConfig(temperature=0.5, logit_bias=((2, 3.0), (7, -1.5))))
    expected = logits.float().clone()
    expected[:, 2] += 3.0
    expected[:, 7] -= 1.5
    torch.testing.assert_close(biased, expected / 0.5)
    raw = logits.float()  # float32 in: the bias must not change the caller's logits (the server reads them after)
    process_logits(raw, SamplingConfig(logit_bias=((2, 3.0),)))
    torch.testing.assert_close(raw, logits.float(), rtol=0, atol=0)
    forced, _ = check_sampling(temperature=1.0, logit_bias={4: 100})
    assert select_next(logits, forced, generator=make_generator(0, "cpu")).tolist() == [4, 4, 4]
    for bias, message in (({11: 1.0}, "beyond the vocabulary of 11"), ({-1: 1.0}, "no token id"),
                          ({3: 100.5}, "must lie in \\[-100, 100\\]"), ({"3": 1.0}, "no token id")):
        with pytest.raises(SamplingError, match=message) as refused:
            check_sampling(logit_bias=bias, vocab_size=11)
        assert refused.value.field == "logit_bias"


@settings(max_examples=30, deadline=None)
@given(presence=st.floats(-2, 2), frequency=st.floats(-2, 2), seed=st.integers(0, 1000))
def test_presence_and_frequency_penalties_follow_openais_definition(presence, frequency, seed):
    """mu[j] -> mu[j] - c[j] * frequency_penalty - float(c[j] > 0) * presence_penalty, c[j] the times token j was
    sampled before (OpenAI's parameter details), recomputed token by token in Python."""
    logits = _logits(seed=seed, batch=2, vocab=7)
    replies = [[3, 3, 0, 5, 3], []]
    counts = torch.zeros(2, 7, dtype=torch.int32)
    for row, reply in enumerate(replies):
        for token in reply:
            counts[row, token] += 1
    config = SamplingConfig(temperature=0.0, presence_penalty=presence, frequency_penalty=frequency)
    processed = process_logits(logits, config, counts=counts)
    for row, reply in enumerate(replies):
        for token in range(7):
            c = reply.count(token)
            expected = float(logits[row, token]) - c * frequency - float(c > 0) * presence
            assert processed[row, token].item() == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_likeliest(min_p):
    logits = _logits(seed=3, batch=4, vocab=20)
    config = SamplingConfig(temperature=0.7, min_p=min_p)
    kept = process_logits(logits, config).isfinite()
    for row in range(4):
        probs = (logits[row] / 0.7).softmax(-1).tolist()
        expected = [p >= min_p * max(probs) for p in probs]
        assert kept[row].tolist() == expected
    assert kept.any(dim=-1).all()  # the likeliest always stays


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(3, 60), seed=st.integers(0, 2**16), temperature=st.floats(0.05, 3.0),
       top_p=st.floats(0.05, 1.0), min_p=st.floats(0.0, 0.5), penalty=st.floats(1.0, 3.0), data=st.data())
def test_the_processed_distribution_is_transformers_own(vocab, seed, temperature, top_p, min_p, penalty, data):
    """Repetition penalty, temperature, top-k, top-p and min-p in that order give the distribution Hugging Face's
    logits processors give in their order. The logits are drawn without ties: which of two equal tokens at the top-p
    border stays is each library's own choice."""
    processors = pytest.importorskip("transformers.generation.logits_process")
    top_k = data.draw(st.integers(1, vocab))
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, vocab, generator=generator) * 3  # (B, V), distinct values: no ties
    ids = torch.randint(0, vocab, (2, 6), generator=generator)  # (B, T): the sequence so far
    seen = torch.zeros(2, vocab, dtype=torch.bool).scatter_(1, ids, True)
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=penalty)
    reference = processors.LogitsProcessorList([
        processors.RepetitionPenaltyLogitsProcessor(penalty), processors.TemperatureLogitsWarper(temperature),
        processors.TopKLogitsWarper(top_k), processors.TopPLogitsWarper(top_p), processors.MinPLogitsWarper(min_p),
    ])(ids, logits.clone())
    torch.testing.assert_close(process_logits(logits, config, seen).softmax(-1), reference.softmax(-1),
                               rtol=1e-5, atol=1e-6)


def rescanned_bans(tokens: list[int], n: int) -> set[int]:
    """The tokens that would repeat an n-gram of `tokens`, found by rescanning it (transformers' way)."""
    last = tuple(tokens[len(tokens) - n + 1:]) if n > 1 else ()
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i:i + n - 1]) == last}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=8), min_size=1, max_size=3),
       st.lists(st.integers(0, 5), max_size=12))
def test_repeated_ngrams_kept_token_by_token_ban_what_rescanning_the_sequence_bans(n, prompts, replies):
    """The n-grams are kept as tokens come (each step costs its new token, not the sequence) and ban at each step the
    tokens a rescan of the whole sequence bans, in one index_put over the logits: row by row, for n = 1 to 4."""
    repeated = RepeatedNgrams(prompts, n)
    sequences = [list(p) for p in prompts]
    for step in range(len(replies) + 1):
        banned = repeated.ban(torch.zeros(len(prompts), 6, dtype=torch.float64))  # (B, V)
        for row, tokens in enumerate(sequences):
            assert {int(t) for t in banned[row].isneginf().nonzero()} == rescanned_bans(tokens, n)
        if step < len(replies):
            for row, tokens in enumerate(sequences):
                token = (replies[step] + row) % 6  # each row its own tokens
                repeated.push(row, token)
                tokens.append(token)


def test_hold_back_sets_the_ids_to_minus_infinity_in_the_rows_given_and_leaves_the_logits_it_was_given():
    """The one helper the library's decoding loop and the server's use to hold tokens back (the stop tokens of rows
    short of min_new_tokens, a padded vocabulary's ids): in every row, or in a slice of rows."""
    logits = _logits(batch=4, vocab=7)
    ids = torch.tensor([1, 5])
    every = hold_back(logits, ids)
    some = hold_back(logits, ids, slice(1, 3))
    for row in range(4):
        for token in range(7):
            held_in_some = token in (1, 5) and row in (1, 2)
            assert bool(every[row, token].isneginf()) == (token in (1, 5))
            assert bool(some[row, token].isneginf()) == held_in_some
            if not held_in_some:
                assert some[row, token] == logits[row, token]
    assert not logits.isinf().any()  # the raw logits stay, for the log-probabilities
    assert hold_back(logits, torch.tensor([], dtype=torch.long)) is logits
