"""Presets: the lecture's table builds, runs, and has the published parameter counts."""

from pathlib import Path

import pytest
import torch

from attnkit import build_model, count_parameters, presets
from attnkit.cli import main
from attnkit.models import families
from attnkit.tasks import task_of_config

TINY = [name for name in presets.names() if name.endswith("-tiny")]
LARGE = [name for name in presets.names() if not name.endswith("-tiny")]


def test_published_parameter_counts():
    assert count_parameters(presets.get("gpt2-124m")) == 124_439_808  # tied embeddings, as GPT2LMHeadModel
    assert count_parameters(presets.get("llama2-7b")) == 6_738_415_616
    assert count_parameters(presets.get("bert-base", encoder_head="none")) == 109_482_240  # BertModel, its pooler too


def test_every_family_has_a_tiny_preset():
    assert {presets.get(name).family for name in TINY} == {family.name for family in families()}


def _forward_loss(model, model_config, vocab, device=None):
    ids = torch.randint(0, vocab, (2, 12), device=device)
    method = task_of_config(model_config).method
    if method == "generate":
        return model(ids, labels=ids).loss
    if method == "classify":
        return model(ids, labels=torch.zeros(2, dtype=torch.long, device=device)).loss
    return model(ids, ids[:, :9], labels=ids[:, 1:10]).loss


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_train_a_step(name):
    torch.manual_seed(0)
    config = presets.get(name)
    model = build_model(config)
    loss = _forward_loss(model, config, config.vocab_size)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", LARGE)
def test_large_presets_run_forward_and_backward_on_meta(name):
    full = presets.get(name)
    config = full.replace(n_layers=2, **({"n_decoder_layers": 2} if hasattr(full, "n_decoder_layers") else {}))
    with torch.device("meta"):
        model = build_model(config)
        loss = _forward_loss(model, config, config.vocab_size, device="meta")
    assert loss.shape == ()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_presets_command_prints_the_table(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in presets.names():
        assert name in out
    assert "124.44M" in out and "6.74B" in out


def test_the_configs_guide_shows_the_table_the_command_prints(capsys):
    # docs/user-guide/configs.md quotes `attnkit presets`: a preset added or changed without it fails here
    assert main(["presets"]) == 0
    printed = capsys.readouterr().out.strip()
    guide = (Path(__file__).resolve().parents[1] / "docs" / "user-guide" / "configs.md").read_text(encoding="utf-8")
    quoted = guide.split("`attnkit presets` prints the table", 1)[1].split("```\n", 2)[1].strip()
    assert quoted == printed, "docs/user-guide/configs.md's table is stale: paste `attnkit presets`'s output there"
