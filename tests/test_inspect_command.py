"""`attnkit inspect RUN ANALYSIS` on a run of every Transformer family and the recurrent seq2seq with attention:
each analysis writes its JSON, markdown and PNG; bad requests are refused before the model loads, naming the fix."""

import json
import re
import stat
import typing

import pytest
import torch
from matplotlib.figure import Figure

from attnkit.checkpoint import load_model, save_model
from attnkit.cli import main
from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError, CheckpointError, InputError
from attnkit.inspect.command import Analysis, InspectSettings, run_inspect
from attnkit.inspect.head_types import head_types, repeated_tokens
from attnkit.inspect.report import write_report
from attnkit.models import build_model
from attnkit.outputs import file_mode
from attnkit.tokenize import CharTokenizer, readable

CHARS = "abcdefghij ."
CONLL = "".join(f"{w}\t{'V' if w in ('ab', 'cd') else 'N'}\n" + ("\n" if i % 4 == 3 else "")
                for i, w in enumerate(["ab", "fg", "cd", "hi", "ij", "ab", "fe", "cd"] * 6))


def _run(directory, family, **fields):
    tokenizer = CharTokenizer(CHARS)
    torch.manual_seed(0)
    sizes = {} if family == "recurrent-seq2seq" else dict(d_model=16, n_heads=2, d_ff=32, n_layers=2, max_seq_len=48)
    config = ModelConfig(family=family, vocab_size=tokenizer.vocab_size, **sizes, **fields)
    tokenizer.save(directory / "tokenizer")
    save_model(build_model(config), config, directory)
    return directory


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {
        "decoder": _run(tmp_path_factory.mktemp("decoder"), "decoder"),
        "mlm": _run(tmp_path_factory.mktemp("mlm"), "encoder", encoder_head="mlm"),
        "classify": _run(tmp_path_factory.mktemp("classify"), "encoder", n_classes=2),
        "encoder-decoder": _run(tmp_path_factory.mktemp("seq2seq"), "encoder-decoder"),
        "recurrent": _run(tmp_path_factory.mktemp("recurrent"), "recurrent-seq2seq", cell="gru", hidden_size=8,
                          attention="luong-dot"),
        "bahdanau": _run(tmp_path_factory.mktemp("bahdanau"), "recurrent-seq2seq", cell="gru", hidden_size=8,
                         attention="bahdanau"),
        "tagger": _labelled(_run(tmp_path_factory.mktemp("tagger"), "encoder", encoder_head="tag", n_classes=3),
                            TAGS),
    }


TAGS = ["NOUN", "VERB", "ADJ"]


def _labelled(directory, labels):
    (directory / "labels.json").write_text(json.dumps({"labels": labels}))
    return directory


def _inspect(run, analysis, tmp_path, **fields):
    paths = run_inspect(InspectSettings(run=str(run), analysis=analysis, out=str(tmp_path), **fields))
    assert [p.name for p in paths] == [f"{analysis}.json", f"{analysis}.md", f"{analysis}.png"]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(paths[0].read_text())


@pytest.mark.parametrize("kind", ["decoder", "mlm", "classify", "encoder-decoder", "recurrent"])
def test_heads_on_every_family(runs, kind, tmp_path):
    text = "abc de\tcba ed" if kind in ("encoder-decoder", "recurrent") else "abc de fgh"
    report = _inspect(runs[kind], "heads", tmp_path, text=(text,))
    sites = [row["site"] for row in report["rows"]]
    assert sites == {"decoder": ["blocks.0.attn", "blocks.1.attn"], "mlm": ["blocks.0.attn", "blocks.1.attn"],
                     "classify": ["blocks.0.attn", "blocks.1.attn"], "recurrent": ["decoder.attn"],
                     "encoder-decoder": ["encoder.blocks.0.attn", "encoder.blocks.1.attn", "decoder.blocks.0.attn",
                                         "decoder.blocks.0.cross_attn", "decoder.blocks.1.attn",
                                         "decoder.blocks.1.cross_attn"]}[kind]
    assert report["summary"]["metric"] == ("KL from the model's output" if kind == "classify" else "loss change")


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder", "recurrent"])
def test_head_types_logit_lens_and_patching(runs, kind, tmp_path):
    translation = kind != "decoder"
    text, corrupt = ("abc de\tcba ed", "jih gf\tcba ed") if translation else ("abc de abc", "abc dj abc")
    types = _inspect(runs[kind], "head-types", tmp_path, text=(text,) if translation else ())
    assert {"site", "head", "type"} <= set(types["rows"][0])
    if kind == "recurrent":
        assert types["rows"][0]["monotonic"] is not None and types["rows"][0]["induction"] is None
        with pytest.raises(InputError, match="logit lens"):
            _inspect(runs[kind], "logit-lens", tmp_path, text=(text,))
    else:
        lens = _inspect(runs[kind], "logit-lens", tmp_path, text=(text,))
        last = [row for row in lens["rows"] if row["layer"] == "1 out"]
        assert last and all(row["rank of final"] == 0 for row in last)
    patched = _inspect(runs[kind], "patch", tmp_path, text=(text,), corrupt=corrupt)
    assert patched["summary"]["logit difference clean"] != patched["summary"]["logit difference corrupted"]


def test_probe_reads_a_conll_file(runs, tmp_path):
    conll = tmp_path / "words.conll"
    conll.write_text(CONLL)
    report = _inspect(runs["mlm"], "probe", tmp_path, conll=str(conll))
    assert [row["layer"] for row in report["rows"]] == ["blocks.0.resid_pre", "blocks.0.resid_post",
                                                         "blocks.1.resid_post"]
    assert all(0 <= row["accuracy"] <= 1 and row["control accuracy"] is not None for row in report["rows"])


@pytest.mark.parametrize(("fields", "message"), [
    (dict(analysis="heads"), "give --text TEXT"),
    (dict(analysis="patch", text=("abc",)), "--corrupt"),
    (dict(analysis="probe"), "--conll FILE"),
])
def test_missing_inputs_are_named_before_loading(runs, fields, message):
    with pytest.raises(InputError, match=message):
        run_inspect(InspectSettings(run=str(runs["decoder"]), **fields))


def test_patch_needs_inputs_of_one_length(runs, tmp_path):
    with pytest.raises(InputError, match="become 6 and 3 tokens; patching needs as many"):
        _inspect(runs["decoder"], "patch", tmp_path, text=("abc de",), corrupt="abc")
    with pytest.raises(InputError, match=r"become 7 \+ 7 and 7 \+ 3 tokens \(source \+ target\); patching needs"):
        _inspect(runs["encoder-decoder"], "patch", tmp_path, text=("abc de\tcba ed",), corrupt="jih gf\tcb")


def test_the_help_describes_every_analysis(capsys):
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse's lines joined
    missing = [a for a in typing.get_args(Analysis) if not re.search(rf"(?<![\w-]){re.escape(a)}: \w", shown)]
    assert not missing


def test_cli_inspect_prints_the_files(runs, tmp_path, capsys):
    assert main(["inspect", str(runs["decoder"]), "logit-lens", "--text", "abc de", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / f"logit-lens.{suffix}") for suffix in ("json", "md", "png")]


@pytest.mark.parametrize("kind", ["classify", "tagger", "bahdanau"])
def test_patch_reads_classes_tags_and_a_decoder_that_attends_step_by_step(runs, kind, tmp_path):
    # a classifier's logits are (B, C), no positions; a tagger's outputs are its tags; Bahdanau's decoder runs its
    # attention once per target step, so its point sees one position per call
    text, corrupt = ("abc de\tcba ed", "jih gf\tcba ed") if kind == "bahdanau" else ("abc de abc", "jih gf abc")
    report = _inspect(runs[kind], "patch", tmp_path, text=(text,), corrupt=corrupt)
    summary = report["summary"]
    if kind == "classify":
        assert summary["position"] == "the pooled sequence"
        assert {summary["answer"], summary["wrong"]} == {"class 0", "class 1"}
    if kind == "tagger":
        assert summary["answer"] in TAGS and summary["wrong"] in TAGS
    heads = [row for row in report["rows"] if " head " in row["patched"]]
    assert heads and all(row["restored"] is not None for row in heads)


def test_patch_warns_when_the_corruption_barely_moves_the_answer(runs, tmp_path):
    report = _inspect(runs["encoder-decoder"], "patch", tmp_path, text=("abc de\tcba ed",),
                      corrupt="abc dj\tcba ed")
    summary = report["summary"]
    gap = abs(summary["logit difference clean"] - summary["logit difference corrupted"])
    assert gap < 0.1  # an untrained model: a substituted letter hardly moves it
    assert "barely moves the answer" in summary["warning"]


def test_resample_ablation_draws_from_the_other_texts_and_refuses_one(runs, tmp_path):
    texts = ("abc de fgh", "hij ab", "fed cba jih gf")
    report = _inspect(runs["decoder"], "heads", tmp_path, text=texts, ablation="resample")
    scores = [value for row in report["rows"] for key, value in row.items() if key.startswith("head ")]
    assert any(abs(value) > 1e-4 for value in scores)  # a text resampled from itself changes nothing: all 0.0
    with pytest.raises(InputError, match="one text has no other"):
        _inspect(runs["decoder"], "heads", tmp_path, text=texts[:1], ablation="resample")


def _last_letter_conll(path):
    """Words of two letters whose tag is their last letter's (b: V, c: N), the first letter random."""
    generator = torch.Generator().manual_seed(3)
    lines = []
    for _ in range(60):
        for _ in range(4):
            first, last = "adefghij"[int(torch.randint(8, (), generator=generator))], "bc"[int(torch.randint(2, (),
                                                                                       generator=generator))]
            lines.append(f"{first}{last}\t{'V' if last == 'b' else 'N'}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_probe_reads_a_causal_models_words_at_their_last_piece(runs, tmp_path):
    # a character decoder's state at a word's first letter has not seen the letter that decides the tag
    report = _inspect(runs["decoder"], "probe", tmp_path, conll=str(_last_letter_conll(tmp_path / "w.conll")))
    assert report["summary"]["read at"] == "each word's last piece"
    embeddings = report["rows"][0]
    assert embeddings["layer"] == "blocks.0.resid_pre" and embeddings["accuracy"] > 0.9
    assert embeddings["control majority"] is not None


def test_a_head_that_looks_19_back_is_not_typed_induction(tmp_path):
    # one head built to attend exactly 19 positions back: on one period of 20 it lands on the induction key of every
    # repeated query, but at periods 13 and 8 it lands on none; the stream holds positions alone (one-hot rows)
    tokenizer = CharTokenizer(CHARS)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=64, n_heads=1, d_ff=8,
                         n_layers=1, max_seq_len=40, position="learned")
    model = build_model(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.stack.embeddings.positions.weight.copy_(torch.eye(40, 64))
        model.stack.blocks[0].attn_norm.weight.fill_(1.0)
        model.stack.blocks[0].self_attn.q_proj.weight.copy_(10 * torch.eye(64).roll(-19, dims=0))  # q_t = e_(t-19)
        model.stack.blocks[0].self_attn.k_proj.weight.copy_(torch.eye(64))
    tokenizer.save(tmp_path / "run" / "tokenizer")
    save_model(model, config, tmp_path / "run")
    report = _inspect(tmp_path / "run", "head-types", tmp_path)
    assert "20, 13, 8 tokens" in report["summary"]["inputs"]
    (row,) = report["rows"]
    assert row["type"] != "induction" and row["induction"] < 0.2
    one_period = head_types(model, repeated_tokens(range(2, 12), 20, batch=16,
                                                   generator=torch.Generator().manual_seed(0)))
    assert float(one_period.scores["induction"][0, 0]) > 0.5  # what one period of 20 alone made of it


# inputs checked before any work (the run, the device, the texts, the files), each refusal naming the fix ----------
@pytest.mark.parametrize(("where", "device", "message"), [
    ("missing", "cpu", "does not exist; give a run directory"),
    ("file", "cpu", "is a file; give a run directory"),
    ("run", "florb", "--device 'florb' is not a device torch knows"),
    ("run", "cuda:7", "--device cuda:7"),  # no CUDA here, or not 8 devices
])
def test_a_run_that_is_no_directory_or_a_device_there_is_not_is_refused_first(runs, tmp_path, where, device, message):
    (tmp_path / "file").write_text("not a run")
    run = {"missing": tmp_path / "missing", "file": tmp_path / "file", "run": runs["decoder"]}[where]
    with pytest.raises(AttnkitError, match=message):
        run_inspect(InspectSettings(run=str(run), analysis="heads", text=("abc",), device=device))


@pytest.fixture(scope="module")
def recurrent_lm(tmp_path_factory):
    directory, tokenizer = tmp_path_factory.mktemp("recurrent-lm"), CharTokenizer(CHARS)
    config = ModelConfig(family="recurrent-lm", vocab_size=tokenizer.vocab_size, cell="lstm", hidden_size=8)
    tokenizer.save(directory / "tokenizer")
    save_model(build_model(config), config, directory)
    return directory


@pytest.mark.parametrize("analysis", ["heads", "logit-lens", "patch", "head-types"])
def test_a_recurrent_lm_is_refused_naming_the_runs_inspect_reads(recurrent_lm, analysis):
    with pytest.raises(InputError, match="recurrent-lm run: it has no attention.*recurrent seq2seq with attention"):
        run_inspect(InspectSettings(run=str(recurrent_lm), analysis=analysis, text=("abc de",), corrupt="abc dj"))


def test_a_one_token_text_is_refused_naming_the_fix(runs):
    with pytest.raises(InputError, match="needs at least 2 tokens; this one has 1: give a longer text"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="heads", text=("a",)))


@pytest.mark.parametrize("analysis", ["logit-lens", "dla", "patch", "attribute"])
def test_a_decoders_answer_is_read_after_the_whole_text(runs, analysis, tmp_path):
    """A prompt's answer is the token after all of it (TransformerLens's `logits[:, -1]`): the analyses that read an
    answer read it at the text's last token, not at the one before (a next-token batch's last input)."""
    text, corrupt = "abc deabc d", "abc dgabc d"
    report = _inspect(runs["decoder"], analysis, tmp_path, text=(text,),
                      corrupt=corrupt if analysis in ("patch", "attribute") else None)
    model, tokenizer = load_model(runs["decoder"])[0].eval(), CharTokenizer.load(runs["decoder"] / "tokenizer")
    with torch.no_grad():
        after = model(torch.tensor([tokenizer.encode(text)])).logits[0, -1]  # (V,): what follows the whole text
    answer = tokenizer.pieces([int(after.argmax())])[0].replace("\n", "\\n")
    last = len(text) - 1
    if analysis == "logit-lens":
        final = [row for row in report["rows"] if row["layer"] == "1 out"]
        assert [row["token"] for row in final] == list(text)
        assert (final[-1]["position"], final[-1]["top"]) == (last, answer)
    elif analysis == "dla":
        assert (report["summary"]["position"], report["summary"]["answer"]) == (f"{last} (d)", answer)
    else:
        assert (report["summary"]["position"], report["summary"]["answer"]) == (last, answer)


@pytest.mark.parametrize("analysis", ["logit-lens", "dla", "patch", "attribute", "path-patch"])
def test_an_analysis_of_one_answer_refuses_several_texts(runs, analysis, tmp_path):
    with pytest.raises(InputError, match=f"{analysis} reads one text, and 2 were given: give one --text"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis=analysis, text=("abc de", "fgh ij"),
                                    corrupt="abc dj", sender=("0.0",), receiver="1.0", via="q", out=str(tmp_path)))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("kind", "analysis", "text", "message"), [
    ("decoder", "heads", "abcdefghij" * 5, "is 50 tokens, more than the 49 this run reads .max_seq_len 48, the last "
     "token only predicted.: shorten it, or split it in two"),
    ("decoder", "dla", "abcdefghij" * 5, "is 50 tokens, more than the 48 this run reads .max_seq_len 48.: shorten"),
    ("mlm", "heads", "abcdefghij" * 5, "is 50 tokens, more than the 46 this run reads .max_seq_len 48, with its start "
     "and end marks."),
    ("encoder-decoder", "heads", "abcdefghij" * 5 + "\tabc", "the source with EOS has 51 tokens; this model reads "
     "at most 48 .max_seq_len.: shorten it"),
    ("encoder-decoder", "logit-lens", "abc\t" + "abcdefghij" * 4 + "abcdefgh", "the target with BOS has 49 tokens; "
     "this model reads at most 48"),
])
def test_a_text_longer_than_the_run_reads_is_refused_not_cut(runs, kind, analysis, text, message, tmp_path):
    with pytest.raises(InputError, match=message):
        run_inspect(InspectSettings(run=str(runs[kind]), analysis=analysis, text=(text,), out=str(tmp_path)))


def test_head_types_refuses_texts_it_would_not_read(runs):
    with pytest.raises(InputError, match="repeated random tokens.*drop --text"):
        run_inspect(InspectSettings(run=str(runs["mlm"]), analysis="head-types", text=("abc de",)))


@pytest.mark.parametrize(("analysis", "reads"), [("circuits", "the weights"), ("probe", "--conll's sentences")])
def test_circuits_and_probe_refuse_texts_they_would_not_read(runs, analysis, reads, tmp_path):
    with pytest.raises(InputError, match=f"{analysis} reads {reads}, not --text or --input: drop them"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis=analysis, text=("abc de",), conll="x.conll",
                                    out=str(tmp_path)))
    assert not list(tmp_path.iterdir())


def test_a_probe_of_the_recurrent_seq2seq_names_the_runs_it_reads(runs, tmp_path):
    conll = tmp_path / "words.conll"
    conll.write_text(CONLL)
    with pytest.raises(InputError, match="RecurrentSeq2Seq has none: give a decoder, an encoder or an encoder-decod"):
        run_inspect(InspectSettings(run=str(runs["recurrent"]), analysis="probe", conll=str(conll),
                                    out=str(tmp_path / "out")))


def test_probe_refuses_a_file_that_is_not_conll_and_names_its_own_column_flag(runs, tmp_path):
    prose = tmp_path / "notes.txt"
    prose.write_text("def f(x):\n    return x + 1\n\nprint(f(2))\n")
    with pytest.raises(InputError, match="notes.txt:2: .* has 4 columns where line 1 has 2: this is not a CoNLL file"):
        run_inspect(InspectSettings(run=str(runs["mlm"]), analysis="probe", conll=str(prose)))
    conllu = tmp_path / "words.conllu"
    conllu.write_text("1\tab\tab\tNOUN\tNN\t_\t0\troot\t_\t_\n2\tcd\tcd\tVERB\tVB\t_\t1\tdep\t_\t_\n\n" * 8)
    with pytest.raises(InputError, match="no 'florb' value; choose the column of tags with --column ") as refusal:
        run_inspect(InspectSettings(run=str(runs["mlm"]), analysis="probe", conll=str(conllu), column="florb"))
    assert "--tag-column" not in str(refusal.value)
    conll = tmp_path / "words.conll"
    conll.write_text(CONLL)
    with pytest.raises(InputError, match="--column picks a CoNLL-U column, but .*words.conll is read as CoNLL"):
        run_inspect(InspectSettings(run=str(runs["mlm"]), analysis="probe", conll=str(conll), column="xpos"))


@pytest.mark.parametrize("kind", ["decoder", "classify", "tagger", "encoder-decoder", "bahdanau"])
def test_attribute_writes_patchings_tables_estimated(runs, kind, tmp_path):
    translation = kind in ("encoder-decoder", "bahdanau")
    text, corrupt = ("abc de\tcba ed", "jih gf\tcba ed") if translation else ("abc de abc", "jih gf abc")
    estimated = _inspect(runs[kind], "attribute", tmp_path, text=(text,), corrupt=corrupt)
    patched = _inspect(runs[kind], "patch", tmp_path, text=(text,), corrupt=corrupt)
    for key in ("answer", "wrong", "position"):
        assert estimated["summary"][key] == patched["summary"][key]
    assert estimated["summary"]["logit difference corrupted"] == pytest.approx(
        patched["summary"]["logit difference corrupted"], abs=1e-5)
    exact = {row["patched"] for row in patched["rows"]}
    assert exact <= {row["patched"] for row in estimated["rows"]}  # every patched part, and the sublayers beside
    assert "attribution patching" in estimated["summary"]["method"]


@pytest.mark.parametrize("kind", ["decoder", "mlm", "classify", "tagger", "encoder-decoder"])
def test_dla_splits_the_answers_logit_difference(runs, kind, tmp_path):
    text = "abc de\tcba ed" if kind == "encoder-decoder" else "abc de fgh"
    report = _inspect(runs[kind], "dla", tmp_path, text=(text,))
    summary = report["summary"]
    assert summary["sum of the shares"] == pytest.approx(summary["logit difference"], abs=1e-4)
    assert summary["logit difference"] >= 0  # the answer against its runner-up
    writers = [row["writer"] for row in report["rows"]]
    assert writers[:2] == ["embed", "pos_embed"] and writers[-1] == "bias" and any(" head " in w for w in writers)
    if kind == "tagger":
        assert summary["answer"] in TAGS


def test_dla_reads_a_position_from_the_end_and_names_the_range(runs, tmp_path):
    first = _inspect(runs["decoder"], "dla", tmp_path, text=("abc de",), position=-6)
    assert first["summary"]["position"] == "0 (a)"
    with pytest.raises(InputError, match=r"--position -7 is out of range: the text has 6 positions \(0..5, or -6..-1 "
                       "from the end"):
        _inspect(runs["decoder"], "dla", tmp_path, text=("abc de",), position=-7)


def test_dla_refuses_the_recurrent_seq2seq_with_the_reason(runs, tmp_path):
    with pytest.raises(InputError, match="tanh"):
        _inspect(runs["recurrent"], "dla", tmp_path, text=("abc de\tcba ed",))


def test_sae_refuses_a_classifier_before_training(runs, tmp_path):
    with pytest.raises(InputError, match="sae scores the model's loss with the SAE spliced in, and this encoder run "
                       "has no output layer over tokens to score .a classifier.: train it on a decoder"):
        run_inspect(InspectSettings(run=str(runs["classify"]), analysis="sae", text=("abc de",),
                                    point="blocks.0.resid_post", steps=3, out=str(tmp_path)))
    assert not (tmp_path / "sae").exists()


def _report(out):
    figure = Figure()
    figure.add_subplot().plot([0, 1])
    return write_report(out, "heads", title="t", rows=[{"site": "blocks.0.attn", "head 0": 0.5}], summary={"s": 1},
                        figure=figure)


def test_reports_are_readable_as_files_open_makes_them(tmp_path):
    """A report shared with others is readable by them: the mode open() gives (0666 less the umask), not 0600."""
    for path in _report(tmp_path / "out"):
        assert stat.S_IMODE(path.stat().st_mode) == file_mode(), path.name


def test_a_full_disk_is_one_error_naming_the_report_and_leaves_no_part(small_disk):
    (small_disk / "filler").write_bytes(b"x" * 60 * 1024)  # of 64 KiB: the picture cannot fit
    with pytest.raises(CheckpointError, match=r"heads\.(json|md|png).*(space|full)"):
        _report(small_disk)
    assert [p.name for p in small_disk.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_an_out_that_is_a_file_and_a_corruption_without_tokens_are_refused(runs, tmp_path):
    (tmp_path / "report").write_text("mine")
    with pytest.raises(InputError, match="report is a file, where the report's directory goes: give --out a dir"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="heads", text=("abc",),
                                    out=str(tmp_path / "report")))
    assert (tmp_path / "report").read_text() == "mine"
    with pytest.raises(InputError, match="becomes no tokens, and a prompt needs at least 1 token .*: give a longer"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="patch", text=("abc",), corrupt=""))


@pytest.mark.parametrize(("family", "record", "expected"), [
    ("tagger", {"task": "tag", "word_pieces": "own"}, "own"),  # trained on each word on its own, and said so
    ("tagger", {"task": "tag"}, "own"),  # trained before the layout was recorded: each word on its own
    ("tagger", None, "running"),  # converted from Hugging Face: no task.json
    ("decoder", {"task": "lm"}, "running"),  # a language model reads running text
])
def test_probe_reads_words_as_the_run_reads_them(family, record, expected, tmp_path, monkeypatch):
    import attnkit.inspect.command as command

    asked = []
    probe_layers = command.probe_layers
    monkeypatch.setattr(command, "probe_layers", lambda *args, word_pieces, **kwargs: asked.append(word_pieces) or
                        probe_layers(*args, word_pieces=word_pieces, **kwargs))
    fields = dict(encoder_head="tag", n_classes=3) if family == "tagger" else {}
    run = _run(tmp_path / "run", "encoder" if family == "tagger" else family, **fields)
    if record is not None:
        (run / "task.json").write_text(json.dumps(record))
    conll = tmp_path / "words.conll"
    conll.write_text(CONLL)
    _inspect(run, "probe", tmp_path / "out", conll=str(conll))
    assert asked == [expected]


def test_attribute_reads_a_translations_two_sides_at_their_own_lengths(runs, tmp_path):
    text, corrupt = "abc deabc\tcb", "jih gfabc\tcb"  # source 9 tokens + EOS, target BOS + 2: the sides' lengths differ
    report = _inspect(runs["encoder-decoder"], "attribute", tmp_path, text=(text,), corrupt=corrupt)
    positions = {}
    for row in report["rows"]:
        found = re.fullmatch(r"(\S+\.(?:attn|cross_attn|mlp)) position (\d+) \((.*)\)", row["patched"])
        if found:
            positions.setdefault(found[1], []).append(found[3])
    assert positions["encoder.blocks.0.attn"] == [*"abc deabc", "<eos>"]  # each row labelled by its own side's tokens
    assert positions["decoder.blocks.1.cross_attn"] == ["<bos>", "c", "b"]
    assert all(isinstance(row["restored"], float) and row["restored"] == row["restored"] for row in report["rows"])


def test_the_logit_lens_picture_writes_each_top_token_in_contrast_and_its_title_inside(runs, tmp_path, monkeypatch):
    """Each cell's top token is written as its number is, white on the dark end of the scale and black on the light
    (it was grey, which the dark cells hid), and the title stays inside the picture of a short text."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnkit.inspect import command

    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts) or [])
    run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="logit-lens", text=("abc",), out=str(tmp_path)))
    ((parts),) = drawn
    (ax, _colorbar) = parts["figure"].axes
    tops = {(row["layer"], row["position"]): (row["top"], row["p(final)"]) for row in parts["rows"]}
    layers = [label.get_text() for label in ax.get_yticklabels()]
    written = [t for t in ax.texts if not re.fullmatch(r"\d\.\d\d", t.get_text())]  # the tokens, not the numbers
    assert len(written) == len(tops)
    for text in written:
        x, y = text.get_position()
        token, p = tops[(layers[round(y - 0.3)], round(x))]
        assert text.get_text() == readable(token) and text.get_color() == ("white" if p < 0.5 else "black")
    parts["figure"].tight_layout()
    extent = ax.title.get_window_extent(FigureCanvasAgg(parts["figure"]).get_renderer())
    assert 0 <= extent.x0 and extent.x1 <= parts["figure"].bbox.width


def test_a_heatmap_writes_small_numbers_to_two_significant_digits():
    """A table of small changes (direct shares of a few thousandths) is written 0.0022 and -0.0044, where every cell
    read 0.00 or -0.00; numbers from 0.1 up keep two decimals."""
    from attnkit.inspect.report import heatmap

    small = heatmap(torch.tensor([[0.0022, -0.0044], [0.0003, 0.0]]), title="t", rows=["a", "b"],
                    columns=["0", "1"], xlabel="head", colorbar="c", centered=True)
    assert [t.get_text() for t in small.axes[0].texts] == ["0.0022", "-0.0044", "0.0003", "0.0000"]
    large = heatmap(torch.tensor([[1.234, -0.5]]), title="t", rows=["a"], columns=["0", "1"], xlabel="head",
                    colorbar="c")
    assert [t.get_text() for t in large.axes[0].texts] == ["1.23", "-0.50"]


@pytest.mark.parametrize("analysis", ["patch", "attribute"])
def test_a_corrupted_source_alone_is_read_under_the_clean_runs_target(runs, analysis, tmp_path):
    """Patching a translation changes the source alone: a --corrupt without a target is read under the clean line's
    target (given, or the clean source's own translation), where it was translated on its own, so the two runs'
    decoders read different tokens and every share mixed the source's effect with the target's."""
    run = runs["encoder-decoder"]
    alone = _inspect(run, analysis, tmp_path / "alone", text=("abc de\tcba ed",), corrupt="jih gf")
    given = _inspect(run, analysis, tmp_path / "given", text=("abc de\tcba ed",), corrupt="jih gf\tcba ed")
    assert alone["summary"] == {**given["summary"], "corrupted": "jih gf"}
    assert alone["rows"] == given["rows"]
    settings = InspectSettings(run=str(run), analysis=analysis, text=("hgf",), corrupt="hga")  # both translated
    from attnkit.inspect.command import Loaded, pair_of
    from attnkit.tokenize import load_tokenizer

    model, _ = load_model(run)
    loaded = Loaded(model.eval(), load_tokenizer(run / "tokenizer"), "encoder-decoder", 48, torch.device("cpu"))
    pair = pair_of(loaded, settings)
    assert torch.equal(pair.clean.args[1], pair.corrupted.args[1])
    assert torch.equal(pair.clean.labels, pair.corrupted.labels)
    assert not torch.equal(pair.clean.args[0], pair.corrupted.args[0])


def test_answer_and_wrong_name_the_logit_difference_read(runs, tmp_path):
    """--answer and --wrong pick the logit difference patch and dla read (TransformerLens's answer and wrong tokens,
    as in the IOI task), instead of the clean answer against the corrupted one (patch) or the runner-up (dla)."""
    from attnkit.inspect.inputs import Batch
    from attnkit.inspect.patching import patch_stream

    run = runs["decoder"]
    model, _ = load_model(run)
    model.eval()
    tokenizer = CharTokenizer(CHARS)
    a, w = tokenizer.encode("d")[0], tokenizer.encode("j")[0]
    ids, corrupt = (torch.tensor([tokenizer.encode(t)]) for t in ("abc de abc", "jih gf abc"))
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    dla = _inspect(run, "dla", tmp_path, text=("abc de abc",), answer="d", wrong="j")
    assert (dla["summary"]["answer"], dla["summary"]["wrong"]) == ("d", "j")
    assert dla["summary"]["logit difference"] == pytest.approx(float(logits[a] - logits[w]), abs=1e-5)
    patched = _inspect(run, "patch", tmp_path, text=("abc de abc",), corrupt="jih gf abc", answer="d", wrong="j")
    expected = patch_stream(model, Batch((ids,)), Batch((corrupt,)), answer=a, wrong=w)
    rows = [r["restored"] for r in patched["rows"] if " in position " in r["patched"]]  # the stream entering each block
    assert rows == pytest.approx(expected.restored.flatten().tolist(), abs=1e-4)
    with pytest.raises(InputError, match="--answer 'de' becomes 2 tokens .'d', 'e'.; an answer is one token"):
        _inspect(run, "dla", tmp_path, text=("abc",), answer="de")
    for analysis, extra in (("dla", {}), ("patch", {"corrupt": "abd"})):  # read as <unk>, scored as <unk>'s logit
        with pytest.raises(InputError, match="--answer '€' is not in this run's vocabulary: its tokenizer reads it as "
                           "the unknown token"):
            _inspect(run, analysis, tmp_path, text=("abc",), answer="€", **extra)
    with pytest.raises(InputError, match="--wrong '€' is not in this run's vocabulary"):
        _inspect(run, "dla", tmp_path, text=("abc",), wrong="€")
    with pytest.raises(InputError, match="--wrong 'maybe' is none of this run's labels: NOUN, VERB, ADJ"):
        _inspect(runs["tagger"], "dla", tmp_path, text=("abc",), wrong="maybe")
    with pytest.raises(InputError, match="heads reads none: drop them"):
        _inspect(run, "heads", tmp_path, text=("abc",), answer="d")


def test_the_probe_picture_names_the_column_only_of_a_conllu_file(runs, tmp_path, monkeypatch):
    """A CoNLL file's labels are each line's last column, whatever --column says (its default is upos): the title
    said 'upos of words.conll' for any such file."""
    from attnkit.inspect import command

    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts["figure"]) or [])
    conll = tmp_path / "words.conll"
    conll.write_text(CONLL)
    run_inspect(InspectSettings(run=str(runs["mlm"]), analysis="probe", conll=str(conll), out=str(tmp_path)))
    assert drawn[0].axes[0].get_title() == "linear probes: labels of words.conll"


def test_a_converted_models_text_is_framed_as_it_learned_to_read_one(tmp_path, monkeypatch):
    """A converted Llama (its tokenizer starts every text with BOS) was read by the logit lens and the patchings
    without it, unlike generation and TransformerLens; a converted GPT-2 tagger (hf_source.json, no task.json) read
    BOS ... EOS it never saw. A converted Llama's prompt starts with BOS; the tagger's text is its tokens alone."""
    import attnkit.inspect.command as command
    from attnkit.inspect.command import Loaded, text_batch

    tokenizer = CharTokenizer(CHARS)
    tokenizer.starts_with_bos = True
    model = build_model(ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2,
                                    d_ff=32, n_layers=1, max_seq_len=4)).eval()
    loaded = Loaded(model, tokenizer, "decoder", 4, torch.device("cpu"))
    assert text_batch(loaded, "abc", prompt=True).args[0][0].tolist() == [tokenizer.bos_id, *tokenizer.encode("abc")]
    assert text_batch(loaded, "abc").args[0][0].tolist() == [tokenizer.bos_id, *tokenizer.encode("ab")]
    with pytest.raises(InputError, match="is 4 tokens, more than the 3 this run reads .*after BOS"):
        text_batch(loaded, "abcd", prompt=True)
    run = _run(tmp_path / "tagger", "decoder", decoder_head="tag", n_classes=3)
    (run / "hf_source.json").write_text(json.dumps({"model_type": "gpt2"}))
    read = []
    batch_of = command.text_batch
    monkeypatch.setattr(command, "text_batch",
                        lambda *args, **kwargs: read.append(batch_of(*args, **kwargs)) or read[-1])
    _inspect(run, "heads", tmp_path / "out", text=("abc de",))
    assert read[0].args[0][0].tolist() == tokenizer.encode("abc de")


def test_an_answer_and_wrong_of_one_output_are_refused_by_id_naming_the_models_top(runs, tmp_path):
    """--wrong naming the model's own top answer gave dla a difference of 0.0 unsaid and patch a failure naming
    another cause; two texts of one id ('x' and 'y', both UNK) passed the check by string (they are now refused before
    it, as not in the vocabulary). With --answer alone, dla's summary named the model's top 'runner-up'."""
    run = runs["decoder"]
    model, _ = load_model(run)
    tokenizer = CharTokenizer(CHARS)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([tokenizer.encode("abc de abc")])).logits[0, -1]  # (V,)
    top = tokenizer.pieces([int(logits.argmax())])[0]
    named = re.escape(repr(top))
    for analysis, extra in (("dla", {}), ("patch", {"corrupt": "jih gf abc"})):
        with pytest.raises(InputError, match=f"--wrong {named} is the same output as the model's top answer here "
                                             f"\\({named}\\), so their logit difference is 0: .* is {named}"):
            _inspect(run, analysis, tmp_path, text=("abc de abc",), wrong=top, **extra)
    with pytest.raises(InputError, match="--wrong 'a' is the same output as --answer 'a' .*, so their logit diff"):
        _inspect(run, "dla", tmp_path, text=("abc de abc",), answer="a", wrong="a")
    other = "j" if top != "j" else "i"
    summary = _inspect(run, "dla", tmp_path, text=("abc de abc",), answer=other)["summary"]
    assert summary["wrong"] == top and "runner-up" not in summary


def test_a_named_difference_is_read_where_it_moves_or_at_the_position_given(runs, tmp_path):
    """A tagger's named difference was read at the position whose whole distribution the corruption moved most
    (KL), wherever the named labels moved: it is read where their difference moves most, or at --position; a
    classifier's is its pooled logits' (patch_stream's)."""
    from attnkit.inspect.inputs import Batch
    from attnkit.inspect.patching import patch_stream

    tokenizer = CharTokenizer(CHARS)
    model, _ = load_model(runs["tagger"])
    clean, corrupt = ([tokenizer.cls_id, *tokenizer.encode(t), tokenizer.sep_id] for t in ("abc de", "jih gf"))
    with torch.no_grad():
        logits, corrupted = (model.eval()(torch.tensor([ids])).logits[0] for ids in (clean, corrupt))  # (T, 3)
    difference, corrupted_difference = logits[:, 1] - logits[:, 2], corrupted[:, 1] - corrupted[:, 2]  # VERB - ADJ
    moved = int((difference - corrupted_difference).abs().argmax())
    assert moved != int(torch.nn.functional.kl_div(corrupted.log_softmax(-1), logits.log_softmax(-1), log_target=True,
                                                   reduction="none").sum(-1).argmax())  # the KL's position is another
    for position, expected in ((None, moved), (2, 2)):
        summary = _inspect(runs["tagger"], "patch", tmp_path, text=("abc de",), corrupt="jih gf", answer="VERB",
                           wrong="ADJ", position=position)["summary"]
        assert summary["position"] == expected
        assert summary["logit difference clean"] == pytest.approx(float(difference[expected]), abs=1e-5)
    model, _ = load_model(runs["classify"])
    ids, corrupted_ids = (torch.tensor([[tokenizer.cls_id, *tokenizer.encode(t), tokenizer.sep_id]])
                          for t in ("abc de", "jih gf"))
    patched = _inspect(runs["classify"], "patch", tmp_path, text=("abc de",), corrupt="jih gf", answer="class 1",
                       wrong="class 0")
    expected = patch_stream(model.eval(), Batch((ids,)), Batch((corrupted_ids,)), answer=1, wrong=0)
    rows = [r["restored"] for r in patched["rows"] if " in position " in r["patched"]]  # the stream entering each block
    assert rows == pytest.approx(expected.restored.flatten().tolist(), abs=1e-4)


def test_the_logit_lens_picture_draws_a_space_visibly(tmp_path, monkeypatch):
    """A top token that is a space was drawn blank in its cell and on the axis: it is drawn '␣', as viz draws it;
    the table keeps the token itself."""
    from attnkit.inspect import command

    tokenizer = CharTokenizer(" abcdefghij.")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                         n_layers=1, max_seq_len=16)
    model = build_model(config)
    with torch.no_grad():
        model.stack.final_norm.weight.zero_()  # every position's normed stream is the norm's bias, ones
        model.stack.final_norm.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.encode(" ")[0]] = 1.0  # the space the one logit above 0, everywhere
    tokenizer.save(tmp_path / "tokenizer")
    save_model(model, config, tmp_path)
    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts) or [])
    run_inspect(InspectSettings(run=str(tmp_path), analysis="logit-lens", text=("a b",), out=str(tmp_path / "out")))
    ((parts),) = drawn
    (ax, _colorbar) = parts["figure"].axes
    assert {row["top"] for row in parts["rows"]} == {" "}
    written = [t.get_text() for t in ax.texts if not re.fullmatch(r"\d\.\d\d", t.get_text())]
    assert written == ["␣"] * len(parts["rows"])
    assert [label.get_text() for label in ax.get_xticklabels()] == ["a", "␣", "b"]


def test_a_heatmap_never_writes_minus_zero_and_a_long_stream_gets_room_for_its_numbers(runs, tmp_path, monkeypatch):
    """A scale reaching 0.1 and more wrote -0.001 as '-0.00'; a translation's attribution picture of 13 stream
    columns put them in half a figure sized for both tables, so their numbers ran into each other."""
    from attnkit.inspect import command
    from attnkit.inspect.report import heatmap

    written = heatmap(torch.tensor([[1.234, -0.001]]), title="t", rows=["a"], columns=["0", "1"], xlabel="head",
                      colorbar="c", centered=True)
    assert [t.get_text() for t in written.axes[0].texts] == ["1.23", "0.00"]
    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts) or [])
    run_inspect(InspectSettings(run=str(runs["encoder-decoder"]), analysis="attribute", out=str(tmp_path),
                                text=("abc de fgh ab\tcba ed fg hij",), corrupt="jih gf edc ba"))
    figure = drawn[0]["figure"]
    stream = figure.axes[0]
    columns = len(stream.get_xticklabels())
    assert columns >= 13
    assert stream.get_position().width * figure.get_figwidth() / columns >= 0.45  # inches per column


def test_answer_and_wrong_are_encoded_once_however_many_positions_are_weighed(runs, tmp_path, monkeypatch):
    """An encoder's patch weighs the named difference at every position: --answer and --wrong were encoded again at
    each, and once more for the position chosen; they are encoded once."""
    encoded: list[str] = []
    encode = CharTokenizer.encode
    monkeypatch.setattr(CharTokenizer, "encode",
                        lambda self, text, **kw: encoded.append(text) or encode(self, text, **kw))
    report = _inspect(runs["mlm"], "patch", tmp_path, text=("abc de",), corrupt="jih gf", answer="d", wrong="j")
    assert (report["summary"]["answer"], report["summary"]["wrong"]) == ("d", "j")
    assert (encoded.count("d"), encoded.count("j")) == (1, 1)


def test_a_probe_reads_the_runs_task_json_once(runs, tmp_path, monkeypatch):
    """The run's task.json says both how a text is framed and how a probe's words become pieces: it is read once."""
    from attnkit.inspect import command

    read: list[str] = []
    record = command.task_record
    monkeypatch.setattr(command, "task_record", lambda directory: read.append(str(directory)) or record(directory))
    conll = tmp_path / "words.conll"
    conll.write_text(CONLL)
    _inspect(runs["mlm"], "probe", tmp_path / "out", conll=str(conll))
    assert read == [str(runs["mlm"])]


@pytest.mark.parametrize("kind", ["classify", "mlm"])
def test_a_text_the_tokenizer_drops_whole_is_refused_naming_its_characters(runs, kind, tmp_path):
    """A text whose every character the tokenizer skips was read as its marks alone, CLS SEP: head importance was
    reported on no text."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "model.safetensors", "checksums.json"):
        (run / name).write_bytes((runs[kind] / name).read_bytes())
    CharTokenizer(CHARS, unknown="skip").save(run / "tokenizer")
    with pytest.raises(InputError, match=r"the text \('ZZZ'\) has no token: .*unknown characters 'Z' skipped"):
        run_inspect(InspectSettings(run=str(run), analysis="heads", text=("ZZZ",), out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("specials", "marks"), [
    (None, "<cls> ... <sep>"),  # attnkit's char tokenizer: CLS and SEP
    (["pad", "bos", "eos", "unk", "mask"], "<bos> ... <eos>"),  # no CLS or SEP: an encoder reads BOS ... EOS
])
def test_head_types_reads_an_encoder_between_the_marks_it_learned(tmp_path, specials, marks):
    """Block 0's head 0 looks for the first mark by content (its key is the normalised mark's embedding, its query a
    constant), as BERT's heads look at [CLS]: scored on tokens framed as the encoder reads a text it puts its weight
    there (first and separator near 1); read without the marks, as before, it had nothing to find."""
    tokenizer = CharTokenizer(CHARS, special_tokens=specials)
    config = ModelConfig(family="encoder", encoder_head="mlm", vocab_size=tokenizer.vocab_size, d_model=16,
                         n_heads=2, d_ff=32, n_layers=1, max_seq_len=48)
    torch.manual_seed(0)
    model = build_model(config)
    mark = tokenizer.cls_id if specials is None else tokenizer.bos_id
    attention, norm = model.stack.blocks[0].self_attn, model.stack.blocks[0].attn_norm
    with torch.no_grad():
        model.stack.embeddings.positions.weight.zero_()  # the head finds the mark by what it is, not where
        key = norm(model.stack.embeddings.token.weight[mark])  # the mark as the head reads it, norm sqrt(16)
        attention.q_proj.weight.zero_()
        attention.q_proj.bias.zero_()
        attention.q_proj.bias[0] = 10.0  # head 0's query: a constant
        attention.k_proj.weight.zero_()
        attention.k_proj.bias.zero_()
        attention.k_proj.weight[0] = key / key.norm()  # head 0's key: the token's likeness to the mark
    tokenizer.save(tmp_path / "run" / "tokenizer")
    save_model(model, config, tmp_path / "run")
    report = _inspect(tmp_path / "run", "head-types", tmp_path)
    head = next(row for row in report["rows"] if row["head"] == 0)
    assert head["first"] > 0.9 and head["separator"] > 0.9 and head["type"] == "separator"
    assert f"framed {marks}" in report["summary"]["inputs"]
    other = next(row for row in report["rows"] if row["head"] == 1)
    assert other["separator"] < 0.5 and other["type"] != "separator"


def test_patch_writes_each_blocks_input_attention_and_ffn_by_position(runs, tmp_path):
    """Beside the stream entering each block, patch writes its attention's and FFN's outputs position by position
    (TransformerLens's get_act_patch_block_every): the last block writes nothing a later position reads, so patched
    anywhere but where the answer is read it restores nothing; the stream entering block 0 at the one corrupted
    position the answer reads restores all of it, and after the read position nothing."""
    report = _inspect(runs["decoder"], "patch", tmp_path, text=("abc de abc",), corrupt=("abc dj abj"),
                      position=8)
    restored = {row["patched"]: row["restored"] for row in report["rows"]}
    for sublayer in ("blocks.1.attn", "blocks.1.mlp"):
        others = [restored[f"{sublayer} position {t} ({c})"] for t, c in enumerate("abc de a")]
        assert others == [0.0] * 8, sublayer
        assert f"{sublayer} position 8 (b)" in restored
    assert restored["blocks.0 in position 5 (e)"] == pytest.approx(1.0, abs=1e-4)
    assert restored["blocks.0 in position 9 (c)"] == 0.0  # after the read position: nothing flows back


def test_a_long_texts_tables_are_drawn_in_panels_of_readable_width(runs, tmp_path):
    """A long text's logit lens and patching tables are cut into panels of at most WRAP positions stacked one under
    another (a 100-token text drew a picture 60 inches wide and an inch tall), each labelled with its positions."""
    from attnkit.inspect.report import WRAP, position_spans

    assert [(s.start, s.stop) for s in position_spans(100)] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert position_spans(WRAP) == [range(WRAP)] and position_spans(WRAP + 1) == [range(17), range(17, 33)]
    text = "abc de fgh ij " * 3 + "abc"  # 45 tokens: two panels
    for analysis, fields in (("logit-lens", {}), ("patch", {"corrupt": text.replace("fgh", "fgj", 1)})):
        _inspect(runs["decoder"], analysis, tmp_path, text=(text,), **fields)
        width, height = (int.from_bytes((tmp_path / f"{analysis}.png").read_bytes()[at:at + 4], "big")
                         for at in (16, 20))  # the PNG header's size in pixels
        assert width < 2400 and height > 400, analysis  # one panel of 45 positions was 3,000 pixels wide


def test_patch_by_position_patches_each_head_at_each_position_alone(runs, tmp_path):
    """--by-position adds each head's output patched at each position alone (TransformerLens's
    get_act_patch_attn_head_out_by_pos): the last layer's heads write only where the answer is read, so there each
    restores what it restores patched at every position, and elsewhere nothing; other analyses and translations
    refuse the option."""
    report = _inspect(runs["decoder"], "patch", tmp_path, text=("abc de abc",), corrupt="jih gf abc",
                      by_position=True)
    restored = {row["patched"]: row["restored"] for row in report["rows"]}
    for head in range(2):
        assert restored[f"blocks.1.attn head {head} position 9 (c)"] == restored[f"blocks.1.attn head {head}"]
        assert [restored[f"blocks.1.attn head {head} position {t} ({c})"] for t, c in enumerate("abc de ab")] == (
            [0.0] * 9)
    assert len([name for name in restored if name.startswith("blocks.0.attn head 1 position")]) == 10
    with pytest.raises(InputError, match="each head at each position, which patch and attribute do"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="dla", text=("abc",), by_position=True))
    for analysis, function in (("patch", "patching.patch_heads"), ("attribute", "attribution.attribute_heads")):
        with pytest.raises(InputError, match=f"a translation's heads read two of different lengths: drop it "
                                             rf"\(attnkit.inspect.{function}\(\.\.\., by_position=True\)"):
            run_inspect(InspectSettings(run=str(runs["encoder-decoder"]), analysis=analysis, text=("abc\tcb",),
                                        corrupt="jih\tcb", by_position=True))


def test_patch_and_attribute_read_each_heads_queries_keys_values_or_pattern_by_point(runs, tmp_path):
    """--point q|k|v|pattern patches each head's queries, keys, values or pattern in place of its output, in patch
    and in attribute (rows `blocks.1.attn.q head 0`): the last layer's queries and pattern matter only where the
    answer is read, so there each restores what it restores at every position and elsewhere nothing; attribute's
    estimate is a sum over cells, so each head's shares position by position add up to its share over all positions.
    A point that is no part of a head, or --point for an analysis that patches none, is refused."""
    text, corrupt = "abc de abc", "jih gf abc"
    for point in ("q", "pattern"):
        report = _inspect(runs["decoder"], "patch", tmp_path, text=(text,), corrupt=corrupt, by_position=True,
                          point=point)
        restored = {row["patched"]: row["restored"] for row in report["rows"]}
        assert report["summary"]["heads"].startswith(f"{point}: each head's")
        for head in range(2):
            name = f"blocks.1.attn.{point} head {head}"
            assert restored[f"{name} position 9 (c)"] == pytest.approx(restored[name], abs=1e-4), point
            assert [restored[f"{name} position {t} ({c})"] for t, c in enumerate("abc de ab")] == [0.0] * 9, point
        assert "blocks.1.attn head 0" not in restored  # the outputs are not what was patched
    for point in ("z", "k"):
        report = _inspect(runs["decoder"], "attribute", tmp_path, text=(text,), corrupt=corrupt, by_position=True,
                          point=point)
        restored = {row["patched"]: row["restored"] for row in report["rows"]}
        for layer in range(2):
            name = f"blocks.{layer}.attn{'' if point == 'z' else f'.{point}'} head 1"
            each = [restored[f"{name} position {t} ({c})"] for t, c in enumerate(text)]
            assert sum(each) == pytest.approx(restored[name], abs=1e-3), (point, layer)
        assert any(abs(value) > 0.01 for value in restored.values()), point
    with pytest.raises(InputError, match="--point 'o': patch patches each head's z .*give one of those"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="patch", text=(text,), corrupt=corrupt,
                                    point="o"))
    with pytest.raises(InputError, match="--point names what sae reads.*heads reads none: drop it"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="heads", text=(text,), point="q"))


def test_tuned_lens_trains_saves_and_reads_back_its_lens(runs, tmp_path):
    """tuned-lens trains a translator per layer on the texts but every tenth, scores both lenses' KL per layer on
    those held out, and saves the lens to OUT/tuned-lens; --lens reads it back (checked against the run) to the same
    scores; a damaged lens, or --lens for another analysis, is refused."""
    texts = tuple(f"abc de {c}{c} fgh" for c in "abcdefghij ")  # 11 texts: the 1st and the 11th held out
    report = _inspect(runs["decoder"], "tuned-lens", tmp_path / "a", text=texts, steps=20)
    summary = report["summary"]
    assert summary["lens"] == "trained 20 steps on 9 texts" and summary["KL scored on"].startswith("2 held-out texts")
    logit, tuned = (list(map(float, summary[f"KL {name} (nats/token, per layer)"].split(", ")))
                    for name in ("logit lens", "tuned lens"))
    assert len(logit) == len(tuned) == 3 and logit[-1] == tuned[-1] == 0.0 and logit[:2] != tuned[:2]
    saved = tmp_path / "a" / "tuned-lens"
    assert summary["saved"] == str(saved) and {p.name for p in saved.iterdir()} == {"tuned_lens.json",
                                                                                   "tuned_lens.safetensors"}
    again = _inspect(runs["decoder"], "tuned-lens", tmp_path / "b", text=texts, lens=str(saved))["summary"]
    assert again["lens"] == f"read from {saved}" and "saved" not in again
    assert again["KL tuned lens (nats/token, per layer)"] == summary["KL tuned lens (nats/token, per layer)"]
    (saved / "tuned_lens.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="tuned_lens.safetensors"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="tuned-lens", text=texts, lens=str(saved),
                                    out=str(tmp_path / "c")))
    with pytest.raises(InputError, match="--lens names a saved tuned lens, which tuned-lens alone reads"):
        run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="logit-lens", text=texts, lens=str(saved)))
    # --steps where nothing is trained was ignored: refused before the model loads
    for analysis, lens, why in (("tuned-lens", str(saved), "--lens reads a lens trained before"),
                                ("logit-lens", None, "logit-lens trains none")):
        with pytest.raises(InputError, match=f"--steps counts the training steps of sae and tuned-lens; {why}"):
            run_inspect(InspectSettings(run=str(runs["decoder"]), analysis=analysis, text=texts, lens=lens, steps=9))


def test_tuned_lens_trains_the_papers_250_steps_unless_told_and_reports_no_kl_below_zero(runs, tmp_path,
                                                                                          monkeypatch):
    """Without --steps, tuned-lens trains the paper's 250 steps (--steps's default was sae's 500, twice the paper's
    schedule); a held-out KL that rounds below 0, or is -0.0, reads 0.0 (the report showed '-0.0')."""
    import attnkit.inspect.command as command

    trained = []
    train = command.train_tuned_lens
    monkeypatch.setattr(command, "train_tuned_lens", lambda *args, steps, **kwargs: trained.append(steps) or train(
        *args, steps=1, **kwargs))
    monkeypatch.setattr(command, "lens_divergences", lambda *args: torch.tensor([0.5, -1e-9, -0.0]))
    summary = _inspect(runs["decoder"], "tuned-lens", tmp_path, text=("abc de ab", "ab cd"))["summary"]
    assert trained == [250] and summary["lens"] == "trained 250 steps on 1 texts"
    assert json.loads((tmp_path / "tuned-lens" / "tuned_lens.json").read_text())["steps"] == 250
    assert summary["KL tuned lens (nats/token, per layer)"] == "0.5, 0.0, 0.0"


def test_tuned_lens_picture_says_what_its_kl_was_scored_on(runs, tmp_path, monkeypatch):
    """The KL panel's title and the saved lens's record name the held-out texts the KL was scored on, and with a
    single text say that text was trained on and none held out (the title read 'on the held-out texts' for one text
    scored on itself)."""
    import attnkit.inspect.command as command

    titles = []
    write = command.write_report
    monkeypatch.setattr(command, "write_report", lambda *args, figure, **kwargs: titles.append(
        figure.axes[0].get_title()) or write(*args, figure=figure, **kwargs))
    texts = tuple(f"abc de {c}{c} fgh" for c in "abcdefghij ")  # 11 texts: the 1st and the 11th held out
    _inspect(runs["decoder"], "tuned-lens", tmp_path / "many", text=texts, steps=2)
    _inspect(runs["decoder"], "tuned-lens", tmp_path / "one", text=texts[:1], steps=2)
    assert titles[0].endswith("on 2 held-out texts")
    assert "held-out" not in titles[1] and titles[1].endswith("on the one text it was trained on (none held out)")
    for out, scored_on in (("many", "2 held-out texts"), ("one", "the one text it was trained on (none held out)")):
        record = json.loads((tmp_path / out / "tuned-lens" / "tuned_lens.json").read_text())
        assert record["KL scored on"] == scored_on and set(record["KL"]) == {"logit lens", "tuned lens"}
        assert not any("held-out" in key for key in record)  # the KL's key said "held-out" where none was


def test_head_types_draws_its_random_tokens_from_text_never_a_converted_tokenizers_special_token(tmp_path,
                                                                                                monkeypatch):
    """A converted tokenizer marks more tokens special than attnkit's roles name (a chat model's <|im_start|> and
    <|im_end|>): head-types drew them among its random 'text' tokens, where no text ever puts them; nor does text put
    a vocabulary's placeholders (BERT's [unused0], not marked special). Its vocabulary is every id but those, and a
    Llama-style tokenizer's BOS frames each sequence: its only mark is the first token, so `separator` (the weight on
    BOS, `first`'s again) is not scored, and the summary says why."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    import attnkit.inspect.command as command
    from attnkit.tokenize import HFTokenizer

    words = ["<pad>", "<s>", "</s>", "<unk>", "[unused0]", "[unused1]", *(f"w{i}" for i in range(12))]
    reference = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    reference.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    reference.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"])
    reference.add_tokens(["hello"])  # an added token that is text: it may be drawn
    reference.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    (tmp_path / "hf").mkdir()
    reference.save(str(tmp_path / "hf" / "tokenizer.json"))
    tokenizer = HFTokenizer.from_dir(tmp_path / "hf")
    chat = {reference.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")}
    assert tokenizer.special_ids == {0, 1, 2, 3, *chat} and tokenizer.starts_with_bos
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                         n_layers=1, max_seq_len=48)
    torch.manual_seed(0)
    tokenizer.save(tmp_path / "run" / "tokenizer")
    save_model(build_model(config), config, tmp_path / "run")
    drawn = []
    scored = command.repeat_types
    monkeypatch.setattr(command, "repeat_types", lambda model, vocab, **kwargs: drawn.append((vocab, kwargs["frame"]))
                        or scored(model, vocab, **kwargs))
    report = _inspect(tmp_path / "run", "head-types", tmp_path / "out")
    vocabulary, frame = drawn[0]
    assert sorted(vocabulary) == sorted(set(range(tokenizer.vocab_size)) - tokenizer.special_ids - {4, 5})
    assert reference.token_to_id("hello") in vocabulary and frame == ([1], [])
    assert "framed <s> ..." in report["summary"]["inputs"]
    assert "separator" not in report["summary"]["types"].split(", ") and "first" in report["summary"]["types"]
    assert "separator not scored: the only mark, <s>, is the first token" in report["summary"]["inputs"]


def test_the_head_table_beside_a_long_texts_panels_keeps_the_height_its_rows_need(runs, tmp_path, monkeypatch):
    """The head table stood beside every panel of a long text's tables: two rows of heads stretched down a picture
    of eight panels, each cell taller than a panel. It stands beside the first panels it needs."""
    from attnkit.inspect import command

    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts) or [])
    text = ("abc de fgh ij " * 3)[:40]  # two panels a table, four with --by-position
    run_inspect(InspectSettings(run=str(runs["decoder"]), analysis="patch", text=(text,),
                                corrupt=text.replace("d", "j", 1), by_position=True, out=str(tmp_path)))
    figure = drawn[0]["figure"]
    heads = next(ax for ax in figure.axes if ax.get_title() == "head outputs patched")
    panels = [ax for ax in figure.axes if ax.get_xlabel().startswith("positions")]
    assert len(panels) == 4
    assert heads.get_position().height < 0.5 * (panels[0].get_position().y1 - panels[-1].get_position().y0)
    assert heads.get_position().y1 == pytest.approx(panels[0].get_position().y1, abs=0.02)  # at the top, beside them
