"""Output projection and cross-entropy fused, in chunks of tokens: the (N, V) logits are never all in memory.

With a large vocabulary (GPT-2: V = 50,257) the logits of a training batch dwarf everything else: 1,024 tokens
make 51 M floats, written, soft-maxed, read back and differentiated, in fp32. Here each chunk of tokens computes
its logits, log-softmax and loss in fp32, and at once the gradient of its logits (softmax - one-hot), which two
matrix products turn into the chunk's rows of the input gradient and its share of the weight gradient, added
into one (V, C) buffer; backward only scales. So no (N, V) tensor exists, not even the logits' gradient: memory
beyond the weight gradient is one chunk's logits (Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary
Language Models", do the same inside one kernel). The plain path (`lm_head` then `F.cross_entropy`) stays the
reference; tests hold the two equal in value and gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.data.batching import IGNORE_INDEX


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int, smoothing: float):
        # hidden (N, C), weight (V, C), targets (N,). Products run in the autocast dtype when autocast is on.
        device_type = hidden.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
        h, w = hidden.to(dtype), weight.to(dtype)
        vocab = w.shape[0]
        valid = targets != IGNORE_INDEX
        row_scale = valid / valid.sum().clamp(min=1)  # (N,): the mean over valid targets, 0 for ignored ones
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight) if want_weight else None  # the weight's own dtype, fp32 masters
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, h.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            chunk_targets = targets[rows].clamp(min=0)[:, None]  # (n, 1)
            # log_softmax in place: logits - max, then log-sum-exp; no second (n, V) tensor
            logits = (h[rows] @ w.t()).float()  # (n, C) @ (C, V) -> (n, V)
            logits -= logits.amax(dim=-1, keepdim=True)
            picked = logits.gather(1, chunk_targets).squeeze(1)  # (n,)
            mean = logits.mean(dim=-1) if smoothing else None
            probs = logits.exp_()  # (n, V), unnormalised
            sums = probs.sum(dim=-1)
            log_sums = sums.log()
            # -log p_t = lse - x_t; label smoothing adds e (lse - mean x) in place of e (lse - x_t)
            loss = log_sums - (1 - smoothing) * picked - (smoothing * mean if smoothing else 0)
            total = total + (loss * row_scale[rows]).sum()
            if not (want_hidden or want_weight):
                continue
            # d loss_i / d logits_i = softmax - (1 - e) one_hot - e / V, scaled by the row's share of the mean
            probs /= sums[:, None]
            probs.scatter_add_(1, chunk_targets, torch.full_like(chunk_targets, smoothing - 1, dtype=probs.dtype))
            if smoothing:
                probs -= smoothing / vocab
            grad_logits = probs.mul_(row_scale[rows, None]).to(dtype)  # (n, V)
            if want_hidden:
                grad_hidden[rows] = grad_logits @ w  # (n, V) @ (V, C) -> (n, C)
            if want_weight:
                _add_product(grad_weight, grad_logits.t(), h[rows])  # (V, n) @ (n, C) -> (V, C)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        # the usual upstream gradient is 1: no second (V, C) tensor then; a compiled step scales without looking
        # (reading the value would split its graph, and the scaling fuses into what follows)
        if torch.compiler.is_compiling() or bool(grad_output != 1):
            grad_hidden = grad_hidden * grad_output if grad_hidden is not None else None
            grad_weight = grad_weight * grad_output if grad_weight is not None else None
        return grad_hidden, grad_weight, None, None, None


def _add_product(out: Tensor, a: Tensor, b: Tensor) -> None:
    """out += a @ b, in place when the dtypes agree; under autocast the product is bf16 and `out` the fp32 master
    weight's gradient, so the product is added slice by slice of out's rows to keep the temporary small."""
    if a.dtype == out.dtype:
        out.addmm_(a, b)
        return
    for start in range(0, out.shape[0], _ROWS_PER_SLICE):
        rows = slice(start, start + _ROWS_PER_SLICE)
        out[rows] += a[rows] @ b


_ROWS_PER_SLICE = 8192  # of the weight gradient: an (8192, C) bf16 temporary in place of a (V, C) one


def chunked_linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    chunk_size: int = 256,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, ignoring -100, without keeping the logits.

    hidden: (…, C); weight: (V, C), the output projection (no bias); targets: (…) class ids.
    """
    hidden_2d = hidden.reshape(-1, hidden.shape[-1])  # (…, C) -> (N, C)
    return _ChunkedLinearCrossEntropy.apply(hidden_2d, weight, targets.reshape(-1), chunk_size, label_smoothing)
