"""The n-gram language model (`attnkit.models.ngram`): each context's distribution sums to 1, the probabilities are
the counts done by hand and by an independent dictionary implementation, perplexity is the brute-force one, NLTK's
`nltk.lm` agrees where it is installed, and sampling draws from the model's own distribution."""

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.errors import ConfigError, InputError
from attnkit.models.ngram import NGramLM

V = 5
TRAIN = torch.tensor([0, 1, 2, 0, 1, 3, 0, 1, 2, 4, 2, 0, 1, 1, 3, 2, 0, 4, 1, 2, 0])
HELD_OUT = torch.tensor([0, 1, 2, 3, 0, 1, 4, 4, 2, 0, 3, 1])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("smoothing", ["add-alpha", "kneser-ney"])
def test_every_contexts_distribution_sums_to_one(n, smoothing):
    model = NGramLM(n=n, vocab_size=V, smoothing=smoothing, alpha=0.3).fit(TRAIN)
    contexts = [TRAIN[t:t + n - 1] for t in range(len(TRAIN) - n + 2)] + [torch.full((n - 1,), 4)]  # seen, unseen
    for context in contexts:
        p = model.next_token_probs(context)
        assert p.shape == (V,) and bool((p > 0).all())
        torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_add_one_bigram_is_the_hand_count():
    # 0 1 0 2 0 1 | bigrams: (0 1) x2, (1 0), (0 2), (2 0); the context 0 starts 3 of them, 1 one, 2 one
    model = NGramLM(n=2, vocab_size=3, alpha=1.0).fit([0, 1, 0, 2, 0, 1])
    torch.testing.assert_close(model.next_token_probs([0]), torch.tensor([1 / 6, 3 / 6, 2 / 6], dtype=torch.float64))
    torch.testing.assert_close(model.next_token_probs([2]), torch.tensor([2 / 4, 1 / 4, 1 / 4], dtype=torch.float64))
    # the newest n - 1 ids are the context: a longer one is cut
    torch.testing.assert_close(model.next_token_probs([1, 2]), model.next_token_probs([2]))


def test_kneser_ney_bigram_is_the_hand_count():
    # 0 1 0 2 0 1, d = 0.5. Unigram continuations N1+(. w): 0 follows {1, 2} -> 2, 1 follows {0} -> 1, 2 follows
    # {0} -> 1; total 4, 3 distinct: P1(w) = (max(N - d, 0) + d * 3 * 1/3) / 4 = (1.5 + 0.5, 0.5 + 0.5, 0.5 + 0.5) / 4
    model = NGramLM(n=2, vocab_size=3, smoothing="kneser-ney", discount=0.5).fit([0, 1, 0, 2, 0, 1])
    unigram = torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64) / 4
    # context 0: (0 1) x2, (0 2) x1: total 3, 2 distinct; P(w | 0) = (max(#(0 w) - d, 0) + d * 2 * P1(w)) / 3
    expected = (torch.tensor([0.0, 1.5, 0.5], dtype=torch.float64) + 0.5 * 2 * unigram) / 3
    torch.testing.assert_close(model.next_token_probs([0]), expected)


def test_kneser_ney_counts_the_continuations_a_sequence_starts_with():
    # 0 1 2 3, n = 3, d = 0.5: the bigrams (0 1) (1 2) (2 3) give 1, 2 and 3 one left neighbour each (N1+(. 1) = 1,
    # though no trigram ends in (0 1)); total 3, 3 distinct: P1(w) = (max(N - d, 0) + d * 3 * 1/4) / 3. The context
    # (3 3) is unseen, and so is 3 as a bigram context: both defer to P1.
    model = NGramLM(n=3, vocab_size=4, smoothing="kneser-ney", discount=0.5).fit([0, 1, 2, 3])
    expected = (torch.tensor([0.0, 0.5, 0.5, 0.5], dtype=torch.float64) + 0.5 * 3 / 4) / 3
    torch.testing.assert_close(model.next_token_probs([3, 3]), expected)
    # each sequence starts its own: (2 1) in the second gives 1 a second left neighbour
    two = NGramLM(n=3, vocab_size=4, smoothing="kneser-ney", discount=0.5).fit([[0, 1, 2, 3], [2, 1]])
    assert two.next_token_probs([3, 3])[1] > model.next_token_probs([3, 3])[1]


@pytest.mark.parametrize("smoothing", ["add-alpha", "kneser-ney"])
def test_tokens_and_contexts_training_never_showed(smoothing):
    # V = 8 over TRAIN's 0 .. 4: 5, 6 and 7 never occur. Each gets the same share, above 0; a context of them defers
    # (Kneser-Ney: to the unigrams, d * (types) / V / (total continuations) for an unseen token; add-alpha: uniform)
    model = NGramLM(n=3, vocab_size=8, smoothing=smoothing, discount=0.5).fit(TRAIN)
    for context in ([0, 1], [6, 7], [1, 5]):
        p = model.next_token_probs(context)
        torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert bool((p[5:] > 0).all()) and bool((p[5:] == p[5]).all())
    unseen = model.next_token_probs([6, 7])
    if smoothing == "add-alpha":
        torch.testing.assert_close(unseen, torch.full((8,), 1 / 8, dtype=torch.float64))
    else:
        train = TRAIN.tolist()
        left = Counter(b for a, b in {tuple(train[i:i + 2]) for i in range(len(train) - 1)})  # N1+(. w)
        assert unseen[5].item() == pytest.approx(0.5 * len(left) / 8 / sum(left.values()), rel=1e-12)


def test_estimated_discounts_are_each_orders_n1_over_n1_plus_2_n2():
    # each order's n1 and n2 recounted from the definitions: the trigrams' raw counts, the lower orders' distinct
    # left neighbours (on TRAIN, (n1, n2) = (1, 2), (7, 3), (13, 3) from the unigrams up: d = 1/5, 7/13, 13/19)
    model = NGramLM(n=3, vocab_size=V, smoothing="kneser-ney", estimate_discounts=True, discount=0.6).fit(TRAIN)
    train = TRAIN.tolist()
    assert model.discounts == pytest.approx(brute_force_discounts(train, 3, 0.6), rel=1e-15)
    assert len(set(model.discounts)) > 1  # the orders differ on this corpus
    held = HELD_OUT.tolist()
    logs = [math.log(brute_force_probability(train, 3, V, "kneser-ney", 0, model.discounts, held[t - 2:t], held[t]))
            for t in range(2, len(held))]
    torch.testing.assert_close(model.log_probs(HELD_OUT), torch.tensor(logs, dtype=torch.float64))


def brute_force_discounts(train, n, fallback):
    """Each order's n1 / (n1 + 2 n2), lowest first, from Python counters: raw counts at the top, distinct left
    neighbours below; `fallback` where n1 or n2 is 0."""
    discounts = []
    for k in range(1, n + 1):
        if k == n:
            counts = Counter(tuple(train[i:i + n]) for i in range(len(train) - n + 1)).values()
        else:
            counts = Counter(g[1:] for g in {tuple(train[i:i + k + 1]) for i in range(len(train) - k)}).values()
        n1, n2 = sum(c == 1 for c in counts), sum(c == 2 for c in counts)
        discounts.append(n1 / (n1 + 2 * n2) if n1 and n2 else fallback)
    return discounts


def brute_force_probability(train, n, vocab_size, smoothing, alpha, d, context, word):
    """The same smoothing from Python counters, one order at a time (independent of the vectorised tables)."""
    grams = Counter(tuple(train[i:i + n]) for i in range(len(train) - n + 1))
    if smoothing == "add-alpha":
        together = grams[(*context, word)]
        total = sum(c for g, c in grams.items() if g[:-1] == tuple(context))
        return (together + alpha) / (total + alpha * vocab_size)
    orders = {n: grams}
    for k in range(n - 1, 0, -1):  # continuation counts: distinct tokens before each k-gram anywhere in the text
        orders[k] = Counter(g[1:] for g in {tuple(train[i:i + k + 1]) for i in range(len(train) - k)})
    p = 1.0 / vocab_size
    discounts = d if isinstance(d, list) else [d] * n  # one per order, lowest first
    for k in range(1, n + 1):
        d = discounts[k - 1]
        ctx = tuple(context[len(context) - (k - 1):]) if k > 1 else ()
        followers = {g[-1]: c for g, c in orders[k].items() if g[:-1] == ctx}
        total = sum(followers.values())
        if total:
            p = (max(followers.get(word, 0) - d, 0) + d * len(followers) * p) / total
    return p


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("smoothing", ["add-alpha", "kneser-ney"])
def test_perplexity_is_the_brute_force_one(n, smoothing):
    model = NGramLM(n=n, vocab_size=V, smoothing=smoothing, alpha=0.5, discount=0.6).fit(TRAIN)
    train, held = TRAIN.tolist(), HELD_OUT.tolist()
    logs = [math.log(brute_force_probability(train, n, V, smoothing, 0.5, 0.6, held[t - n + 1:t], held[t]))
            for t in range(n - 1, len(held))]
    torch.testing.assert_close(model.log_probs(HELD_OUT), torch.tensor(logs, dtype=torch.float64))
    assert model.perplexity(HELD_OUT) == pytest.approx(math.exp(-sum(logs) / len(logs)), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=4, max_size=30), st.lists(st.integers(0, 3), min_size=3, max_size=3),
       st.integers(1, 3), st.sampled_from(["add-alpha", "kneser-ney"]), st.floats(0.05, 2.0), st.floats(0.05, 0.95),
       st.booleans())
def test_drawn_corpora_sum_to_one_and_equal_the_brute_force(train, context, n, smoothing, alpha, d, estimate):
    model = NGramLM(n=n, vocab_size=4, smoothing=smoothing, alpha=alpha, discount=d,
                    estimate_discounts=estimate).fit(train)
    d = brute_force_discounts(train, n, d) if estimate else d
    p = model.next_token_probs(context)
    torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=torch.float64))
    brute = [brute_force_probability(train, n, 4, smoothing, alpha, d, context[len(context) - (n - 1):], w)
             for w in range(4)]
    torch.testing.assert_close(p, torch.tensor(brute, dtype=torch.float64))


def test_sequences_are_counted_apart():
    apart = NGramLM(n=2, vocab_size=3).fit([torch.tensor([0, 1]), torch.tensor([2, 2])])
    joined = NGramLM(n=2, vocab_size=3).fit(torch.tensor([0, 1, 2, 2]))
    assert apart.next_token_probs([1])[2] < joined.next_token_probs([1])[2]  # (1 2) crosses the boundary


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("smoothing", ["laplace", "lidstone"])
def test_equal_to_nltk_lm(n, smoothing):
    nltk_lm = pytest.importorskip("nltk.lm", reason="NLTK is not installed (pip install nltk to compare with nltk.lm)")
    from nltk.util import everygrams

    words = [str(i) for i in TRAIN.tolist()]
    theirs = nltk_lm.Laplace(n) if smoothing == "laplace" else nltk_lm.Lidstone(0.3, n)
    theirs.fit([list(everygrams(words, max_len=n))], vocabulary_text=words)
    vocab_size = len(theirs.vocab)  # the tokens and NLTK's <UNK>, which adds one to the denominator
    ours = NGramLM(n=n, vocab_size=vocab_size, alpha=1.0 if smoothing == "laplace" else 0.3).fit(TRAIN)
    held = HELD_OUT.tolist()
    expected = [theirs.logscore(str(held[t]), [str(i) for i in held[t - n + 1:t]]) * math.log(2)  # log2 -> ln
                for t in range(n - 1, len(held))]
    torch.testing.assert_close(ours.log_probs(HELD_OUT), torch.tensor(expected, dtype=torch.float64))


def test_samples_follow_the_models_distribution():
    model = NGramLM(n=2, vocab_size=V, smoothing="kneser-ney").fit(TRAIN)
    generator = torch.Generator().manual_seed(0)
    draws = torch.tensor([model.generate([1], 1, generator=generator)[0] for _ in range(4000)])
    frequencies = torch.bincount(draws, minlength=V).double() / len(draws)
    torch.testing.assert_close(frequencies, model.next_token_probs([1]), atol=0.03, rtol=0)


def test_generation_continues_from_its_own_tokens():
    cycle = torch.tensor([0, 1, 2, 3] * 20)
    model = NGramLM(n=3, vocab_size=V, smoothing="kneser-ney").fit(cycle)
    new = model.generate([2, 3], 8, temperature=0.05, generator=torch.Generator().manual_seed(0))
    assert new == [0, 1, 2, 3, 0, 1, 2, 3]
    assert model.generate([2, 3], 0) == []


def test_a_small_temperature_samples_the_likeliest_token_where_its_powers_underflow():
    model = NGramLM(n=2, vocab_size=V).fit(TRAIN)  # after 0, 1 is the likeliest by far
    assert model.generate([0], 3, temperature=1e-6, generator=torch.Generator().manual_seed(0))[0] == 1


@pytest.mark.parametrize("count", [-1, 2.5, True])
def test_a_token_count_that_is_not_a_whole_number_is_refused(count):
    with pytest.raises(InputError, match=f"max_new_tokens={count!r} must be a whole number >= 0"):
        NGramLM(n=2, vocab_size=V).fit(TRAIN).generate([0], count)


def test_a_numpy_array_is_one_sequence_as_a_tensor_is():
    numpy = pytest.importorskip("numpy")
    from_array = NGramLM(n=2, vocab_size=V).fit(numpy.array(TRAIN.tolist()))
    from_tensor = NGramLM(n=2, vocab_size=V).fit(TRAIN)
    torch.testing.assert_close(from_array.next_token_probs([1]), from_tensor.next_token_probs([1]))


@pytest.mark.parametrize("settings, field", [
    (dict(n=0, vocab_size=5), "n=0"), (dict(n=2, vocab_size=5, alpha=0.0), "alpha"),
    (dict(n=2, vocab_size=5, smoothing="witten-bell"), "smoothing"),
    (dict(n=2, vocab_size=5, discount=1.0), "discount"),
    (dict(n=2, vocab_size=5, estimate_discounts="yes"), "estimate_discounts"),
    (dict(n=5, vocab_size=50_000), "int64"),
    (dict(n=2, vocab_size=5, alpha=math.inf), "alpha=inf must be a finite number"),  # was nan probabilities
    (dict(n=2, vocab_size=5, alpha="1"), "alpha='1' must be a number"),  # was a TypeError
    (dict(n=2, vocab_size=5, discount="0.5"), "discount='0.5' must be a number"),
])
def test_bad_settings_name_the_field(settings, field):
    with pytest.raises(ConfigError, match=field):
        NGramLM(**settings)


def test_bad_ids_are_refused_with_the_fix():
    model = NGramLM(n=3, vocab_size=V)
    with pytest.raises(InputError, match="fit"):
        model.next_token_probs([0, 1])
    with pytest.raises(InputError, match="0 .. 4"):
        model.fit([0, 1, 7])
    with pytest.raises(InputError, match="smaller n"):
        model.fit([0, 1])
    model.fit(TRAIN)
    with pytest.raises(InputError, match="at least 2"):
        model.next_token_probs([1])
    with pytest.raises(InputError, match="integers"):
        model.log_probs(torch.tensor([0.5, 1.0, 2.0]))
