"""The convolutional sequence model: the gated convolutional language model of Dauphin et al. (2017), with
WaveNet's and ByteNet's dilations (lecture 004's second type: representations conditioned on local context)."""

from attnkit.models.convolutional.gated import CausalConv1d, GatedConvBlock
from attnkit.models.convolutional.lm import ConvLM, ConvState

__all__ = ["CausalConv1d", "ConvLM", "ConvState", "GatedConvBlock"]
