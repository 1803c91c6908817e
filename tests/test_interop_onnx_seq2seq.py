"""`attnkit convert RUN --to-onnx DIR` for an encoder-decoder: Optimum's three graphs (encoder, first decoding step,
later steps with the self-attention past and the encoder's keys and values fed back), run from the folder alone with
onnxruntime and `tokenizers`, translate greedily token for token as attnkit does, with attnkit's logits at every
step."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from export_runs import random_run, tokenizer

from attnkit.checkpoint import load_model
from attnkit.cli import main
from attnkit.generate.seq2seq import greedy_translate
from attnkit.interop import onnx
from attnkit.interop.onnx import ONNXExport, Seq2SeqDecoderGraph, Seq2SeqEncoderGraph, seq2seq_graphs

ort = pytest.importorskip("onnxruntime", reason="the ONNX tests run the graph in onnxruntime (pip install "
                                                 "'attnkit[export]')")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")

# grouped-query heads and a decoder deeper than the encoder, so each count is read from the right place
FIELDS = dict(family="encoder-decoder", d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=1, n_decoder_layers=2,
              max_seq_len=64)
TEXTS = ["def main(): return 1", "x", "class Pipeline: tokens, masks and caches"]
STEPS = 12  # target tokens at most, EOS counted


def _varied_run(root: Path) -> Path:
    """A run of FIELDS whose random weights translate none of TEXTS into one token repeated (the test could not tell
    two steps apart): the first such of a few seeds, since the test tokenizer is trained on attnkit's own source."""
    pad, bos, eos = tokenizer().pad_id, tokenizer().bos_id, tokenizer().eos_id
    for seed in range(20):
        run = random_run(root, FIELDS, name=f"run-{seed}", seed=seed)
        targets = greedy_translate(load_model(run)[0], _sources(TEXTS), bos_id=bos, eos_id=eos, max_length=STEPS,
                                   pad_id=pad)
        if all(len(set(row)) > 1 for row in targets):
            return run
        shutil.rmtree(run)
    raise AssertionError("no seed of 20 gives varied translations")


Run = Callable[[str, dict[str, np.ndarray]], list[np.ndarray]]  # (graph role, named inputs) -> outputs in order


def _translate(run: Run, runtime: dict, ids: np.ndarray, mask: np.ndarray) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy translation as runtime.json says it runs, through `run`. Returns each source's target ids (without BOS
    and EOS) and each step's logits of the newest position (B, V)."""
    (memory,) = run("encoder", {"input_ids": ids, "attention_mask": mask})
    bos, eos = runtime["special_ids"]["bos"], runtime["special_ids"]["eos"]
    tokens = np.full((len(ids), 1), bos, dtype=np.int64)
    logits, *present = run("decoder", {"input_ids": tokens, "encoder_attention_mask": mask,
                                       "encoder_hidden_states": memory})
    named = dict(zip(runtime["graphs"]["decoder"]["outputs"][1:], present, strict=True))
    encoder_past = {name.replace("present", "past_key_values"): v for name, v in named.items() if ".encoder." in name}
    targets: list[list[int]] = [[] for _ in ids]
    finished = [False] * len(ids)
    steps = [logits[:, -1]]
    while True:
        tokens = logits[:, -1].argmax(-1)[:, None]  # (B, 1)
        for row, token in enumerate(tokens[:, 0].tolist()):
            finished[row] = finished[row] or token == eos
            if not finished[row]:
                targets[row].append(token)
        if all(finished) or len(steps) == STEPS:
            return targets, steps
        past = {name.replace("present", "past_key_values"): v for name, v in named.items() if ".decoder." in name}
        logits, *present = run("decoder_with_past", {"input_ids": tokens, "encoder_attention_mask": mask, **past,
                                                     **encoder_past})
        named = dict(zip(runtime["graphs"]["decoder_with_past"]["outputs"][1:], present, strict=True))
        steps.append(logits[:, -1])


def _sources(texts: list[str]) -> list[list[int]]:
    """What `attnkit translate` feeds the encoder: `tokens EOS`."""
    return [[*tokenizer().encode(text), tokenizer().eos_id] for text in texts]


def _check_against_attnkit(model, targets: list[list[int]], steps: list[np.ndarray], ids: np.ndarray) -> float:
    """The targets are attnkit's greedy translation of `ids` (B, S; padded), token for token, and each step's logits
    attnkit's whole teacher-forced pass over the target so far (no cache); returns the largest logit difference,
    relative to the largest logit."""
    pad, bos, eos = tokenizer().pad_id, tokenizer().bos_id, tokenizer().eos_id
    sources = [row[row != pad].tolist() for row in ids]
    assert targets == greedy_translate(model, sources, bos_id=bos, eos_id=eos, max_length=STEPS, pad_id=pad)
    assert all(len(set(row)) > 1 for row in targets)  # not one token repeated: the test could tell two apart
    src, mask = torch.from_numpy(ids), torch.from_numpy(ids != pad).long()
    target = torch.full((len(ids), 1), bos)
    worst = 0.0
    with torch.no_grad():
        for logits in steps:
            ours = model(src, target, src_mask=mask).logits[:, -1]  # (B, V)
            worst = max(worst, float((torch.from_numpy(logits) - ours).abs().max() / ours.abs().max()))
            target = torch.cat((target, ours.argmax(-1, keepdim=True)), dim=1)
    return worst


def test_the_three_graphs_step_through_their_caches_as_attnkit_translates(tmp_path):
    """The graphs' modules, run by PyTorch: the first step computes the encoder's keys and values, the later ones
    take them and the self-attention past back, and the positions continue after the past's."""
    model, config = load_model(_varied_run(tmp_path))
    layers = config.resolved.n_decoder_layers
    graphs = {"encoder": Seq2SeqEncoderGraph(model), "decoder": Seq2SeqDecoderGraph(model, config, first=True),
              "decoder_with_past": Seq2SeqDecoderGraph(model, config, first=False)}
    names = {graph.role: {"inputs": graph.inputs, "outputs": graph.outputs} for graph in seq2seq_graphs(layers)}

    def run(role: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        given = [torch.from_numpy(feed[name]) for name in names[role]["inputs"]]
        if role == "decoder_with_past":  # per layer (self keys, self values, encoder keys, encoder values)
            given = [*given[:2], [tuple(given[2 + 4 * i:6 + 4 * i]) for i in range(layers)]]
        with torch.no_grad():
            out = graphs[role](*given)
        return [tensor.numpy() for tensor in (out if isinstance(out, tuple) else (out,))]

    runtime = {"graphs": names, "special_ids": {"bos": tokenizer().bos_id, "eos": tokenizer().eos_id}}
    ids = np.array(_padded(_sources(TEXTS)), dtype=np.int64)
    targets, steps = _translate(run, runtime, ids, (ids != tokenizer().pad_id).astype(np.int64))
    assert _check_against_attnkit(model, targets, steps, ids) <= 1e-6


def _padded(rows: list[list[int]]) -> list[list[int]]:
    width = max(map(len, rows))
    return [row + [tokenizer().pad_id] * (width - len(row)) for row in rows]


def _graphs_unwritten(model, config, folder: Path, *, opset: int) -> list[ONNXExport]:
    """export_seq2seq_onnx's answer without the export (about 45 s): what the folder's other files are tested with."""
    return [ONNXExport(path=folder / graph.file, kind=graph.kind, inputs=graph.inputs, outputs=graph.outputs)
            for graph in seq2seq_graphs(config.resolved.n_decoder_layers)]


def _runtime_of(run: Path, out: Path, monkeypatch) -> dict:
    monkeypatch.setattr(onnx, "export_seq2seq_onnx", _graphs_unwritten)
    assert main(["convert", str(run), "--to-onnx", str(out)]) == 0
    return json.loads((out / "runtime.json").read_text())


def test_runtime_json_stops_a_translation_where_attnkit_translate_stops_by_default(tmp_path, monkeypatch, capsys):
    """runtime.json's max_length rule, read as its fields say, gives the target lengths `attnkit translate` writes
    with no --max-length: a source of 2 ids stops at 2 x 2 + 10 = 14 target tokens, not at max_seq_len (32)."""
    run = _varied_run(tmp_path)
    rule = _runtime_of(run, tmp_path / "exported", monkeypatch)["max_length"]
    model, config = load_model(run)
    pad, bos, eos = tokenizer().pad_id, tokenizer().bos_id, tokenizer().eos_id
    capped = 0
    for text in ("x", "def main(): return 1"):
        capsys.readouterr()
        assert main(["translate", str(run), "--text", text]) == 0
        printed = capsys.readouterr().out
        sources = _sources([text])
        length = min(rule["max_seq_len"], rule["times_longest_source"] * max(map(len, sources)) + rule["plus"])
        (target,) = greedy_translate(model, sources, bos_id=bos, eos_id=eos, max_length=length, pad_id=pad)
        assert printed == tokenizer().decode(target) + "\n", text
        capped += len(target) == length < config.max_seq_len  # stopped by the rule, short of max_seq_len
    assert capped  # so a rule of max_seq_len would have written another translation


def test_runtime_json_names_only_the_ids_and_files_the_folder_has(tmp_path, monkeypatch):
    """A Marian converted from Hugging Face without its tokenizer: BOS and EOS are its config's
    decoder_start_token_id and eos_token_id; a run with neither tokenizer nor origin gets no special_ids, and its
    "how" names none."""
    from interop_models import PAD, hf_model

    hf_model("marian", tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "marian")]) == 0
    assert not (tmp_path / "marian" / "tokenizer").exists()
    runtime = _runtime_of(tmp_path / "marian", tmp_path / "marian-onnx", monkeypatch)
    assert runtime["special_ids"] == {"bos": PAD, "eos": 2, "pad": PAD} and runtime["tokenizer"] is None
    assert "special_ids.bos" in runtime["how"] and "tokenizer.json" not in runtime["how"]

    bare = _varied_run(tmp_path)
    shutil.rmtree(bare / "tokenizer")
    runtime = _runtime_of(bare, tmp_path / "bare-onnx", monkeypatch)
    assert "special_ids" not in runtime and "special_ids" not in runtime["how"]
    assert "tokenizer.json" not in runtime["how"]


@pytest.mark.slow  # three graphs exported: about 45 s on 2 busy cores
def test_an_encoder_decoder_folder_translates_alone_as_attnkit_does(tmp_path, capsys):
    run = _varied_run(tmp_path)
    out = tmp_path / "exported"
    assert main(["convert", str(run), "--to-onnx", str(out)]) == 0
    printed = capsys.readouterr().out
    for line in ("encoder_model.onnx: encoder; inputs input_ids, attention_mask; outputs last_hidden_state",
                 "decoder_model.onnx: decoder, first step; inputs input_ids, encoder_attention_mask, "
                 "encoder_hidden_states; outputs logits, present.0.decoder.key, present.0.decoder.value, ...",
                 "decoder_with_past_model.onnx: decoder, later steps; inputs input_ids, encoder_attention_mask, "
                 "past_key_values.0.decoder.key, ...; outputs logits, present.0.decoder.key, "
                 "present.0.decoder.value, ..."):
        assert f"wrote {out / line}" in printed
    runtime = json.loads((out / "runtime.json").read_text())
    assert runtime["past"] == {"n_layers": 2, "n_kv_heads": 2, "head_dim": 8}
    assert runtime["text"]["adds"] == ["<eos>"]  # a source is `text EOS`, as attnkit's pair data lays it out
    model, _ = load_model(run)
    folder = Path(shutil.move(out, tmp_path / "elsewhere"))
    shutil.rmtree(run)  # the folder alone: onnxruntime, tokenizers and json, no attnkit

    from tokenizers import Tokenizer

    runtime = json.loads((folder / "runtime.json").read_text())
    sessions = {role: ort.InferenceSession(str(folder / graph["file"]), providers=["CPUExecutionProvider"])
                for role, graph in runtime["graphs"].items()}
    rows = Tokenizer.from_file(str(folder / runtime["tokenizer"])).encode_batch(TEXTS)  # text EOS, padded
    ids = np.array([row.ids for row in rows], dtype=np.int64)
    mask = np.array([row.attention_mask for row in rows], dtype=np.int64)
    assert ids.tolist() == _padded(_sources(TEXTS))
    targets, steps = _translate(lambda role, feed: sessions[role].run(None, feed), runtime, ids, mask)
    worst = _check_against_attnkit(model, targets, steps, ids)
    print(f"largest logit difference over {len(steps)} steps: {worst:.1e} of the largest logit")
    assert worst <= 1e-5


def test_a_model_too_short_for_the_traced_lengths_is_refused_naming_the_least_max_seq_len(tmp_path):
    """The graphs are traced on lengths unlike each other and the model's sizes (here 3 the batch, 4 heads, head_dim
    8, d_model 32), a past and a target within max_seq_len: 2 + 5 needs 7; the error blames the model, not an input."""
    from attnkit.errors import ConfigError
    from attnkit.interop.onnx import export_seq2seq_onnx

    fields = {**FIELDS, "n_kv_heads": 4, "max_seq_len": 6, "position": "learned"}
    model, config = load_model(random_run(tmp_path, fields))
    with pytest.raises(ConfigError, match="max_seq_len=6 leaves no room; it needs max_seq_len >= 7"):
        export_seq2seq_onnx(model, config, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


@pytest.mark.slow  # three graphs exported: about 45 s on 2 busy cores
def test_a_short_learned_position_table_is_traced_within_it_and_stays_dynamic(tmp_path):
    """max_seq_len 8 with learned positions: traced on a target of 2 after a past of 5 and a source of 6 (where 5
    after 7 passed the table), and run at other batch sizes and lengths as the graphs' modules run them."""
    from attnkit.interop.onnx import export_seq2seq_onnx

    fields = {**FIELDS, "n_kv_heads": 4, "max_seq_len": 8, "position": "learned"}
    model, config = load_model(random_run(tmp_path, fields))
    export_seq2seq_onnx(model, config, tmp_path / "onnx")
    layers = config.resolved.n_decoder_layers
    sessions = {graph.role: ort.InferenceSession(str(tmp_path / "onnx" / graph.file),
                                                 providers=["CPUExecutionProvider"])
                for graph in seq2seq_graphs(layers)}
    past_names = [graph.inputs[2:] for graph in seq2seq_graphs(layers) if graph.role == "decoder_with_past"][0]
    generator = torch.Generator().manual_seed(0)
    for batch, source, target in ((1, 2, 1), (2, 8, 3), (4, 3, 4)):
        src = torch.randint(3, 300, (batch, source), generator=generator)
        mask = torch.ones_like(src)
        mask[0, source - 1:] = int(source == 1)  # the first row one token short
        tgt = torch.randint(3, 300, (batch, target), generator=generator)
        step = torch.randint(3, 300, (batch, 1), generator=generator)
        with torch.no_grad():
            memory = Seq2SeqEncoderGraph(model)(src, mask)
            logits, *present = Seq2SeqDecoderGraph(model, config, first=True)(tgt, mask, memory)
            state = [tuple(present[4 * i:4 * i + 4]) for i in range(layers)]
            later, *_ = Seq2SeqDecoderGraph(model, config, first=False)(step, mask, state)
        (onnx_memory,) = sessions["encoder"].run(None, {"input_ids": src.numpy(), "attention_mask": mask.numpy()})
        first = sessions["decoder"].run(None, {"input_ids": tgt.numpy(), "encoder_attention_mask": mask.numpy(),
                                               "encoder_hidden_states": onnx_memory})
        (onnx_later, *_) = sessions["decoder_with_past"].run(
            None, {"input_ids": step.numpy(), "encoder_attention_mask": mask.numpy(),
                   **dict(zip(past_names, first[1:], strict=True))})
        torch.testing.assert_close(torch.from_numpy(first[0]), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(onnx_later), later, rtol=1e-5, atol=1e-5)
