"""Training precisions: the bf16 copy with fp32 master weights keeps what bf16 alone would round away, its
gradients match fp32 ones to bf16 accuracy, and it moves gradients and weights between the two models faithfully."""

import pytest
import torch
from torch import nn

from attnkit import build_model, presets
from attnkit.errors import ConfigError
from attnkit.train import TrainConfig
from attnkit.train.precision import TRAIN_DTYPES, Autocast, FullPrecision, MasterWeights, make_precision


@pytest.fixture
def gpt2_tiny():
    torch.manual_seed(0)
    return build_model(presets.get("gpt2-tiny").replace(dropout=0.0))


def test_the_compute_copy_is_bf16_tied_like_the_model_and_leaves_the_model_alone(gpt2_tiny):
    before = {name: t.clone() for name, t in gpt2_tiny.state_dict().items()}
    precision = MasterWeights(gpt2_tiny)
    compute = precision.compute_model
    assert compute is not gpt2_tiny
    assert {p.dtype for p in compute.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in gpt2_tiny.parameters()} == {torch.float32}
    assert compute.lm_head.weight is compute.stack.embeddings.token.weight  # still one tensor
    for name, tensor in gpt2_tiny.state_dict().items():
        assert torch.equal(tensor, before[name]), name
        assert torch.equal(compute.state_dict()[name], tensor.to(compute.state_dict()[name].dtype)), name


def test_master_weights_keep_updates_smaller_than_half_a_bf16_step():
    """bf16 has 8 bits of mantissa: at 1.0 a step is 2^-7, so adding 1e-3 to a bf16 1.0 gives 1.0 again. Ten such
    updates applied to the fp32 masters add up to 1.01, which the bf16 copy then shows (as 1.0078125)."""
    layer = nn.Linear(4, 1, bias=False)
    nn.init.ones_(layer.weight)
    precision = MasterWeights(layer)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)
    naive = torch.ones(4, dtype=torch.bfloat16)
    for _ in range(10):
        precision.compute_model(-torch.ones(1, 4, dtype=torch.bfloat16)).sum().backward()  # d/dw = -1
        precision.gradients_to_model()
        optimizer.step()
        optimizer.zero_grad()
        precision.weights_to_compute()
        naive -= 1e-3
    assert torch.equal(naive, torch.ones(4, dtype=torch.bfloat16))  # bf16 in place: every update lost
    torch.testing.assert_close(layer.weight, torch.full((1, 4), 1.01), rtol=0, atol=1e-6)
    assert torch.equal(precision.compute_model.weight, torch.full((1, 4), 1.01).to(torch.bfloat16))
    assert precision.compute_model.weight[0, 0].item() == 1.0078125


def test_gradients_accumulate_in_fp32_on_the_model_and_leave_the_copy(gpt2_tiny):
    precision = MasterWeights(gpt2_tiny)
    compute = precision.compute_model
    ids = torch.randint(0, 64, (2, 2, 12), generator=torch.Generator().manual_seed(1))
    expected: dict[str, torch.Tensor] = {}
    for micro_batch in ids:
        compute(micro_batch, labels=micro_batch).loss.backward()
        for name, param in compute.named_parameters():
            expected[name] = expected.get(name, 0) + param.grad.float()
        precision.gradients_to_model()
        assert all(p.grad is None for p in compute.parameters())
    for name, param in gpt2_tiny.named_parameters():
        assert param.grad.dtype == torch.float32
        torch.testing.assert_close(param.grad, expected[name], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama2-tiny", "vaswani-tiny"])
def test_bf16_gradients_agree_with_fp32_gradients(name):
    """The bf16 copy's gradient, moved to the model, is the fp32 gradient to bf16 accuracy (the reference path)."""
    torch.manual_seed(0)
    config = presets.get(name).replace(dropout=0.0)
    model = build_model(config)
    ids = torch.randint(4, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    args = (ids, ids) if config.family == "encoder-decoder" else (ids,)
    model(*args, labels=ids).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    precision = MasterWeights(model)
    precision.compute_model(*args, labels=ids).loss.backward()
    precision.gradients_to_model()
    got = torch.cat([p.grad.flatten() for _, p in model.named_parameters()])
    want = torch.cat([reference[n].flatten() for n, _ in model.named_parameters()])
    assert ((got - want).norm() / want.norm()).item() < 0.02  # measured 0.005-0.006
    assert torch.nn.functional.cosine_similarity(got, want, dim=0).item() > 0.9995


def test_make_precision_names_each_strategy(gpt2_tiny):
    assert TRAIN_DTYPES == ("fp32", "bf16", "bf16-master")
    assert type(make_precision("fp32", gpt2_tiny)) is FullPrecision
    assert make_precision("fp32", gpt2_tiny).compute_model is gpt2_tiny
    autocast = make_precision("bf16", gpt2_tiny)
    assert type(autocast) is Autocast and autocast.compute_model is gpt2_tiny
    with autocast.context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert type(make_precision("bf16-master", gpt2_tiny)) is MasterWeights


def test_an_unknown_training_dtype_is_refused_with_the_choices(gpt2_tiny):
    message = "dtype='fp16' is not a known choice; use one of fp32, bf16, bf16-master"
    with pytest.raises(ConfigError, match=message):
        TrainConfig(dtype="fp16")
    with pytest.raises(ConfigError, match=message):
        make_precision("fp16", gpt2_tiny)
