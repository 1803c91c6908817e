"""Output projection and cross-entropy fused, in chunks of tokens: the (N, V) logits are never all in memory.

With a large vocabulary (GPT-2: V = 50,257) the logits of a training batch dwarf everything else: 1,024 tokens
make 51 M floats, written, soft-maxed, read back and differentiated, in fp32. Here each chunk of tokens computes
its logits, log-softmax and loss in fp32, and at once the gradient of the logits (softmax - one-hot), kept in the
compute dtype (bf16 under autocast); two matrix products then give the input and weight gradients, which
backward only scales. The plain path (`lm_head` then `F.cross_entropy`) stays the reference; tests hold the two
equal in value and gradient.
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
        n_tokens, vocab = h.shape[0], w.shape[0]
        valid = targets != IGNORE_INDEX
        row_scale = valid / valid.sum().clamp(min=1)  # (N,): the mean over valid targets, 0 for ignored ones
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_logits = torch.empty((n_tokens, vocab), dtype=dtype, device=h.device) if needs_grad else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, n_tokens, chunk_size):
            rows = slice(start, start + chunk_size)
            chunk_targets = targets[rows].clamp(min=0)[:, None]  # (n, 1)
            log_probs = torch.log_softmax((h[rows] @ w.t()).float(), dim=-1)  # (n, C) @ (C, V) -> (n, V)
            loss = -(1 - smoothing) * log_probs.gather(1, chunk_targets).squeeze(1)
            if smoothing:
                loss = loss - smoothing * log_probs.mean(dim=-1)
            total = total + (loss * row_scale[rows]).sum()
            if needs_grad:
                # d loss_i / d logits_i = softmax - (1 - e) one_hot - e / V, scaled by the row's share of the mean
                probs = log_probs.exp_()
                probs.scatter_add_(1, chunk_targets, torch.full_like(chunk_targets, smoothing - 1, dtype=probs.dtype))
                if smoothing:
                    probs -= smoothing / vocab
                grad_logits[rows] = probs.mul_(row_scale[rows, None])
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad_logits @ w).to(hidden.dtype)  # (N, V) @ (V, C) -> (N, C)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_logits.t() @ h).to(weight.dtype)  # (V, N) @ (N, C) -> (V, C)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scaled_hidden = grad_hidden * grad_output if grad_hidden is not None else None
        scaled_weight = grad_weight * grad_output if grad_weight is not None else None
        return scaled_hidden, scaled_weight, None, None, None


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
