"""`attnkit eval`: sliding-window perplexity against independent computations, BLEU and chrF against sacreBLEU
called directly, classification scores against scikit-learn, and clear errors for what cannot be scored."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import build_model
from attnkit.checkpoint import save_model
from attnkit.config import ModelConfig
from attnkit.errors import ConfigError, InputError
from attnkit.tasks.bleu import translation_scores
from attnkit.tasks.lm import sliding_window_nll, sliding_windows
from attnkit.tokenize import CharTokenizer
from attnkit.train.evaluate import evaluate_run

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. Ünïcödé ✓\n"
WINDOW = 16


def make_run(directory, family="decoder", **changes):
    tokenizer = CharTokenizer.from_texts([TEXT + "0123456789 abcdefghijklmnopqrstuvwxyz"])
    config = ModelConfig(family=family, vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                         max_seq_len=WINDOW, position="rope" if family == "decoder" else "learned", **changes)
    torch.manual_seed(0)
    model = build_model(config).eval()
    save_model(model, config, directory)
    tokenizer.save(directory / "tokenizer")
    return model, tokenizer


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def nll_of(model, context, target):
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[0, -1]
    return -F.log_softmax(logits.double(), dim=-1)[target].item()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 80), window=st.integers(1, 20), data=st.data())
def test_windows_score_every_token_but_the_first_exactly_once(n, window, data):
    stride = data.draw(st.integers(1, window))
    windows = sliding_windows(n, window=window, stride=stride)
    scored = [t for w in windows for t in range(w.end - w.n_new + 1, w.end + 1)]
    assert scored == list(range(1, n))
    assert all(0 <= w.begin < w.end <= n - 1 and w.end - w.begin <= window and w.n_new >= 1 for w in windows)


def test_perplexity_of_a_short_text_is_exp_of_the_mean_token_loss(tmp_path):
    model, tokenizer = make_run(tmp_path / "run")
    text = TEXT[:WINDOW]  # one window holds it all
    report = evaluate_run(tmp_path / "run", [write(tmp_path / "short.txt", text)])
    ids = torch.tensor(tokenizer.encode(text))
    with torch.no_grad():
        loss = F.cross_entropy(model(ids[None, :-1]).logits[0].double(), ids[1:]).item()
    row = report.rows[0]
    assert row["tokens"] == len(ids) - 1
    assert row["loss"] == pytest.approx(loss, rel=1e-5)
    assert row["ppl"] == pytest.approx(math.exp(loss), rel=1e-5)


def test_stride_equal_to_the_window_gives_the_non_overlapping_figure(tmp_path):
    model, tokenizer = make_run(tmp_path / "run")
    ids = tokenizer.encode(TEXT)
    assert len(ids) > 4 * WINDOW
    expected = sum(nll_of(model, ids[start:t], ids[t]) for start in range(0, len(ids) - 1, WINDOW)
                   for t in range(start + 1, min(start + WINDOW, len(ids) - 1) + 1))
    got = sliding_window_nll(model, ids, window=WINDOW, stride=WINDOW, batch_size=3)
    assert got == pytest.approx(expected, rel=1e-5)


def test_stride_one_predicts_every_token_from_a_full_window(tmp_path):
    model, tokenizer = make_run(tmp_path / "run")
    ids = tokenizer.encode(TEXT)[:40]
    expected = sum(nll_of(model, ids[max(0, t - WINDOW):t], ids[t]) for t in range(1, len(ids)))
    got = sliding_window_nll(model, ids, window=WINDOW, stride=1, batch_size=5)
    assert got == pytest.approx(expected, rel=1e-5)
    assert abs(got - sliding_window_nll(model, ids, window=WINDOW, stride=WINDOW)) > 1e-3  # context matters


def test_character_and_byte_figures(tmp_path):
    _, tokenizer = make_run(tmp_path / "run")
    report = evaluate_run(tmp_path / "run", [write(tmp_path / "a.txt", TEXT), write(tmp_path / "b.txt", TEXT[:30])],
                          stride=4)
    first, second, total = report.rows
    scored = TEXT[1:]  # a character tokenizer: the first character is context only
    assert (first["chars"], first["bytes"]) == (len(scored), len(scored.encode()))
    assert first["char_ppl"] == pytest.approx(first["ppl"])  # one token per character
    assert first["bits_per_byte"] == pytest.approx(first["nll"] / len(scored.encode()) / math.log(2))
    assert total["file"] == "all" and total["tokens"] == first["tokens"] + second["tokens"]
    assert total["loss"] == pytest.approx((first["nll"] + second["nll"]) / total["tokens"])
    saved = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert saved["stride"] == 4 and saved["rows"][0]["loss"] == pytest.approx(first["loss"])
    assert "bits_per_byte" in report.table()


def test_bleu_and_chrf_equal_sacrebleu_called_directly(tmp_path):
    import sacrebleu

    make_run(tmp_path / "run", family="encoder-decoder")
    pairs = [("ein Haus", "a house ."), ("der Hund", "the dog runs ."), ("die Katze", "the cat sleeps on the mat .")]
    tsv = write(tmp_path / "pairs.tsv", "".join(f"{s}\t{t}\n" for s, t in pairs))
    guesses = {"ein Haus": "a house .", "der Hund": "the dog ran .", "die Katze": "a cat sleeps on a mat ."}
    report = evaluate_run(tmp_path / "run", [tsv], translate=lambda texts: [guesses[t] for t in texts])
    hypotheses, references = [guesses[s] for s, _ in pairs], [t for _, t in pairs]
    row = report.rows[0]
    assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert row["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert 0 < row["bleu"] < 100
    assert "tok:13a" in report.details["bleu_signature"] and "nrefs:1" in report.details["bleu_signature"]
    assert translation_scores(references, references)["bleu"] == pytest.approx(100.0)
    # the published Multi30k protocol lowercases: a lowercased reference scores 100 there, less than that cased
    lowered = translation_scores([r.upper() for r in references], references)
    assert lowered["bleu_lowercased"] == pytest.approx(100.0) and lowered["bleu"] < 50
    assert "case:lc" in lowered["bleu_lowercased_signature"] and "case:mixed" in lowered["bleu_signature"]
    lowercase = sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score
    assert row["bleu_lowercased"] == pytest.approx(lowercase)
    with pytest.raises(ConfigError, match="translate="):
        evaluate_run(tmp_path / "run", [tsv])


def test_a_character_task_is_scored_on_characters():
    """Reversed strings hold no spaces: on words each line is one word and BLEU is 0 for a model almost always right;
    on characters it says how close the reversals are."""
    import sacrebleu

    references = ["edcba", "ponmlk", "jihgfedc", "cba"]
    hypotheses = ["edcba", "ponmlk", "jihgfedx", "cab"]  # two right, one letter off, one shuffled
    scores = translation_scores(hypotheses, references)
    assert sacrebleu.corpus_bleu(hypotheses, [references]).score == 0.0  # words: nothing to match
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references], tokenize="char").score)
    assert 50 < scores["bleu"] < 100 and "tok:char" in scores["bleu_signature"]
    assert translation_scores(references, references)["bleu"] == pytest.approx(100.0)


def test_classification_scores_match_scikit_learn(tmp_path):
    metrics = pytest.importorskip("sklearn.metrics")
    from attnkit.generate import load

    make_run(tmp_path / "run", family="encoder", encoder_head="classify", n_classes=3)
    (tmp_path / "run" / "labels.json").write_text(json.dumps({"labels": ["neg", "neu", "pos"]}))
    generator = torch.Generator().manual_seed(0)
    words = ["good", "bad", "fine", "to be", "or not", "question", "mind", "suffer"]
    examples = [(" ".join(words[i] for i in torch.randint(0, 8, (3,), generator=generator).tolist()),
                 ["neg", "neu", "pos"][int(torch.randint(0, 3, (1,), generator=generator))]) for _ in range(40)]
    data = write(tmp_path / "dev.txt", "".join(f"{label} {text}\n" for text, label in examples))
    report = evaluate_run(tmp_path / "run", [data], batch_size=7)

    predicted = [c.label for c in load(tmp_path / "run", device="cpu").classify([t for t, _ in examples])]
    truth = [label for _, label in examples]
    row = report.rows[0]
    assert row["examples"] == 40
    assert row["accuracy"] == pytest.approx(metrics.accuracy_score(truth, predicted))
    assert row["macro_f1"] == pytest.approx(metrics.f1_score(truth, predicted, average="macro"))
    expected = metrics.confusion_matrix(truth, predicted, labels=["neg", "neu", "pos"]).tolist()
    assert report.details["confusion"] == expected
    png = tmp_path / "run" / "eval" / "confusion.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "true \\ predicted" in report.table()


def test_a_classifier_on_unlabelled_text_is_refused(tmp_path):
    make_run(tmp_path / "run", family="encoder", encoder_head="classify")
    text = write(tmp_path / "plain.txt", "a fine film\nnot good at all\n")
    with pytest.raises(InputError, match="unlabelled"):
        evaluate_run(tmp_path / "run", [text])
    with pytest.raises(InputError, match="labelled examples"):
        evaluate_run(tmp_path / "run", [write(tmp_path / "one.txt", "word\n")])


def test_what_cannot_be_scored_is_refused(tmp_path):
    make_run(tmp_path / "bare-encoder", family="encoder", encoder_head="none")  # no task head: nothing to score
    text = write(tmp_path / "t.txt", TEXT)
    with pytest.raises(InputError, match="--init-from"):
        evaluate_run(tmp_path / "bare-encoder", [text])
    make_run(tmp_path / "lm")
    with pytest.raises(ConfigError, match="stride"):
        evaluate_run(tmp_path / "lm", [text], stride=WINDOW + 1)
    with pytest.raises(ConfigError, match="longer than the model's context"):
        evaluate_run(tmp_path / "lm", [text], window=100_000)
    with pytest.raises(InputError, match=r"one.txt holds 1 token\(s\), .* so it needs at least 2: give --data a"):
        evaluate_run(tmp_path / "lm", [write(tmp_path / "one.txt", "T")])
    (tmp_path / "bare").mkdir()
    make_run(tmp_path / "bare")
    import shutil

    shutil.rmtree(tmp_path / "bare" / "tokenizer")
    with pytest.raises(InputError, match="no tokenizer"):
        evaluate_run(tmp_path / "bare", [text])


def test_the_eval_command_prints_a_table_and_writes_json(tmp_path, capsys):
    from attnkit.cli import main

    make_run(tmp_path / "run")
    text = write(tmp_path / "t.txt", TEXT)
    assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(text), "--stride", "8", "--no-progress",
                 "--out", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((tmp_path / "report" / "eval.json").read_text())
    direct = evaluate_run(tmp_path / "run", [text], stride=8)
    assert saved["rows"][0]["loss"] == pytest.approx(direct.rows[0]["loss"], rel=1e-9)
    assert saved["window"] == WINDOW and saved["stride"] == 8
    assert "ppl" in printed and f"{direct.rows[0]['ppl']:.4f}" in printed
    assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(text), "--window", "0"]) == 2
    assert "window=0" in capsys.readouterr().err


def test_perplexity_of_a_converted_gpt2_run_equals_transformers(tmp_path):
    from interop_models import hf_model, word_tokenizer

    from attnkit.interop import hf

    reference = hf_model("gpt2", tmp_path / "gpt2")
    word_tokenizer(tmp_path / "gpt2")
    hf.convert_from_hf(tmp_path / "gpt2", tmp_path / "run")
    generator = torch.Generator().manual_seed(3)
    words = [f"w{i}" for i in torch.randint(4, 99, (150,), generator=generator).tolist()]
    text = write(tmp_path / "words.txt", " ".join(words))
    report = evaluate_run(tmp_path / "run", [text], window=64, stride=64)

    ids = torch.tensor([int(w[1:]) for w in words])  # the word-level vocabulary: wN has id N
    total = 0.0
    with torch.no_grad():  # windows of 64 inputs that do not overlap, each predicting the token after each input
        for start in range(0, len(ids) - 1, 64):
            x = ids[start : min(start + 64, len(ids) - 1)]
            logits = reference(input_ids=x[None]).logits[0].double()
            total += F.cross_entropy(logits, ids[start + 1 : start + 1 + len(x)], reduction="sum").item()
    row = report.rows[0]
    assert row["tokens"] == len(ids) - 1
    assert row["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-5)


def test_a_line_missing_its_label_is_named_and_can_be_skipped_while_a_rare_class_of_the_run_is_scored(
        tmp_path, capsys):
    from attnkit.cli import main

    make_run(tmp_path / "run", family="encoder", encoder_head="classify", n_classes=3)
    (tmp_path / "run" / "labels.json").write_text(json.dumps({"labels": ["neg", "neu", "pos"]}))
    lines = [f"{['neg', 'pos'][i % 2]} to be or not {i}" for i in range(30)] + ["neu the question"]
    lines[4] = "this line forgot its label"
    data = write(tmp_path / "dev.txt", "\n".join(lines) + "\n")
    argv = ["eval", "--run", str(tmp_path / "run"), "--data", str(data), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "dev.txt, line 5: the label 'this' is not among the known labels ['neg', 'neu', 'pos']" in err
    assert "--bad-labels skip" in err and "bad_labels=" not in err and len(err.splitlines()) == 1
    assert main([*argv, "--bad-labels", "skip"]) == 0
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert report["rows"][0]["examples"] == 30  # the neu line, one of 31, is a class of the run's: scored


@pytest.mark.parametrize("flag", ["--int8", "--int8-dynamic"])
def test_eval_scores_the_quantized_model_as_generate_runs_it(tmp_path, flag):
    """The quantized model's loss is its own (not the stored model's), close to it, and the report says which."""
    from attnkit.cli import main
    from attnkit.generate.plan import prepare_for_inference
    from attnkit.generate.quantize import dynamic_quantization_available

    if flag == "--int8-dynamic" and dynamic_quantization_available() is not None:
        pytest.skip(dynamic_quantization_available())
    make_run(tmp_path / "run")
    text = write(tmp_path / "t.txt", TEXT)
    assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(text), "--no-progress", flag,
                 "--out", str(tmp_path / "report")]) == 0
    saved = json.loads((tmp_path / "report" / "eval.json").read_text())
    form = flag.removeprefix("--")
    assert saved["quantize"] == form
    exact = evaluate_run(tmp_path / "run", [text]).rows[0]["loss"]
    quantized = evaluate_run(tmp_path / "run", [text], details={"quantize": form},
                             prepare=lambda m: prepare_for_inference(m, "decoder", quantize=form)).rows[0]["loss"]
    assert saved["rows"][0]["loss"] == pytest.approx(quantized, rel=1e-9)
    assert saved["rows"][0]["loss"] != exact and saved["rows"][0]["loss"] == pytest.approx(exact, rel=0.02)


def test_eval_refuses_both_int8_forms(tmp_path, capsys):
    from attnkit.cli import main

    make_run(tmp_path / "run")
    assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(write(tmp_path / "t.txt", TEXT)),
                 "--int8", "--int8-dynamic"]) == 2
    assert "give one" in capsys.readouterr().err


def test_eval_explain_prints_the_plan_the_model_is_scored_with(tmp_path, capsys):
    """A decoder scored in whole passes keeps separate q/k/v and nn.Linear's layout, and says why; a translation
    run is scored through its pipeline, whose plan decodes."""
    from attnkit.cli import main

    make_run(tmp_path / "lm")
    text = write(tmp_path / "t.txt", TEXT)
    assert main(["eval", str(tmp_path / "lm"), "--data", str(text), "--no-progress", "--explain",
                 "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    assert "inference plan for fp32" in captured.err and "ppl" in captured.out and "ppl" not in captured.err
    assert "q/k/v" in captured.err and "separate: only whole passes run here" in captured.err
    assert main(["eval", str(tmp_path / "lm"), "--data", str(text), "--no-progress",
                 "--out", str(tmp_path / "report")]) == 0
    assert "inference plan" not in capsys.readouterr().err  # only when asked
    make_run(tmp_path / "mt", family="encoder-decoder")
    pairs = write(tmp_path / "pairs.tsv", "ein Haus\ta house .\n")
    assert main(["eval", str(tmp_path / "mt"), "--data", str(pairs), "--no-progress", "--explain",
                 "--out", str(tmp_path / "mt-report")]) == 0
    err = capsys.readouterr().err
    assert "inference plan for fp32" in err and "q/k/v" in err and "fused" in err
