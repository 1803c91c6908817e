"""Beam search with a decoder-only model (`generate/beam.beam_generate`): what transformers' generate(num_beams=K,
do_sample=False) finds on tiny random GPT-2 and Llama checkpoints, token for token, over a sweep of beam widths,
length penalties, early stopping, returned sequences and stop-token lists, for a batch of two prompts of different
lengths (left-padded); on attnkit's own models, beam search by whole forward passes and the exhaustive best where the
beam is as wide as the vocabulary; the pipeline's and the command's options and refusals."""

import collections
import itertools
import logging
import math
import re

import numpy as np
import pytest
import torch
from generate_models import randomised, tiny_model

import attnkit
from attnkit.errors import InputError
from attnkit.generate import EagerDecoding, generate_tokens
from attnkit.generate.beam import beam_generate
from attnkit.generate.sampling import SamplingConfig, SamplingError

PROMPTS = [[5, 17, 33, 8, 61], [42, 7]]  # two lengths: the second is left-padded
NEW_TOKENS = 7
SWEEP = [  # (num_beams, length_penalty, early_stopping, num_return_sequences)
    (k, penalty, early, n)
    for k, penalty, early in itertools.product((2, 3, 4), (0.0, 1.0, 2.0, -1.0), (True, False))
    for n in sorted({1, k})
]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def converted(request, tmp_path_factory):
    """(transformers' model, attnkit's conversion of the same checkpoint, stop ids): the stop ids are the two tokens
    greedy decoding writes most, so that hypotheses end at them as well as at max_new_tokens."""
    interop_models = pytest.importorskip("interop_models")
    from attnkit.interop import hf

    directory = tmp_path_factory.mktemp(request.param)
    reference = interop_models.hf_model(request.param, directory)
    ids, mask = _left_padded(PROMPTS)
    with torch.no_grad():
        greedy = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                    pad_token_id=interop_models.PAD, eos_token_id=None)
    counts = collections.Counter(greedy[:, ids.shape[1]:].flatten().tolist())
    return reference, hf.load(directory).model, [token for token, _ in counts.most_common(2)]


def _left_padded(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # (B, T)
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    return ids, mask


def _reference(reference, stops, **search):
    """transformers' beam search on PROMPTS: each returned row's new tokens, cut before its first stop token."""
    ids, mask = _left_padded(PROMPTS)
    with torch.no_grad():
        out = reference.generate(input_ids=ids, attention_mask=mask, eos_token_id=stops, pad_token_id=0,
                                 **{"do_sample": False, **search})
    rows = out[:, ids.shape[1]:].tolist()
    return [row[:next((i for i, t in enumerate(row) if t in stops), len(row))] for row in rows]


def test_beam_search_finds_what_transformers_beam_search_finds_over_a_sweep(converted):
    """Every case of SWEEP (48) agrees with transformers token for token; some hypotheses end at a stop token and
    some at max_new_tokens, so both kinds of ending are compared."""
    reference, model, stops = converted
    disagree, ended, cut = [], 0, 0
    for k, penalty, early, n in SWEEP:
        ours = beam_generate(model, PROMPTS, max_new_tokens=NEW_TOKENS, context_len=64, num_beams=k,
                             length_penalty=penalty, early_stopping=early, num_return_sequences=n, stop_ids=stops)
        expected = _reference(reference, stops, max_new_tokens=NEW_TOKENS, num_beams=k, length_penalty=penalty,
                              early_stopping=early, num_return_sequences=n)
        if ours != expected:
            disagree.append(((k, penalty, early, n), ours, expected))
        ended += sum(len(row) < NEW_TOKENS for row in ours)
        cut += sum(len(row) == NEW_TOKENS for row in ours)
    assert not disagree, f"{len(disagree)} of {len(SWEEP)} cases differ, first: {disagree[0]}"
    assert ended and cut


@pytest.mark.parametrize("min_new_tokens", [2, 5])
def test_min_new_tokens_holds_back_the_stop_tokens_as_transformers_does(converted, min_new_tokens):
    reference, model, stops = converted
    ours = beam_generate(model, PROMPTS, max_new_tokens=NEW_TOKENS, context_len=64, num_beams=3,
                         num_return_sequences=3, stop_ids=stops, min_new_tokens=min_new_tokens)
    expected = _reference(reference, stops, max_new_tokens=NEW_TOKENS, num_beams=3, num_return_sequences=3,
                          min_new_tokens=min_new_tokens)
    assert ours == expected
    assert min(map(len, ours)) >= min_new_tokens


def _recurrent_lm():
    config = attnkit.ModelConfig(family="recurrent-lm", cell="gru", vocab_size=13, hidden_size=32, n_layers=2,
                                 max_seq_len=24)
    torch.manual_seed(3)
    return randomised(attnkit.build_model(config)), config


def _conv_lm():
    """Dilations 1, 2, 4 with 3 taps: R = 15, so the prompts and beams of 6 new tokens run past the receptive field."""
    config = attnkit.ModelConfig(family="conv-lm", vocab_size=13, d_model=16, n_layers=3, kernel_size=3,
                                 dilation_base=2, max_seq_len=24)
    torch.manual_seed(3)
    return randomised(attnkit.build_model(config)), config


MODELS = {  # the caches whose rows follow the beams: a KV cache, a sliding window's ring buffer, a recurrent state,
    # a convolutional LM's per-block queues of past inputs
    "rope": lambda: tiny_model("decoder", position="rope", seed=3),
    "sliding-window": lambda: tiny_model("decoder", position="rope", seed=3, attention_window=3),
    "recurrent-lm": _recurrent_lm,
    "conv-lm": _conv_lm,
}


@pytest.mark.parametrize(("repetition_penalty", "no_repeat_ngram_size"), [(1.5, 0), (1.0, 2), (1.3, 3)])
def test_repetition_penalty_and_ngram_blocking_act_on_the_beams_as_in_transformers(converted, repetition_penalty,
                                                                                  no_repeat_ngram_size):
    """transformers' beam search applies both to each beam's log-probabilities, over its prompt and tokens."""
    reference, model, stops = converted
    stops = stops[1:]  # the second likeliest alone: longer texts, where repeats are more to be had
    plain = beam_generate(model, PROMPTS, max_new_tokens=8, context_len=64, num_beams=3, num_return_sequences=3,
                          stop_ids=stops)
    for early in (True, False):
        search = dict(max_new_tokens=8, num_beams=3, num_return_sequences=3, early_stopping=early,
                      repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        ours = beam_generate(model, PROMPTS, context_len=64, stop_ids=stops, **search)
        assert ours == _reference(reference, stops, **search)
    assert ours != plain


@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(temperature=1.3, top_k=8, top_p=0.9),
                                      dict(min_p=0.05, repetition_penalty=1.3)], ids=["t", "t-top-k-top-p", "min-p"])
def test_beam_sampling_draws_what_transformers_beam_sampling_draws_under_the_same_seed(converted, settings):
    """transformers' generate(num_beams=K, do_sample=True): the warped log-probabilities, candidates drawn without
    replacement from the softmax of their summed scores (torch.multinomial's own draw, so a generator seeded s draws
    what the global generator seeded s draws), ranked by score: the same texts under the same seed."""
    reference, model, stops = converted
    stops = stops[1:]
    penalty = settings.pop("repetition_penalty", 1.0)
    search = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, early_stopping=False)
    found = set()
    for seed in range(3):
        ours = beam_generate(model, PROMPTS, context_len=64, stop_ids=stops, sample=SamplingConfig(**settings),
                             generator=torch.Generator().manual_seed(seed), repetition_penalty=penalty, **search)
        torch.manual_seed(seed)
        theirs = _reference(reference, stops, do_sample=True, top_k=settings.get("top_k", 0),
                            repetition_penalty=penalty, **{k: v for k, v in settings.items() if k != "top_k"},
                            **search)
        assert ours == theirs, seed
        found.add(str(ours))
    assert len(found) > 1  # the seeds draw different beams: the draw is compared, not a deterministic search


@torch.no_grad()
def _beam_search_by_whole_passes(model, prompt, *, k, stop, max_new_tokens, length_penalty, early_stopping):
    """Beam search as the module docstring of generate/beam.py states it, each beam's next-token log-probabilities
    recomputed by a whole forward pass over its prompt and tokens (no cache, no batch, no padding)."""
    live, finished = [(0.0, [])], []  # (summed log p, tokens); (normalised score, tokens)
    for length in range(1, max_new_tokens + 1):
        candidates = []
        for score, tokens in live:
            logprobs = model(torch.tensor([prompt + tokens])).logits[0, -1].log_softmax(-1).tolist()  # (V,)
            candidates += [(score + p, [*tokens, v]) for v, p in enumerate(logprobs)]
        candidates = sorted(candidates, key=lambda c: -c[0])[:2 * k]
        live = []
        for rank, (score, tokens) in enumerate(candidates):
            ends = tokens[-1] == stop
            if rank < k and (ends or length == max_new_tokens):
                finished.append((score / length ** length_penalty, tokens[:-1] if ends else tokens))
            elif not ends and len(live) < k:
                live.append((score, tokens))
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        if len(finished) == k and (early_stopping or live[0][0] / length ** length_penalty <= finished[-1][0]):
            break
    return [tokens for _, tokens in finished]


@pytest.mark.parametrize("kind", MODELS)
def test_the_cached_batched_search_is_the_search_by_whole_passes_and_one_beam_is_greedy(kind):
    """The cache's rows (a KV cache, a sliding window's ring, a recurrent state) follow the beams, and left padding
    changes nothing: a batch of three prompts finds what beam search by whole passes finds for each prompt alone."""
    model, config = MODELS[kind]()
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    greedy = generate_tokens(model, prompts, max_new_tokens=6, context_len=config.max_seq_len, stop_ids=[0])
    assert beam_generate(model, prompts, max_new_tokens=6, context_len=config.max_seq_len, num_beams=1,
                         stop_ids=[0]) == greedy
    for early_stopping, penalty in ((True, 1.0), (False, 0.5)):
        batched = beam_generate(model, prompts, max_new_tokens=6, context_len=config.max_seq_len, num_beams=3,
                                num_return_sequences=3, stop_ids=[0], early_stopping=early_stopping,
                                length_penalty=penalty)
        assert batched == [row for prompt in prompts for row in _beam_search_by_whole_passes(
            model, prompt, k=3, stop=0, max_new_tokens=6, length_penalty=penalty, early_stopping=early_stopping)]
        assert batched[::3] != greedy  # beams find other texts than greedy here


def _exhaustive_best(model, prompt, *, vocab, stop, max_new_tokens, length_penalty):
    """Score every continuation of up to max_new_tokens tokens (ended by `stop`, or cut at the limit) by summed
    log-probabilities over the new tokens / their count ** length_penalty, through whole forward passes."""
    best, best_score = None, -math.inf
    for length in range(1, max_new_tokens + 1):
        for tokens in itertools.product(range(vocab), repeat=length):
            if stop in tokens[:-1] or (length < max_new_tokens and tokens[-1] != stop):
                continue
            ids = torch.tensor([prompt + list(tokens)])
            with torch.no_grad():
                logprobs = model(ids).logits[0].log_softmax(-1)  # (T, V)
            total = sum(float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens))
            score = total / length ** length_penalty
            if score > best_score:
                best, best_score = [t for t in tokens if t != stop], score
    return best


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 3.0])
def test_a_beam_as_wide_as_the_vocabulary_finds_the_exhaustive_best(kind, length_penalty):
    """Vocabulary 13, at most 2 new tokens: a beam of 13 keeps every first token, so it must find the best. The stop
    token is each prompt's second likeliest first token, so that texts ending at it compete with those cut at the
    limit."""
    model, config = MODELS[kind]()
    for prompt in ([3, 4, 5, 6], [7]):
        with torch.no_grad():
            stop = int(model(torch.tensor([prompt])).logits[0, -1].topk(2).indices[1])
        found = beam_generate(model, [prompt], max_new_tokens=2, context_len=config.max_seq_len, num_beams=13,
                              length_penalty=length_penalty, stop_ids=[stop], early_stopping=False)
        best = _exhaustive_best(model, prompt, vocab=config.vocab_size, stop=stop, max_new_tokens=2,
                                length_penalty=length_penalty)
        assert found == [best]


def test_bad_searches_are_refused_naming_the_setting():
    model, config = tiny_model("decoder", position="rope")
    search = dict(context_len=config.max_seq_len, stop_ids=[0])
    with pytest.raises(InputError, match=r"num_return_sequences=3 must be an integer from 1 to num_beams=2"):
        beam_generate(model, [[1, 2]], max_new_tokens=3, num_beams=2, num_return_sequences=3, **search)
    with pytest.raises(InputError, match=r"num_beams=0 must be a positive integer"):
        beam_generate(model, [[1, 2]], max_new_tokens=3, num_beams=0, **search)
    with pytest.raises(InputError, match=r"give max_new_tokens <= 20, or shorten the prompt"):
        beam_generate(model, [[1, 2, 3, 4, 5]], max_new_tokens=21, num_beams=2, **search)
    assert len(beam_generate(model, [[1, 2, 3, 4, 5]], max_new_tokens=20, num_beams=2, **search)[0]) <= 20
    with pytest.raises(InputError, match=r"prompt 1 is empty"):
        beam_generate(model, [[1], []], max_new_tokens=3, num_beams=2, **search)


def test_stop_ids_outside_the_vocabulary_hold_back_no_token_in_any_loop():
    """A stop id outside [0, V) names no token: while min_new_tokens holds the stop tokens back, it holds back
    nothing (index_fill would wrap -1 onto token V - 1, and -V - 1 is out of range), in beam search as in greedy
    decoding; both build the held-back ids in one place (`sampling.held_back_ids`)."""
    model, config = tiny_model("decoder", position="rope", seed=5)
    vocab, prompts = config.vocab_size, [[3, 4, 5], [6]]
    outside = [*range(-vocab - 1, 0), vocab, vocab + 7]  # every negative id wraps onto a real token but -V - 1
    search = dict(max_new_tokens=3, min_new_tokens=3, context_len=config.max_seq_len)
    beams = dict(num_beams=3, num_return_sequences=3, **search)
    assert beam_generate(model, prompts, stop_ids=outside, **beams) == beam_generate(model, prompts, **beams)
    assert generate_tokens(model, prompts, stop_ids=outside, **search) == generate_tokens(model, prompts, **search)


def test_beam_generate_refuses_bad_input_naming_it():
    """A context beyond a learned position table, stop ids that are no ids, and a tensor of prompts: InputError, as
    generate_tokens gives, not an IndexError or a TypeError from deep inside."""
    model, config = tiny_model("decoder", position="learned", seed=5)  # 24 learned positions
    search = dict(max_new_tokens=4, num_beams=2)
    with pytest.raises(InputError, match=r"context_len=40 is beyond the 24 positions of the model's learned"):
        beam_generate(model, [[1] * 22], context_len=40, **search)
    for stop_ids, message in ((None, r"stop_ids are token ids .*got None"), (["a"], r"stop_ids: 'a' is no token id"),
                              ("ab", r"stop_ids are token ids .*got 'ab'")):
        with pytest.raises(InputError, match=message):
            beam_generate(model, [[3, 4]], context_len=24, stop_ids=stop_ids, **search)
        with pytest.raises(InputError, match=message):
            generate_tokens(model, [[3, 4]], context_len=24, max_new_tokens=4, stop_ids=stop_ids)
    with pytest.raises(InputError, match=r"prompts are lists of token ids.* got a Tensor: pass ids.tolist\(\)"):
        beam_generate(model, torch.tensor([[3, 4, 5]]), context_len=24, **search)
    for token in (4.5, "4", None, True):  # rounded, parsed, a TypeError, read as 1
        with pytest.raises(InputError, match=rf"prompt 1 holds {re.escape(repr(token))}, no token id"):
            beam_generate(model, [[3], [3, token]], context_len=24, **search)
        with pytest.raises(InputError, match=rf"prompt 1 holds {re.escape(repr(token))}, no token id"):
            generate_tokens(model, [[3], [3, token]], context_len=24, max_new_tokens=4)
    assert beam_generate(model, [[np.int64(3), 4]], context_len=24, **search) == beam_generate(
        model, [[3, 4]], context_len=24, **search)  # numpy's integers are ids


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    """(transformers' tiny GPT-2, the run `attnkit convert` makes of it, with a word-level tokenizer: w4 .. w98)."""
    interop_models = pytest.importorskip("interop_models")
    from attnkit.interop.hf import convert_from_hf

    directory = tmp_path_factory.mktemp("gpt2-hf")
    reference = interop_models.hf_model("gpt2", directory)
    interop_models.word_tokenizer(directory)
    run = tmp_path_factory.mktemp("gpt2-run") / "run"
    convert_from_hf(directory, run)
    return reference, run


def _words(ids):
    return " ".join(f"w{i}" for i in ids)


def test_pipeline_generate_with_beams_is_transformers_beam_search_in_text(gpt2_run):
    """Pipeline.generate(num_beams=...) on two prompts of different lengths gives the text of transformers' beams,
    n per prompt, best first; the tokenizer's EOS and the stop tokens end a text, as transformers' eos list does."""
    reference, run = gpt2_run
    pipeline = attnkit.load(run, device="cpu")
    stops = [44]  # a token greedy decoding writes often (see `converted`)
    search = dict(max_new_tokens=NEW_TOKENS, num_beams=3, num_return_sequences=2, length_penalty=0.5,
                  early_stopping=True, min_new_tokens=1)
    texts = pipeline.generate([_words(p) for p in PROMPTS], stop_tokens=stops, **search)
    expected = _reference(reference, sorted({*stops, *pipeline.end_ids}), **search)
    assert texts == [pipeline.tokenizer.decode(row) for row in expected]
    assert len(set(texts)) == 4 and {len(row) for row in expected} > {1, NEW_TOKENS}  # ended, and cut at the limit


def test_pipeline_refuses_what_beam_search_does_not_take_in_one_line_naming_them(gpt2_run, monkeypatch):
    _, run = gpt2_run
    pipeline = attnkit.load(run, device="cpu")
    with pytest.raises(InputError, match=r"^num_beams=2 \(beam search\) does not take top_k, stop, on_text: [^\n]*$"):
        pipeline.generate("w5 w6", num_beams=2, top_k=5, stop=["w7"], on_text=lambda *_: None)
    with pytest.raises(InputError, match=r"does not take presence_penalty, logit_bias: "):
        pipeline.generate("w5 w6", num_beams=2, presence_penalty=0.5, logit_bias={5: 1.0}, repetition_penalty=1.2,
                          no_repeat_ngram_size=2)
    with pytest.raises(SamplingError, match=r"no_repeat_ngram_size=-1 must be an integer >= 0"):
        pipeline.generate("w5 w6", num_beams=2, no_repeat_ngram_size=-1)
    with pytest.raises(InputError, match=r"num_beams=3 \(beam search\) does not take temperature, num_samples, "
                                         r"json_schema"):
        pipeline.generate("w5 w6", num_beams=3, temperature=0.7, num_samples=2, json_schema={"type": "object"})
    with pytest.raises(InputError, match=r"num_return_sequences=3 must be an integer from 1 to num_beams=2"):
        pipeline.generate("w5 w6", num_beams=2, num_return_sequences=3)
    with pytest.raises(InputError, match=r"num_return_sequences=2 .* to num_beams=1 .* give num_samples=2 instead"):
        pipeline.generate("w5 w6", num_return_sequences=2)
    for search, message in ((dict(num_beams=True), "num_beams=True must be a positive integer"),  # not 1: sampling
                            (dict(num_beams=2, num_return_sequences=True), "num_return_sequences=True must be an")):
        with pytest.raises(InputError, match=message):
            pipeline.generate("w5 w6", max_new_tokens=3, **search)
    for search in (dict(num_beams=10**6), dict(num_beams=2, early_stopping="never")):  # a decoder's words
        with pytest.raises(InputError, match=r"wider than the vocabulary \(|a prompt ends with") as refused:
            pipeline.generate("w5 w6", **search)
        assert "target" not in str(refused.value) and "source" not in str(refused.value)
    monkeypatch.setattr("attnkit.generate.pipeline.free_bytes", lambda device: 1000)
    with pytest.raises(InputError, match=r"8 hypotheses \(--num-beams x the prompts\) need at least .* choose a "
                                         r"smaller --num-beams"):
        pipeline.generate(["w5", "w6"], num_beams=4, max_new_tokens=3)


def test_pipeline_refuses_each_option_of_the_table_beside_beams_naming_it(gpt2_run):
    """Every option of NOT_BESIDE_BEAMS but the command line's own is an argument of Pipeline.generate, and set
    beside num_beams=2 it is refused by name: a new entry of the table needs a value here, and one the API does not
    read fails, rather than being let through beside beams."""
    import inspect

    from attnkit.generate import Pipeline
    from attnkit.generate.constrained import Grammar
    from attnkit.run_settings import CLI_ONLY_BESIDE_BEAMS, NOT_BESIDE_BEAMS

    _, run = gpt2_run
    pipeline = attnkit.load(run, device="cpu")
    set_values = dict(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, presence_penalty=0.5, frequency_penalty=0.5,
                      logit_bias={5: 1.0}, num_samples=2, stop=["w7"], on_text=lambda *_: None,
                      json_schema={"type": "object"}, regex="w5( w6)*", lark='start: "w5"', grammar=Grammar.regex("w5"))
    assert set(set_values) == set(NOT_BESIDE_BEAMS) - CLI_ONLY_BESIDE_BEAMS
    assert not CLI_ONLY_BESIDE_BEAMS & set(inspect.signature(Pipeline.generate).parameters)
    for name, value in set_values.items():
        with pytest.raises(InputError, match=rf"^num_beams=2 \(beam search\) does not take {name}: "):
            pipeline.generate("w5 w6", max_new_tokens=3, num_beams=2, **{name: value})


def test_beam_settings_without_beams_are_ignored_with_one_warning_naming_them(gpt2_run, caplog):
    """length_penalty and early_stopping steer beam search alone: given with one beam, through the API or the command
    line, one warning line names them and num_beams (--num-beams), as transformers warns; the text is greedy's."""
    from attnkit import cli

    _, run = gpt2_run
    pipeline = attnkit.load(run, device="cpu")
    greedy = dict(max_new_tokens=3, temperature=0)
    caplog.set_level(logging.WARNING, logger="attnkit.generate.pipeline")
    plain = pipeline.generate("w5 w6", **greedy)
    assert not caplog.records  # defaults given or not, nothing to say
    assert pipeline.generate("w5 w6", num_beams=1, early_stopping=False, length_penalty=1, **greedy) == plain
    assert not caplog.records
    assert pipeline.generate("w5 w6", length_penalty=2.0, early_stopping=True, **greedy) == plain
    [record] = caplog.records
    assert "\n" not in record.getMessage()
    assert re.search(r"num_beams=1 \(--num-beams\) runs no beam search: length_penalty=2.0 \(--length-penalty\), "
                     r"early_stopping=True \(--early-stopping\);", record.getMessage())
    caplog.clear()
    assert cli.main(["generate", str(run), "--prompt", "w5 w6", "--max-new-tokens", "3", "--temperature", "0",
                     "--device", "cpu", "--length-penalty", "2"]) == 0
    [record] = caplog.records
    message = record.getMessage()
    assert "length_penalty=2.0 (--length-penalty)" in message and "early_stopping" not in message
    assert "(--num-beams K)" in message


def test_cli_generate_takes_the_beam_flags_and_refuses_the_others_before_loading(gpt2_run, capsys, caplog,
                                                                                      monkeypatch):
    from attnkit import cli
    from attnkit.generate import Pipeline

    _, run = gpt2_run
    common = ["generate", str(run), "--prompt", "w5 w17 w33", "--max-new-tokens", "6", "--device", "cpu"]
    seen = []
    generate = Pipeline.generate
    monkeypatch.setattr(Pipeline, "generate", lambda self, prompts, **kw: seen.append(kw) or generate(self, prompts,
                                                                                                      **kw))
    assert cli.main([*common, "--num-beams", "3", "--num-return-sequences", "2", "--length-penalty", "2",
                     "--early-stopping"]) == 0
    assert {key: seen[-1][key] for key in ("num_beams", "num_return_sequences", "length_penalty", "early_stopping")} \
        == dict(num_beams=3, num_return_sequences=2, length_penalty=2.0, early_stopping=True)
    texts = attnkit.load(run, device="cpu").generate("w5 w17 w33", max_new_tokens=6, num_beams=3,
                                                     num_return_sequences=2, length_penalty=2.0, early_stopping=True)
    assert capsys.readouterr().out == "".join(f"--- sequence {i + 1} ---\nw5 w17 w33{t}\n" for i, t in enumerate(texts))
    assert cli.main([*common, "--num-beams", "2", "--no-early-stopping"]) == 0
    assert seen[-1]["early_stopping"] is False and seen[-1]["on_text"] is None  # beams' texts are printed whole
    assert capsys.readouterr().out.count("\n") == 1
    missing = ["generate", str(run.parent / "nowhere"), "--prompt", "w5", "--num-beams", "4"]
    assert cli.main([*missing, "--top-p", "0.9", "--num-samples", "2", "--regex", "w5"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("attnkit: error: --num-beams 4 (beam search) does not take --top-p, --num-samples, "
                            "--regex:") and "\n" not in error
    for flags, message in ((["--num-beams", "0"], "--num-beams 0 must be a positive integer"),  # before loading
                           (["--num-return-sequences", "2"], "--num-return-sequences 2 must be an integer from 1 to "
                            "--num-beams 1 (a search keeps --num-beams hypotheses): give a smaller number or a wider "
                            "beam; for 2 sampled texts of the prompt, give --num-samples 2 instead"),
                           (["--num-beams", "2", "--length-penalty", "nan"], "--length-penalty nan must be a finite")):
        assert cli.main([*missing[:4], *flags]) == 2
        assert capsys.readouterr().err.strip().startswith(f"attnkit: error: {message}")  # named as flags, not loaded
    caplog.set_level(logging.WARNING, logger="attnkit.tasks.lm")
    assert cli.main([*common, "--num-beams", "2", "--compile"]) == 0  # the plan names a step the search never runs
    assert "--compile default: beam search decodes eagerly" in caplog.text
    caplog.clear()
    assert cli.main([*common, "--num-beams", "2"]) == 0 and "--compile" not in caplog.text
    capsys.readouterr()  # the two runs' texts
    assert cli.main([*common, "--num-beams", "2", "--max-new-tokens", "100"]) == 2  # the tiny GPT-2's 64 positions
    assert capsys.readouterr().err.strip().endswith("the longest prompt (length 3) and --max-new-tokens 100 outgrow "
                                                    "the model's context of 64 (max_seq_len): give --max-new-tokens 62 "
                                                    "or fewer, or shorten the prompt")
    long_prompt = ["generate", str(run), "--prompt", "w5 " * 70, "--num-beams", "2", "--device", "cpu"]
    assert cli.main(long_prompt) == 2  # no count of new tokens fits: the prompt is what to shorten
    assert capsys.readouterr().err.strip().endswith("the longest prompt (length 70) and --max-new-tokens 200 outgrow "
                                                    "the model's context of 64 (max_seq_len): shorten the prompt to "
                                                    "64 tokens or fewer")


def test_the_flags_refused_beside_beams_are_looked_up_strictly(monkeypatch):
    """Every option beam search refuses is a flag of attnkit generate, or one the Python API alone takes: a flag
    renamed without the table is an error, not an option let through beside beams."""
    from dataclasses import fields

    from attnkit.run_settings import API_ONLY_BESIDE_BEAMS, NOT_BESIDE_BEAMS
    from attnkit.tasks.lm import GenerateSettings, check_beam_flags

    flags = {f.name for f in fields(GenerateSettings)}
    assert set(NOT_BESIDE_BEAMS) - API_ONLY_BESIDE_BEAMS <= flags and not API_ONLY_BESIDE_BEAMS & flags
    settings = GenerateSettings(run="run", prompt="w5", num_beams=2, top_k=4)
    with pytest.raises(InputError, match=r"--num-beams 2 \(beam search\) does not take --top-k:"):
        check_beam_flags(settings)
    monkeypatch.setitem(NOT_BESIDE_BEAMS, "top_n", lambda value: value is not None)  # a flag the settings lack
    with pytest.raises(AttributeError, match="top_n"):
        check_beam_flags(settings)


def test_a_pipelines_beam_search_decodes_through_the_one_eager_decoding_it_keeps(gpt2_run, monkeypatch):
    """Beam search reads the model's position limit once per pipeline (its EagerDecoding), not once per call; a
    compiled pipeline keeps an eager one beside its compiled step; a decoding of another model is refused."""
    _, run = gpt2_run
    pipeline = attnkit.load(run, device="cpu")
    first = pipeline.generate("w5 w6", num_beams=2, max_new_tokens=4)

    def no_new_decoding(*_, **__):
        raise AssertionError("an EagerDecoding was built for one call")

    monkeypatch.setattr(EagerDecoding, "__init__", no_new_decoding)
    assert pipeline.generate("w5 w6", num_beams=2, max_new_tokens=4) == first
    monkeypatch.undo()
    model, _ = tiny_model(position="rope")
    with pytest.raises(InputError, match="beam search decodes eagerly: give decoding=EagerDecoding"):
        beam_generate(model, [[1, 2]], max_new_tokens=3, context_len=24, num_beams=2,
                      decoding=EagerDecoding(pipeline.model))


def test_pipeline_and_command_sample_the_beams_as_transformers_does(gpt2_run, capsys, caplog):
    """generate(num_beams=K, do_sample=True, seed=s) writes the text of transformers' beam sampling after
    torch.manual_seed(s); the command takes --do-sample with the sampling flags it then allows."""
    from attnkit import cli

    reference, run = gpt2_run
    pipeline = attnkit.load(run, device="cpu")
    search = dict(max_new_tokens=NEW_TOKENS, num_beams=3, num_return_sequences=2, temperature=0.8, top_k=10)
    texts = pipeline.generate([_words(p) for p in PROMPTS], do_sample=True, seed=4, **search)
    torch.manual_seed(4)
    expected = _reference(reference, sorted(pipeline.end_ids), do_sample=True, **search)
    assert texts == [pipeline.tokenizer.decode(row) for row in expected]
    assert texts != pipeline.generate([_words(p) for p in PROMPTS], do_sample=True, seed=5, **search)
    with pytest.raises(InputError, match="do_sample=True samples the beams, but temperature=0 is greedy"):
        pipeline.generate("w5", num_beams=2, do_sample=True, temperature=0)
    with caplog.at_level(logging.WARNING):
        pipeline.generate("w5", do_sample=True, max_new_tokens=2, seed=0)
    assert "ignored, as num_beams=1 (--num-beams) runs no beam search: do_sample=True" in caplog.text
    argv = ["generate", "--run", str(run), "--prompt", _words(PROMPTS[0]), "--max-new-tokens", str(NEW_TOKENS),
            "--num-beams", "3", "--temperature", "0.8", "--top-k", "10", "--seed", "4", "--no-echo"]
    capsys.readouterr()
    assert cli.main([*argv, "--do-sample"]) == 0
    sampled = pipeline.generate(_words(PROMPTS[0]), do_sample=True, seed=4, **search | {"num_return_sequences": 1})
    assert capsys.readouterr().out == sampled[0] + "\n"
    assert cli.main(argv) != 0  # without --do-sample, beam search takes no sampling flags
    assert "--num-beams 3 (beam search) does not take --temperature, --top-k" in capsys.readouterr().err


@pytest.mark.parametrize(("n_kv_heads", "dtype"), [(1, torch.bfloat16), (4, torch.float32)])
def test_pipeline_counts_a_beam_searchs_cache_as_allocated(monkeypatch, n_kv_heads, dtype):
    """The memory check before a beam search counts a decoder's cache as `allocate_cache` makes it: Hkv heads of
    head_dim in the model's dtype (an MQA bf16 model's is an eighth of an MHA fp32 one's), plus three rows of fp32
    scores per hypothesis; refused one byte short of that, searched with exactly that free."""
    from attnkit.config import ModelConfig
    from attnkit.generate import Pipeline
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefgh")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4,
                         n_kv_heads=n_kv_heads, n_layers=2, d_ff=64, max_seq_len=32)
    pipeline = Pipeline(attnkit.build_model(config).to(dtype).eval(), config, tokenizer)
    prompts, beams, new = ["abc", "de"], 3, 4
    rows, positions = beams * len(prompts), len("abc") + new
    element = torch.empty((), dtype=dtype).element_size()
    need = rows * (2 * config.n_layers * n_kv_heads * (32 // 4) * element * positions + 3 * config.vocab_size * 4)
    monkeypatch.setattr("attnkit.generate.pipeline.free_bytes", lambda device: need - 1)
    with pytest.raises(InputError, match=r"^6 hypotheses \(--num-beams x the prompts\) need at least "):
        pipeline.generate(prompts, num_beams=beams, max_new_tokens=new, add_bos=False)
    monkeypatch.setattr("attnkit.generate.pipeline.free_bytes", lambda device: need)
    assert len(pipeline.generate(prompts, num_beams=beams, max_new_tokens=new, add_bos=False)) == len(prompts)
