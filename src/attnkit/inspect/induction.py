"""A model whose answer is known: a two-layer attention-only decoder trained on repeated random tokens, which learns
induction heads (Olsson et al. 2022): on `x1..xn x1..xn` the second half is predictable only by finding the earlier
copy of the current token and copying the token after it. A previous-token head in layer 0 writes each token's
predecessor into its position; an induction head in layer 1 matches the current token against those and attends
to the token after the earlier copy (n - 1 positions back).

The analyses are tried on this model first: the detector must name its induction head, ablating that head must send
the second half's loss back up, and patching it must restore the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.blocks import DecoderBlock
from attnkit.inspect.head_types import repeated_tokens
from attnkit.inspect.inputs import lm_batch, token_losses
from attnkit.layers.attention import Attention
from attnkit.layers.embedding import Embeddings
from attnkit.layers.positions import LearnedPositions
from attnkit.models.decoder import DecoderLM
from attnkit.models.stack import TransformerStack


class NoFeedForward(nn.Module):
    """The attention-only model's FFN: nothing added to the stream (x -> 0), so each block is attention alone."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def attention_only_decoder(*, vocab_size: int, d_model: int, n_heads: Sequence[int], max_seq_len: int) -> DecoderLM:
    """A pre-norm decoder LM of attention blocks only, with learned positions (Elhage et al. 2021's toy models);
    `n_heads` gives each layer's heads (one layer per entry)."""
    blocks = [DecoderBlock(self_attn=Attention(d_model, heads, bias=False), attn_norm=nn.LayerNorm(d_model),
                           mlp=NoFeedForward(), mlp_norm=nn.Identity()) for heads in n_heads]
    positions = LearnedPositions(max_seq_len, d_model)
    positions.init_weights()
    stack = TransformerStack(embeddings=Embeddings(vocab_size, d_model, positions=positions), blocks=blocks,
                             final_norm=nn.LayerNorm(d_model))
    return DecoderLM(stack=stack, lm_head=nn.Linear(d_model, vocab_size, bias=False))


@dataclass(frozen=True)
class InductionTask:
    """Repeated random sequences from a vocabulary of `vocab_size`: `half` tokens, then the same again. Training
    batches draw their `half` between `shortest` and `half`, so that the copy sits at no fixed distance and a head
    that attends a fixed number of positions back cannot stand in for an induction head."""

    vocab_size: int = 24
    half: int = 8
    shortest: int = 4
    batch: int = 32

    def ids(self, generator: torch.Generator, batch: int | None = None, half: int | None = None) -> Tensor:
        """(B, 2 * half) token ids."""
        return repeated_tokens(self.vocab_size, half or self.half, batch=batch or self.batch, generator=generator)

    def training_ids(self, generator: torch.Generator) -> Tensor:
        """A training batch, (B, 2 * n) with n drawn from [shortest, half]."""
        half = int(torch.randint(self.shortest, self.half + 1, (), generator=generator))
        return self.ids(generator, half=half)

    def half_losses(self, model: nn.Module, ids: Tensor) -> tuple[float, float]:
        """The model's mean next-token loss on the first half's predictions and on the repeated half's, ids (B, 2n)."""
        half = ids.shape[1] // 2
        batch = lm_batch(ids)
        with torch.no_grad():
            losses = token_losses(batch.logits(model(*batch.args)), batch.labels)  # (B, 2n - 1)
        return float(losses[:, : half - 1].mean()), float(losses[:, half:].mean())


def train_induction(model: nn.Module, task: InductionTask, *, steps: int, lr: float = 3e-3, seed: int = 0
                    ) -> list[float]:
    """Train `model` on `task` with Adam for `steps` steps; returns the loss of each step."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        batch = lm_batch(task.training_ids(generator))
        loss = model(*batch.args, labels=batch.labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
