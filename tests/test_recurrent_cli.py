"""The recurrent families as a user runs them: `attnkit train` (and --resume), `translate` greedy and beam,
`generate`, `eval` and `viz` on the tiny presets, each answer held to the library's own. The Bahdanau preset's
train/resume/load and the LM's are in test_families.py, its alignment picture in test_viz.py."""

import json
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import cli
from attnkit.checkpoint import load_config, load_model
from attnkit.data.synthetic import make_task

VARIANTS = {  # name -> the preset and --set lines that make it
    "gru-plain": ["--preset", "gru-seq2seq-tiny"],
    "gru-luong": ["--preset", "gru-attn-seq2seq-tiny", "--set", "attention=luong-general"],
    "lstm-bahdanau": ["--preset", "gru-attn-seq2seq-tiny", "--set", "cell=lstm"],
}
COMMON = ["--data", "synthetic:reverse", "--batch-size", "8", "--eval-every", "3", "--no-progress", "--set",
          "bleu_samples=4", "--set", "dropout=0.1"]


@pytest.fixture
def small_synthetic(monkeypatch):
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (300, 16))


def _train(out, *args):
    assert cli.main(["train", "--out", str(out), *args]) == 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_seq2seq_variants_train_resume_and_translate_from_the_command_line(tmp_path, capsys, small_synthetic,
                                                                          variant):
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["--task", "translate", *VARIANTS[variant], *COMMON]
    _train(whole, *common, "--max-steps", "6")
    _train(split, *common, "--max-steps", "3")
    _train(split, "--resume", "--max-steps", "6", "--no-progress")
    a, b = load_model(whole)[0].state_dict(), load_model(split)[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # resumed bit for bit
    config = load_config(whole)
    assert (config.attention, config.cell) == {"gru-plain": ("none", "gru"), "gru-luong": ("luong-general", "gru"),
                                               "lstm-bahdanau": ("bahdanau", "lstm")}[variant]

    pipeline = attnkit.load(whole, device="cpu")
    texts = ["abcdef", "ji", "cab"]
    for beam in ("1", "3"):
        capsys.readouterr()
        assert cli.main(["translate", "--run", str(whole), "--text", *texts, "--beam-size", beam]) == 0
        printed = capsys.readouterr().out.splitlines()
        assert printed == pipeline.translate(texts, beam_size=int(beam))


def test_translate_eval_and_viz_on_a_recurrent_run(tmp_path, capsys, small_synthetic):
    run = tmp_path / "run"
    _train(run, "--task", "translate", *VARIANTS["gru-luong"], *COMMON, "--max-steps", "3")
    pairs = make_task("reverse", 12, seed=7).pairs()
    (tmp_path / "test.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    assert cli.main(["eval", "--run", str(run), "--data", str(tmp_path / "test.tsv")]) == 0
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert report["rows"][0]["sentences"] == 12 and "bleu" in report["rows"][0]
    assert cli.main(["viz", "--run", str(run), "--text", "abcd", "--translate", "--no-per-head"]) == 0
    assert (run / "viz" / "alignment.png").is_file()


def test_generate_command_continues_a_recurrent_lm(tmp_path, capsys, small_synthetic):
    run = tmp_path / "lm"
    text = tmp_path / "text.txt"  # characters only: no EOS in the data, so greedy text runs to its length
    text.write_text(Path(cli.__file__).read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    _train(run, "--task", "lm", "--preset", "lstm-lm-tiny", "--data", str(text), "--tokenizer", "char",
           "--batch-size", "4", "--eval-every", "3", "--no-progress", "--max-steps", "3", "--set", "max_seq_len=32")
    pipeline = attnkit.load(run, device="cpu")
    capsys.readouterr()
    args = ["generate", "--run", str(run), "--prompt", "abc=", "--max-new-tokens", "40", "--temperature", "0"]
    assert cli.main([*args, "--no-stream"]) == 0
    printed = capsys.readouterr().out
    new = pipeline.generate("abc=", max_new_tokens=40, temperature=0)[0]
    assert printed.rstrip("\n").endswith(new)
    # greedy through the state, past max_seq_len, is the argmax of a pass from scratch over all before it
    ids = pipeline.tokenizer.encode("abc=")
    with torch.no_grad():
        for _ in range(len(pipeline.tokenizer.encode(new))):
            ids.append(int(pipeline.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert pipeline.tokenizer.decode(ids[4:]) == new and len(ids) > pipeline.config.max_seq_len
    for quantize in ("int8", "int8-dynamic"):  # the readout and attention layers quantized, torch's cells kept
        quantized = attnkit.load(run, device="cpu", quantize=quantize)
        with torch.no_grad():
            logits = quantized.model(torch.tensor([ids[:12]])).logits
            expected = pipeline.model(torch.tensor([ids[:12]])).logits
        assert (logits - expected).abs().max() < 0.1 * expected.abs().max()
        assert len(quantized.generate("abc=", max_new_tokens=10, temperature=0)[0]) > 0



def test_gru_attention_recipe_is_the_preset_with_a_bpe_of_8000(tmp_path):
    """The recipe trains gru-attn-seq2seq as the preset has it; its vocab_size (a model field and a data option
    alike) sizes the BPE, as --vocab-size does, where it once left the tokenizer at its default of 2,048."""
    from attnkit import presets
    from attnkit.train.job import check_request

    def request(*argv):
        invocation = cli.parse(["train", *argv])
        return cli.train_request(invocation.settings, *invocation.sections)

    for folder in ("multi30k", "multi30k/test_2016_flickr.de", "multi30k/test_2016_flickr.en"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    config, data, _ = check_request(request("--recipe", "multi30k-gru-attention", "--data-root", str(tmp_path)))
    assert data.vocab_size == 8000
    assert config == presets.get("gru-attn-seq2seq")
    _, data, _ = check_request(request("--out", "x", "--set", "vocab_size=1000"))
    assert data.vocab_size == 1000
