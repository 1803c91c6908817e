"""benchmarks/nanogpt.py, the one nanoGPT every training benchmark measures against: model.py's forward and init, and
train.py's iteration (its learning-rate schedule, the batch fetched before backward, clipping) as `train_step` runs
it; and the CPU recipes' nanoGPT row, which trains that model through that step."""

import contextlib
import math

import pytest
import torch
from shared_data import shared

from benchmarks import bench_train
from benchmarks.nanogpt import GPT, GPTConfig, get_lr, train_step

TINY = GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32)


def test_get_lr_warms_up_then_follows_the_cosine_down_to_min_lr():
    """train.py's get_lr at nanoGPT's CPU Shakespeare setting (1e-3, warmup 100, decay over 2,000 to 1e-4)."""
    lr = dict(learning_rate=1e-3, warmup_iters=100, lr_decay_iters=2000, min_lr=1e-4)
    assert get_lr(0, **lr) == pytest.approx(1e-3 / 101)
    assert get_lr(99, **lr) == pytest.approx(1e-3 * 100 / 101)
    assert get_lr(100, **lr) == pytest.approx(1e-3)
    assert get_lr(1050, **lr) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way: cos(pi / 2) = 0
    assert get_lr(2000, **lr) == pytest.approx(1e-4)
    assert get_lr(5000, **lr) == 1e-4


def test_train_step_sets_the_rate_and_fetches_the_next_batch_before_backward():
    """The first batch is fetched when the step is built; each step trains on the batch fetched before it, sets
    lr(iteration) first, and fetches the next batch after the forward and before the backward."""
    torch.manual_seed(0)
    model = GPT(TINY)
    optimizer = model.configure_optimizers(0.1, 1.0, (0.9, 0.95), "cpu")
    batches = [(torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))) for _ in range(4)]
    events: list[tuple] = []

    def get_batch():
        events.append(("fetch", len([e for e in events if e[0] == "fetch"])))
        return batches[events[-1][1]]

    def forward(x, y):
        events.append(("forward", next(i for i, b in enumerate(batches) if b[0] is x), optimizer.param_groups[0]["lr"]))
        return model(x, y)

    step = train_step(model, optimizer, get_batch, forward=forward, ctx=contextlib.nullcontext(),
                      lr=lambda it: 0.1 * (it + 1))
    assert events == [("fetch", 0)]
    step()
    step()
    assert events == [("fetch", 0), ("forward", 0, 0.1), ("fetch", 1), ("forward", 1, 0.2), ("fetch", 2)]


@pytest.mark.parametrize("grad_clip", [0.0, 1e-3])
def test_train_step_clips_the_gradient_norm_before_the_update(grad_clip):
    torch.manual_seed(0)
    model = GPT(TINY)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    norms = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: norms.append(
        torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()))
    batch = (torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16)))
    step = train_step(model, optimizer, lambda: batch, forward=model, ctx=contextlib.nullcontext(), grad_clip=grad_clip)
    loss = step()
    assert torch.isfinite(loss) and len(norms) == 1
    if grad_clip:
        assert norms[0] == pytest.approx(grad_clip, rel=1e-3)
    else:
        assert norms[0] > 10 * 1e-3  # unclipped: the clipped run's bound is far below it
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)


def test_forward_without_targets_gives_the_last_positions_logits_and_refuses_past_block_size():
    torch.manual_seed(0)
    model = GPT(TINY)
    x = torch.randint(0, 50, (3, 16))
    with torch.no_grad():
        every, loss = model(x, x)
        last, none = model(x)
    assert none is None and loss is not None and every.shape == (3, 16, 50) and last.shape == (3, 1, 50)
    torch.testing.assert_close(last[:, 0], every[:, -1])
    with pytest.raises(ValueError, match="longer than block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_init_ties_the_output_to_wte_and_scales_the_residual_projections():
    """N(0, 0.02) weights, zero biases, c_proj at 0.02 / sqrt(2 L) (GPT-2's scaled init), lm_head the same tensor as
    wte; the optimizer's two groups are the matrices (decayed) and the vectors (not)."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=16, vocab_size=512, n_layer=8, n_head=4, n_embd=256)
    model = GPT(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    block = model.transformer.h[0]
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for projection in (block.attn.c_proj, block.mlp.c_proj):
        assert projection.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * config.n_layer), rel=0.05)
        assert not projection.bias.any()
    decayed, kept = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
    assert (decayed["weight_decay"], kept["weight_decay"]) == (0.1, 0.0)
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in kept["params"])
    assert len(decayed["params"]) + len(kept["params"]) == len(list(model.parameters()))
    assert model.get_num_params(non_embedding=False) - model.get_num_params() == 16 * 256  # wpe


@pytest.mark.slow  # a pass over every validation token and 200 batches: about 7 s
def test_the_recipes_nanogpt_row_trains_nanogpts_model_from_its_seeded_init(monkeypatch):
    """`python -m benchmarks train nanogpt`'s loop (2 steps here) starts from the weights `nanogpt.GPT` draws at the
    seed, with no biases (the shakespeare_char setting), and trains them: its row reports the losses it measured."""
    shared("tinyshakespeare", "input.txt")
    built = []

    def build(config: GPTConfig) -> GPT:
        model = GPT(config)
        built.append((model, {k: v.clone() for k, v in model.state_dict().items()}))
        return model

    monkeypatch.setattr(bench_train, "GPT", build)
    torch.manual_seed(5)
    expected = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, bias=False)).state_dict()
    row = bench_train.nanogpt_train(5, 2)
    ((model, initial),) = built
    assert not model.config.bias and initial.keys() == expected.keys()
    assert all(torch.equal(initial[k], expected[k]) for k in expected)
    assert all(not torch.equal(initial[k], v) for k, v in model.state_dict().items() if k.endswith("weight"))
    assert row["steps"] == 2 and 3.0 < row["val_loss_every_token"] < 5.0  # near ln(65) = 4.17 after two steps
    assert row["parameters"] == model.get_num_params(non_embedding=False)


def test_the_parity_row_finds_the_shakespeare_recipes_model_computing_nanogpts_logits():
    """`python -m benchmarks train nanogpt`'s first row: the recipe shakespeare-char, as `attnkit train --recipe`
    builds it, loaded with a nanoGPT model's weights (no biases), gives its logits."""
    shared("tinyshakespeare", "input.txt")
    assert bench_train.nanogpt_parity(65, 64)["max_logit_difference"] < 1e-5
