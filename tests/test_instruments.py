"""Training instruments: attention entropy, residual-stream norm and gradient norm per layer, against values computed
independently; logged at each evaluation and drawn from metrics.jsonl."""

import json
import math

import pytest
import torch
from matplotlib.image import imread
from torch.testing import assert_close

from attnkit.config import ModelConfig
from attnkit.models import build_model
from attnkit.train.instruments import attention_entropy, gradient_norms, measure_activations
from attnkit.viz.instruments import plot_run_instruments, read_instruments


def _model(**kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=32, **kw))


def test_entropy_is_log_s_for_uniform_rows_and_zero_for_one_hot():
    uniform = torch.full((2, 3, 4, 8), 1 / 8)
    assert_close(attention_entropy(uniform), torch.tensor(math.log(8)))
    one_hot = torch.zeros(1, 1, 3, 5)
    one_hot[..., 2] = 1.0
    assert float(attention_entropy(one_hot)) == 0.0


def test_activations_match_the_reference_weights_and_hidden_states():
    model = _model().eval()
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        out = model(ids, need_weights=True)
        hidden = []
        handles = [b.register_forward_hook(lambda m, a, o: hidden.append(o[0])) for b in model.stack.blocks]
        model(ids)
        for handle in handles:
            handle.remove()
        with measure_activations(model, max_calls=1) as measured:
            model(ids)
            model(torch.randint(0, 40, (2, 10)))  # beyond max_calls: not counted
    summary = measured.summary()
    for layer in range(2):
        weights = out.attentions[layer]["self"]
        expected = -(weights * weights.clamp_min(1e-30).log()).sum(-1).mean()
        assert summary[f"attention_entropy/stack.causal.{layer}"] == pytest.approx(float(expected), rel=1e-5)
        norm = hidden[layer].norm(dim=-1).mean()
        assert summary[f"residual_norm/stack.{layer}"] == pytest.approx(float(norm), rel=1e-5)


def test_gradient_norms_per_block():
    model = _model()
    ids = torch.randint(0, 40, (2, 10))
    model(ids, targets=ids).loss.backward()
    norms = gradient_norms(model)
    assert set(norms) == {"grad_norm/stack.0", "grad_norm/stack.1"}
    for layer, block in enumerate(model.stack.blocks):
        expected = torch.cat([p.grad.flatten() for p in block.parameters()]).norm()
        assert norms[f"grad_norm/stack.{layer}"] == pytest.approx(float(expected), rel=1e-5)


def test_plot_is_drawn_from_metrics(tmp_path):
    records = [{"kind": "eval", "step": 1, "val_loss": 3.0}] + [
        {"kind": "instruments", "step": step, "attention_entropy/stack.causal.0": 2.0 - step / 10,
         "residual_norm/stack.0": 1.0 + step, "grad_norm/stack.0": 0.5 * step, "grad_norm/stack.1": step}
        for step in (10, 20, 30)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "instr')
    assert len(read_instruments(tmp_path / "metrics.jsonl")) == 3  # the torn last line is skipped
    image = imread(plot_run_instruments(tmp_path))
    assert image.shape[0] > 600 and image[..., :3].std() > 0.05
    assert plot_run_instruments(tmp_path / "nowhere") is None
