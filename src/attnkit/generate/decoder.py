"""Text generation with a decoder-only model, always through the KV cache (as in gpt-fast):

    prefill(prompt)        one forward over the whole (left-padded) prompt fills the cache   -> logits (B, V)
    decode_one_token(t)    one forward over the newest token, attending to the cache        -> logits (B, V)
    decode_n_tokens(n)     choose a token, feed it, repeat, until n tokens or every row has stopped

A `grammar` (`generate/constrained.GrammarMask`) masks each step's logits before the token is chosen, so that a
constrained row's text follows its grammar (a JSON schema); a row ends when its grammar is complete. A model whose
vocabulary is padded past its tokenizer's (Qwen's 151,936 ids for 151,665 tokens; nanoGPT's 50,304 for GPT-2's
50,257) is given `writable`, the tokenizer's size: the ids past it name no text and are never chosen.

Prompts of different lengths share one batch by left padding, so every row's newest token sits in the last
column:

    row 0   <pad> <pad>  The   cat        attention_mask 0 0 1 1     position_ids 0 0 0 1
    row 1    A    long   prompt here                     1 1 1 1                  0 1 2 3

`position_ids = cumsum(mask) - 1` gives each row's real tokens the positions 0, 1, 2, ... they would have alone,
which absolute positions (sinusoidal, learned) need; rotary and relative positions depend only on differences
between positions, which left padding keeps, since each row's real tokens are contiguous.

Decoding strategies: `EagerDecoding` (the default) runs these through the model's forward over a cache that grows
a position a step; `generate/static_decode.StaticDecoding` compiles the step for fixed shapes.

Context: a prompt must fit in the model's context (`context_len`, its `max_seq_len`). When a row's prompt and new
tokens together outgrow it, the window slides: that row keeps its last `context_len // 2` tokens, whose positions
restart at 0, and the cache is rebuilt (nanoGPT crops its input to the block size the same way, one token at a
time). Each row slides when it outgrows the context itself, so a row sees what it would see alone, whatever the
other rows of its batch.

Host reads: a step's one read is the chosen tokens (`tokens.tolist()`, for stop tokens and the reply). The model's
edge checks read its inputs' values too (the ids within the vocabulary, the positions within the position table:
three reads a forward pass), which a step's inputs need not pass: each token was drawn from this model's own logits
over its vocabulary (`check_drawn`), and each position counts the row's real tokens, which the cache, never longer
than the context, bounds; `decode_n_tokens` checks once that the context fits the model's positions, and runs its
steps within `inputs_checked`. The prompt (prefill) is checked as any input is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from numbers import Integral

import torch
from torch import Tensor, nn

from attnkit.data.batching import pad
from attnkit.deprecation import warn_renamed
from attnkit.errors import InputError
from attnkit.generate.constrained import GrammarMask
from attnkit.generate.sampling import (
    GREEDY,
    RepeatedNgrams,
    SamplingConfig,
    check_drawn,
    check_min_new_tokens,
    held_back_ids,
    hold_back,
    select_next_in_groups,
)
from attnkit.layers.embedding import Embeddings, inputs_checked
from attnkit.layers.kv_cache import KVCache
from attnkit.models.decoder import positions_from_mask

# on_token(row, token) is called for each new token of each unfinished row; returning True ends that row.
TokenHook = Callable[[int, int], bool]


@dataclass
class Window:
    """The tokens the model sees now: ids (B, L), prompts left-padded, and attention_mask (B, L), True at real
    tokens."""

    ids: Tensor
    attention_mask: Tensor
    padded: bool  # whether any row has padding: without it the model needs no attention mask

    @property
    def mask(self) -> Tensor:
        """The old name of `attention_mask`, with a DeprecationWarning."""
        warn_renamed("Window.mask", "Window.attention_mask")
        return self.attention_mask

    @classmethod
    def of(cls, ids: Tensor, attention_mask: Tensor) -> Window:
        return cls(ids, attention_mask, padded=not bool(attention_mask.all()))

    def rows(self, index: Tensor) -> Window:
        """Keep rows `index` (B',), in that order (the beams of beam search, `generate/beam.py`)."""
        return Window(self.ids[index], self.attention_mask[index], self.padded)

    def append(self, tokens: Tensor) -> Window:
        """Add one token per row, (B,), at the right."""
        return self.extend(tokens[:, None])

    def extend(self, tokens: Tensor) -> Window:
        """Add n tokens per row, (B, n), at the right."""
        new_mask = torch.ones_like(tokens, dtype=self.attention_mask.dtype)  # (B, n)
        ids = torch.cat((self.ids, tokens), dim=1)  # (B, L + n)
        return Window(ids, torch.cat((self.attention_mask, new_mask), dim=1), self.padded)

    def slide(self, context_len: int) -> Window:
        """The window each row has alone once the context is full: a row that outgrew `context_len` keeps its last
        `context_len // 2` tokens, the others all theirs; left-padded again (see the module docstring)."""
        keep = max(1, context_len // 2)
        rows = [row[mask] for row, mask in zip(self.ids, self.attention_mask, strict=True)]  # each (n_r,)
        rows = [row[-keep:] if len(row) > context_len else row for row in rows]
        return left_pad([row.tolist() for row in rows], pad_id=0, device=self.ids.device)  # padding is masked out


def left_pad(prompts: Sequence[Sequence[int]], *, pad_id: int, device: torch.device | str | None = None) -> Window:
    """Token id lists -> one left-padded Window (B, T), T the longest prompt."""
    return Window.of(*pad(prompts, pad_id, left=True, device=device))


def prefill(model: nn.Module, window: Window, cache: KVCache) -> Tensor:
    """Run the window through a DecoderLM once, filling `cache`: every column when it is empty, else the columns
    after those it holds (a prefix it was given, `layers/prefix_cache.py`). Returns the last logits (B, V).

    Only the last position's logits are computed: the others would cost a (B, T, V) tensor (206 MB for a prompt of
    1,024 tokens and GPT-2's vocabulary in fp32) and almost a third of `gpt2-124m`'s prefill arithmetic.
    """
    return logits_of_new(model, window, cache, 1)[:, 0]


def logits_of_new(model: nn.Module, window: Window, cache: KVCache, count: int) -> Tensor:
    """Run the window's columns after those `cache` holds through a DecoderLM, appending them to the cache; returns
    the logits of the last `count` of them (B, count, V) (`prefill`'s one; speculative decoding's drafts and the one
    after them, `generate/speculative.py`)."""
    start = cache.length
    hidden, _ = model.stack(
        window.ids[:, start:],
        attention_mask=window.attention_mask if window.padded else None,
        position_ids=positions_from_mask(window.attention_mask)[:, start:],
        cache=cache,
    )  # (B, T - start, C)
    return model.lm_head(hidden[:, -count:])  # (B, count, V)


def decode_one_token(model: nn.Module, window: Window, cache: KVCache) -> Tensor:
    """Feed the window's newest token (its last column); the cache holds the rest. Returns logits (B, V)."""
    position = window.attention_mask.sum(dim=-1, keepdim=True) - 1  # (B, 1): the row's real tokens before it
    out = model(
        window.ids[:, -1:],
        attention_mask=window.attention_mask if window.padded else None,
        position_ids=position,
        cache=cache,
    )
    return out.logits[:, -1]


class EagerDecoding:
    """Prefill and decoding steps of `model` through its forward, over a cache that grows a position a step."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.max_positions = _position_limit(model)  # read once: every decoding checks its context against it

    def allocate(self, batch_size: int, needed: int, context_len: int) -> KVCache:
        """A cache for `needed` positions (at most the context's)."""
        return self.model.allocate_cache(batch_size, min(needed, context_len))

    def prefill(self, window: Window, cache: KVCache) -> Tensor:
        return prefill(self.model, window, cache)

    def step(self, window: Window, cache: KVCache) -> Tensor:
        return decode_one_token(self.model, window, cache)


def decode_n_tokens(
    model: nn.Module,
    window: Window,
    cache: KVCache,
    logits: Tensor,
    n: int,
    *,
    context_len: int,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | Sequence[torch.Generator | None] | None = None,
    stop_ids: Collection[int] = (),
    on_token: TokenHook | None = None,
    decoding: EagerDecoding | None = None,
    grammar: GrammarMask | None = None,
    writable: int | None = None,
    min_new_tokens: int = 0,
) -> list[list[int]]:
    """Choose up to n tokens per row, starting from the prefill's `logits` (B, V).

    A row stops at a token in `stop_ids` (which is not returned), when `on_token` returns True, or when its grammar
    (`grammar`, one matcher per row) is complete; the stop tokens are never chosen among its first `min_new_tokens`
    (transformers' min_new_tokens, vLLM's min_tokens). `generator`: one for every row, or a list of one per row (each
    row's draws its own). `writable`: the ids from it on are never chosen (see the module docstring). The repetition
    penalty reads each row's prompt and reply, the presence and frequency penalties its reply alone
    (`generate/sampling.py`). Returns each row's new tokens. Raises InputError for a `min_new_tokens` that is negative
    or more than n (`sampling.check_min_new_tokens`).
    """
    batch, vocab = window.ids.shape[0], logits.shape[-1]
    check_min_new_tokens(min_new_tokens, n)
    decoding = _decoding_for(model, decoding)
    check_context(decoding, context_len)  # the steps' positions go unread (see the module docstring)
    seen = _seen_tokens(window, vocab) if sampling.repetition_penalty != 1.0 else None
    penalised = sampling.presence_penalty != 0.0 or sampling.frequency_penalty != 0.0
    counts = torch.zeros((batch, vocab), dtype=torch.int32, device=logits.device) if penalised else None  # (B, V)
    groups = [(1, g) for g in generator] if isinstance(generator, Sequence) else [(batch, generator)]
    # (U,), (S + U,): a padded vocabulary's textless ids; also the stop tokens, while the rows are too short
    unwritable, early = held_back_ids(vocab, stop_ids=stop_ids, writable=writable, device=logits.device)
    stop = set(stop_ids)
    finished = [False] * batch
    new_tokens: list[list[int]] = [[] for _ in range(batch)]
    ngram = sampling.no_repeat_ngram_size
    repeated = RepeatedNgrams([row[mask].tolist() for row, mask in zip(window.ids, window.attention_mask, strict=True)],
                              ngram) if ngram else None  # each row's real tokens: padding is no part of its n-grams
    for step in range(n):
        if repeated is not None:  # the tokens that would repeat an n-gram of the row's prompt and reply
            logits = repeated.ban(logits)
        logits = hold_back(logits, early if step < min_new_tokens else unwritable)
        if grammar is not None:
            logits = grammar(logits)  # (B, V): what no row's grammar allows next at -inf
        tokens = select_next_in_groups(logits, sampling, groups, seen=seen, counts=counts)  # (B,)
        for row, token in enumerate(check_drawn(tokens.tolist(), model=model)):
            if finished[row]:
                continue
            if token in stop:
                finished[row] = True
                continue
            new_tokens[row].append(token)
            if repeated is not None:
                repeated.push(row, token)
            complete = grammar is not None and grammar.advance(row, token)
            if (on_token is not None and on_token(row, token)) or complete:
                finished[row] = True
        if step == n - 1 or all(finished):
            break
        if seen is not None:
            seen[torch.arange(batch), tokens] = True
        if counts is not None:  # the reply's tokens, for the presence and frequency penalties
            counts[torch.arange(batch), tokens] += 1
        window = window.append(tokens)
        if cache.length == cache.max_len:  # the context is full: slide the window (see the module docstring)
            window = window.slide(context_len)
            still_to_feed = n - step - 2  # the tokens of later steps, but not the last one
            cache = decoding.allocate(batch, window.ids.shape[1] + still_to_feed, context_len)
            logits = decoding.prefill(window, cache)
        else:
            with inputs_checked():  # a token this model drew, at a position the cache bounds: nothing to read
                logits = decoding.step(window, cache)
    return new_tokens


def _position_limit(model: nn.Module) -> int | None:
    """The positions of the model's position table where a learned one ends it; None where none does (rotary and
    sinusoidal positions, a recurrent model)."""
    limits = [m.max_positions for m in model.modules() if isinstance(m, Embeddings) and m.max_positions is not None]
    return min(limits, default=None)


def check_context(decoding: EagerDecoding, context_len: int) -> None:
    """Raise InputError for a context longer than the model's position table (`_position_limit`, read when `decoding`
    was built): a step's position can reach context_len - 1."""
    limit = decoding.max_positions
    if limit is not None and context_len > limit:
        raise InputError(f"context_len={context_len} is beyond the {limit} positions of the model's learned position "
                         f"table (its max_seq_len); give context_len <= {limit}")


def _decoding_for(model: nn.Module, decoding: EagerDecoding | None) -> EagerDecoding:
    if decoding is None:
        return EagerDecoding(model)
    if decoding.model is not model:
        raise InputError("the decoding strategy was built for another model; build one for this model")
    return decoding


def _seen_tokens(window: Window, vocab_size: int) -> Tensor:
    """(B, V) bool: which tokens occur among each row's real tokens (for the repetition penalty)."""
    ids = torch.where(window.attention_mask, window.ids, vocab_size)  # padding goes to an extra column, dropped below
    seen = torch.zeros((ids.shape[0], vocab_size + 1), dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids, True)[:, :vocab_size]


def check_prompts(prompts: Sequence[Sequence[int]], *, max_new_tokens: int, context_len: int,
                  min_new_tokens: int = 0) -> None:
    """Raise InputError for prompts that are not lists of token ids (a tensor; a token that is no integer, which the
    padded batch would round, parse or refuse deep inside), no prompts, an empty prompt, a prompt longer than
    `context_len`, a negative `max_new_tokens`, or a `min_new_tokens` that is negative or more than `max_new_tokens`."""
    if isinstance(prompts, Tensor | str) or any(isinstance(prompt, Tensor | str) for prompt in prompts):
        raise InputError(f"prompts are lists of token ids, one list per prompt; got a {type(prompts).__name__}: pass "
                         "ids.tolist() for a tensor, or encode a text with the tokenizer")
    if not prompts:
        raise InputError("no prompts given; pass at least one list of token ids")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InputError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 0")
    check_min_new_tokens(min_new_tokens, max_new_tokens)
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise InputError(f"prompt {index} is empty; give at least one token (e.g. the tokenizer's BOS)")
        bad = [token for token in prompt if isinstance(token, bool) or not isinstance(token, Integral)]
        if bad:
            raise InputError(f"prompt {index} holds {bad[0]!r}, no token id: prompts are lists of integers (encode a "
                             "text with the tokenizer)")
        if len(prompt) > context_len:
            raise InputError(
                f"prompt {index} has {len(prompt)} tokens but the model's context holds {context_len} "
                f"(max_seq_len); shorten the prompt to its last {context_len} tokens"
            )


@torch.inference_mode()
def generate_tokens(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    context_len: int,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | Sequence[torch.Generator | None] | None = None,
    pad_id: int = 0,
    stop_ids: Collection[int] = (),
    on_token: TokenHook | None = None,
    decoding: EagerDecoding | None = None,
    grammar: GrammarMask | None = None,
    writable: int | None = None,
    min_new_tokens: int = 0,
) -> list[list[int]]:
    """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens; returns the new tokens.

    model: a decoder-only model in eval mode (`DecoderLM`); context_len: its `max_seq_len`; decoding: how prefill
    and steps run (see the module docstring); grammar: a matcher per prompt that each row's text follows;
    generator: one for every prompt, or a list of one per prompt; writable: the tokenizer's vocabulary size, where
    the model's is padded past it (the ids from it on are never chosen); min_new_tokens: no stop token among a row's
    first that many (`decode_n_tokens`).
    Raises InputError for an empty prompt, a prompt longer than `context_len`, a negative `max_new_tokens`, or a
    `min_new_tokens` that is negative or more than `max_new_tokens` (`sampling.check_min_new_tokens`);
    BrokenOutputs for logits that give no distribution to draw from (`check_drawn`: nan, or a grammar allowing
    nothing).
    """
    check_prompts(prompts, max_new_tokens=max_new_tokens, context_len=context_len, min_new_tokens=min_new_tokens)
    if max_new_tokens == 0:
        return [[] for _ in prompts]
    device = next(model.parameters()).device
    window = left_pad(prompts, pad_id=pad_id, device=device)
    decoding = _decoding_for(model, decoding)
    cache = decoding.allocate(len(prompts), window.ids.shape[1] + max_new_tokens - 1, context_len)
    logits = decoding.prefill(window, cache)
    return decode_n_tokens(
        model,
        window,
        cache,
        logits,
        max_new_tokens,
        context_len=context_len,
        sampling=sampling,
        generator=generator,
        stop_ids=stop_ids,
        on_token=on_token,
        decoding=decoding,
        grammar=grammar,
        writable=writable,
        min_new_tokens=min_new_tokens,
    )
