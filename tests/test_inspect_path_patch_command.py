"""`attnkit inspect RUN path-patch`: the command's shares are `path_patch`'s on the same inputs and logit difference
(recomputed here through the library), for the senders together and each alone; a head named badly, senders of two
sublayers and a missing --via are refused before anything runs, naming the fix."""

import json
import re

import pytest
import torch

from attnkit.checkpoint import save_model
from attnkit.cli import main
from attnkit.config import ModelConfig
from attnkit.errors import InputError
from attnkit.inspect.command import InspectSettings, run_inspect
from attnkit.inspect.inputs import Batch
from attnkit.inspect.patching import FAINT, logit_difference
from attnkit.inspect.path_patching import path_patch
from attnkit.models import build_model
from attnkit.tokenize import CharTokenizer

CHARS = "abcdefghij ."
CLEAN, CORRUPT = "abc deabc de", "abc dgabc dh"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("decoder")
    tokenizer = CharTokenizer(CHARS)
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                         n_layers=2, max_seq_len=48)
    model = build_model(config)
    with torch.no_grad():  # peaked attention, so that a path carries something
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(6.0)
    tokenizer.save(directory / "tokenizer")
    save_model(model, config, directory)
    return directory, model.eval(), tokenizer


@pytest.mark.parametrize("via", ["q", "k", "v"])
def test_path_patch_writes_what_path_patch_computes(run, via, tmp_path, capsys):
    directory, model, tokenizer = run
    assert main(["inspect", str(directory), "path-patch", "--text", CLEAN, "--corrupt", CORRUPT, "--sender", "0.0",
                 "--sender", "0.1", "--receiver", "1.1", "--via", via, "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split()[0] == str(tmp_path / "path-patch.json")
    report = json.loads((tmp_path / "path-patch.json").read_text())
    clean, corrupted = (Batch((torch.tensor([tokenizer.encode(t)]),)) for t in (CLEAN, CORRUPT))  # whole prompts
    with torch.no_grad():
        last = model(*clean.args).logits[0, -1]  # (V,): a decoder's answer: the token after the text
        runner = model(*corrupted.args).logits[0, -1]
    answer, wrong = int(last.argmax()), int(runner.argmax())
    wrong = wrong if wrong != answer else int(last.topk(2).indices[1])

    def metric(logits):
        return logit_difference(logits, answer, wrong, -1)

    expected = [path_patch(model, clean, corrupted, sender=("blocks.0.attn", heads), receiver=("blocks.1.attn", 1),
                           via=via, metric=metric) for heads in ([0, 1], [0], [1])]
    assert [row["path"] for row in report["rows"]] == [
        f"blocks.0.attn heads 0, 1 -> blocks.1.attn head 1 ({via})", f"blocks.0.attn head 0 -> blocks.1.attn head 1 "
        f"({via})", f"blocks.0.attn head 1 -> blocks.1.attn head 1 ({via})"]
    assert [row["restored"] for row in report["rows"]] == pytest.approx([e.restored for e in expected], abs=1e-4)
    assert [row["logit difference patched"] for row in report["rows"]] == pytest.approx([e.patched for e in expected],
                                                                                         abs=2e-6)
    assert report["summary"]["logit difference clean"] == pytest.approx(expected[0].clean, abs=1e-5)
    assert report["summary"]["logit difference corrupted"] == pytest.approx(expected[0].corrupted, abs=1e-5)
    moved = abs(expected[0].clean - expected[0].corrupted)  # 0.33 against -0.04: patch's warning only below FAINT
    assert ("warning" in report["summary"]) == (moved < FAINT)


@pytest.mark.parametrize(("fields", "message"), [
    ({"sender": ("0.1",), "receiver": "1.0"}, "--via q, k or v"),
    ({"sender": ("0.1",), "via": "k"}, "--receiver LAYER.HEAD"),
    ({"sender": ("first",), "receiver": "1.0", "via": "k"}, "'first' is not a head: give LAYER.HEAD"),
    ({"sender": ("0.1", "1.0"), "receiver": "1.1", "via": "q"}, "one sublayer; these are of blocks.0.attn, blocks.1"),
    ({"sender": ("1.0",), "receiver": "0.1", "via": "k"}, "does not write into what blocks.0.attn's k reads"),
    ({"sender": ("0.0",), "receiver": "1.1", "via": "k", "corrupt": None}, "give --corrupt TEXT"),
    ({"sender": ("0.0", "0.2"), "receiver": "1.1", "via": "k"},
     "head 2 is out of range: blocks.0.attn has 2 heads (0..1)"),
    ({"sender": ("0.0",), "receiver": "1.5", "via": "q"}, "head 5 is out of range: blocks.1.attn has 2 heads (0..1)"),
])
def test_path_patch_refuses_what_it_cannot_follow(run, fields, message, tmp_path):
    settings = {"text": (CLEAN,), "corrupt": CORRUPT, **fields}
    with pytest.raises(InputError, match=re.escape(message)):
        run_inspect(InspectSettings(run=str(run[0]), analysis="path-patch", out=str(tmp_path), **settings))


def test_the_path_patch_picture_reads_each_share_against_the_whole(run, tmp_path, monkeypatch):
    """The bars are drawn against 0 and 1 (all of the logit difference), each labelled with its share, on a handful
    of ticks: a share of 0.001 filled the whole axis, whose crowded ticks ran into one another."""
    from attnkit.inspect import command

    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts) or [])
    directory, _, _ = run
    run_inspect(InspectSettings(run=str(directory), analysis="path-patch", text=(CLEAN,), corrupt=CORRUPT,
                                sender=("0.0", "0.1"), receiver="1.1", via="k", out=str(tmp_path)))
    ((parts),) = drawn
    (ax,) = parts["figure"].axes
    low, high = ax.get_xlim()
    assert low < 0 and high > 1
    assert len([t for t in ax.get_xticks() if low <= t <= high]) <= 7
    shares = [f"{row['restored']:.3f}" for row in parts["rows"]][::-1]  # drawn bottom-up
    assert [text.get_text() for text in ax.texts] == shares
