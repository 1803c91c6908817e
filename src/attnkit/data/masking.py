"""BERT's masked-language-model inputs (Devlin et al. 2019, 3.1 "Task #1: Masked LM").

Each batch is masked afresh ("dynamic masking", Liu et al. 2019, RoBERTa 4.1), from a generator the caller
passes in, so a run that saves and restores that generator's state masks its batches the same way again:

    every token except special ones (CLS, SEP, PAD, ...) is chosen with probability 0.15
    a chosen token becomes  [MASK]          with probability 0.8
                            a random token  with probability 0.1   (never a special one)
                            itself          with probability 0.1
    labels: the original id at chosen positions, IGNORE_INDEX (-100) everywhere else: only chosen tokens
            carry loss

The random draws have fixed shapes whatever the tokens are, so the generator advances by the same amount for
every batch of a given shape.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from attnkit.data.batching import IGNORE_INDEX
from attnkit.errors import ConfigError, InputError

MASK_PROB = 0.15  # share of the (non-special) tokens chosen for prediction
MASK_TOKEN_PROB = 0.8  # of those: replaced by [MASK]
RANDOM_TOKEN_PROB = 0.1  # replaced by a random token (the remaining 0.1 stay as they are)


def mask_tokens(
    ids: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Collection[int],
    generator: torch.Generator,
    mask_prob: float = MASK_PROB,
    mask_token_prob: float = MASK_TOKEN_PROB,
    random_token_prob: float = RANDOM_TOKEN_PROB,
) -> tuple[Tensor, Tensor]:
    """Masked inputs and labels for a batch of token ids (see the module docstring).

    ids: (B, T) int64 on the generator's device. Returns inputs (B, T) and labels (B, T), both int64.
    A batch with any maskable token gets at least one chosen position (the one with the smallest draw), so its
    loss is never an average over nothing.
    Raises ConfigError for probabilities outside [0, 1] and InputError for ids outside the vocabulary.
    """
    if not 0.0 < mask_prob <= 1.0:
        raise ConfigError(f"mask_prob={mask_prob} must lie in (0, 1] (BERT: 0.15)")
    if min(mask_token_prob, random_token_prob) < 0.0 or mask_token_prob + random_token_prob > 1.0:
        raise ConfigError(
            f"mask_token_prob={mask_token_prob} and random_token_prob={random_token_prob} must be >= 0 and sum to "
            "at most 1 (BERT: 0.8 and 0.1)"
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise InputError(f"token ids must lie in [0, {vocab_size}); got {int(ids.min())} .. {int(ids.max())}")
    specials = torch.tensor(sorted(special_ids), dtype=ids.dtype, device=ids.device)
    if not 0 <= mask_id < vocab_size or mask_id not in set(special_ids):
        raise InputError(f"mask_id={mask_id} must be one of the special ids {sorted(special_ids)}")
    replacements = _non_special_ids(vocab_size, specials)

    maskable = ~torch.isin(ids, specials)  # (B, T)
    choose_draw = torch.rand(ids.shape, generator=generator, device=ids.device)
    action_draw = torch.rand(ids.shape, generator=generator, device=ids.device)
    random_ids = replacements[
        torch.randint(len(replacements), ids.shape, generator=generator, device=ids.device)
    ]  # (B, T)

    chosen = maskable & (choose_draw < mask_prob)
    if not chosen.any() and maskable.any():
        first = choose_draw.masked_fill(~maskable, 2.0).argmin()  # the maskable position with the smallest draw
        chosen.view(-1)[first] = True
    to_mask = chosen & (action_draw < mask_token_prob)
    to_random = chosen & (action_draw >= mask_token_prob) & (action_draw < mask_token_prob + random_token_prob)
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), torch.where(to_random, random_ids, ids))
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return inputs, labels


def _non_special_ids(vocab_size: int, specials: Tensor) -> Tensor:
    """The ids a random replacement may take: the vocabulary without its special tokens."""
    every = torch.arange(vocab_size, device=specials.device)
    candidates = every[~torch.isin(every, specials)]
    if len(candidates) == 0:
        raise InputError(f"all {vocab_size} ids are special tokens; masked LM needs ordinary tokens to predict")
    return candidates
