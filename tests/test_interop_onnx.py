"""`attnkit convert RUN --to-onnx DIR`: the graph run by onnxruntime gives attnkit's numbers, at batch sizes and
lengths other than the ones it was exported with: decoders through their past keys/values step by step, encoders
with padding (classification, token tagging, embeddings); and the folder alone, read with onnxruntime and
`tokenizers` only, labels texts as `attnkit classify` does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from export_runs import ENCODERS, LAYOUTS, random_run

from attnkit.checkpoint import load_model
from attnkit.cli import main
from attnkit.errors import ConfigError, InputError
from attnkit.generate.pipeline import load
from attnkit.interop.onnx import convert_to_onnx

ort = pytest.importorskip("onnxruntime", reason="the ONNX tests run the graph in onnxruntime (pip install "
                                                 "'attnkit[export]')")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")

TOLERANCE = 1e-4  # relative to the largest logit


def _close(theirs: np.ndarray, ours: torch.Tensor) -> None:
    ours = ours.detach().numpy()
    assert theirs.shape == ours.shape
    assert np.abs(theirs - ours).max() <= TOLERANCE * np.abs(ours).max()


def test_decoder_steps_through_its_past_keys_and_values(tmp_path, capsys):
    run = random_run(tmp_path, {**LAYOUTS["llama-gqa-untied"], "n_kv_heads": 2})
    out = tmp_path / "exported"
    assert main(["convert", str(run), "--to-onnx", str(out)]) == 0
    assert f"wrote {out / 'model.onnx'}: decoder" in capsys.readouterr().out
    runtime = json.loads((out / "runtime.json").read_text())
    assert runtime["past"] == {"n_layers": 2, "n_kv_heads": 2, "head_dim": 16, "empty_shape": ["batch", 2, 0, 16]}
    assert runtime["text"]["adds"] == []  # a decoder's prompt is its own tokens
    model, config = load_model(run)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    dims = {i.name: i.shape for i in session.get_inputs()}
    assert dims["input_ids"] == ["batch", "sequence"]
    assert dims["past_key_values.1.value"] == ["batch", 2, "past_sequence", 16]
    assert [o.name for o in session.get_outputs()][:3] == ["logits", "present.0.key", "present.0.value"]

    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (2, 6), generator=generator)  # batch and length unlike the export's
    empty = np.zeros((2, 2, 0, 16), dtype=np.float32)
    feed = {"input_ids": prompt.numpy(), "attention_mask": np.ones((2, 6), dtype=np.int64)}
    feed |= {f"past_key_values.{i}.{kv}": empty for i in range(2) for kv in ("key", "value")}
    logits, *present = session.run(None, feed)
    with torch.no_grad():
        _close(logits, model(prompt).logits)

    ids = prompt  # greedy decoding: one token a step, the presents fed back as the past
    for _ in range(8):
        token = logits[:, -1].argmax(-1)[:, None]  # (B, 1)
        ids = torch.cat((ids, torch.from_numpy(token)), dim=1)
        feed = {"input_ids": token, "attention_mask": np.ones(tuple(ids.shape), dtype=np.int64)}
        feed |= {f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}": value for i, value in enumerate(present)}
        logits, *present = session.run(None, feed)
        assert present[0].shape[2] == ids.shape[1]
    with torch.no_grad():
        _close(logits[:, -1], model(ids).logits[:, -1])  # the last step's logits are the whole sequence's
        expected = ids[:, :6]
        for _ in range(8):
            expected = torch.cat((expected, model(expected).logits[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(ids, expected)


@pytest.mark.parametrize("head", [  # the classifier's graph is also run, from text, by the folder test below
    pytest.param(head, marks=pytest.mark.slow) for head in ("classify", "tag", "embeddings")])
def test_encoder_gives_attnkits_outputs_with_padding(tmp_path, head):
    fields = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_seq_len": 32, **ENCODERS[head]}
    run = random_run(tmp_path, fields)
    export = convert_to_onnx(run, tmp_path / "exported").graphs[0]
    runtime = json.loads((tmp_path / "exported" / "runtime.json").read_text())
    assert ("words" in runtime) == (head == "tag")  # a tagger's words are encoded one by one, as attnkit tag does
    model, config = load_model(run)
    session = ort.InferenceSession(str(export.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == export.inputs
    generator = torch.Generator().manual_seed(2)
    for batch, length in ((2, 9), (4, 3)):
        ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, length // 2:] = 0  # a padded row
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        kwargs = {}
        if "token_type_ids" in export.inputs:
            types = (torch.arange(length) >= length // 3).long().expand(batch, length)
            feed["token_type_ids"] = types.numpy()
            kwargs["token_type_ids"] = types
        outputs = session.run(None, feed)
        with torch.no_grad():
            ours = model(ids, attention_mask=mask, **kwargs)
        if head == "embeddings":
            _close(outputs[0][mask.bool().numpy()], ours.hidden_states[mask.bool()])  # padded positions: any
            _close(outputs[1], ours.logits)  # the pooled vector (mean over real tokens)
        elif head == "tag":
            _close(outputs[0][mask.bool().numpy()], ours.logits[mask.bool()])
        else:
            _close(outputs[0], ours.logits)


@pytest.mark.slow  # one graph exported: about 25 s on 2 busy cores
def test_a_decoder_tagger_is_written_as_a_labelling_graph_with_attnkits_logits(tmp_path, capsys):
    """A decoder with a tag head (GPT2ForTokenClassification's layout; GGUF refuses it, pointing here) labels every
    position from the tokens up to it: no past, its text framed as attnkit tag frames it (BOS and EOS)."""
    run = random_run(tmp_path, {**LAYOUTS["default"], "d_model": 32, "d_ff": 64, "decoder_head": "tag",
                                "n_classes": 5})
    (run / "task.json").write_text(json.dumps({"task": "tag", "word_pieces": "running"}))  # trained by attnkit
    assert main(["convert", str(run), "--to-onnx", str(tmp_path / "exported")]) == 0
    assert "model.onnx: tag; inputs input_ids, attention_mask; outputs logits" in capsys.readouterr().out
    runtime = json.loads((tmp_path / "exported" / "runtime.json").read_text())
    assert "past" not in runtime and "words" in runtime and runtime["text"]["adds"] == ["<bos>", "<eos>"]
    model, config = load_model(run)
    session = ort.InferenceSession(str(tmp_path / "exported" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0  # a padded row
    (logits,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        _close(logits[mask.bool().numpy()], model(ids, attention_mask=mask).logits[mask.bool()])


def test_a_decoder_taggers_tokenizer_json_frames_its_text_as_its_tagger_reads_it(tmp_path):
    """The decoder tagger's framing without exporting a graph: a tagger attnkit trained reads `BOS text EOS`
    (`align`), and the file adds both; one converted from Hugging Face reads its tokenizer's own framing (here none)."""
    from export_runs import tokenizer

    from attnkit.config import ModelConfig
    from attnkit.interop.runtime_tokenizer import runtime_tokenizer
    from attnkit.tasks.tag import align

    config = ModelConfig(**{**LAYOUTS["default"], "vocab_size": tokenizer().vocab_size, "decoder_head": "tag",
                            "n_classes": 5})
    words = "def f ( x ) : return x".split()
    for own_frame, adds in ((False, ["<bos>", "<eos>"]), (True, [])):
        file, framing = runtime_tokenizer(tokenizer(), config, own_frame=own_frame)
        assert framing.adds == adds and framing.max_length == config.max_seq_len
        read = align(tokenizer(), words, None, config.max_seq_len, "running", "own" if own_frame else "attnkit")
        assert file.encode(" ".join(words)).ids == read.ids


def test_families_without_an_onnx_form_are_refused(tmp_path):
    run = random_run(tmp_path, dict(family="recurrent-lm", cell="gru", hidden_size=32))
    with pytest.raises(ConfigError, match="ONNX export writes decoders, encoders and encoder-decoders; .* a "
                                          "recurrent-lm model has no export form"):
        convert_to_onnx(run, tmp_path / "exported")
    assert not (tmp_path / "exported").exists()
    with pytest.raises(InputError, match="writes a folder"):
        convert_to_onnx(run, tmp_path / "model.onnx")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="replaces only such a folder"):
        convert_to_onnx(run, tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_full_disk_after_the_graph_leaves_no_folder_and_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import errno
    import os

    from attnkit.interop import onnx

    run = random_run(tmp_path, {**LAYOUTS["llama-gqa-untied"], "d_model": 32, "d_ff": 64, "n_layers": 1})
    written = onnx.atomic_write

    def full_at_runtime_json(path, data):  # model.onnx, tokenizer.json and config.json are already written
        if Path(path).name == "runtime.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        written(path, data)

    monkeypatch.setattr(onnx, "atomic_write", full_at_runtime_json)
    assert main(["convert", str(run), "--to-onnx", str(tmp_path / "exported")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the disk is full; free some space, or write to another disk" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no folder, no partial one beside it


LABELS = ["negative", "neutral", "positive"]
TEXTS = ["a gorgeous, witty film", "", "Ünïcödé and emoji 🙂", "def main(): return 1  " * 12]  # the last is cut


def _label_from_folder(folder: Path, texts: list[str]) -> tuple[list[str], np.ndarray]:
    """What a user's program does with the folder: onnxruntime, tokenizers and json, no attnkit."""
    from tokenizers import Tokenizer

    runtime = json.loads((folder / "runtime.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / runtime["tokenizer"]))
    labels = json.loads((folder / runtime["labels"]).read_text())["labels"]
    session = ort.InferenceSession(str(folder / runtime["graph"]), providers=["CPUExecutionProvider"])
    rows = tokenizer.encode_batch(texts)  # framed, cut and padded as tokenizer.json says
    columns = {"input_ids": [r.ids for r in rows], "attention_mask": [r.attention_mask for r in rows],
               "token_type_ids": [r.type_ids for r in rows]}
    (logits,) = session.run(None, {name: np.array(columns[name], dtype=np.int64) for name in runtime["inputs"]})
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    return [labels[i] for i in logits.argmax(-1)], probabilities


def test_a_classifier_folder_labels_text_alone_as_attnkit_does(tmp_path, capsys):
    fields = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_seq_len": 24, **ENCODERS["classify"]}
    run = random_run(tmp_path, fields)
    (run / "labels.json").write_text(json.dumps({"labels": LABELS}))
    out = tmp_path / "exported"
    assert main(["convert", str(run), "--to-onnx", str(out)]) == 0
    printed = capsys.readouterr()
    files = ["model.onnx", "tokenizer.json", "config.json", "labels.json", "runtime.json"]
    assert printed.out.splitlines() == [line for line in printed.out.splitlines() if line.startswith("wrote ")]
    assert [line.split(":")[0] for line in printed.out.splitlines()] == [f"wrote {out / name}" for name in files]
    assert "training mode" not in printed.err and "torchvision" not in printed.err  # the exporter says nothing
    assert sorted(p.name for p in out.iterdir()) == sorted(files)

    expected = load(run).classify(TEXTS)
    assert expected[-1].truncated  # the long text is cut to max_seq_len, as tokenizer.json cuts it
    moved = shutil.move(out, tmp_path / "elsewhere")
    shutil.rmtree(run)  # the folder alone
    labels, probabilities = _label_from_folder(Path(moved), TEXTS)
    assert labels == [result.label for result in expected]
    np.testing.assert_allclose(probabilities, [[r.probabilities[name] for name in LABELS] for r in expected],
                               atol=1e-5)


def _begins_texts_with_bos(directory: Path) -> Path:
    """`directory` with the runs' tokenizer whose post-processor puts BOS before every text (Llama's does)."""
    from export_runs import tokenizer

    spec = json.loads(tokenizer().to_str())
    bos = tokenizer().bos_id
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [
        {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    return directory


def test_the_export_says_what_a_decoders_tokenizer_json_adds_and_nothing_it_does_not_do(tmp_path, capsys):
    """--to-onnx said of a decoder whose tokenizer begins its texts with BOS that its tokenizer.json "adds <bos> and
    None, cut to None ids"; it says the BOS it adds, and no cut or padding, which the file does not do."""
    from attnkit.tokenize import HFTokenizer

    run = random_run(tmp_path, {**LAYOUTS["default"], "d_model": 32, "d_ff": 64, "n_layers": 1})
    shutil.rmtree(run / "tokenizer")
    HFTokenizer.from_dir(_begins_texts_with_bos(tmp_path / "bos")).save(run / "tokenizer")
    assert main(["convert", str(run), "--to-onnx", str(tmp_path / "exported")]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "tokenizer.json" in line]
    assert said == [f"wrote {tmp_path / 'exported' / 'tokenizer.json'}: the run's tokenizer, as it is (adds <bos>)"]


def test_a_decoders_runtime_json_says_the_bos_its_tokenizer_json_adds(tmp_path):
    """A tokenizer that begins every text with BOS (Llama's post-processor) keeps it in the exported file, and
    runtime.json, which says what the file adds, names it: the prompt attnkit generates from starts with it."""
    from export_runs import tokenizer

    from attnkit.config import ModelConfig
    from attnkit.interop.runtime_tokenizer import runtime_tokenizer
    from attnkit.tokenize import HFTokenizer

    bos = tokenizer().bos_id
    starts_with_bos = HFTokenizer.from_dir(_begins_texts_with_bos(tmp_path))
    config = ModelConfig(**{**LAYOUTS["default"], "vocab_size": tokenizer().vocab_size})
    for own, adds in ((tokenizer(), []), (starts_with_bos, ["<bos>"])):
        file, framing = runtime_tokenizer(own, config)
        assert framing.as_json()["adds"] == adds
        assert framing.as_json()["template"] == " ".join([*adds, "$TEXT"])
        assert file.encode("def f():").ids == [bos] * len(adds) + tokenizer().encode("def f():")


def test_onnx_folder_graph_is_the_old_name_of_its_first_graph(tmp_path):
    from attnkit.interop.onnx import ONNXExport, ONNXFolder

    export = ONNXExport(path=tmp_path / "model.onnx", kind="decoder", inputs=["input_ids"], outputs=["logits"])
    folder = ONNXFolder(path=tmp_path, graphs=[export], files={})
    with pytest.warns(DeprecationWarning, match=r"ONNXFolder.graph is deprecated; use ONNXFolder.graphs\[0\]"):
        assert folder.graph is export
