"""AdamW parameter groups and the learning-rate schedules."""

import math

import pytest

from attnkit import ModelConfig, build_model
from attnkit.errors import ConfigError
from attnkit.train.optim import lr_factor, make_optimizer, param_groups


@pytest.mark.parametrize("position", ["learned", "relative", "rope"])
@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder-decoder"])
def test_only_weight_matrices_decay(family, position):
    config = ModelConfig(family=family, vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=8,
                         position=position)
    model = build_model(config)
    decay, plain = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    named = dict(model.named_parameters())
    assert sorted(decay["names"] + plain["names"]) == sorted(named)  # every parameter once, tied ones once
    for name in plain["names"]:
        is_norm_or_bias = named[name].dim() == 1
        is_embedding = "embeddings" in name or ".relative." in name
        assert is_norm_or_bias or is_embedding, name
    for name in decay["names"]:
        assert named[name].dim() == 2 and "embeddings" not in name and "norm" not in name, name
        assert name.endswith("_proj.weight") or name.endswith(("classifier.weight", "lm_head.weight")), name


def test_optimizer_rejects_bad_settings():
    model = build_model(ModelConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=16))
    with pytest.raises(ConfigError, match="lr=0"):
        make_optimizer(model, lr=0, weight_decay=0.1)
    with pytest.raises(ConfigError, match="weight_decay=-1"):
        make_optimizer(model, lr=1e-3, weight_decay=-1)


def test_cosine_warms_up_linearly_then_decays_to_the_floor():
    factors = [lr_factor("cosine", s, warmup=10, progress=(s - 10) / 90, min_lr_ratio=0.1) for s in range(1, 101)]
    assert factors[:10] == pytest.approx([s / 10 for s in range(1, 11)])
    assert all(a >= b for a, b in zip(factors[9:], factors[10:], strict=False))
    assert factors[-1] == pytest.approx(0.1)
    halfway = lr_factor("cosine", 55, warmup=10, progress=0.5, min_lr_ratio=0.1)
    assert halfway == pytest.approx(0.1 + 0.9 * 0.5)


def test_noam_matches_vaswani_et_al():
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), here divided by its peak value."""
    d_model, warmup = 512, 4000
    peak = d_model**-0.5 * warmup**-0.5
    for step in (1, 100, 3999, 4000, 4001, 16000, 100000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert lr_factor("noam", step, warmup=warmup, progress=0.0) * peak == pytest.approx(paper)
    assert lr_factor("noam", 16000, warmup=4000, progress=0.0) == pytest.approx(0.5)


def test_constant_is_flat_after_warmup():
    assert lr_factor("constant", 3, warmup=4, progress=0.0) == pytest.approx(0.75)
    assert lr_factor("constant", 5000, warmup=4, progress=1.0) == 1.0


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ConfigError, match="cosine, noam, constant"):
        lr_factor("linear", 1, warmup=0, progress=0.0)


def test_progress_beyond_the_end_stays_at_the_floor():
    assert lr_factor("cosine", 10, warmup=0, progress=1.7, min_lr_ratio=0.2) == pytest.approx(0.2)
    assert math.isclose(lr_factor("cosine", 1, warmup=0, progress=0.0), 1.0)
