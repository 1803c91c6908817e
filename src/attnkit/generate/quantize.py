"""int8 weight-only quantization for decoding: each linear layer's weight stored as int8 with one scale per row.

Decoding one token at a time reads every weight once per token, so its speed is bounded by memory bandwidth, not
arithmetic. Storing weights in 8 bits instead of 16 halves the bytes read; activations stay bf16. Each output row
r keeps scale_r = max|W_r| / 127 and W_r ~ scale_r * round(W_r / scale_r) (symmetric, per-channel, as in
LLM.int8's weight-only baselines and gpt-fast's int8 mode). The quality cost is measured, not assumed:
`python -m benchmarks int8` reports perplexity before and after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.generate.swap import swap_linear_layers


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight (N, K) -> int8 weight (N, K) and fp32 scales (N,), symmetric per output row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # (N,)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


class Int8Linear(nn.Module):
    """A linear layer with an int8 weight and per-row scales. x (…, K) -> (…, N), in x's dtype.

    The product runs in bf16 through PyTorch's int8-weight kernel (`torch._weight_int8pack_mm`); `reference`
    dequantizes and multiplies, the readable path that tests hold it equal to.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight, scales = quantize_rows(linear.weight)
        self.register_buffer("weight", weight)  # (N, K) int8
        self.register_buffer("scales", scales.to(torch.bfloat16))  # (N,)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (M, K)
        out = torch._weight_int8pack_mm(rows, self.weight, self.scales)  # (M, N)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def reference(self, x: Tensor) -> Tensor:
        dequantized = self.weight.float() * self.scales.float()[:, None]  # (N, K)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), dequantized, bias).to(x.dtype)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by an Int8Linear; returns the model, for inference only.

    A tied output layer gets its own int8 copy; the embedding table it was tied to stays as it was.
    """
    return swap_linear_layers(model, lambda linear: Int8Linear(linear).to(linear.weight.device))
