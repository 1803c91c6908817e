"""Speculative decoding (`attnkit.generate.speculative`): greedy, the target's own tokens whatever the draft; sampled,
the target's own distribution (Leviathan et al. 2023), shown by chi-square tests that a wrong acceptance rule fails."""

import copy
import inspect
import itertools
import logging
import re

import pytest
import torch
from generate_models import POSITIONS, tiny_model
from scipy.stats import chisquare

import attnkit
from attnkit import cli
from attnkit.checkpoint import save_model
from attnkit.errors import InputError
from attnkit.generate import Pipeline, speculative
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.sampling import GREEDY, SamplingConfig, draw, process_logits
from attnkit.generate.speculative import accept_sampled, speculative_generate
from attnkit.tokenize import CharTokenizer

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 2], [3]]  # of different lengths: left padding under the drafts


def perturbed(model, scale: float, seed: int):
    """A copy of `model` with noise of std `scale` on its matrices: a draft that agrees with it often, not always."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            if parameter.dim() > 1:
                parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * scale)
    return draft


MODELS = [dict(position=p) for p in POSITIONS] + [
    dict(position="rope", n_kv_heads=2), dict(position="rope", n_kv_heads=1, attention_window=4),
    dict(position="alibi", attention_window=3, global_every=2)]


@pytest.mark.parametrize("settings", MODELS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_greedy_text_is_the_targets_own_token_for_token(settings):
    target, config = tiny_model(**settings)
    draft = perturbed(target, 0.15, seed=1)
    with torch.no_grad():
        alone = generate_tokens(target, PROMPTS, max_new_tokens=14, context_len=config.max_seq_len)
    rates = []
    for k in (1, 5):
        tokens, stats = speculative_generate(target, draft, PROMPTS, max_new_tokens=14, context_len=config.max_seq_len,
                                             draft_tokens=k)
        assert tokens == alone, k
        rates.append(stats.acceptance_rate)
    assert 0 < min(rates) and max(rates) < 1  # the drafts were kept and refused: both paths ran


@pytest.mark.parametrize("position", ["learned", "relative", "alibi"])
def test_greedy_text_fills_the_context_to_its_last_position(position):
    """The most new tokens the check allows (the longest prompt and they fill max_seq_len, the last one chosen and
    never fed), the last rounds' drafts cut to the tokens left: a learned position table has no row past
    max_seq_len, and the caches are sized to the text."""
    target, config = tiny_model(position=position)
    draft = perturbed(target, 0.05, seed=3)
    room = config.max_seq_len + 1 - max(map(len, PROMPTS))
    with torch.no_grad():
        alone = generate_tokens(target, PROMPTS, max_new_tokens=room, context_len=config.max_seq_len)
    tokens, _ = speculative_generate(target, draft, PROMPTS, max_new_tokens=room, context_len=config.max_seq_len,
                                     draft_tokens=5)
    assert tokens == alone and len(tokens[0]) == room


def test_a_different_draft_model_and_stops_leave_the_greedy_text_unchanged():
    target, config = tiny_model(position="rope", n_kv_heads=2)
    draft, _ = tiny_model(position="learned", n_layers=1, d_model=16, n_heads=2, d_ff=32, seed=5)
    with torch.no_grad():
        free = generate_tokens(target, PROMPTS, max_new_tokens=16, context_len=24)
        stops = {free[0][6], free[1][4]}  # tokens the rows write: they end there (the second not before its 3rd)
        alone = generate_tokens(target, PROMPTS, max_new_tokens=16, context_len=24, stop_ids=stops, min_new_tokens=3)
    tokens, _ = speculative_generate(target, draft, PROMPTS, max_new_tokens=16, context_len=24, draft_tokens=4,
                                     stop_ids=stops, min_new_tokens=3)
    assert tokens == alone
    assert any(len(row) < 16 for row in tokens)  # a stop token ended a row: the rows went on out of step


def test_on_token_ends_a_row_as_without_a_draft():
    target, _ = tiny_model(position="rope")
    draft = perturbed(target, 0.1, seed=2)
    seen = []

    def stop_after_five(row, token):
        seen.append((row, token))
        return sum(r == row for r, _ in seen) == 5

    tokens, _ = speculative_generate(target, draft, PROMPTS, max_new_tokens=12, context_len=24, draft_tokens=3,
                                     on_token=stop_after_five)
    assert [len(row) for row in tokens] == [5, 5, 5]
    assert sorted(seen) == sorted((row, t) for row, ts in enumerate(tokens) for t in ts)


def _first_two_exact(target, prompt, sampling):
    """The target's exact distribution of its first two new tokens: (V, V) from V + 1 forward passes."""
    with torch.no_grad():
        first = process_logits(target(torch.tensor([prompt])).logits[:, -1], sampling).softmax(-1)[0]  # (V,)
        vocab = first.shape[0]
        after = torch.tensor([prompt + [t] for t in range(vocab)])  # (V, T + 1)
        second = process_logits(target(after).logits[:, -1], sampling).softmax(-1)  # (V, V)
    return (first[:, None] * second).double()


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)],
                         ids=["plain", "temperature-top-k-top-p"])
def test_sampled_texts_follow_the_targets_distribution(sampling):
    target, _ = tiny_model(position="rope", vocab_size=6, seed=3)
    draft = perturbed(target, 0.3, seed=4)
    prompt = [1, 4, 2]
    exact = _first_two_exact(target, prompt, sampling).flatten()
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(36, dtype=torch.float64)
    for _ in range(50):  # rows in batches of 80: the fewest drafts a row keeps sets each round's advance
        tokens, stats = speculative_generate(target, draft, [prompt] * 80, max_new_tokens=2, context_len=24,
                                             draft_tokens=2, sampling=sampling, generator=generator)
        for first, second in tokens:
            counts[first * 6 + second] += 1
    assert 0.2 < stats.acceptance_rate < 0.95
    support = exact > 0
    assert counts[~support].sum() == 0  # nothing top-k or top-p dropped is ever written
    expected = exact[support] / exact[support].sum() * counts.sum()
    assert chisquare(counts[support], expected).pvalue > 1e-3, "the texts do not follow the target's distribution"


def _resample_from_p(p, q, drafted, groups):
    """A wrong rule: a rejected draft is replaced by a draw from p, not from max(0, p - q)."""
    kept, _ = accept_sampled(p, q, drafted, groups)
    return kept, draw(p[torch.arange(p.shape[0]), kept], groups)


def _tables(vocab: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    def table(*shape):
        return torch.randn(*shape, vocab, generator=generator, dtype=torch.float64).mul(1.5).softmax(-1)
    return table(), table(vocab), table(), table(vocab)  # p1 (V,), p2 (V, V) given token 1; q1, q2 alike


def _rule_draws(rule, rows: int, seed: int):
    """One round of K = 2 drafts on fixed conditional tables (V = 4), through `rule`: the first token of each row, and
    the second where the round gave one (-1 where it did not), with the exact tables."""
    p1, p2, q1, q2 = _tables(4, seed)
    generator = torch.Generator().manual_seed(seed)
    d1 = torch.multinomial(q1.expand(rows, -1), 1, generator=generator)[:, 0]  # (N,)
    d2 = torch.multinomial(q2[d1], 1, generator=generator)[:, 0]  # (N,): drafted after d1
    p = torch.stack((p1.expand(rows, -1), p2[d1], p2[d1] * 0 + 0.25), dim=1)  # (N, 3, V): p3 plays no part below
    q = torch.stack((q1.expand(rows, -1), q2[d1]), dim=1)  # (N, 2, V)
    kept, after = rule(p, q, torch.stack((d1, d2), dim=1), [(rows, generator)])
    first = torch.where(kept >= 1, d1, after)
    second = torch.where(kept >= 2, d2, torch.where(kept == 1, after, -1))
    return first, second, p1, p2


@pytest.mark.parametrize("rule, holds", [(accept_sampled, True), (_resample_from_p, False)],
                         ids=["leviathan", "wrong-resample-from-p"])
def test_the_acceptance_rule_gives_the_targets_distribution_and_a_wrong_one_fails(rule, holds):
    first, second, p1, p2 = _rule_draws(rule, 200_000, seed=7)
    pvalues = [chisquare(torch.bincount(first, minlength=4).double(), p1 * len(first)).pvalue]
    for token in range(4):  # the second token, given the first, where the round kept the first draft
        chosen = second[(first == token) & (second >= 0)]
        pvalues.append(chisquare(torch.bincount(chosen, minlength=4).double(), p2[token] * len(chosen)).pvalue)
    assert (min(pvalues) > 1e-4) == holds, pvalues


def test_a_wrong_rule_fails_the_end_to_end_distribution_test(monkeypatch):
    monkeypatch.setattr(speculative, "accept_sampled", _resample_from_p)
    with pytest.raises(AssertionError, match="the texts do not follow the target's distribution"):  # no other check
        test_sampled_texts_follow_the_targets_distribution(SamplingConfig())


def _after_at_every_row(n, kept, after, drafted):
    """A wrong batch rule: every row's last token is the one drawn after all it kept, even where the round cuts its
    kept drafts short at n."""
    return torch.cat((drafted[:, :n], after[:, None]), dim=1)


@pytest.mark.parametrize("rule, holds", [(speculative.advance_together, True), (_after_at_every_row, False)],
                         ids=["fewest-kept", "wrong-after-at-every-row"])
def test_rows_cut_short_by_the_batch_keep_the_targets_distribution(monkeypatch, rule, holds):
    """Three tokens of batches of 8 rows from a draft that mostly agrees, so that rounds end after 0, 1 or 2 kept
    drafts of a row that kept more (the test above draws two tokens with K = 1, where rows are never cut short):
    the joint distribution of the three is the target's, and a rule that ends a cut row with its own after-token
    fails."""
    monkeypatch.setattr(speculative, "advance_together", rule)
    target, _ = tiny_model(position="rope", vocab_size=4, seed=3)
    draft = perturbed(target, 0.03, seed=4)
    prompt = [1, 3, 2]
    with torch.no_grad():
        def step(texts):  # (N, 4): the target's next-token distribution after each text
            return target(torch.tensor(texts)).logits[:, -1].softmax(-1).double()
        exact = (step([prompt])[0, :, None, None] * step([prompt + [a] for a in range(4)])[:, :, None]
                 * step([prompt + [a, b] for a in range(4) for b in range(4)]).view(4, 4, 4)).flatten()  # (64,)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(64, dtype=torch.float64)
    rounds = set()
    for _ in range(150):
        tokens, stats = speculative_generate(target, draft, [prompt] * 8, max_new_tokens=3, context_len=24,
                                             draft_tokens=2, sampling=SamplingConfig(), generator=generator)
        rounds.add(stats.rounds)
        for a, b, c in tokens:
            counts[a * 16 + b * 4 + c] += 1
    assert rounds == {1, 2, 3}  # every row kept both drafts; the fewest was one; or none
    expected = exact / exact.sum() * counts.sum()
    rare = expected < 5  # pooled into one cell, as a chi-square test needs
    observed = torch.cat((counts[~rare], counts[rare].sum()[None]))
    assert (chisquare(observed, torch.cat((expected[~rare], expected[rare].sum()[None]))).pvalue > 1e-3) == holds


def test_the_same_seed_gives_the_same_sampled_text():
    target, _ = tiny_model(position="rope")
    draft = perturbed(target, 0.2, seed=1)
    runs = [speculative_generate(target, draft, PROMPTS, max_new_tokens=10, context_len=24, draft_tokens=3,
                                 sampling=SamplingConfig(), generator=[torch.Generator().manual_seed(i)
                                                                      for i in range(3)])[0] for _ in range(2)]
    assert runs[0] == runs[1]


def test_bad_settings_are_clear_errors():
    target, _ = tiny_model(position="rope")
    draft, _ = tiny_model(position="rope", vocab_size=9)
    with pytest.raises(InputError, match=r"draft_tokens=0 must be an integer from 1 to 64"):
        speculative_generate(target, target, PROMPTS, max_new_tokens=4, context_len=24, draft_tokens=0)
    with pytest.raises(InputError, match=r"vocabularies \(13 and 9 ids\) must both hold the 13 tokens"):
        speculative_generate(target, draft, PROMPTS, max_new_tokens=4, context_len=24)
    with pytest.raises(InputError, match=r"prompt \(length 6\) and max_new_tokens=20 outgrow the context of 24 .*"
                                         r"give at most 19 new tokens"):
        speculative_generate(target, target, PROMPTS, max_new_tokens=20, context_len=24)


def test_a_rewound_cache_equals_one_never_written_past(monkeypatch):
    model, _ = tiny_model(position="rope", attention_window=3)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        fresh = model.allocate_cache(1, 10, rolling=False)
        expected = model(ids, cache=fresh).logits
        cache = model.allocate_cache(1, 10, rolling=False)
        model(torch.tensor([[1, 2, 3, 4, 9, 9, 9]]), cache=cache)
        cache.rewind(4)
        torch.testing.assert_close(model(ids[:, 4:], cache=cache).logits, expected[:, 4:])
    with pytest.raises(InputError, match="cannot rewind a KV cache of 7 positions to 8"):
        cache.rewind(8)
    rolling = model.allocate_cache(1, 10)
    with pytest.raises(InputError, match="rolling .* cannot be rewound.*rolling=False"):
        rolling.rewind(0)
    static = model.allocate_cache(1, 10, static=True, rolling=False)  # its step reads `filled`, not the length
    with pytest.raises(InputError, match="static KV cache .* cannot be rewound.*static=False"):
        static.rewind(0)


def test_an_empty_request_and_greedy_constant_are_handled():
    target, _ = tiny_model(position="rope")
    assert speculative_generate(target, target, PROMPTS, max_new_tokens=0, context_len=24)[0] == [[], [], []]
    tokens, stats = speculative_generate(target, target, [[1]], max_new_tokens=1, context_len=24, sampling=GREEDY)
    assert len(tokens[0]) == 1 and stats.drafted == 0  # one token left: the target's own, nothing drafted


def test_every_pair_of_first_tokens_is_reachable_in_the_exact_table():
    target, _ = tiny_model(position="rope", vocab_size=6, seed=3)
    exact = _first_two_exact(target, [1, 4, 2], SamplingConfig())
    assert torch.allclose(exact.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert all(exact[a, b] > 0 for a, b in itertools.product(range(6), repeat=2))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A target run, a smaller draft run of the same character tokenizer, and drafts that cannot serve it."""
    root = tmp_path_factory.mktemp("speculative")
    alphabet = "abcdefgh \n"

    def save(name, tokenizer, family="decoder", **overrides):
        model, config = tiny_model(family, vocab_size=tokenizer.vocab_size, **overrides)
        save_model(model, config, root / name)
        tokenizer.save(root / name / "tokenizer")
        return root / name

    return {"target": save("target", CharTokenizer(alphabet), position="rope", seed=1),
            "draft": save("draft", CharTokenizer(alphabet), position="rope", n_layers=1, seed=2),
            "other": save("other", CharTokenizer(alphabet.replace("h", "i")), position="rope", n_layers=1, seed=2),
            "wider": save("wider", CharTokenizer(alphabet + "xyz"), position="rope", n_layers=1, seed=2),
            "mt": save("mt", CharTokenizer(alphabet), "encoder-decoder", position="sinusoidal", seed=3),
            "tagger": save("tagger", CharTokenizer(alphabet), position="rope", n_layers=1, decoder_head="tag",
                           n_classes=3)}


def test_pipeline_and_command_with_a_draft_write_the_targets_text(runs, capsys, caplog):
    target = attnkit.load(runs["target"], device="cpu")
    draft = attnkit.load(runs["draft"], device="cpu")
    prompts = ["abc", "hgf ed"]
    alone = target.generate(prompts, max_new_tokens=12, temperature=0, stop_at_eos=False)
    with caplog.at_level(logging.INFO, logger="attnkit.generate.pipeline"):
        assert target.generate(prompts, max_new_tokens=12, temperature=0, stop_at_eos=False, draft=draft,
                               draft_tokens=3) == alone
        assert target.generate(prompts, max_new_tokens=12, temperature=0, stop_at_eos=False,
                               draft=str(runs["draft"])) == alone  # a run directory, loaded
    assert re.search(r"\d+ of \d+ drafted tokens accepted \(\d+\.\d%\)", caplog.text)
    assert cli.main(["generate", "--run", str(runs["target"]), "--draft", str(runs["draft"]), "--draft-tokens", "2",
                     "--prompt", "abc", "--max-new-tokens", "12", "--temperature", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == "abc" + target.generate("abc", max_new_tokens=12, temperature=0)[0] + "\n"


def test_what_a_draft_cannot_serve_is_refused_in_one_line(runs, capsys):
    target = attnkit.load(runs["target"], device="cpu")
    with pytest.raises(InputError, match=r"^draft= \(speculative decoding\) does not take num_beams, "
                                         r"repetition_penalty, regex: [^\n]*$"):
        target.generate("ab", draft=runs["draft"], num_beams=2, repetition_penalty=1.2, regex="a+")
    with pytest.raises(InputError, match=r"reads token \d+ as 'i', the target's as 'h'.*target's tokenizer"):
        target.generate("ab", draft=runs["other"], max_new_tokens=8)
    with pytest.raises(InputError, match=r"draft's tokenizer has \d+ tokens and the target's \d+"):
        target.generate("ab", draft=runs["wider"], max_new_tokens=8)
    with pytest.raises(InputError, match=r"the target is a 'decoder' and the draft a 'encoder-decoder' model"):
        target.generate("ab", draft=runs["mt"], max_new_tokens=8)
    with pytest.raises(InputError, match=r"draft_tokens=0 must be an integer from 1"):
        target.generate("ab", draft=runs["draft"], draft_tokens=0)
    argv = ["generate", "--run", str(runs["target"]), "--draft", str(runs["draft"]), "--prompt", "ab"]
    assert cli.main([*argv, "--no-repeat-ngram-size", "3", "--json"]) != 0
    assert ("--draft (speculative decoding) does not take --no-repeat-ngram-size, --json"
            in capsys.readouterr().err)
    assert cli.main([*argv, "--max-new-tokens", "40"]) != 0
    assert "and --max-new-tokens 40 outgrow the context of 24" in capsys.readouterr().err


def test_a_draft_is_checked_by_its_vocabulary_without_serialising_either_tokenizer(runs, monkeypatch):
    """Each call compares the draft's vocabulary with the target's: comparing fingerprints serialised both tokenizers
    (seconds a call for a 128k-token tokenizer.json), where the ids' meaning is all the draft must share."""
    target, draft = attnkit.load(runs["target"], device="cpu"), attnkit.load(runs["draft"], device="cpu")
    alone = target.generate("abc", max_new_tokens=8, temperature=0, stop_at_eos=False)

    def serialise(self):
        raise AssertionError("a tokenizer was serialised to compare it with the draft's")

    monkeypatch.setattr(CharTokenizer, "fingerprint", serialise)
    assert target.generate("abc", max_new_tokens=8, temperature=0, stop_at_eos=False, draft=draft) == alone
    with pytest.raises(InputError, match=r"reads token \d+ as 'i', the target's as 'h'"):
        target.generate("ab", draft=runs["other"], max_new_tokens=8)


def test_compile_beside_a_draft_compiles_neither_model_and_says_so(runs, monkeypatch, caplog, capsys):
    """Speculative decoding runs both models eagerly: --compile beside --draft built (and with aot, captured) a
    step for each model that nothing ran, and said nothing."""
    from attnkit.generate import pipeline as pipeline_module

    asked, build = [], pipeline_module.decoding_for
    monkeypatch.setattr(pipeline_module, "decoding_for",
                        lambda model, compile=False: asked.append(compile) or build(model, compile))
    argv = ["generate", "--run", str(runs["target"]), "--draft", str(runs["draft"]), "--prompt", "abc",
            "--max-new-tokens", "8", "--temperature", "0", "--device", "cpu", "--compile"]
    with caplog.at_level(logging.WARNING, logger="attnkit.tasks.lm"):
        assert cli.main(argv) == 0
    assert asked == [False, False]  # the target's load, then the draft's
    assert "--compile default: speculative decoding decodes both models eagerly" in caplog.text
    target = attnkit.load(runs["target"], device="cpu")
    assert capsys.readouterr().out == "abc" + target.generate("abc", max_new_tokens=8, temperature=0)[0] + "\n"


def test_a_seeded_sample_with_a_draft_is_the_same_alone_or_batched(runs):
    """As without a draft (sample i of a prompt seeded seed + i): a batch's rows advance together, by the drafts
    every row keeps, so seeded rows decode one at a time, where a prompt's text changed with the batch around it."""
    target, draft = attnkit.load(runs["target"], device="cpu"), attnkit.load(runs["draft"], device="cpu")
    prompts = ["abc", "hgf ed", "ba"]
    options = dict(max_new_tokens=16, seed=3, stop_at_eos=False, draft=draft, draft_tokens=3, num_samples=2)
    batched = target.generate(prompts, **options)
    assert batched == [text for prompt in prompts for text in target.generate(prompt, **options)]
    assert len(set(batched)) > 1  # sampled: the rows differ


def test_a_decoder_draft_that_does_not_generate_is_refused_naming_its_task(runs):
    """A decoder trained to tag has no next-token head: it failed with AttributeError: ... no attribute 'lm_head'."""
    target = attnkit.load(runs["target"], device="cpu")
    with pytest.raises(InputError, match=r"^the draft was trained for tag, not to generate: give a language-model "):
        target.generate("ab", draft=runs["tagger"], max_new_tokens=4)


def test_a_draft_run_directory_loads_in_the_targets_dtype(runs, monkeypatch):
    """attnkit generate loads the draft as it loads the target; the API loaded a run directory as stored (fp32
    beside a bf16 target: the draft's steps at fp32's cost)."""
    from attnkit.generate import pipeline as pipeline_module

    drafted, run = [], pipeline_module.speculative_generate
    monkeypatch.setattr(pipeline_module, "speculative_generate",
                        lambda target, draft, *a, **k: drafted.append(draft.lm_head.weight.dtype) or run(
                            target, draft, *a, **k))
    target = attnkit.load(runs["target"], device="cpu", dtype="bf16")
    target.generate("abc", max_new_tokens=4, temperature=0, draft=str(runs["draft"]))
    assert drafted == [torch.bfloat16]


def test_the_options_refused_beside_a_draft_are_names_of_both_the_command_and_the_api():
    """A name of NOT_BESIDE_DRAFT renamed on one side without the table would let that option through unrefused."""
    from dataclasses import fields

    from attnkit.run_settings import API_ONLY_BESIDE_DRAFT, CLI_ONLY_BESIDE_DRAFT, NOT_BESIDE_DRAFT
    from attnkit.tasks.lm import GenerateSettings

    flags = {f.name for f in fields(GenerateSettings)}
    arguments = set(inspect.signature(Pipeline.generate).parameters)
    assert set(NOT_BESIDE_DRAFT) - API_ONLY_BESIDE_DRAFT <= flags and not API_ONLY_BESIDE_DRAFT & flags
    assert set(NOT_BESIDE_DRAFT) - CLI_ONLY_BESIDE_DRAFT <= arguments and not CLI_ONLY_BESIDE_DRAFT & arguments


def test_a_draft_vocabulary_once_checked_is_compared_again_only_when_a_tokenizer_changes(runs, monkeypatch):
    """The entry-by-entry comparison (0.1 s a call at 128k tokens) ran at every call with the same draft: the pair
    found alike is remembered by the tokenizers' identity and sizes, so another tokenizer object is compared again."""
    target, draft = attnkit.load(runs["target"], device="cpu"), attnkit.load(runs["draft"], device="cpu")
    compared = []
    pieces = CharTokenizer.pieces
    monkeypatch.setattr(CharTokenizer, "pieces", lambda self, ids: (
        compared.append(self) if isinstance(ids, range) else None) or pieces(self, ids))
    options = dict(max_new_tokens=4, temperature=0, stop_at_eos=False, draft=draft)
    alone = target.generate("ab", max_new_tokens=4, temperature=0, stop_at_eos=False)
    assert target.generate("ab", **options) == alone and len(compared) == 2  # both tokenizers, once
    assert target.generate("ab", **options) == alone and len(compared) == 2  # remembered
    draft.tokenizer = CharTokenizer("abcdefgi \n")  # another object, here another vocabulary: compared again
    with pytest.raises(InputError, match=r"reads token \d+ as 'i', the target's as 'h'"):
        target.generate("ab", **options)
    draft.tokenizer = CharTokenizer("abcdefgh \n")
    assert target.generate("ab", **options) == alone and len(compared) == 6


def test_caches_that_cannot_fit_in_the_memory_free_are_refused_before_they_are_allocated(monkeypatch):
    """As beam search checks its hypotheses: both models' caches (every position kept) and a round's scores, counted
    here by allocating the caches whole, against the memory free."""
    target, config = tiny_model(position="rope", n_kv_heads=2)
    draft = tiny_model(position="rope", n_layers=1, seed=3)[0]
    k, width, new = 3, max(len(p) for p in PROMPTS), 10
    positions = width + new - 1
    caches = sum(buffer.numel() * buffer.element_size() for model in (target, draft)
                 for layer in model.allocate_cache(len(PROMPTS), positions, rolling=False).layers
                 for buffer in (layer.keys, layer.values))
    need = caches + 2 * len(PROMPTS) * (2 * k + 1) * config.vocab_size * 4
    options = dict(max_new_tokens=new, context_len=config.max_seq_len, draft_tokens=k)
    monkeypatch.setattr(speculative, "free_bytes", lambda device: need - 1)
    with pytest.raises(InputError, match=r"needs at least .* GiB .* but cpu has .* free: decode fewer prompts"):
        speculative_generate(target, draft, PROMPTS, **options)
    monkeypatch.setattr(speculative, "free_bytes", lambda device: need)
    tokens, _ = speculative_generate(target, draft, PROMPTS, **options)
    assert tokens == generate_tokens(target, PROMPTS, max_new_tokens=new, context_len=config.max_seq_len)


def test_a_target_drafting_for_itself_is_counted_a_draft_per_row_and_round():
    """Every draft kept: 10 tokens in rounds of K = 3, 3 and 1 (the round's last token the target's own), for two
    rows: 3 rounds, 6 drafts (vLLM's num_drafts: one per row and round), 14 tokens drafted and accepted, 10 advanced."""
    target, config = tiny_model(position="rope")
    tokens, stats = speculative_generate(target, target, [[1, 2, 3], [4, 5]], draft_tokens=3, max_new_tokens=10,
                                         context_len=config.max_seq_len)
    assert (stats.rounds, stats.drafts, stats.drafted, stats.accepted, stats.advanced) == (3, 6, 14, 14, 10)
    assert tokens == generate_tokens(target, [[1, 2, 3], [4, 5]], max_new_tokens=10, context_len=config.max_seq_len)


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("value", ["2", "4"])  # 4, the default, given is refused as well: nothing reads it
def test_draft_tokens_without_a_draft_is_refused_in_one_line_naming_draft(runs, capsys, monkeypatch, command, value):
    monkeypatch.setattr("attnkit.serve.build_app", lambda settings: pytest.fail("the server went on to load its run"))
    argv = [command, "--run", str(runs["target"]), "--draft-tokens", value, "--device", "cpu"]
    argv += ["--prompt", "ab", "--max-new-tokens", "2"] if command == "generate" else ["--port", "0"]
    assert cli.main(argv) != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"--draft-tokens {value}" in error[0] and "give --draft RUN too" in error[0]


def test_the_token_after_the_kept_drafts_is_the_targets_where_a_row_kept_no_more_else_its_next_draft():
    """`token_after_kept`, the one rule of `advance_together` and the server's rounds: a row that keeps as many drafts
    as it kept gets the target's token after them; one cut short gets its next draft (accepted); a row cut at all K
    drafts (a closed choice beside an open one that kept them all) gets the token after, not a draft past the K-th."""
    drafted = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]])  # (B, K)
    kept, after = torch.tensor([1, 3, 2, 1]), torch.tensor([10, 11, 12, 13])  # (B,), (B,)
    keep = torch.tensor([1, 1, 0, 3])
    assert speculative.token_after_kept(keep, kept, after, drafted).tolist() == [10, 6, 5, 13]
    assert speculative.advance_together(1, kept, after, drafted).tolist() == [[5, 10], [5, 6], [5, 6], [5, 13]]
