"""Output projection and cross-entropy fused, in chunks of tokens: the (N, V) logits are never all in memory.

With a large vocabulary (GPT-2: V = 50,257) the logits of a training batch dwarf everything else: 1,024 tokens
make 51 M floats, written, soft-maxed, read back and differentiated. Here each chunk of tokens computes its
logits, its loss, and at once its gradients (softmax - one-hot), which backward only scales. The plain path
(`lm_head` then `F.cross_entropy`) stays the reference; tests hold the two equal in value and gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int, smoothing: float):
        # hidden (N, C), weight (V, C), targets (N,)
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        valid = targets != IGNORE_INDEX
        n_valid = valid.sum().clamp(min=1)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n_tokens, chunk_size):
            rows = slice(start, start + chunk_size)
            chunk_targets, chunk_valid = targets[rows], valid[rows]
            logits = (hidden[rows] @ weight.t()).float()  # (n, V)
            log_z = torch.logsumexp(logits, dim=-1)  # (n,)
            safe_targets = chunk_targets.clamp(min=0)
            target_logit = logits.gather(1, safe_targets[:, None]).squeeze(1)
            loss = (1 - smoothing) * (log_z - target_logit)
            if smoothing:
                loss = loss + smoothing * (log_z - logits.mean(dim=-1))
            total = total + (loss * chunk_valid).sum()
            if needs_grad:
                # d loss_i / d logits_i = softmax - (1 - e) one_hot - e / V, for valid rows; / n_valid (mean)
                grad_logits = torch.softmax(logits, dim=-1)
                grad_logits.scatter_add_(
                    1, safe_targets[:, None], torch.full_like(target_logit[:, None], -(1 - smoothing))
                )
                if smoothing:
                    grad_logits -= smoothing / vocab
                grad_logits *= (chunk_valid / n_valid)[:, None]
                grad_logits = grad_logits.to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = grad_logits @ weight  # (n, V) @ (V, C) -> (n, C)
                if grad_weight is not None:
                    grad_weight += (grad_logits.t() @ hidden[rows]).float()  # (V, n) @ (n, C) -> (V, C)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total / n_valid

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scaled_hidden = grad_hidden * grad_output if grad_hidden is not None else None
        scaled_weight = (grad_weight * grad_output).to(ctx.weight_dtype) if grad_weight is not None else None
        return scaled_hidden, scaled_weight, None, None, None


def chunked_linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    chunk_size: int = 1024,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, ignoring -100, without keeping the logits.

    hidden: (…, C); weight: (V, C), the output projection (no bias); targets: (…) class ids.
    """
    hidden_2d = hidden.reshape(-1, hidden.shape[-1])  # (…, C) -> (N, C)
    return _ChunkedLinearCrossEntropy.apply(hidden_2d, weight, targets.reshape(-1), chunk_size, label_smoothing)
