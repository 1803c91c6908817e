"""Grammar-constrained decoding: output that must parse, as JSON of a schema or as any grammar.

Before each token is chosen, the tokens that cannot continue the grammar get the logit -inf, so sampling (greedy,
temperature, top-k, top-p) picks among the others alone, whatever the weights say (Willard & Louf 2023, "Efficient
Guided Generation"; Microsoft's llguidance computes the masks, as in vLLM, SGLang and llama.cpp):

    logits (B, V) -> GrammarMask: each constrained row's forbidden tokens -> -inf -> sampling -> token (B,)
                                                                                       |
                                  each row's Matcher advances over its token <---------+
                                  (a grammar complete: the row ends, "stop")

A `Grammar` is what the text must be (`Grammar.json_schema(schema)`, `Grammar.json_object()`, `Grammar.regex(pattern)`,
`Grammar.lark(text)`: vLLM's guided json, regex and grammar);
a `Matcher` is one sequence's place in it; a `GrammarMask` holds the matchers of a batch's rows (None for a row
left free). The token table (`token_table`) is built from any attnkit tokenizer: a char tokenizer's characters, a
byte-level BPE's bytes, any Hugging Face tokenizer.json. Special tokens are never allowed, except EOS where the
grammar may end.

A grammar that needs a character the tokenizer cannot write (a char tokenizer whose alphabet lacks "{") is refused
with InputError where it first gets stuck: before generation when it cannot start.

Needs the `structured` extra (`pip install 'attnkit[structured]'`, llguidance).
"""

from __future__ import annotations

import copy
import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import InputError
from attnkit.generate.finite_schema import check_finite
from attnkit.grammars import lark_grammar, llguidance, regex_grammar
from attnkit.tokenize import CharTokenizer, Tokenizer

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # as json.dumps writes


@dataclass(frozen=True)
class Grammar:
    """What the generated text must be: llguidance's grammar (its JSON text) and a name for messages."""

    source: str
    name: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> Grammar:
        """JSON valid under `schema` (a dict or its JSON text), written as `json.dumps` writes it (", ", ": ", no
        other whitespace). Raises InputError for a schema that is not a JSON object, or that no finite JSON value
        satisfies (a `$ref` cycle, a recursion that never ends: `finite_schema.check_finite`)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise InputError(f"the JSON schema is not JSON: {error}") from None
        if not isinstance(schema, Mapping):
            raise InputError(f"a JSON schema is a JSON object, not {type(schema).__name__}")
        check_finite(dict(schema))
        return cls(llguidance().LLMatcher.grammar_from_json_schema(dict(schema), defaults=JSON_STYLE), "JSON schema")

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Text the regular expression matches whole (llguidance's syntax, Rust's regex: `[a-z]+@[a-z]+\\.com`,
        `(yes|no)`). Raises InputError for a malformed one, with llguidance's reason (`grammars.checked`)."""
        return cls(regex_grammar(pattern), "regular expression")

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """A grammar in llguidance's Lark syntax (`%json {schema}` embeds a JSON schema). Raises InputError for a
        malformed one, with llguidance's reason (`grammars.checked`)."""
        return cls(lark_grammar(text), "grammar")


@dataclass(frozen=True)
class TokenTable:
    """A tokenizer as llguidance reads it, and which ids may ever be allowed: (V_tok,) bool, the ordinary tokens
    and EOS (no other special token)."""

    tokens: Any  # llguidance.LLTokenizer
    ordinary: np.ndarray
    eos_id: int


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> TokenTable, built once each


class _CharTokens:
    """A char tokenizer in the shape llguidance.TokenizerWrapper reads: each id's bytes (specials marked with the
    0xff byte that llguidance reads as "special"), and `__call__(text) -> ids`."""

    def __init__(self, tokenizer: CharTokenizer) -> None:
        self.ids = {c: i for i, c in enumerate(tokenizer.alphabet)}  # ids 0..n-1 are the alphabet
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        specials = [b"\xff" + token.encode("utf-8") for token in tokenizer.specials.values()]
        self.tokens = [c.encode("utf-8") for c in tokenizer.alphabet] + specials
        self.special_token_ids = [tokenizer.token_id(role) for role in tokenizer.specials]

    def __call__(self, text: bytes) -> list[int]:
        """The ids of the characters of UTF-8 `text` that the alphabet holds (whatever the tokenizer's
        unknown-character policy)."""
        return [self.ids[c] for c in text.decode("utf-8", errors="ignore") if c in self.ids]


def token_table(tokenizer: Tokenizer) -> TokenTable:
    """The tokenizer's TokenTable (built once per tokenizer object: a large vocabulary takes about a second).
    Raises InputError for a tokenizer without EOS (a constrained text ends there)."""
    if tokenizer in _TABLES:
        return _TABLES[tokenizer]
    lib = llguidance()
    eos = tokenizer.eos_id
    if eos is None:
        raise InputError(f"structured output needs a tokenizer with an EOS token; this {tokenizer.kind} tokenizer's "
                         f"special tokens are {tokenizer.specials}")
    if isinstance(tokenizer, CharTokenizer):
        tokens = lib.LLTokenizer(lib.TokenizerWrapper(_CharTokens(tokenizer)))
    else:
        tokens = lib.LLTokenizer(tokenizer.to_str(), eos_token=eos)
    specials = {tokenizer.token_id(role) for role in tokenizer.specials} - {eos}
    ordinary = np.array([i not in specials and (i == eos or not tokens.is_special_token(i))
                         for i in range(tokens.vocab_size)], dtype=bool)
    table = TokenTable(tokens, ordinary, eos)
    _TABLES[tokenizer] = table
    return table


class Matcher:
    """One sequence's place in a grammar: the tokens allowed next, advanced over each token chosen.

    Raises InputError (on construction) for a grammar llguidance refuses (a schema keyword it does not support, a
    malformed Lark grammar), naming the grammar and llguidance's reason.
    """

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        self.table = token_table(tokenizer)
        self.tokenizer = tokenizer
        self.grammar = grammar
        self.matcher = llguidance().LLMatcher(self.table.tokens, grammar.source, log_level=0)
        if self.matcher.is_error():
            raise InputError(f"the {grammar.name} cannot be followed: {self.matcher.get_error()[:300]}")
        self.tokens: list[int] = []
        self._bits = np.zeros(((self.table.tokens.vocab_size + 31) // 32,), dtype=np.int32)

    @property
    def finished(self) -> bool:
        """The grammar is complete (nothing may follow but EOS), or the matcher failed."""
        return self.matcher.is_stopped()

    def allowed(self) -> np.ndarray:
        """(V_tok,) bool: the tokens that may come next. Raises InputError when there are none: the grammar needs a
        character the tokenizer cannot write."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: len(self.table.ordinary)]
        allowed = allowed.astype(bool) & self.table.ordinary  # (V_tok,)
        if self.matcher.is_error() or not allowed.any():  # stuck: llguidance then allows EOS alone
            raise self._stuck("it has no token for what the grammar needs next")
        return allowed

    def advance(self, token: int) -> bool:
        """Take the token chosen; True when the grammar is now complete. Raises InputError for a token the grammar
        forbids: a caller that ignored the mask, or a grammar that needs bytes no token holds (llguidance's mask
        may then let a token through that it refuses here)."""
        if not self.matcher.consume_token(int(token)):
            raise self._stuck(self.matcher.get_error().split("\n")[0][:300])
        self.tokens.append(int(token))
        return self.finished

    def copy(self) -> Matcher:
        """A matcher at the same place, moving on apart from this one: llguidance's copy, which shares the compiled
        grammar and the lexer states found so far (a grammar whose first mask takes a second, such as `a{100000}`,
        takes it once, not once per copy)."""
        twin = copy.copy(self)
        twin.matcher = self.matcher.deep_copy()
        twin.tokens = list(self.tokens)
        twin._bits = np.zeros_like(self._bits)
        return twin

    def _stuck(self, why: str) -> InputError:
        where = f"go on after {self.tokenizer.decode(self.tokens)[-40:]!r}" if self.tokens else "start"
        return InputError(f"the {self.grammar.name} cannot {where} with this {self.tokenizer.kind} tokenizer: {why} (a "
                          "char tokenizer writes only its alphabet: train one on text that holds every character "
                          "the output needs)")


class GrammarMask:
    """The matchers of a batch's rows, in row order (None: a row left free). Called on logits (B, V), it sets each
    constrained row's forbidden tokens to -inf; `advance(row, token)` moves a row's matcher on."""

    def __init__(self, matchers: Sequence[Matcher | None]) -> None:
        self.matchers = list(matchers)

    @classmethod
    def of(cls, grammar: Grammar | None, tokenizer: Tokenizer, rows: int) -> GrammarMask | None:
        """A mask of `rows` rows, each with its own matcher of `grammar` (None: no grammar, no mask): one matcher
        built, its first mask computed, and copied for the other rows (`Matcher.copy`). Raises InputError when the
        grammar cannot start with this tokenizer's tokens."""
        if grammar is None:
            return None
        first = Matcher(grammar, tokenizer)
        first.allowed()  # a grammar that cannot start is refused before any model runs
        return cls([first, *(first.copy() for _ in range(rows - 1))])

    @classmethod
    def joined(cls, groups: Sequence[tuple[int, GrammarMask | None]]) -> GrammarMask | None:
        """One mask over consecutive groups of rows [(rows, mask or None), ...] (the requests sharing a server's
        decoding step); None when no group has a mask."""
        if all(mask is None for _, mask in groups):
            return None
        return cls([m for rows, mask in groups for m in (mask.matchers if mask is not None else [None] * rows)])

    def __len__(self) -> int:
        return len(self.matchers)

    def allowed(self, vocab_size: int) -> Tensor:
        """(rows, V) bool on the CPU: True where a token may come next (every token of a free or finished row)."""
        allowed = torch.ones((len(self.matchers), vocab_size), dtype=torch.bool)
        for row, matcher in enumerate(self.matchers):
            if matcher is not None and not matcher.finished:
                ids = matcher.allowed()[:vocab_size]  # (V_tok,): ids past the tokenizer's (padding) stay forbidden
                allowed[row] = False
                allowed[row, : len(ids)] = torch.from_numpy(ids)
        return allowed

    def __call__(self, logits: Tensor) -> Tensor:
        """logits (rows, V) -> (rows, V), the forbidden tokens at -inf."""
        allowed = self.allowed(logits.shape[-1]).to(logits.device, non_blocking=True)
        return logits.masked_fill(~allowed, float("-inf"))

    def unfinished(self) -> list[int]:
        """The constrained rows whose grammar is not complete (their text was cut short: it does not parse)."""
        return [row for row, matcher in enumerate(self.matchers) if matcher is not None and not matcher.finished]

    def advance(self, row: int, token: int) -> bool:
        """Move row's matcher over `token`; True when its grammar is complete (a free row: False)."""
        matcher = self.matchers[row]
        return matcher is not None and not matcher.finished and matcher.advance(token)
