"""The feed-forward neural language models the lectures teach before the RNN: Bengio et al.'s (2003) fixed window
and the deep averaging network (Iyyer et al. 2015) read as a language model."""

from attnkit.models.feedforward.lm import FeedForwardLM, PrefixState

__all__ = ["FeedForwardLM", "PrefixState"]
