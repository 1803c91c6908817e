"""`attnkit.load` and the `generate`, `translate`, `classify` commands, on tiny runs saved in tmp_path."""

import io
import json
import logging
import re
import shutil
from functools import partial

import pytest
import torch
from generate_models import tiny_model  # noqa: F401

import attnkit
from attnkit import cli
from attnkit.checkpoint import save_model
from attnkit.errors import AttnkitError, CheckpointError, ConfigError, InputError
from attnkit.generate import Pipeline, StaticDecoding, generate_tokens, greedy_translate, native_gemv
from attnkit.generate.decode_layout import NativeLinear, PackedLinear, TransposedLinear
from attnkit.generate.pipeline import TextTracker
from attnkit.generate.quantize import NativeInt8Linear, dynamic_quantization_available
from attnkit.generate.sampling import SamplingConfig
from attnkit.machine import CpuCapabilities
from attnkit.run_settings import text_list
from attnkit.tokenize import CharTokenizer, train_bpe

ALPHABET = "abcdefgh \n"


def _save_run(path, family, **overrides):
    tokenizer = CharTokenizer(ALPHABET)
    model, config = tiny_model(family, vocab_size=tokenizer.vocab_size, **overrides)
    save_model(model, config, path)
    tokenizer.save(path / "tokenizer")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    lm = _save_run(root / "lm", "decoder", position="rope", seed=1)
    mt = _save_run(root / "mt", "encoder-decoder", position="sinusoidal", seed=2)
    clf = _save_run(root / "clf", "encoder", n_classes=3, seed=3)
    (clf / "labels.json").write_text(json.dumps({"labels": ["neg", "neutral", "pos"]}))
    return {"lm": lm, "mt": mt, "clf": clf}


@pytest.fixture(scope="module")
def lm(runs):
    return attnkit.load(runs["lm"], device="cpu")


def test_load_gives_the_model_tokenizer_and_config(runs, lm):
    assert isinstance(lm, Pipeline) and lm.family == "decoder"
    assert lm.device.type == "cpu" and lm.dtype == torch.float32
    assert lm.tokenizer.vocab_size == lm.config.vocab_size
    assert attnkit.load(runs["lm"], device="cpu", dtype="bf16").dtype == torch.bfloat16
    with pytest.raises(InputError, match="unknown dtype 'fp8'"):
        attnkit.load(runs["lm"], dtype="fp8")


def test_greedy_text_is_the_decoded_greedy_tokens(lm):
    prompt = "abc d"
    text = lm.generate(prompt, max_new_tokens=12, temperature=0, stop_at_eos=False)[0]
    ids = generate_tokens(lm.model, [lm.tokenizer.encode(prompt)], max_new_tokens=12, context_len=24)[0]
    assert text == lm.tokenizer.decode(ids)


def test_samples_per_prompt_and_seeds(lm):
    prompts = ["ab", "hhh g"]
    first = lm.generate(prompts, max_new_tokens=10, num_samples=3, seed=5, stop_at_eos=False)
    assert len(first) == 6
    assert first == lm.generate(prompts, max_new_tokens=10, num_samples=3, seed=5, stop_at_eos=False)
    assert len(set(first[:3])) > 1  # three samples of one prompt are not all alike
    assert first != lm.generate(prompts, max_new_tokens=10, num_samples=3, seed=6, stop_at_eos=False)
    for i in range(3):  # sample i of each prompt is that prompt alone seeded seed + i, as vLLM seeds a request's
        assert [first[i], first[3 + i]] == [lm.generate(p, max_new_tokens=10, seed=5 + i, stop_at_eos=False)[0]
                                            for p in prompts]


def test_a_seeded_prompt_samples_the_same_text_whatever_else_is_in_its_batch(lm):
    """One sample per prompt: each prompt draws from its own generator seeded `seed`, as with several samples."""
    prompts = ["ab", "hhh g", "c"]
    batched = lm.generate(prompts, max_new_tokens=12, seed=7, stop_at_eos=False)
    assert batched == [lm.generate(p, max_new_tokens=12, seed=7, stop_at_eos=False)[0] for p in prompts]


def test_stop_strings_end_the_text_and_streaming_never_shows_them(lm):
    free = lm.generate("abc", max_new_tokens=20, temperature=0, stop_at_eos=False)[0]
    assert len(free) >= 10
    stop = free[4:6]
    pieces = []
    text = lm.generate(
        "abc", max_new_tokens=20, temperature=0, stop=[stop, "zz"], stop_at_eos=False,
        on_text=lambda row, piece: pieces.append(piece),
    )[0]
    assert text == free[: free.find(stop)]
    assert "".join(pieces) == text


def test_stop_tokens_given_as_a_generator_stop_as_a_list_does(lm):
    free = lm.generate("abc", max_new_tokens=20, temperature=0, stop_at_eos=False)[0]
    stop_id = lm.tokenizer.encode(free[5])[0]  # the sixth character's token
    as_list = lm.generate("abc", max_new_tokens=20, temperature=0, stop_at_eos=False, stop_tokens=[stop_id])[0]
    once = lm.generate("abc", max_new_tokens=20, temperature=0, stop_at_eos=False,
                       stop_tokens=(token for token in [stop_id]))[0]
    assert once == as_list == free[: free.index(free[5])]


def test_streamed_pieces_add_up_to_each_text(lm):
    pieces = {0: [], 1: []}
    texts = lm.generate(
        ["a", "bb"], max_new_tokens=8, seed=0, on_text=lambda row, piece: pieces[row].append(piece)
    )
    assert ["".join(pieces[0]), "".join(pieces[1])] == texts


def test_streaming_a_byte_level_bpe_never_shows_half_a_character():
    """Each character below spans several byte tokens (no merges learned): a piece ends only at whole characters,
    and text that could start the stop string waits until it cannot."""
    tokenizer = train_bpe(["中文 😀 한국어"], vocab_size=263)  # 256 bytes and 7 special tokens: no merge
    text = "a中😀b한"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode())
    pieces = []
    tracker = TextTracker(tokenizer, 1, ["b한x"], lambda row, piece: pieces.append(piece))
    for token in ids:
        assert not tracker.push(0, token)
        assert "\ufffd" not in "".join(pieces) and text.startswith("".join(pieces))
    assert tracker.finish() == [text] and "".join(pieces) == text


class _NoBosTokenizer:
    """A tokenizer with no BOS token: one id per letter of ALPHABET, then EOS and padding."""

    bos_id, eos_id, pad_id, cls_id, sep_id = None, len(ALPHABET), len(ALPHABET) + 1, None, None
    vocab_size = len(ALPHABET) + 2

    def encode(self, text):
        return [ALPHABET.index(c) for c in text]

    def decode(self, ids):
        return "".join(ALPHABET[i] for i in ids if i < len(ALPHABET))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_vocabulary_padded_past_the_tokenizers_never_writes_the_ids_that_name_no_text(tmp_path, temperature):
    """A model of 40 ids over a char tokenizer of 17 (padded as Qwen's or nanoGPT's), its padding ids made the
    likeliest: generation chose them and failed ('token id 39 is outside the char vocabulary'; a Hugging Face
    tokenizer drops them without a word). They are never chosen now, and the ids below keep their order."""
    tokenizer = CharTokenizer(ALPHABET)
    model, config = tiny_model("decoder", vocab_size=40, seed=5)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.vocab_size:] *= 50
    save_model(model, config, tmp_path)
    tokenizer.save(tmp_path / "tokenizer")
    lm = attnkit.load(tmp_path, device="cpu")
    prompt = tokenizer.encode("abc")
    assert max(generate_tokens(lm.model, [prompt], max_new_tokens=8, context_len=24)[0]) >= tokenizer.vocab_size
    text = lm.generate("abc", max_new_tokens=8, temperature=temperature, seed=0, stop_at_eos=False)[0]
    if temperature == 0.0:  # greedy among the tokenizer's ids: the model's own greedy choice within them
        written = generate_tokens(lm.model, [prompt], max_new_tokens=8, context_len=24,
                                  writable=tokenizer.vocab_size)[0]
        assert max(written) < tokenizer.vocab_size
        assert text == tokenizer.decode(written)


def test_empty_prompt_starts_from_bos_and_fails_clearly_without_one(lm):
    text = lm.generate("", max_new_tokens=5, temperature=0, stop_at_eos=False)[0]
    ids = generate_tokens(lm.model, [[lm.tokenizer.bos_id]], max_new_tokens=5, context_len=24)[0]
    assert text == lm.tokenizer.decode(ids)
    no_bos = Pipeline(lm.model, lm.config, _NoBosTokenizer())
    assert isinstance(no_bos.generate("ab", max_new_tokens=3, seed=0)[0], str)
    with pytest.raises(InputError, match="prompt 1 is empty and the tokenizer has no BOS"):
        no_bos.generate(["ab", ""], max_new_tokens=3)


def test_a_prompt_the_tokenizer_drops_whole_is_refused_not_replaced_by_bos(lm):
    skipping = CharTokenizer(ALPHABET, unknown="skip")  # characters outside its alphabet are dropped
    pipeline = Pipeline(lm.model, lm.config, skipping)
    assert pipeline.generate("ab", max_new_tokens=3, temperature=0) == lm.generate("ab", max_new_tokens=3,
                                                                                    temperature=0)
    with pytest.raises(InputError, match="prompt 1 .'XYZ'. has no token: the tokenizer drops every character"):
        pipeline.generate(["ab", "XYZ"], max_new_tokens=3)


@pytest.mark.parametrize("run", ["clf", "mt"])
def test_a_text_the_tokenizer_drops_whole_is_refused_not_read_as_its_marks(runs, run):
    """A text whose every character the tokenizer skips was classified as CLS SEP, and translated from EOS alone."""
    loaded = attnkit.load(runs[run], device="cpu")
    pipeline = Pipeline(loaded.model, loaded.config, CharTokenizer(ALPHABET, unknown="skip"), labels=loaded.labels,
                        task=loaded.task)
    read = pipeline.classify if run == "clf" else partial(pipeline.translate, max_length=5)
    assert len(read(["ab"])) == 1
    with pytest.raises(InputError, match="text 1 .'XYZ'. has no token: the tokenizer drops every character"):
        read(["ab", "XYZ"])


@pytest.mark.parametrize(
    "settings, error, message",
    [
        (dict(top_p=0.0), ConfigError, "top_p"),
        (dict(top_p=1.01), ConfigError, "top_p"),
        (dict(temperature=-1.0), ConfigError, "temperature"),
        (dict(num_samples=0), InputError, "num_samples"),
        (dict(stop=[""]), InputError, "stop string is empty"),
        (dict(max_new_tokens=-3), InputError, "max_new_tokens"),
        (dict(seed="x"), ConfigError, "seed='x' must be an integer"),  # not torch's TypeError
        (dict(seed=10**29), ConfigError, "seed=10+ lies outside 0 to 2\\*\\*64 - 1"),
        (dict(temperature=1e-300), ConfigError, "temperature=1e-300 is below"),
    ],
)
def test_bad_generation_arguments_are_clear_errors(lm, settings, error, message):
    with pytest.raises(error, match=message):
        lm.generate("ab", **settings)


@pytest.mark.parametrize(("prompts", "settings", "message"), [
    (123, {}, r"prompts are a string or a list of strings; got 123 \(int\)"),
    (b"ab", {}, "prompts are a string or a list of strings; got b'ab'"),
    ([], {}, "no prompts given: pass a string or a list of strings"),  # not "token ids": this call takes text
    (["ab", [1, 2]], {}, r"item 1 is \[1, 2\] \(list\)"),
    ("ab", dict(stop=5), r"stop strings are a string or a list of strings; got 5 \(int\)"),
    ("ab", dict(stop=["x", 5]), r"item 1 is 5 \(int\)"),
    ("ab", dict(temperature="x"), "temperature='x' must be a number, not str"),
    ("ab", dict(top_p="0.9"), "top_p='0.9' must be a number, not str"),
    ("ab", dict(repetition_penalty=None), "repetition_penalty=None must be a number"),
    ("ab", dict(stop_tokens="\n"), r"stop_tokens are token ids .integers from 0 to 16.; got '\\n'"),
    ("ab", dict(stop_tokens=[3, 17]), r"stop_tokens: 17 is no token id .integers from 0 to 16."),
    ("ab", dict(stop_tokens=[-1]), r"stop_tokens: -1 is no token id"),
    ("ab", dict(stop_tokens=[2.0]), r"stop_tokens: 2.0 is no token id"),
])
def test_the_python_api_checks_argument_types_at_its_door(lm, prompts, settings, message):
    with pytest.raises(AttnkitError, match=message):
        lm.generate(prompts, max_new_tokens=2, **settings)


def test_every_pipeline_method_checks_its_texts_and_load_its_dtype(runs):
    with pytest.raises(InputError, match=r"texts are a string or a list of strings; got 7 \(int\)"):
        attnkit.load(runs["mt"]).translate(7)
    with pytest.raises(InputError, match="no texts given"):
        attnkit.load(runs["clf"]).classify([])
    assert text_list([["Greta", "Lind"], "hired ."], words=True) == [["Greta", "Lind"], "hired ."]  # tag's texts
    with pytest.raises(InputError, match=r"\(or of lists of words\); item 0 is \['Greta', 3\]"):
        text_list([["Greta", 3]], words=True)
    for dtype in (5, ["fp32"], torch.int64):
        with pytest.raises(InputError, match=f"unknown dtype {re.escape(repr(dtype))}; choose one of fp32"):
            attnkit.load(runs["lm"], dtype=dtype)


def test_a_method_that_does_not_fit_names_the_family(runs, lm):
    with pytest.raises(InputError, match="translate does not fit this model: its family is 'decoder'; use generate"):
        lm.translate("abc")
    with pytest.raises(InputError, match="generate does not fit .* family is 'encoder'; use classify"):
        attnkit.load(runs["clf"]).generate("abc")
    with pytest.raises(InputError, match="classify does not fit .* family is 'encoder-decoder'; use translate"):
        attnkit.load(runs["mt"]).classify("abc")
    tagger = attnkit.load(runs["clf"])  # an encoder run of another encoder task: its task named, not its family
    with pytest.raises(InputError, match="tag does not fit this model: it was trained for classify, not tag; use "
                                         "classify instead"):
        tagger.tag("abc")


def test_translate_greedy_and_beam(runs):
    mt = attnkit.load(runs["mt"])
    texts = ["abc", "hgfedcba", "", "a b"]
    greedy = mt.translate(texts, max_length=10, batch_size=2)
    tok = mt.tokenizer
    sources = [[*tok.encode(t), tok.eos_id] for t in texts if t]
    ids = greedy_translate(mt.model, sources, bos_id=tok.bos_id, eos_id=tok.eos_id, max_length=10, pad_id=tok.pad_id)
    assert greedy == [tok.decode(ids[0]), tok.decode(ids[1]), "", tok.decode(ids[2])]
    beam = mt.translate(texts, beam_size=3, max_length=10, progress=True)
    assert len(beam) == 4 and beam[2] == ""
    assert beam == [mt.translate(t, beam_size=3, max_length=10)[0] for t in texts]
    n_best = mt.translate(texts, beam_size=3, max_length=10, num_return_sequences=2, batch_size=2)
    assert n_best[::2] == beam and n_best[4:6] == ["", ""]  # two per text, the best first; a blank text's blank
    assert n_best[:2] == mt.translate("abc", beam_size=3, max_length=10, num_return_sequences=2)
    with pytest.raises(InputError, match="num_return_sequences=2 must be an integer from 1 to beam_size=1"):
        mt.translate("abc", num_return_sequences=2)
    with pytest.raises(InputError, match="max_length=99 is beyond"):
        mt.translate("abc", max_length=99)


def test_classify_gives_labels_and_probabilities_batched(runs):
    clf = attnkit.load(runs["clf"])
    texts = ["abc", "hh gg", "a", "defgh abc"]
    results = clf.classify(texts, batch_size=3)
    for result in results:
        assert set(result.probabilities) == {"neg", "neutral", "pos"}
        assert sum(result.probabilities.values()) == pytest.approx(1.0)
        assert result.probability == max(result.probabilities.values())
        assert result.probabilities[result.label] == result.probability
    alone = [clf.classify(t)[0] for t in texts]
    assert not any(r.truncated for r in results) and clf.classify("abc " * 5_000)[0].truncated  # said, not silent
    for a, b in zip(results, alone, strict=True):
        assert a.label == b.label and a.probability == pytest.approx(b.probability, abs=1e-5)


def test_labels_that_do_not_fit_the_config_are_a_checkpoint_error(tmp_path):
    run = _save_run(tmp_path / "clf", "encoder", n_classes=2)
    (run / "labels.json").write_text(json.dumps(["a", "b", "c"]))
    with pytest.raises(CheckpointError, match="holds 3 label names; n_classes in config.json is 2"):
        attnkit.load(run)


def test_cli_generate_streams_the_prompt_and_continuation(runs, lm, capsys):
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "ab", "--max-new-tokens", "9",
                     "--temperature", "0", "--device", "cpu"]) == 0
    expected = "ab" + lm.generate("ab", max_new_tokens=9, temperature=0)[0] + "\n"
    assert capsys.readouterr().out == expected
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "ab", "--max-new-tokens", "0"]) == 0
    assert capsys.readouterr().out == "ab\n"  # nothing generated: the prompt alone


def test_cli_generate_reads_stdin_and_prints_several_samples(runs, lm, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("cab"))
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "-", "--max-new-tokens", "6",
                     "--num-samples", "2", "--seed", "3"]) == 0
    samples = lm.generate("cab", max_new_tokens=6, num_samples=2, seed=3)
    assert capsys.readouterr().out == "".join(f"--- sample {i + 1} ---\ncab{s}\n" for i, s in enumerate(samples))


@pytest.mark.parametrize(("flags", "refused"), [
    (["--length-penalty", "nan"], "--length-penalty nan must be a finite number between"),
    (["--length-penalty", "inf"], "--length-penalty inf must be a finite number between"),
    (["--max-prompt-bytes", "-1"], "--max-prompt-bytes -1 must be a positive number of bytes"),
    (["--max-prompt-bytes", "10"], None),
])
def test_cli_generate_checks_a_flag_that_this_prompt_does_not_read(runs, capsys, caplog, flags, refused):
    # without beams nothing reads --length-penalty, nor --max-prompt-bytes without --prompt -: a value out of range
    # is refused all the same (it was taken in silence, nan with a note that it was ignored), one in range is said
    # to be ignored
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        code = cli.main(["generate", str(runs["lm"]), "--prompt", "ab", "--max-new-tokens", "2", *flags])
    err = capsys.readouterr().err
    if refused is not None:
        assert code == 2 and err.startswith(f"attnkit: error: {refused}") and err.count("\n") == 1, err
    else:
        assert code == 0 and "ignored: --max-prompt-bytes 10 bounds the prompt --prompt - reads" in caplog.text


def test_min_p_penalties_no_repeat_ngrams_and_min_new_tokens_reach_generate_and_its_command(runs, lm, capsys):
    greedy = lm.generate("abc d", max_new_tokens=12, temperature=0, stop_at_eos=False)[0]
    assert lm.generate("abc d", max_new_tokens=12, min_p=1.0, seed=3, stop_at_eos=False)[0] == greedy  # argmax alone
    sampling = SamplingConfig(temperature=0.0, presence_penalty=0.5, frequency_penalty=1.5)
    ids = generate_tokens(lm.model, [lm.tokenizer.encode("abc d")], max_new_tokens=12, context_len=24,
                          sampling=sampling)[0]
    penalised = lm.generate("abc d", max_new_tokens=12, temperature=0, presence_penalty=0.5, frequency_penalty=1.5,
                            stop_at_eos=False)[0]
    assert penalised == lm.tokenizer.decode(ids) != greedy
    common = ["generate", str(runs["lm"]), "--prompt", "abc d", "--max-new-tokens", "12", "--temperature", "0"]
    assert cli.main([*common, "--presence-penalty", "0.5", "--frequency-penalty", "1.5"]) == 0
    assert capsys.readouterr().out == "abc d" + lm.generate("abc d", max_new_tokens=12, temperature=0,
                                                            presence_penalty=0.5, frequency_penalty=1.5)[0] + "\n"
    for flag, value, message in (("--presence-penalty", "3", "presence_penalty=3.0 must lie in [-2, 2]"),
                                 ("--frequency-penalty", "-2.5", "frequency_penalty=-2.5 must lie in [-2, 2]"),
                                 ("--min-p", "1.5", "min_p=1.5 must lie in [0, 1]"),
                                 ("--no-repeat-ngram-size", "-1", "no_repeat_ngram_size=-1 must be an integer >= 0")):
        assert cli.main([*common, flag, value]) == 2
        assert message in capsys.readouterr().err
    unrepeated = lm.generate("abc d", max_new_tokens=12, temperature=0, no_repeat_ngram_size=2)[0]
    assert unrepeated != greedy
    assert cli.main([*common, "--no-repeat-ngram-size", "2"]) == 0
    assert capsys.readouterr().out == f"abc d{unrepeated}\n"
    first = lm.generate("abc d", max_new_tokens=1, temperature=0)[0]
    stop = lm.tokenizer.encode(first)
    assert lm.generate("abc d", max_new_tokens=12, temperature=0, stop_tokens=stop)[0] == ""
    held = lm.generate("abc d", max_new_tokens=12, temperature=0, stop_tokens=stop, min_new_tokens=4)[0]
    tokens = generate_tokens(lm.model, [lm.tokenizer.encode("abc d")], max_new_tokens=12, context_len=24,
                             stop_ids={*stop, lm.tokenizer.eos_id}, min_new_tokens=4)[0]
    assert len(tokens) >= 4 and held == lm.tokenizer.decode(tokens)  # the stop tokens held back for 4 tokens
    assert cli.main([*common, "--min-new-tokens", "-1"]) == 2
    assert "min_new_tokens=-1 must be an integer >= 0" in capsys.readouterr().err


def test_cli_min_new_tokens_holds_back_an_eos_the_model_would_write_at_once(tmp_path, capsys):
    """A run whose greedy text ends at once (its EOS row is twice the row of the token it would write first): the
    command's --min-new-tokens 4 gives a longer text than the command without it, and the library's."""
    run = _save_run(tmp_path / "lm", "decoder", position="rope", seed=1)
    lm = attnkit.load(run, device="cpu")
    first = lm.tokenizer.encode(lm.generate("abc d", max_new_tokens=1, temperature=0, stop_at_eos=False)[0])[0]
    model, config = tiny_model("decoder", vocab_size=lm.tokenizer.vocab_size, position="rope", seed=1)  # the run's
    rows = model.stack.embeddings.token.weight  # (V, C), the output head's too
    with torch.no_grad():
        rows[lm.tokenizer.eos_id] = 2 * rows[first]
    save_model(model, config, run)
    common = ["generate", str(run), "--prompt", "abc d", "--max-new-tokens", "12", "--temperature", "0"]
    assert cli.main(common) == 0
    assert capsys.readouterr().out == "abc d\n"  # EOS first: no text
    assert cli.main([*common, "--min-new-tokens", "4"]) == 0
    held = capsys.readouterr().out
    expected = attnkit.load(run, device="cpu").generate("abc d", max_new_tokens=12, temperature=0, min_new_tokens=4)
    assert held == f"abc d{expected[0]}\n" != "abc d\n"  # the flag changed the text, as the library changes it


def test_cli_bad_arguments_print_a_clear_error(runs, capsys):
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "ab", "--top-p", "0"]) == 2
    assert "top_p=0.0 must lie in (0, 1]" in capsys.readouterr().err
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "ab", "--seed", str(2**64)]) == 2
    assert "seed=18446744073709551616 lies outside 0 to 2**64 - 1 (64 bits)" in capsys.readouterr().err
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "ab", "--top-k", "0"]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""  # the prompt is not streamed ahead of an error
    assert "top_k=0 must be a positive integer (leave it out to keep every token)" in printed.err
    assert cli.main(["generate", "--run", str(runs["lm"].parent / "nosuch"), "--prompt", "ab"]) == 2
    assert f"{runs['lm'].parent / 'nosuch'} does not exist; give a run directory" in capsys.readouterr().err
    assert cli.main(["classify", "--run", str(runs["lm"]), "--text", "ab"]) == 2
    assert "its family is 'decoder'" in capsys.readouterr().err


def test_logits_that_overflow_in_fp16_end_generation_with_one_line_naming_the_dtype(tmp_path, capsys):
    """An output layer whose logits pass fp16's largest number (65504) gives inf, then nan probabilities."""
    tokenizer = CharTokenizer(ALPHABET)
    model, config = tiny_model("decoder", vocab_size=tokenizer.vocab_size, seed=3, norm="rms")
    with torch.no_grad():
        model.lm_head.weight.mul_(1e4)
    save_model(model.float(), config, tmp_path / "run")
    tokenizer.save(tmp_path / "run" / "tokenizer")
    assert cli.main(["generate", str(tmp_path / "run"), "--prompt", "ab", "--max-new-tokens", "3"]) == 0  # fp32
    capsys.readouterr()
    assert cli.main(["generate", str(tmp_path / "run"), "--prompt", "ab", "--max-new-tokens", "3",
                     "--dtype", "fp16"]) == 2
    printed = capsys.readouterr()
    errors = printed.err.strip().splitlines()
    assert errors[-1].startswith("attnkit: error: the model's logits for row(s) [0] are no probability distribution")
    assert "in fp16" in errors[-1] and "--dtype bf16" in errors[-1] and "Traceback" not in printed.err


@pytest.mark.parametrize(("head", "command"), [("classify", ["classify", "--text", "ab cd"]),
                                              ("tag", ["tag", "--text", "ab cd"]),
                                              ("mlm", ["fill-mask", "--text", "ab [MASK] cd"])])
def test_an_encoders_nan_outputs_in_fp16_are_one_line_naming_the_dtype_not_a_prediction(tmp_path, capsys, head,
                                                                                         command):
    tokenizer = CharTokenizer(ALPHABET)
    classes = {"n_classes": 3} if head != "mlm" else {}
    model, config = tiny_model("encoder", vocab_size=tokenizer.vocab_size, seed=3, encoder_head=head, **classes)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(30)  # activations past fp16's largest number
    run = tmp_path / "run"
    save_model(model.float(), config, run)
    tokenizer.save(run / "tokenizer")
    assert cli.main([command[0], str(run), *command[1:]]) == 0  # fp32: a prediction
    capsys.readouterr()
    assert cli.main([command[0], str(run), *command[1:], "--dtype", "fp16"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "Traceback" not in printed.err
    error = printed.err.strip().splitlines()[-1]
    assert error.startswith("attnkit: error: the model's outputs for text") and "are nan, no probabilities" in error
    assert "in fp16 the activations may overflow" in error and "--dtype bf16" in error


def test_cli_translate_passes_early_stopping_and_num_return_sequences_to_the_beam_search(runs, monkeypatch, capsys):
    """translate offered --beam-size and --length-penalty but not transformers' early stopping, which
    Pipeline.translate takes, nor its n best translations (--num-return-sequences: n lines per text)."""
    seen = []
    translate = Pipeline.translate
    monkeypatch.setattr(Pipeline, "translate",
                        lambda self, texts, **kw: seen.append(kw) or translate(self, texts, **kw))
    for flag, expected in (([], True), (["--no-early-stopping"], False), (["--early-stopping"], True)):
        assert cli.main(["translate", "--run", str(runs["mt"]), "--text", "abc", "--beam-size", "2", *flag]) == 0
        assert seen[-1]["early_stopping"] is expected
    assert capsys.readouterr().out
    assert cli.main(["translate", "--run", str(runs["mt"]), "--text", "abc", "hg", "--beam-size", "3",
                     "--num-return-sequences", "2", "--max-length", "8"]) == 0
    mt = attnkit.load(runs["mt"])
    expected = mt.translate(["abc", "hg"], beam_size=3, num_return_sequences=2, max_length=8)
    assert capsys.readouterr().out.splitlines() == expected  # two lines per text, the best first


def test_cli_translate_file_to_file_and_classify(runs, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("abc\n\nhg fe\n")
    out = tmp_path / "out.txt"
    assert cli.main(["translate", "--run", str(runs["mt"]), "--input", str(source), "--output", str(out),
                     "--beam-size", "2", "--max-length", "8"]) == 0
    mt = attnkit.load(runs["mt"])
    assert out.read_text() == "".join(f"{t}\n" for t in mt.translate(["abc", "", "hg fe"], beam_size=2, max_length=8))
    assert cli.main(["classify", "--run", str(runs["clf"]), "--text", "abc", "--text", "hh"]) == 0
    lines = capsys.readouterr().out.splitlines()
    results = attnkit.load(runs["clf"]).classify(["abc", "hh"])
    assert lines == [f"{r.label}\t{r.probability:.4f}" for r in results]



def test_cli_classify_reads_its_texts_from_standard_input_with_input_dash(runs, capsys, monkeypatch):
    """`... | attnkit classify RUN --input -`: the lines of standard input, as a file's (BOM, CRLF, blank lines)."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\ufeffabc\r\n\nhh\n".encode())))
    assert cli.main(["classify", "--run", str(runs["clf"]), "--input", "-"]) == 0
    results = attnkit.load(runs["clf"]).classify(["abc", "", "hh"])
    assert capsys.readouterr().out.splitlines() == [f"{r.label}\t{r.probability:.4f}" for r in results]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ab\xffc\n")))
    assert cli.main(["classify", "--run", str(runs["clf"]), "--input", "-"]) == 2
    assert "standard input is not valid UTF-8: byte 0xff at offset 2" in capsys.readouterr().err


def test_cli_classify_reads_the_text_column_of_a_csv_tsv_or_jsonl_input(runs, tmp_path, capsys):
    """A labelled file given to attnkit classify was read as lines: the header classified as a text, and each label
    read as part of its text, with no word said. Its text column (or key) is what is classified."""
    texts = ["abc, d", "hh"]
    files = {"in.csv": 'label,text\npos,"abc, d"\nneg,hh\n', "in.tsv": "text\tid\nabc, d\t1\nhh\t2\n",
             "in.jsonl": '{"text": "abc, d", "label": "pos"}\n{"text": "hh"}\n'}
    expected = [f"{r.label}\t{r.probability:.4f}" for r in attnkit.load(runs["clf"]).classify(texts)]
    for name, content in files.items():
        (tmp_path / name).write_text(content, encoding="utf-8")
        assert cli.main(["classify", "--run", str(runs["clf"]), "--input", str(tmp_path / name)]) == 0
        assert capsys.readouterr().out.splitlines() == expected, name
    (tmp_path / "header.csv").write_text("text,label\n", encoding="utf-8")
    assert cli.main(["classify", "--run", str(runs["clf"]), "--input", str(tmp_path / "header.csv")]) == 2
    assert "header.csv holds no texts below its header" in capsys.readouterr().err

def test_cli_translate_refuses_an_output_it_cannot_write_before_loading_the_run(runs, tmp_path):
    from attnkit.tasks.translate import run_translate

    def never(settings):
        raise AssertionError("the run was loaded (and every text translated) before --output was checked")

    settings = cli.parse(["translate", str(runs["mt"]), "--text", "abc", "--output", str(tmp_path)]).settings
    with pytest.raises(InputError, match=f"--output {tmp_path} is a directory, where a file is to be written"):
        run_translate(settings, never)


def test_load_takes_the_native_products_only_for_models_that_decode(runs):
    """The session's profile (the documented defaults) names the native kernels: models that decode get them for
    their linear layers (fp32 and bf16; int8 weights get their own native layer), a classifier keeps nn.Linear."""
    reason = native_gemv.unavailable()
    if reason is not None:
        pytest.skip(f"the native kernels cannot run here: {reason}")

    def native(pipeline):
        return any(isinstance(m, NativeLinear) for m in pipeline.model.modules())

    assert native(attnkit.load(runs["lm"], device="cpu"))
    assert native(attnkit.load(runs["mt"], device="cpu"))
    assert native(attnkit.load(runs["lm"], device="cpu", dtype="bf16"))
    int8 = attnkit.load(runs["lm"], device="cpu", quantize="int8")
    assert not native(int8) and any(isinstance(m, NativeInt8Linear) for m in int8.model.modules())
    assert not native(attnkit.load(runs["clf"], device="cpu"))


def test_load_packs_only_bf16_models_that_decode_eagerly(runs):
    def packed(pipeline):
        return any(isinstance(m, PackedLinear) for m in pipeline.model.modules())

    can_pack = CpuCapabilities.detect().onednn_bf16  # elsewhere the plan keeps nn.Linear (test_generate_plan.py)
    assert packed(attnkit.load(runs["lm"], device="cpu", dtype="bf16")) == can_pack
    assert packed(attnkit.load(runs["mt"], device="cpu", dtype="bf16")) == can_pack
    assert not packed(attnkit.load(runs["lm"], device="cpu"))
    assert not packed(attnkit.load(runs["lm"], device="cpu", dtype="bf16", quantize="int8"))
    assert not packed(attnkit.load(runs["lm"], device="cpu", dtype="bf16", compile=True))
    assert not packed(attnkit.load(runs["clf"], device="cpu", dtype="bf16"))


def test_max_autotune_decoding_keeps_weights_to_be_packed_and_bad_modes_fail_before_loading(runs, tmp_path):
    tuned = attnkit.load(runs["lm"], device="cpu", compile="max-autotune")
    assert not any(isinstance(m, TransposedLinear) for m in tuned.model.modules())
    assert isinstance(tuned.decoding, StaticDecoding) and tuned.decoding.freezes_weights
    with pytest.raises(InputError, match="not a compile mode"):
        attnkit.load(tmp_path / "missing", compile="fastest")


def test_loaded_models_hold_no_dropout_layers(runs):
    for name in ("lm", "mt", "clf"):
        assert not any(isinstance(m, torch.nn.Dropout) for m in attnkit.load(runs[name], device="cpu").model.modules())


def test_load_fuses_qkv_projections_of_models_that_decode(runs):
    def fused(pipeline):
        return any(getattr(m, "qkv_proj", None) is not None for m in pipeline.model.modules())

    assert fused(attnkit.load(runs["lm"], device="cpu", dtype="bf16"))
    assert fused(attnkit.load(runs["mt"], device="cpu", quantize="int8"))
    assert not fused(attnkit.load(runs["clf"], device="cpu"))


@pytest.mark.slow  # compiles a decoder and a translator; test_generate_static_decode covers the step
def test_compiled_models_generate_and_translate_the_same_text(runs):
    """`compile=True` is a speed option only: a decoder's step is compiled for fixed shapes, an encoder-decoder's
    blocks for any length (batches of several lengths exercise the dynamic shapes)."""
    for name, call in (("lm", lambda p: p.generate(["abc d", "h"], max_new_tokens=10, temperature=0,
                                                     stop_at_eos=False)),
                       ("mt", lambda p: p.translate(["abc", "hg fe"], max_length=8))):
        eager = attnkit.load(runs[name], device="cpu", quantize="int8")
        compiled = attnkit.load(runs[name], device="cpu", quantize="int8", compile=True)
        blocks_compiled = any(getattr(m, "_compiled_call_impl", None) for m in compiled.model.modules())
        assert blocks_compiled == (name == "mt")
        assert isinstance(compiled.decoding, StaticDecoding) == (name == "lm")
        assert call(compiled) == call(eager)


@pytest.mark.skipif(dynamic_quantization_available() is not None, reason=str(dynamic_quantization_available()))
def test_int8_dynamic_loads_generates_and_translates_close_to_fp32(runs, capsys):
    from attnkit.generate.quantize import Int8DynamicLinear

    for name, call in (("lm", lambda p: p.model(torch.tensor([[1, 2, 3, 4]])).logits),
                       ("mt", lambda p: p.model(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2]])).logits)):
        exact, dynamic = attnkit.load(runs[name], device="cpu"), attnkit.load(runs[name], device="cpu",
                                                                              quantize="int8-dynamic")
        assert any(isinstance(m, Int8DynamicLinear) for m in dynamic.model.modules())
        with torch.no_grad():
            expected, got = call(exact), call(dynamic)
        assert (got - expected).abs().max() < 0.1 * expected.abs().max()  # 7-bit activations; quality: benchmarks
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "abc", "--max-new-tokens", "5",
                     "--temperature", "0", "--int8-dynamic"]) == 0
    assert capsys.readouterr().out.startswith("abc")


def test_int8_dynamic_is_refused_where_it_cannot_run(runs, capsys):
    with pytest.raises(InputError, match="runs eagerly"):
        attnkit.load(runs["lm"], device="cpu", quantize="int8-dynamic", compile=True)
    with pytest.raises(InputError, match="CPU only"):
        attnkit.load(runs["lm"], device="meta", quantize="int8-dynamic")
    with pytest.raises(InputError, match="use one of int8, int8-dynamic, int4"):
        attnkit.load(runs["lm"], device="cpu", quantize="nf4")
    with pytest.raises(InputError, match="CPU only"):
        attnkit.load(runs["lm"], device="meta", quantize="int4")
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "a", "--int8", "--int8-dynamic"]) == 2
    assert "give one" in capsys.readouterr().err


@pytest.mark.slow  # a capture (20 s); the default suite holds the captured step itself to eager decoding
@pytest.mark.skipif(shutil.which("g++") is None, reason="capturing a step needs a C++ compiler (g++)")
def test_cli_generate_with_a_captured_step_prints_what_eager_decoding_does(runs, lm, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_COMPILED", str(tmp_path))
    assert cli.main(["generate", "--run", str(runs["lm"]), "--prompt", "ab", "--max-new-tokens", "9",
                     "--temperature", "0", "--compile", "aot", "--explain"]) == 0
    printed = capsys.readouterr()
    assert printed.out.endswith("ab" + lm.generate("ab", max_new_tokens=9, temperature=0)[0] + "\n")
    assert "decoding step captured ahead of time" in printed.out + printed.err
    assert len(list(tmp_path.glob("step-*.pt2"))) == 1


@pytest.mark.parametrize("specials", [["pad", "unk", "bos", "eos", "cls", "sep"], ["pad", "unk", "bos", "eos", "cls"],
                                      ["pad", "unk", "bos", "eos"]])
def test_a_classifier_reads_a_text_framed_as_its_training_data(specials):
    """Pipeline.classifier_ids framed a text by a rule of its own (CLS and SEP where the tokenizer has CLS, a missing
    mark dropped): with CLS but no SEP it read CLS ... where the classifier was trained on CLS ... EOS
    (`LabelledData`, `frame_ids`). It frames by `frame_ids` now, cut to the same length."""
    from attnkit.data import LabelledData

    tokenizer = CharTokenizer("abcdefgh ", special_tokens=specials)
    config = attnkit.ModelConfig(family="encoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                                 n_layers=1, max_seq_len=6, n_classes=2)
    pipeline = Pipeline(attnkit.build_model(config).eval(), config, tokenizer)
    for text in ("abc", "abcdefgh"):  # one that fits, one cut to the model's length
        trained = LabelledData.from_examples([(text, "x")], tokenizer, max_len=config.max_seq_len).ids[0].tolist()
        assert pipeline.classifier_ids(text, index=0)[0] == trained


def test_translate_takes_the_repetition_penalty_and_ngram_blocking_from_the_api_and_its_command(runs, capsys):
    mt = attnkit.load(runs["mt"], device="cpu")
    texts = ["abcabc", "hgfedcba", "aaaa"]
    for beam_size in (1, 3):
        plain = mt.translate(texts, beam_size=beam_size, max_length=12)
        blocked = mt.translate(texts, beam_size=beam_size, max_length=12, no_repeat_ngram_size=1)
        assert blocked != plain
        assert all(len(set(text)) == len(text) for text in blocked)  # no character twice (no_repeat_ngram_size=1)
    penalised = mt.translate(texts, max_length=12, repetition_penalty=3.0)
    assert penalised != mt.translate(texts, max_length=12)
    with pytest.raises(ConfigError, match="no_repeat_ngram_size=-1 must be an integer >= 0"):
        mt.translate(texts, no_repeat_ngram_size=-1)
    assert cli.main(["translate", "--run", str(runs["mt"]), "--max-length", "12", "--repetition-penalty", "3",
                     *[arg for text in texts for arg in ("--text", text)]]) == 0
    assert capsys.readouterr().out == "\n".join(penalised) + "\n"
