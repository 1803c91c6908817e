"""The position-wise feed-forward network: the same two-layer MLP applied to every token.

```
relu/gelu/silu:  x -> up (C -> d_ff) -> act -> down (d_ff -> C)       (Vaswani et al. 2017, eq. 2)
swiglu:     x -> gate (C -> d_ff) -> silu --*--> down (d_ff -> C)    (Shazeer 2020; Llama)
            x -> up   (C -> d_ff) ----------'
```
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.layers.autocast import cast_for_autocast

_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # x * sigmoid(x), "swish" (Ramachandran et al. 2017; Marian)
}


def activation_function(name: str) -> Callable[[Tensor], Tensor]:
    """The elementwise activation `name`: relu, gelu, gelu_tanh or silu. Raises ValueError for any other."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; use one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


class FeedForward(nn.Module):
    """`down(act(up(x)))` with ReLU, GELU or SiLU. (B, T, C) -> (B, T, C)."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "gelu", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.act = activation_function(activation)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.act(self.up_proj(x))  # (B, T, d_ff)
        return self.down_proj(self.dropout(hidden))


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`, the gated FFN of Llama. (B, T, C) -> (B, T, C)."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, dropout: float = 0.0):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = cast_for_autocast(x)  # read by two products: one cast under autocast, not two
        hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, T, d_ff)
        return self.down_proj(self.dropout(hidden))


def make_feedforward(activation: str, d_model: int, d_ff: int, *, bias: bool, dropout: float) -> nn.Module:
    if activation == "swiglu":
        return SwiGLU(d_model, d_ff, bias=bias, dropout=dropout)
    return FeedForward(d_model, d_ff, activation=activation, bias=bias, dropout=dropout)
