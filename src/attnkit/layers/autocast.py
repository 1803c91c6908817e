"""One cast of an input that several products read under autocast.

Under `torch.autocast` every `nn.Linear` casts its input to the lower precision itself, and autograd keeps that
cast copy for the backward pass. Where one input feeds several products (self-attention's q, k and v projections,
cross-attention's k and v, SwiGLU's gate and up), each product makes and keeps its own copy: with q, k and v,
two (B, T, C) copies per layer more than a fused [q; k; v] product keeps (nanoGPT's and GPT-2's `c_attn`). Casting
once first gives every product the same tensor. The forward numbers are unchanged: autocast's own cast rounds the
same way and passes a tensor already in the target dtype through. The gradient reaching the shared copy is summed
in bf16 before its cast back (autograd sums a tensor's gradients in its dtype), so gradients are not the same bit
for bit; measured against fp32 they are as close as before (tests/test_autocast_inputs.py).
"""

from __future__ import annotations

import torch
from torch import Tensor


def cast_for_autocast(x: Tensor) -> Tensor:
    """x in autocast's lower precision when autocast is on for x's device and x is a floating-point tensor of
    another dtype; otherwise x itself. (..., C) -> (..., C)"""
    device = x.device.type
    if not x.is_floating_point():
        return x
    # Devices without autocast (meta tensors, say) are asked about outside compiled graphs only: a graph runs on a
    # device that has autocast, and torch 2.11's Dynamo cannot trace `is_autocast_available`
    if not torch.compiler.is_compiling() and not torch.amp.is_autocast_available(device):
        return x
    if not torch.is_autocast_enabled(device):
        return x
    return x.to(torch.get_autocast_dtype(device))
