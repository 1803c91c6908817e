"""The gated causal convolution block of Dauphin et al. (2017), "Language Modeling with Gated Convolutional
Networks" (GCNN), section 2, with WaveNet's and ByteNet's dilation (van den Oord et al. 2016; Kalchbrenner et al.
2016):

    x (B, C, T) -> pad (k - 1) * d zeros on the left -> Conv1d(C -> 2C, k, dilation d) -> A, G (B, C, T) each
                -> A * sigmoid(G)   (the gated linear unit, GLU)   -> dropout -> + x

Position t reads x[t], x[t - d], ..., x[t - (k - 1) d]: the zeros on the left stand for the text before the first
token, and nothing to the right of t is read (the lecture's "condition representations on local context"). The
paper's blocks also come in bottleneck form with weight normalisation; these are its plain residual blocks.

The residual sum is the paper's, x + h(x), unscaled. fairseq's GCNN (`fconv_lm`, whose decoder is ConvS2S's)
multiplies each sum by sqrt(0.5) to keep the variance from growing with depth, which Gehring et al. (2017, section
3.5) introduced and Dauphin et al. do not describe. The weights start as torch's Conv1d does, U(+-1/sqrt(k C)); the
paper says only "Kaiming initialization" (He et al. 2015), and fairseq draws N(0, 4 (1 - p) / (k C)) under weight
normalisation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalConv1d(nn.Module):
    """A 1-D convolution over time that reads only the present and the past: out[t] = b + sum_j W[:, :, j]
    x[t - (k - 1 - j) d], with x before the first position read as zeros."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.left = (kernel_size - 1) * dilation  # positions each output reaches back
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """x (B, C_in, T) -> (B, C_out, T). past (B, C_in, left): the inputs just before x (a decoding step's
        `ConvState`); None reads zeros there, the text before the first token."""
        padded = F.pad(x, (self.left, 0)) if past is None else torch.cat((past, x), dim=2)  # (B, C_in, left + T)
        return self.conv(padded)  # (B, C_in, left + T) -> (B, C_out, T)


class GatedConvBlock(nn.Module):
    """h(x) = x + dropout((x * W + b) ⊗ sigmoid(x * V + c)), * a causal convolution (Dauphin et al. 2017, eq. 1 with
    the residual connection of section 2)."""

    def __init__(self, d_model: int, kernel_size: int, *, dilation: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        self.conv = CausalConv1d(d_model, 2 * d_model, kernel_size, dilation)  # W and V as one convolution
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """x (B, C, T) -> (B, C, T); past (B, C, (k - 1) d): the block's inputs before x, as `CausalConv1d` reads
        them."""
        gated = F.glu(self.conv(x, past), dim=1)  # (B, 2C, T) -> (B, C, T): A * sigmoid(G)
        return x + self.dropout(gated)
