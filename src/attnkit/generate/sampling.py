"""Choosing the next token from the model's logits: greedy or sampled, reshaped by logits processors.

    logits (B, V) -> + logit bias -> repetition, presence and frequency penalties -> / temperature -> top-k -> top-p
                   -> min-p -> softmax -> sample (or argmax)

- logit bias (OpenAI's `logit_bias`): a number from -100 to 100 added to chosen tokens' logits; -100 in effect
  bans a token and +100 forces it;
- temperature (Ackley et al. 1985; as in GPT-2 sampling): divide the logits; < 1 sharpens, > 1 flattens,
  0 means greedy (always the most likely token);
- top-k (Fan et al. 2018): keep the k most likely tokens;
- top-p, "nucleus" (Holtzman et al. 2020): keep the smallest set of most likely tokens whose probability
  reaches p;
- repetition penalty (Keskar et al. 2019, CTRL): divide positive logits, multiply negative ones, of every
  token already in the sequence (prompt and reply, as vLLM and transformers apply it);
- presence and frequency penalties (OpenAI's definitions): with c[j] the times token j was generated so far,
  logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty (the reply's tokens only, as vLLM);
- min-p (Nguyen et al. 2024): keep the tokens whose probability is at least min_p times the likeliest one's;
- no repeated n-gram (Paulus et al. 2017's trigram blocking; transformers' `no_repeat_ngram_size`): a token that
  would complete an n-gram the sequence (prompt and reply) already holds gets -inf (`RepeatedNgrams`, kept
  by the decoding loop as each token comes).

Randomness comes only from the `torch.Generator` passed in, so the same seed gives the same tokens.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import ConfigError, InputError
from attnkit.tasks.common import broken_outputs

MIN_TEMPERATURE = 1e-5  # below it (but above 0, greedy) logits / temperature overflow float32 (vLLM's threshold too)
MIN_TOP_P = 1e-6  # below it the nucleus is the likeliest token alone, and p underflows float32 at 1e-45
REPETITION_PENALTY_RANGE = (1e-3, 1e3)  # beyond, the penalised logits overflow or vanish (0 * inf is nan)
PRESENCE_FREQUENCY_RANGE = (-2.0, 2.0)  # as OpenAI's API takes presence_penalty and frequency_penalty
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # as OpenAI's API takes it
SEED_RANGE = (0, 2**64 - 1)  # what torch.Generator.manual_seed takes as a seed of 64 bits


class SamplingError(ConfigError):
    """A sampling setting out of its range; `field` names it (the server answers 400 naming that field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. `temperature=0` is greedy decoding; `top_k`/`top_p` of None keep all.

    `logit_bias` holds (token id, bias) pairs, added to those tokens' logits before anything else.

    Raises:
        SamplingError (a ConfigError): temperature not 0 nor in [MIN_TEMPERATURE, inf), top_k < 1, top_p outside
        [MIN_TOP_P, 1], min_p outside [0, 1], repetition_penalty outside REPETITION_PENALTY_RANGE, presence_penalty
        or frequency_penalty outside PRESENCE_FREQUENCY_RANGE, a logit bias outside LOGIT_BIAS_RANGE or of a
        negative token id, or any of them not a number; no_repeat_ngram_size not an integer >= 0.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    no_repeat_ngram_size: int = 0  # 0: off; applied by a decoding loop (RepeatedNgrams), not by select_next

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty"):  # the type first: "x" is no number, not "< 0"
            value = getattr(self, name)
            kept = name == "top_p" and value is None  # None: every token kept
            if not kept and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise SamplingError(name, f"{name}={value!r} must be a number, not {type(value).__name__}")
        t = self.temperature
        if not _number(t) or t < 0:
            raise SamplingError("temperature", f"temperature={t!r} must be a finite number >= 0 (0 is greedy, 1 "
                                "samples as the model says)")
        if 0 < t < MIN_TEMPERATURE:
            raise SamplingError("temperature", f"temperature={t!r} is below {MIN_TEMPERATURE:g}, where dividing the "
                                "logits by it overflows: give 0 for greedy decoding, or at least that")
        bad_k = isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1
        if self.top_k is not None and bad_k:
            raise SamplingError("top_k", f"top_k={self.top_k!r} must be a positive integer (leave it out to keep "
                                "every token)")
        p = self.top_p
        if p is not None and (not _number(p) or not 0.0 < p <= 1.0):
            raise SamplingError("top_p", f"top_p={p!r} must lie in (0, 1] (1 keeps every token; 0.9 is usual)")
        if p is not None and p < MIN_TOP_P:
            raise SamplingError("top_p", f"top_p={p!r} is below {MIN_TOP_P:g}, where it underflows: give at least "
                                "that (or temperature 0 for the likeliest token alone)")
        low, high = REPETITION_PENALTY_RANGE
        penalty = self.repetition_penalty
        if not _number(penalty) or penalty <= 0:
            raise SamplingError("repetition_penalty", f"repetition_penalty={penalty!r} must be a finite number > 0 "
                                "(1 disables it; 1.2 is usual)")
        if not low <= penalty <= high:
            raise SamplingError("repetition_penalty", f"repetition_penalty={penalty!r} must lie in [{low:g}, "
                                f"{high:g}], where the penalised logits stay finite (1 disables it; 1.2 is usual)")
        low, high = PRESENCE_FREQUENCY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not low <= value <= high:
                raise SamplingError(name, f"{name}={value!r} must lie in [{low:g}, {high:g}] (0 disables it; "
                                    "positive values make repeats less likely)")
        if not _number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise SamplingError("min_p", f"min_p={self.min_p!r} must lie in [0, 1] (0 keeps every token; 0.05 is "
                                "usual)")
        n = self.no_repeat_ngram_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SamplingError("no_repeat_ngram_size", f"no_repeat_ngram_size={n!r} must be an integer >= 0 (0 "
                                "disables it; 3 forbids repeating any three tokens in a row)")
        low, high = LOGIT_BIAS_RANGE
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise SamplingError("logit_bias", f"logit_bias: {token!r} is no token id (an integer >= 0)")
            if not _number(bias) or not low <= bias <= high:
                raise SamplingError("logit_bias", f"logit_bias: the bias of token {token} is {bias!r}; it must lie "
                                    f"in [{low:g}, {high:g}] (-100 bans the token, 100 forces it)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalises(self) -> bool:
        """Whether the tokens already chosen change the next choice (a repetition, presence or frequency penalty)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def check_seed(seed: object) -> int | None:
    """`seed` as an int, or None for none. Raises SamplingError for a seed that is no integer or lies outside
    SEED_RANGE (64 bits, as torch.Generator.manual_seed takes)."""
    if seed is None:
        return None
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise SamplingError("seed", f"seed={seed!r} must be an integer from {low} to 2**64 - 1")
    if not low <= seed <= high:
        raise SamplingError("seed", f"seed={seed} lies outside {low} to 2**64 - 1 (64 bits): give a smaller seed")
    return int(seed)


def check_sampling(*, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                   repetition_penalty: float = 1.0, logit_bias: Mapping[int, float] | None = None,
                   vocab_size: int | None = None, seed: object = None, presence_penalty: float = 0.0,
                   frequency_penalty: float = 0.0, min_p: float = 0.0,
                   no_repeat_ngram_size: int = 0) -> tuple[SamplingConfig, int | None]:
    """The one check of the sampling settings that the Python API, the command line and the server share: the
    SamplingConfig and the seed (`check_seed`). `logit_bias` ({token id: bias}) names tokens below `vocab_size`
    when it is given. Raises SamplingError naming the first bad field."""
    bias = tuple((logit_bias or {}).items())
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                            logit_bias=bias, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                            min_p=min_p, no_repeat_ngram_size=no_repeat_ngram_size)
    beyond = [token for token, _ in bias if vocab_size is not None and token >= vocab_size]
    if beyond:
        raise SamplingError("logit_bias", f"logit_bias: token {beyond[0]} is beyond the vocabulary of {vocab_size} "
                            f"tokens; give ids from 0 to {vocab_size - 1}")
    return config, check_seed(seed)


GREEDY = SamplingConfig(temperature=0.0)


def apply_logit_bias(logits: Tensor, bias: Sequence[tuple[int, float]]) -> Tensor:
    """logits (B, V) with each (token, bias) pair's bias added to that token's logit in every row; a new tensor."""
    if not bias:
        return logits
    tokens = torch.tensor([token for token, _ in bias], device=logits.device)  # (K,)
    amounts = torch.tensor([amount for _, amount in bias], dtype=logits.dtype, device=logits.device)  # (K,)
    return logits.index_add(-1, tokens, amounts.expand(logits.shape[0], -1))


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """logits (B, V), seen (B, V) bool: tokens already in each sequence get less likely (CTRL's rule)."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_presence_frequency(logits: Tensor, counts: Tensor, presence: float, frequency: float) -> Tensor:
    """logits (B, V), counts (B, V): how often each token was generated in each row. OpenAI's definition:
    logit[j] - counts[j] * frequency - (counts[j] > 0) * presence."""
    if presence == 0.0 and frequency == 0.0:
        return logits
    return logits - counts.to(logits.dtype) * frequency - (counts > 0).to(logits.dtype) * presence


def check_min_new_tokens(min_new_tokens: object, max_new_tokens: int, *,
                         names: tuple[str, str] = ("min_new_tokens", "max_new_tokens")) -> int:
    """The one check of min_new_tokens (transformers' setting, vLLM's min_tokens): an integer from 0 to
    max_new_tokens, since a text ends at max_new_tokens first. `names`: the two as the caller's API spells them (the
    server's min_tokens and max_tokens). Raises InputError naming the value and the fix."""
    name, max_name = names
    if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) or min_new_tokens < 0:
        raise InputError(f"{name}={min_new_tokens!r} must be an integer >= 0")
    if min_new_tokens > max_new_tokens:
        raise InputError(f"{name}={min_new_tokens} is more than {max_name}={max_new_tokens}: give at most as many "
                         f"(a text ends at {max_name} first)")
    return min_new_tokens


def unwritable_ids(vocab_size: int, writable: int | None, *, device: torch.device | str) -> Tensor:
    """(U,) the ids from `writable` (the tokenizer's size) up to `vocab_size` (the model's): a vocabulary padded past
    its tokenizer's (Qwen's 151,936 ids for 151,665 tokens, nanoGPT's 50,304 for GPT-2's 50,257) has ids that name
    no text. Built once before a decoding loop and held back at each step (`hold_back`); empty for None."""
    start = vocab_size if writable is None else min(max(writable, 0), vocab_size)
    return torch.arange(start, vocab_size, device=device)


def held_back_ids(vocab_size: int, *, stop_ids: Collection[int], writable: int | None,
                  device: torch.device | str) -> tuple[Tensor, Tensor]:
    """(always (U,), early (S + U,)): the ids a decoding loop never chooses (`unwritable_ids`), and those it holds
    back while a text is shorter than its min_new_tokens: also the stop tokens that are ids of the vocabulary (an
    id outside [0, vocab_size) names no token, so holds nothing back; `index_fill` would wrap a negative one onto a
    real token). The one place the library's loops (greedy, sampling, beam search) build them. Raises InputError
    for `stop_ids` that are not a collection of integers."""
    if isinstance(stop_ids, str | bytes | Tensor) or not isinstance(stop_ids, Collection):
        raise InputError(f"stop_ids are token ids (a list of integers); got {stop_ids!r}")
    bad = [token for token in stop_ids if isinstance(token, bool) or not isinstance(token, int)]
    if bad:
        raise InputError(f"stop_ids: {bad[0]!r} is no token id; give integers from 0 to {vocab_size - 1}")
    always = unwritable_ids(vocab_size, writable, device=device)
    stops = torch.tensor(sorted(t for t in set(stop_ids) if 0 <= t < vocab_size), dtype=torch.long, device=device)
    return always, torch.cat((stops, always))


def hold_back(logits: Tensor, ids: Tensor, rows: slice | None = None) -> Tensor:
    """logits (B, V) with the tokens `ids` (K,) at -inf in `rows` (every row for None): tokens that must not be
    chosen there (a padded vocabulary's ids; the stop tokens of rows short of their min_new_tokens, in the library's
    decoding loop and the server's alike). A new tensor where any is held back, so the raw logits stay for the
    log-probabilities."""
    if not len(ids):
        return logits
    if rows is None:
        return logits.index_fill(-1, ids, float("-inf"))
    return hold_back_in_rows(logits, [(rows, ids)])


def hold_back_in_rows(logits: Tensor, held: Sequence[tuple[slice, Tensor]]) -> Tensor:
    """logits (B, V) with each pair's ids (K,) at -inf in its rows: one new tensor for all the pairs (the server's
    step holds back the stop tokens of each job short of its min_tokens, each job's rows its own), the logits
    themselves for none, so the raw logits stay for the log-probabilities."""
    if not held:
        return logits
    logits = logits.clone()  # (B, V): one copy, however many pairs
    for rows, ids in held:
        logits[rows].index_fill_(-1, ids, float("-inf"))  # a slice is a view: filled in the copy
    return logits


class RepeatedNgrams:
    """The tokens that would repeat an n-gram, kept as decoding goes (transformers' NoRepeatNGramLogitsProcessor finds
    the same ones by rescanning each sequence at every step). Per row, a dict from each (n - 1)-token prefix the row
    holds to the set of tokens that followed it, updated once per new token (`push`); the banned tokens are those
    following the row's last n - 1 tokens (n = 1: every token it holds).

    sequences: each row's tokens so far (prompt, without padding). Beam search gives each prompt's table to its
    beams (`repeat`), which read it and record their own n-grams apart, following the beams as they are chosen
    (`reorder`)."""

    def __init__(self, sequences: Sequence[Sequence[int]], n: int) -> None:
        self.n = n
        self.followers: list[dict[tuple[int, ...], set[int]]] = [{} for _ in sequences]
        self.tails: list[tuple[int, ...]] = [()] * len(sequences)  # each row's last n - 1 tokens (fewer at first)
        self.shared: list[dict[tuple[int, ...], set[int]]] = [{} for _ in sequences]  # read, never written
        for row, tokens in enumerate(sequences):
            for token in tokens:
                self.push(row, token)

    def repeat(self, k: int) -> RepeatedNgrams:
        """A table of k rows for each row of this one, whose rows share none (beam search's beams: row b * k + j is
        row b's): each reads its row's n-grams so far, shared and never copied (a long prompt's would be copied at
        every step), and records its own from here on."""
        beams = RepeatedNgrams([], self.n)
        beams.followers = [{} for _ in self.tails for _ in range(k)]
        beams.shared = [followers for followers in self.followers for _ in range(k)]
        beams.tails = [tail for tail in self.tails for _ in range(k)]
        return beams

    def reorder(self, index: Sequence[int]) -> None:
        """Row i becomes a copy of row index[i] (beam search's chosen beams), its own n-grams copied, its shared
        ones shared."""
        self.followers = [{prefix: set(tokens) for prefix, tokens in self.followers[i].items()} for i in index]
        self.shared = [self.shared[i] for i in index]
        self.tails = [self.tails[i] for i in index]

    def push(self, row: int, token: int) -> None:
        """`token` joins row `row`'s sequence: the n-gram it ends is recorded."""
        tail = self.tails[row]
        if len(tail) == self.n - 1:
            self.followers[row].setdefault(tail, set()).add(token)
        self.tails[row] = (tail + (token,))[-(self.n - 1):] if self.n > 1 else ()

    def ban(self, logits: Tensor) -> Tensor:
        """logits (B, V) with each row's banned tokens at -inf (one index_put on the logits' device); a new tensor
        where any is banned."""
        rows, tokens = [], []
        for row, (followers, shared, tail) in enumerate(zip(self.followers, self.shared, self.tails, strict=True)):
            banned = followers.get(tail, set()) | shared.get(tail, set())
            rows += [row] * len(banned)
            tokens += banned
        if not rows:
            return logits
        index = torch.tensor([rows, tokens], device=logits.device)  # (2, K)
        return logits.index_put((index[0], index[1]), logits.new_full((), float("-inf")))


class Repeats:
    """transformers' repetition penalty (CTRL's rule: a log-probability, negative, times `penalty`) and n-gram
    blocking (no n tokens in a row twice), applied to each beam's log-probabilities as its beam search applies them
    (`generate/beam.py`), or to each row's logits as its greedy search does (k = 1: greedy translation), over the
    beam's prompt (beam b * k + j: prompt b; a translation's BOS) and tokens. Both are kept up as the search goes,
    never rebuilt from the whole text: the tokens each beam's text holds (`seen`) and its n-grams (the prompt's table
    built once and shared by its beams, `RepeatedNgrams.repeat`), following the beams as they are chosen
    (`advance`).

    prompts: B lists of token ids below `vocab_size`; k: beams per prompt."""

    def __init__(self, prompts: Sequence[Sequence[int]], *, k: int, penalty: float, n: int, vocab_size: int,
                 device: torch.device | str) -> None:
        self.penalty = penalty
        self.seen: Tensor | None = None  # (B*K, V) bool: the tokens each beam's text holds
        if penalty != 1.0:
            rows = [row for row, prompt in enumerate(prompts) for _ in prompt]
            seen = torch.zeros((len(prompts), vocab_size), dtype=torch.bool, device=device)  # (B, V)
            seen[rows, [token for prompt in prompts for token in prompt]] = True
            self.seen = seen.repeat_interleave(k, dim=0)  # (B, V) -> (B*K, V)
        self.ngrams = RepeatedNgrams(prompts, n).repeat(k) if n else None

    @classmethod
    def of(cls, prompts: Sequence[Sequence[int]], *, k: int, penalty: float, n: int, vocab_size: int,
           device: torch.device | str) -> Repeats | None:
        """The Repeats of these settings, or None where both are off (penalty 1, n 0): nothing to apply."""
        if penalty == 1.0 and not n:
            return None
        return cls(prompts, k=k, penalty=penalty, n=n, vocab_size=vocab_size, device=device)

    def __call__(self, logprobs: Tensor) -> Tensor:
        """logprobs (B*K, V), each beam's (or logits), penalised and blocked."""
        if self.seen is not None:
            logprobs = apply_repetition_penalty(logprobs, self.seen, self.penalty)
        return self.ngrams.ban(logprobs) if self.ngrams is not None else logprobs

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        """The beams are chosen: beam i continues beam rows[i] (B*K,) by tokens[i] (B*K,)."""
        if self.seen is not None:
            self.seen = self.seen[rows]
            self.seen[torch.arange(len(rows), device=rows.device), tokens] = True
        if self.ngrams is not None:
            self.ngrams.reorder(rows.tolist())
            for row, token in enumerate(tokens.tolist()):
                self.ngrams.push(row, token)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Set every logit below the k-th largest of its row to -inf. (B, V) -> (B, V)."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float, *, keep: int = 1) -> Tensor:
    """Keep the smallest set of most likely tokens whose probabilities sum to at least p, and at least the `keep`
    likeliest. (B, V) -> (B, V)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(dim=-1)  # (B, V)
    drop_sorted = probs.cumsum(dim=-1) - probs >= p  # the more likely tokens before this one already reach p
    drop_sorted[:, :keep] = False  # the `keep` likeliest tokens always stay, however small p is
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: Tensor, min_p: float, *, keep: int = 1) -> Tensor:
    """Drop the tokens whose probability is below min_p times the likeliest token's, but never the `keep` likeliest.
    (B, V) -> (B, V)."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)  # (B, V)
    drop = probs < min_p * probs.amax(dim=-1, keepdim=True)  # (B, V)
    if keep > 1:
        drop.scatter_(-1, probs.topk(min(keep, probs.shape[-1]), dim=-1).indices, False)
    return logits.masked_fill(drop, float("-inf"))


def process_logits(logits: Tensor, config: SamplingConfig, seen: Tensor | None = None,
                   counts: Tensor | None = None) -> Tensor:
    """Apply the logit bias, the repetition penalty (over `seen` (B, V) bool: the tokens in each sequence), the
    presence and frequency penalties (over `counts` (B, V): each token's count in each reply), temperature, top-k,
    top-p and min-p, in that order. (B, V) float32 -> (B, V)."""
    logits = apply_logit_bias(logits.float(), config.logit_bias)
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, config.repetition_penalty)
    if counts is not None:
        logits = apply_presence_frequency(logits, counts, config.presence_penalty, config.frequency_penalty)
    return logits if config.greedy else warp(logits, config)


def warp(scores: Tensor, config: SamplingConfig, *, keep: int = 1) -> Tensor:
    """Temperature, top-k, top-p and min-p (transformers' warpers), on logits or log-probabilities (beam sampling,
    `generate/beam.py`), each filter keeping at least the `keep` likeliest tokens (transformers keeps one more than
    the end tokens in beam search). (B, V) -> (B, V)."""
    scores = scores / config.temperature
    if config.top_k is not None:
        scores = top_k_filter(scores, max(config.top_k, keep))
    if config.top_p is not None:
        scores = top_p_filter(scores, config.top_p, keep=keep)
    return min_p_filter(scores, config.min_p, keep=keep)


NO_TOKEN = -1  # what a row draws whose probabilities are no distribution (nan logits, or every token at -inf)
Groups = Sequence[tuple[int, torch.Generator | None]]  # consecutive rows and the generator each group draws from


class NoDistribution(RuntimeError):
    """The model's logits for a row gave no probability distribution to draw from (nan, or every token at -inf):
    a broken model or a grammar that allows nothing."""


def select_next(
    logits: Tensor, config: SamplingConfig, *, seen: Tensor | None = None, generator: torch.Generator | None = None
) -> Tensor:
    """The next token of each row: logits (B, V) -> ids (B,). Greedy takes the argmax; otherwise sample. A row whose
    logits give no distribution gets NO_TOKEN: `check_drawn` raises for it. `config.no_repeat_ngram_size` is not
    applied here (it reads each row's sequence, which the logits do not hold): a decoding loop bans those tokens
    first with `RepeatedNgrams`, as `decode_n_tokens` does."""
    return select_next_in_groups(logits, config, [(logits.shape[0], generator)], seen=seen)


def select_next_in_groups(
    logits: Tensor,
    config: SamplingConfig,
    groups: Groups,
    *,
    seen: Tensor | None = None,
    counts: Tensor | None = None,
) -> Tensor:
    """`select_next` for consecutive groups of rows that each draw from their own generator (the requests sharing
    a server's decoding step): logits (B, V), groups [(rows, generator), ...] covering the B rows -> ids (B,).
    The logits are processed once for all rows; each group draws what `select_next` draws for its rows alone.

    The draw is torch.multinomial's own for one sample, an exponential race (argmax of p / q with q ~ Exp(1), the
    Gumbel-max trick with exp applied), so the same generator gives the same tokens; but multinomial first checks
    its input by reading the device twice per call, which on a GPU stalls each decoding step once per request.
    Here nothing is read: a row that is no distribution gets NO_TOKEN, found when the tokens are read. seen, counts:
    what the penalties read (`process_logits`). `config.no_repeat_ngram_size` is not applied here (see
    `select_next`)."""
    logits = process_logits(logits, config, seen, counts)
    if config.greedy:  # one pass over the logits: max takes a nan where a row holds one, and -inf only where all are
        chosen, ids = logits.max(dim=-1)  # (B,) twice: the first of equal maxima, as argmax takes it
        return torch.where(chosen > float("-inf"), ids, NO_TOKEN)  # nan and -inf are not: three operators a step
    return draw(logits.softmax(dim=-1), groups)  # a row of nan logits, or all at -inf, is all nan


def draw(probs: Tensor, groups: Groups) -> Tensor:
    """One token per row of probs (B, V), each group of rows drawing from its own generator (`select_next_in_groups`'s
    exponential race); NO_TOKEN where a row holds a nan. -> ids (B,)."""
    races = torch.empty_like(probs)  # (B, V)
    for part, (_, generator) in zip(races.split([rows for rows, _ in groups]), groups, strict=True):
        part.exponential_(1, generator=generator)
    broken = probs.isnan().any(dim=-1)  # (B,)
    return (probs / races).argmax(dim=-1).masked_fill(broken, NO_TOKEN)


def check_drawn(ids: list[int], *, model: nn.Module | None = None) -> list[int]:
    """The chosen ids, read from the device (`tokens.tolist()`, the one read a decoding step needs). Raises for a row
    that drew NO_TOKEN: with the `model` that gave the logits, BrokenOutputs (`broken_outputs`: in fp16, naming bf16
    or fp32 as the fix), which greedy translation and `Pipeline.generate` raise; without, NoDistribution (the server
    ends the one request that drew it)."""
    broken = [row for row, token in enumerate(ids) if token == NO_TOKEN]
    if broken:
        message = (f"the model's logits for row(s) {broken} are no probability distribution (nan, or every token "
                   "forbidden): the model's weights or its input are broken, or a grammar allows nothing")
        raise NoDistribution(message) if model is None else broken_outputs(message, model)
    return ids


def choice_seed(seed: int | None, choice: int) -> int | None:
    """The seed of choice (sample) `choice` of a request seeded `seed`: seed + choice, as vLLM seeds the n samples of
    one request, so choice i is what a request of one sample seeded seed + i gives; wrapped within 64 bits."""
    return None if seed is None else (seed + choice) % (SEED_RANGE[1] + 1)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator seeded with `seed` on `device` (None: use torch's global generator). Raises SamplingError for a
    seed `check_seed` refuses."""
    seed = check_seed(seed)
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def token_logprobs(logits: Tensor, tokens: Tensor, top: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """The log-probabilities the model's own (raw, unprocessed) logits give: logits (B, V), tokens (B,) -> each
    token's log-softmax (B,), and the `top` likeliest tokens' log-probabilities and ids (B, top), likeliest first (as
    OpenAI's `logprobs` and `top_logprobs`; vLLM's default "raw" log-probabilities)."""
    logprobs = logits.float().log_softmax(dim=-1)  # (B, V)
    chosen = logprobs.gather(-1, tokens[:, None])[:, 0]  # (B,)
    values, ids = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)  # (B, top)
    return chosen, values, ids
