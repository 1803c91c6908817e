"""Tokenizers: text <-> token ids, behind one small protocol.

Four kinds, one interface:

    char       one id per character of a corpus's alphabet (the classic Tiny Shakespeare setup), plus specials
    bpe        byte-level BPE (GPT-2 style) trained here with Hugging Face `tokenizers`: lossless on any UTF-8
    wordpiece  BERT's WordPiece trained here with `tokenizers` (uncased or cased), [CLS] [SEP] [MASK] [PAD] [UNK]
    hf         any Hugging Face `tokenizer.json` already on disk (GPT-2, Llama, BERT, ...), used as it is

`encode` never adds special tokens and never reads them out of the text: a string such as "<eos>" in the
input is ordinary text. Special ids are placed by the data code (BOS/EOS, CLS/SEP, padding), so
`decode(encode(s)) == s` holds for any string a kind can represent (WordPiece's decode gives the text as BERT's
does: as its normalizer left it, lower-cased where uncased, its words and punctuation joined by single spaces).

A tokenizer is saved as a directory holding `attnkit_tokenizer.json` (the kind and the special tokens) and,
for `bpe`/`wordpiece`/`hf`, the `tokenizer.json` itself; `load_tokenizer(dir)` reads any of them back.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from attnkit.errors import ConfigError, InputError
from attnkit.textfiles import EncodingErrors, iter_texts, split_text

log = logging.getLogger(__name__)

KINDS = ("char", "bpe", "wordpiece", "hf")
TRAINED_KINDS = ("char", "bpe", "wordpiece")  # kinds trained on a text (`train_tokenizer`, attnkit train --tokenizer)
SIZED_KINDS = ("bpe", "wordpiece")  # kinds trained to a vocab_size
JSON_KINDS = ("bpe", "wordpiece", "hf")  # kinds that are a Hugging Face tokenizer.json underneath (`HFTokenizer`)
BPE_VOCAB_SIZE = 2048  # a trained BPE's vocabulary size unless told (attnkit train, attnkit tokenizer train)
SPECIAL_ROLES = ("pad", "bos", "eos", "unk", "mask", "cls", "sep")
REQUIRED_ROLES = ("pad", "bos", "eos", "unk")
META_FILE = "attnkit_tokenizer.json"
HF_FILE = "tokenizer.json"
HEAD_CHARS_PER_TOKEN = 32  # characters read per token wanted before a long text is judged by its head
HEAD_MARGIN = 64  # tokens by which a text's head may tokenize longer than the same span of the whole (a cut word)
UnknownPolicy = Literal["unk", "error", "skip"]


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer offers. `pad_id bos_id eos_id unk_id` are always set for `char` and `bpe`; any
    special id is `None` where a kind has no such token (BERT has no BOS; GPT-2 has no CLS).
    """

    kind: str  # "char" | "bpe" | "wordpiece" | "hf"
    specials: dict[str, str]  # role -> token string, e.g. {"eos": "<eos>"}
    starts_with_bos: bool  # its own texts begin with BOS (Llama's tokenizers); a prompt is given one (`Pipeline`),
    # a chat in the default format too, one with a template of its own only where it writes bos_token (`ChatTemplate`)
    space_starts_word: bool  # a space is written into the word after it (byte-level 'Ġcat', SentencePiece '▁cat')
    own_frame: tuple[tuple[int, ...], tuple[int, ...]]  # (before, after): the ids its own post-processor puts
    # around a text (BERT's CLS and SEP, Llama's BOS, nothing for GPT-2's); `encode` adds none of them
    special_ids: frozenset[int]  # every special token's id: the roles' and, of a Hugging Face tokenizer, every
    # token its tokenizer.json marks special (Qwen's <|im_start|>, Llama 3's reserved ones), which no text encodes to

    @property
    def vocab_size(self) -> int: ...
    @property
    def pad_id(self) -> int | None: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def unk_id(self) -> int | None: ...
    @property
    def mask_id(self) -> int | None: ...
    @property
    def cls_id(self) -> int | None: ...
    @property
    def sep_id(self) -> int | None: ...
    def token_id(self, role: str) -> int | None: ...
    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...
    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str: ...
    def pieces(self, ids: Iterable[int]) -> list[str]: ...
    def fingerprint(self) -> str: ...
    def save(self, directory: str | os.PathLike) -> None: ...
    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer: ...


class _SpecialIds:
    """The `pad_id ... sep_id` properties, shared by every kind through `token_id(role)`."""

    starts_with_bos = False  # attnkit's own tokenizers: the language-model data places no BOS
    own_frame: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # the ids its post-processor puts around a text
    space_starts_word = False  # a character tokenizer's space is a character of its own
    continuing_prefix: str | None = None  # the mark of a piece inside a word that stands for no text (WordPiece's ##)

    def token_id(self, role: str) -> int | None:
        raise NotImplementedError

    pad_id = property(lambda self: self.token_id("pad"))
    bos_id = property(lambda self: self.token_id("bos"))
    eos_id = property(lambda self: self.token_id("eos"))
    unk_id = property(lambda self: self.token_id("unk"))
    mask_id = property(lambda self: self.token_id("mask"))
    cls_id = property(lambda self: self.token_id("cls"))
    sep_id = property(lambda self: self.token_id("sep"))

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of its special tokens, one per role it has (`SPECIAL_ROLES`)."""
        return frozenset(i for i in map(self.token_id, SPECIAL_ROLES) if i is not None)


def encode_head(tokenizer: Tokenizer, text: str, tokens: int, what: str | None = None) -> tuple[list[int], bool]:
    """`text`'s token ids and True; or, for a text far longer than `tokens` tokens, only its head's ids and False:
    when its first HEAD_CHARS_PER_TOKEN * `tokens` characters alone hold more than `tokens` + HEAD_MARGIN tokens,
    the rest is not tokenized, so a megabyte of text costs what `tokens` tokens cost (a server reading texts to a
    context). The first `tokens` ids are the whole text's either way: a token never spans the margin's words.
    With `what`, raises InputError for a text of no token, as `encode_some` does."""
    head = text[:HEAD_CHARS_PER_TOKEN * tokens]
    if len(head) < len(text):
        ids = tokenizer.encode(head)
        if len(ids) > tokens + HEAD_MARGIN:
            return ids, False
    return (tokenizer.encode(text) if what is None else encode_some(tokenizer, text, what)), True


def encode_some(tokenizer: Tokenizer, text: str, what: str) -> list[int]:
    """`text`'s token ids. Raises InputError naming `what` and its characters for a text that is not empty but of no
    token: a tokenizer that skips unknown characters dropped every one (a model given no ids reads nothing)."""
    ids = tokenizer.encode(text)
    if text and not ids:
        characters = "".join(dict.fromkeys(text))
        raise InputError(f"{what} ({text[:40]!r}) has no token: the tokenizer drops every character of it (unknown "
                         f"characters {characters[:20]!r} skipped); write it in characters the tokenizer knows")
    return ids


def require_id(tokenizer: Tokenizer, role: str) -> int:
    """The id of special token `role`, or `InputError` naming the tokenizer kind and the missing role."""
    token_id = tokenizer.token_id(role)
    if token_id is None:
        raise InputError(
            f"this {tokenizer.kind} tokenizer has no {role} token, which this data needs; "
            f"its special tokens are {tokenizer.specials}"
        )
    return token_id


def _sha256_json(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _normalize_specials(special_tokens: Mapping[str, str] | Sequence[str] | None) -> dict[str, str]:
    """Roles -> token strings. A sequence names roles and gets `<role>` tokens; the default is every role."""
    if special_tokens is None:
        special_tokens = SPECIAL_ROLES
    if not isinstance(special_tokens, Mapping):
        special_tokens = {role: f"<{role}>" for role in special_tokens}
    unknown = sorted(set(special_tokens) - set(SPECIAL_ROLES))
    if unknown:
        raise ConfigError(f"unknown special token roles {unknown}; choose from {list(SPECIAL_ROLES)}")
    missing = [r for r in REQUIRED_ROLES if r not in special_tokens]
    if missing:
        raise ConfigError(f"special tokens must include {list(REQUIRED_ROLES)}; missing {missing}")
    return {role: special_tokens[role] for role in SPECIAL_ROLES if role in special_tokens}


def _write_meta(directory: Path, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{META_FILE}.tmp"
    tmp.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, directory / META_FILE)


class CharTokenizer(_SpecialIds):
    """One id per character. Ids 0..n-1 are the alphabet in code-point order (as in nanoGPT's char setup),
    so a Tiny Shakespeare model's character ids match the classic ones; the specials follow.

    `unknown` says what `encode` does with a character outside the alphabet: map it to `<unk>`, raise
    `InputError`, or skip it.
    """

    kind = "char"

    def __init__(
        self,
        alphabet: Iterable[str],
        *,
        special_tokens: Mapping[str, str] | Sequence[str] | None = None,
        unknown: UnknownPolicy = "unk",
    ) -> None:
        chars = sorted(set(alphabet))
        if not chars:
            raise InputError("a char tokenizer needs a non-empty alphabet (was the corpus empty?)")
        if any(len(c) != 1 for c in chars):
            raise ConfigError("a char tokenizer's alphabet must be single characters")
        if unknown not in ("unk", "error", "skip"):
            raise ConfigError(f"unknown-character policy {unknown!r}; choose 'unk', 'error' or 'skip'")
        self.alphabet = "".join(chars)
        self.specials = _normalize_specials(special_tokens)
        self.unknown: UnknownPolicy = unknown
        self._codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted: id = rank
        self._special_id = {role: len(chars) + i for i, role in enumerate(self.specials)}
        self._id_to_special = {self._special_id[role]: tok for role, tok in self.specials.items()}

    @classmethod
    def from_texts(cls, texts: Iterable[str], **kwargs) -> CharTokenizer:
        """Build the alphabet from every character that occurs in `texts`."""
        alphabet: set[str] = set()
        for text in texts:
            alphabet.update(text)
        return cls(alphabet, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + len(self.specials)

    def token_id(self, role: str) -> int | None:
        return self._special_id.get(role)

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as a numpy array (int64, (N,)), vectorised: the fast path for large corpora."""
        try:
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        except UnicodeEncodeError:
            raise not_utf8([text]) from None
        ids = np.searchsorted(self._codepoints, codes)
        known = self._codepoints[np.minimum(ids, len(self._codepoints) - 1)] == codes
        if known.all():
            return ids.astype(np.int64)
        if self.unknown == "error":
            pos = int(np.argmin(known))
            raise InputError(
                f"character {text[pos]!r} at position {pos} is not in the char tokenizer's alphabet "
                "(build the tokenizer on this text, or use unknown='unk' or 'skip')"
            )
        if self.unknown == "skip":
            return ids[known].astype(np.int64)
        return np.where(known, ids, self._special_id["unk"]).astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if 0 <= i < len(self.alphabet):
                out.append(self.alphabet[i])
            elif i in self._id_to_special:
                if not skip_special:
                    out.append(self._id_to_special[i])
            else:
                raise InputError(f"token id {i} is outside the char vocabulary of size {self.vocab_size}")
        return "".join(out)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.decode([i], skip_special=False) for i in ids]

    def _state(self) -> dict:
        return {"kind": self.kind, "alphabet": self.alphabet, "specials": self.specials, "unknown": self.unknown}

    def fingerprint(self) -> str:
        return _sha256_json(self._state())

    def save(self, directory: str | os.PathLike) -> None:
        _write_meta(Path(directory), self._state())

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CharTokenizer:
        meta = _read_meta(Path(directory))
        return cls(meta["alphabet"], special_tokens=meta["specials"], unknown=meta["unknown"])


# Token strings that commonly fill each role in Hugging Face tokenizers that carry no tokenizer_config.json.
_HF_ROLE_GUESSES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>"),
    "bos": ("<bos>", "<s>", "<|begin_of_text|>", "<|endoftext|>"),
    "eos": ("<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]", "<|endoftext|>"),
    "mask": ("<mask>", "[MASK]"),
    "cls": ("<cls>", "[CLS]"),
    "sep": ("<sep>", "[SEP]"),
}


def _hf_config_specials(directory: Path) -> dict[str, str]:
    """Special tokens named in `tokenizer_config.json` / `special_tokens_map.json`, when present."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InputError(f"{path} is not valid JSON: {err}") from None
        for role in SPECIAL_ROLES:
            value = config.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and role not in found:
                found[role] = value
    return found


def not_utf8(texts: Sequence[str], *, fix: str = "give the text in UTF-8") -> InputError | None:
    """The InputError for the first of `texts` holding a lone surrogate, which no tokenizer reads: the bytes that are
    not UTF-8 of a command-line argument or a file read with errors="surrogateescape"; None when there is none.
    `fix` is the caller's advice, which knows where the text came from."""
    for text in texts:
        found = _SURROGATE.search(text) if isinstance(text, str) else None
        if found is not None:
            code = ord(found.group())
            byte = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
            return InputError(f"the text {text[:40]!r} is not UTF-8 ({byte} at character {found.start()}): {fix}")
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


class _rust_panics_named:
    """Context manager: a panic inside the Rust tokenizer (pyo3's PanicException, a BaseException: a pre-tokenizer's
    regular expression exhausting its stack on a hostile text) becomes an InputError naming the cause and the fix,
    and so does the TypeError it raises for a text of `texts` that is not UTF-8 (`not_utf8`)."""

    def __init__(self, texts: Sequence[str] = ()) -> None:
        self.texts = texts

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, err: BaseException | None, traceback: object) -> None:
        if kind is TypeError and (refusal := not_utf8(self.texts)) is not None:
            raise refusal from None
        if kind is not None and kind.__name__ == "PanicException":
            raise InputError(f"the tokenizer failed on this text ({str(err).splitlines()[0][:200]}): it holds a run of "
                             "characters its splitting rules cannot take; shorten or split the text") from None


class HFTokenizer(_SpecialIds):
    """A Hugging Face `tokenizers.Tokenizer`: kind `bpe` or `wordpiece` (trained here) or `hf` (brought from disk).

    `encode` adds no special tokens (no post-processor template) and reads none from the text.
    """

    def __init__(self, tokenizer, *, kind: str, specials: Mapping[str, str]) -> None:
        self._tok = tokenizer
        self._tok.encode_special_tokens = True  # "<eos>" in a text is text, not the EOS token
        self._tok.no_truncation()  # a tokenizer.json may carry BERT's 512-token truncation; the data code decides
        self._tok.no_padding()
        self.kind = kind
        self.specials = dict(specials)
        self._ids = {role: tokenizer.token_to_id(tok) for role, tok in self.specials.items()}
        missing = {role: tok for role, tok in self.specials.items() if self._ids[role] is None}
        if missing:
            raise InputError(f"special tokens {missing} are not in the tokenizer's vocabulary")

    @functools.cached_property
    def own_frame(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(before, after): the ids this tokenizer's post-processor puts around a text (read on first use)."""
        return _added_around(self._tok)

    @functools.cached_property
    def starts_with_bos(self) -> bool:
        """Whether the post-processor puts BOS before every text as a language model's start (Llama's, Mistral's; a
        Llama's with add_eos_token, `<s> text </s>`, too): its model was trained and is prompted after it. A
        classifier's frame does not count: a text closed after a BOS that is also its CLS (BERT's `[CLS] text
        [SEP]`, where BOS borrows CLS; RoBERTa's `<s> text </s>`, whose CLS is `<s>`). A stream of such texts, and
        a prompt, take neither mark alone (a [CLS] without its [SEP]); the tasks that read whole texts frame them
        (`frame_ids`)."""
        bos = self._ids.get("bos")
        before, after = self.own_frame
        return bos is not None and before[:1] == (bos,) and not (after and bos == self._ids.get("cls"))

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> HFTokenizer:
        """Wrap the `tokenizer.json` in `directory` (kind `hf`). Special tokens come from
        `tokenizer_config.json` / `special_tokens_map.json` when present, else from the usual names;
        a tokenizer without BOS/EOS borrows CLS/SEP (BERT), and one without padding pads with EOS (GPT-2).
        Raises `InputError` naming the file when `tokenizer.json` is missing.
        """

        directory = Path(directory)
        path = directory / HF_FILE
        if not path.is_file():
            raise InputError(
                f"no Hugging Face tokenizer in {directory}: it needs the file {HF_FILE} (attnkit reads "
                "tokenizers from disk and never downloads one)"
            )
        tok = _read_hf(path)
        specials = _hf_config_specials(directory)
        vocab = tok.get_vocab(with_added_tokens=True)
        for role, guesses in _HF_ROLE_GUESSES.items():
            if role not in specials:
                hit = next((g for g in guesses if g in vocab), None)
                if hit is not None:
                    specials[role] = hit
        for role, fallback in (("bos", "cls"), ("eos", "sep"), ("pad", "eos")):
            if role not in specials and fallback in specials:
                specials[role] = specials[fallback]
        specials = {role: specials[role] for role in SPECIAL_ROLES if role in specials and specials[role] in vocab}
        return cls(tok, kind="hf", specials=specials)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """The ids of its special tokens: the roles' and every added token the tokenizer.json marks special (a chat
        model's <|im_start|>, Llama 3's <|reserved_special_token_0|>, ...)."""
        added = {i for i, token in self._tok.get_added_tokens_decoder().items() if token.special}
        return frozenset({*super().special_ids, *added})

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, role: str) -> int | None:
        return self._ids.get(role)

    def encode(self, text: str) -> list[int]:
        # as a batch of one: encode_batch_fast lets go of the interpreter while Rust works, where encode holds it
        # throughout (a megabyte: a second in which no other thread runs, a server's event loop among them)
        with _rust_panics_named([text]):
            return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once (in parallel, in Rust)."""
        with _rust_panics_named(texts):
            return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's pieces in the running text `" ".join(words)`, encoded once: what a tokenizer that writes a
        space into the word after it (`space_starts_word`) makes of a sentence ('ĠParis', '▁Paris'), the first word
        with no space before it (transformers' `is_split_into_words` with add_prefix_space gives it one too; every
        later word's pieces are the ones it gives). A piece belongs to the word its last character lies in, the
        space before a word to that word (its offsets, `bisect`); a word left without a piece of its own (an empty
        one) gets []."""
        text = " ".join(words)
        with _rust_panics_named([text]):
            encoding = self._tok.encode_batch([text], add_special_tokens=False)[0]  # offsets (the fast one has none)
        ends = list(itertools.accumulate(len(word) + 1 for word in words))  # past each word's end and its space
        found: list[list[int]] = [[] for _ in words]
        for piece, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
            last = max(start, end - 1)  # the piece's last character (its start, for an empty span)
            found[min(bisect.bisect(ends, last + 1), len(words) - 1)].append(piece)
        return found

    def encode_with_specials(self, text: str) -> list[int]:
        """`encode`, but a special token's text in `text` ("<s>", "</s>", "<|im_start|>") is that token, as
        transformers' tokenizers read the text a chat template writes (`apply_chat_template(tokenize=True)`); no
        special token is added. A second copy of the tokenizer reads them, made on first use: `encode`'s copy keeps
        them text, and switching one copy between the two would race with other threads."""
        with _rust_panics_named([text]):
            return self._special_reader.encode_batch_fast([text], add_special_tokens=False)[0].ids

    @functools.cached_property
    def _special_reader(self):
        """`encode_with_specials`'s copy of the tokenizer, set up as `encode`'s (no truncation, no padding) but
        reading special tokens, with those tokenizer_config.json names added as transformers adds them."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as _HF

        reader = _HF.from_str(self._tok.to_str())
        reader.encode_special_tokens = False
        reader.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                   for token in self.specials.values()])
        return reader

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The vocabulary entry of each id (byte-level BPE shows a space as 'Ġ', a newline as 'Ċ')."""
        return [self._tok.id_to_token(int(i)) for i in ids]

    def to_str(self) -> str:
        """The tokenizer.json text, as Hugging Face `tokenizers` writes it (what other libraries read)."""
        return self._tok.to_str()

    @functools.cached_property
    def space_starts_word(self) -> bool:
        """Whether a space is written into the word after it: a byte-level pre-tokenizer ('Ġcat': GPT-2, RoBERTa,
        the `bpe` kind), a Metaspace one or a normalizer that writes spaces as '▁' (SentencePiece's '▁cat': Llama).
        WordPiece (BERT) drops spaces."""
        spec = json.loads(self.to_str())
        return _writes_spaces(spec.get("pre_tokenizer")) or _writes_spaces(spec.get("normalizer"))

    @functools.cached_property
    def space_before_text(self) -> bool:
        """Whether '▁' is put before every text encoded (Llama's and Mistral's SentencePiece conversions): a text
        encoded in pieces has one more '▁' at each piece's start than the whole (`textfiles.split_text`)."""
        spec = json.loads(self.to_str())
        return _puts_space_first(spec.get("normalizer")) or _puts_space_first(spec.get("pre_tokenizer"))

    @functools.cached_property
    def continuing_prefix(self) -> str | None:
        """WordPiece's mark on a piece inside a word ('##ing'), which stands for no text; None for other models."""
        model = json.loads(self.to_str()).get("model") or {}
        return model.get("continuing_subword_prefix") if model.get("type") == "WordPiece" else None

    def fingerprint(self) -> str:
        return _sha256_json({"kind": self.kind, "tokenizer": json.loads(self.to_str()), "specials": self.specials})

    def save(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{HF_FILE}.tmp"
        self._tok.save(str(tmp))
        os.replace(tmp, directory / HF_FILE)
        _write_meta(directory, {"kind": self.kind, "specials": self.specials})

    @classmethod
    def load(cls, directory: str | os.PathLike) -> HFTokenizer:

        directory = Path(directory)
        meta = _read_meta(directory)
        if not (directory / HF_FILE).is_file():
            raise InputError(f"tokenizer directory {directory} lacks {HF_FILE}, which its {META_FILE} needs")
        return cls(_read_hf(directory / HF_FILE), kind=meta["kind"], specials=meta["specials"])


def _added_around(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(before, after): the ids a `tokenizers.Tokenizer`'s post-processor adds around a text; ((), ()) where it adds
    none or the text's own ids are not found whole among its output."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    framed = tokenizer.encode("a").ids
    for start in range(len(framed) - len(bare) + 1):
        if framed[start:start + len(bare)] == bare:
            return tuple(framed[:start]), tuple(framed[start + len(bare):])
    return (), ()


def _writes_spaces(step: object) -> bool:
    """Whether a tokenizer.json pre-tokenizer or normalizer (`step`, with those of a Sequence inside it) keeps
    spaces as marks on the words after them (`HFTokenizer.space_starts_word`)."""
    return any(part.get("type") in ("ByteLevel", "Metaspace") or (part.get("type") == "Replace"
                                                                   and part.get("content") == SENTENCEPIECE_SPACE)
               for part in _steps(step))


def _puts_space_first(step: object) -> bool:
    """Whether a tokenizer.json normalizer or pre-tokenizer (`step`) puts '▁' before a text
    (`HFTokenizer.space_before_text`): a Prepend('▁') or a Metaspace that prepends."""
    return any((part.get("type") == "Prepend" and part.get("prepend") == SENTENCEPIECE_SPACE)
               or (part.get("type") == "Metaspace" and part.get("prepend_scheme", "always") != "never"
                   and part.get("add_prefix_space", True))
               for part in _steps(step))


def _steps(step: object) -> Iterator[dict]:
    """A tokenizer.json normalizer or pre-tokenizer and the steps of every Sequence inside it."""
    if isinstance(step, list):
        for part in step:
            yield from _steps(part)
    elif isinstance(step, dict):
        yield step
        yield from _steps(step.get("pretokenizers"))
        yield from _steps(step.get("normalizers"))


def _read_hf(path: Path):
    from tokenizers import Tokenizer as _HF

    try:
        return _HF.from_file(str(path))
    except Exception as err:  # tokenizers raises plain Exception on a malformed file
        raise InputError(f"cannot read the Hugging Face tokenizer {path}: {err}; the file is damaged or no "
                         "tokenizer.json: put back the one its model came with") from None


def _read_meta(directory: Path) -> dict:
    """The kind and special tokens `save` wrote in `directory` (and a char tokenizer's alphabet and policy), checked:
    InputError naming the file and what is wrong with it (missing, not JSON, a field missing or of the wrong type)."""
    path = directory / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"no attnkit tokenizer in {directory}: {META_FILE} is missing") from None
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
        raise InputError(f"{path} is not valid JSON: {err}") from None
    problem = "not a JSON object"
    if isinstance(meta, dict):
        char = {"alphabet": str, "unknown": str} if meta.get("kind") == "char" else {}
        wrong = [name for name, kind in {"kind": str, "specials": dict, **char}.items()
                 if not isinstance(meta.get(name), kind)]
        if not wrong and not all(isinstance(token, str) for token in meta["specials"].values()):
            wrong = ["specials"]
        problem = f"{', '.join(wrong)} missing or of the wrong type" if wrong else ""
    if problem:
        raise InputError(f"{path} is not the description attnkit saves with a tokenizer ({problem}): put back the "
                         "file saved with it, or save the tokenizer again")
    return meta


def check_kind(kind: str) -> str:
    """Return `kind` if it names a tokenizer kind, else raise `ConfigError` listing the choices."""
    if kind not in KINDS:
        raise ConfigError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
    return kind


def load_tokenizer(directory: str | os.PathLike) -> CharTokenizer | HFTokenizer:
    """Load a tokenizer directory saved by any kind, or a bare Hugging Face directory (`tokenizer.json`).

    Raises `InputError` when the directory holds neither `attnkit_tokenizer.json` nor `tokenizer.json`.
    """
    directory = Path(directory)
    if not (directory / META_FILE).is_file():
        if (directory / HF_FILE).is_file():
            return HFTokenizer.from_dir(directory)
        inner = directory / "tokenizer"
        if (inner / META_FILE).is_file() or (inner / HF_FILE).is_file():
            raise InputError(f"no tokenizer in {directory} itself (a run?): give its tokenizer folder, {inner}")
        raise InputError(
            f"no tokenizer in {directory}: expected {META_FILE} (saved by attnkit) or {HF_FILE} (Hugging Face)"
        )
    kind = check_kind(_read_meta(directory).get("kind", "?"))
    return CharTokenizer.load(directory) if kind == "char" else HFTokenizer.load(directory)


def train_bpe(
    texts: Iterable[str],
    *,
    vocab_size: int,
    special_tokens: Mapping[str, str] | Sequence[str] | None = None,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> HFTokenizer:
    """Train a byte-level BPE (GPT-2's scheme: the 256 bytes are the base alphabet, so nothing is unknown).
    Raises InputError for texts that are all empty; a vocabulary smaller than `vocab_size` (too few pairs seen twice
    in a short text) is logged."""
    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    specials = _normalize_specials(special_tokens)
    n_base = 256 + len(specials)
    if vocab_size < n_base:
        raise ConfigError(f"vocab_size {vocab_size} is too small for byte-level BPE: it needs at least {n_base}")
    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(specials.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    _train_on(tok, trainer, texts, "a BPE", vocab_size)
    return HFTokenizer(tok, kind="bpe", specials=specials)


# BERT's special tokens; BOS and EOS borrow CLS and SEP, as those of a BERT tokenizer from disk do
WORDPIECE_SPECIALS = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]", "mask": "[MASK]",
                      "cls": "[CLS]", "sep": "[SEP]"}


def train_wordpiece(
    texts: Iterable[str],
    *,
    vocab_size: int,
    lowercase: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    min_frequency: int = 2,
    show_progress: bool = False,
    inner_pieces: Sequence[str] | None = None,
) -> HFTokenizer:
    """Train BERT's WordPiece (Devlin et al. 2019, the lectures' BERT) as bert-base-uncased's tokenizer.json is
    built: BERT's normalizer (lower-cased and accents stripped where `lowercase`, as uncased BERT; both kept
    otherwise, as cased), its pre-tokenizer (words split at white space and punctuation), pieces inside a word
    marked '##', and its post-processor's `[CLS] text [SEP]` (which `encode` does not add: the data code frames).
    A word with a character the vocabulary lacks is [UNK] whole, as in BERT. Raises InputError for texts that are
    all empty and ConfigError for a `vocab_size` that leaves no room past the special tokens.

    The same text trains the same WordPiece: `tokenizers`' trainer numbers the '##' piece of each character in the
    order of a hash map (huggingface/tokenizers#1794), and those numbers break ties between merges, so they are given
    to it first, sorted (`wordpiece_inner_pieces`; `texts` is read for them first unless `inner_pieces` are given),
    as special tokens it then keeps as plain pieces. As in BERT's own vocabulary, each character that may stand
    inside a word has its '##' piece."""
    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = _normalize_specials(WORDPIECE_SPECIALS if special_tokens is None else special_tokens)
    distinct = list(dict.fromkeys(specials.values()))
    if vocab_size <= len(distinct):
        raise ConfigError(f"vocab_size {vocab_size} is too small for WordPiece: its {len(distinct)} special tokens "
                          "leave no room for text; give a larger one")
    if inner_pieces is None:
        texts = list(texts)
        inner_pieces = wordpiece_inner_pieces(texts, lowercase=lowercase)
    tok = _HF(models.WordPiece(unk_token=specials["unk"]))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    numbered_first = distinct + [piece for piece in inner_pieces if piece not in distinct]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=numbered_first, continuing_subword_prefix="##",
                                        show_progress=show_progress)
    _train_on(tok, trainer, texts, "a WordPiece", vocab_size)
    spec = json.loads(tok.to_str())  # the '##' pieces were special tokens only to be numbered first
    spec["added_tokens"] = [added for added in spec["added_tokens"] if added["content"] in distinct]
    tok = _HF.from_str(json.dumps(spec))
    first, last = specials.get("cls", specials["bos"]), specials.get("sep", specials["eos"])
    ids = {token: tok.token_to_id(token) for token in (first, last)}
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", pair=f"{first} $A {last} $B:1 {last}:1", special_tokens=list(ids.items()))
    return HFTokenizer(tok, kind="wordpiece", specials=specials)


def wordpiece_inner_pieces(texts: Iterable[str], *, lowercase: bool = True) -> list[str]:
    """The '##' piece of every character of `texts` that BERT's normalizer (`lowercase`: uncased) leaves and that may
    stand inside a word: not white space, nor punctuation or a CJK character, which its pre-tokenizer and normalizer
    set apart as words of their own; sorted."""
    from tokenizers import normalizers

    normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    seen: set[str] = set()
    for text in texts:
        seen.update(text)
    inner: set[str] = set()
    for character in seen:
        normalized = normalizer.normalize_str(character)
        if normalized == normalized.strip():  # a CJK character comes back with spaces around it
            inner.update(c for c in normalized if not _bert_punctuation(c))
    return ["##" + c for c in sorted(inner)]


def _bert_punctuation(character: str) -> bool:
    """Whether BERT's pre-tokenizer splits `character` off as a word: ASCII punctuation or a Unicode P* category."""
    return (character.isascii() and not character.isalnum() and character.isprintable() and not character.isspace()
            ) or unicodedata.category(character).startswith("P")


def _train_on(tok, trainer, texts: Iterable[str], what: str, vocab_size: int) -> None:
    """Train `tok` (a `tokenizers.Tokenizer`) with `trainer` on `texts`, read in pieces of about a megabyte cut
    at line ends (flat memory on large files). Raises InputError for texts that are all empty; a vocabulary smaller
    than `vocab_size` (too few pairs seen twice in a short text) or larger (an alphabet that does not fit) is logged."""
    seen = [0]  # characters read

    def pieces() -> Iterable[str]:
        for text in texts:
            seen[0] += len(text)
            yield from split_text(text, 1 << 20)

    tok.train_from_iterator(pieces(), trainer)
    if not seen[0]:
        raise InputError(f"the training text is empty: {what} learns its pieces from text; give files that hold some")
    log.info("trained %s: %d tokens", what, tok.get_vocab_size())
    if tok.get_vocab_size() < vocab_size:
        log.warning("%s has %d tokens of the %s asked: its text holds no more pairs seen twice to merge; give "
                    "more text, or a smaller vocab_size", what, tok.get_vocab_size(), f"{vocab_size:,}")
    elif tok.get_vocab_size() > vocab_size:
        log.warning("%s has %d tokens, more than the %s asked: its special tokens and its alphabet (every byte for "
                    "a BPE; every character of the text, and a WordPiece's '##' piece of each) are all kept; give "
                    "a larger vocab_size to make room for merges", what, tok.get_vocab_size(), f"{vocab_size:,}")


def train_tokenizer(
    kind: str,
    source: Iterable[str | os.PathLike],
    *,
    vocab_size: int | None = None,
    special_tokens: Mapping[str, str] | Sequence[str] | None = None,
    unknown: UnknownPolicy = "unk",
    encoding_errors: EncodingErrors = "strict",
    lowercase: bool = True,
    progress: bool = False,
) -> CharTokenizer | HFTokenizer:
    """Build a `char`, `bpe` or `wordpiece` tokenizer from texts (`str` items) and files (`Path` items).

    `vocab_size` is required for `bpe` and `wordpiece` and ignored by `char` (its vocabulary is the alphabet);
    `lowercase` is WordPiece's (uncased or cased BERT); `progress` draws a bar over the text read (and, on a
    terminal, `tokenizers`' own over the merges). Raises `ConfigError` for an unknown kind or for `hf` (load one
    with `load_tokenizer` instead).
    """
    check_kind(kind)
    items = list(source)
    texts = _reading(items, encoding_errors, progress)
    if kind == "char":
        return CharTokenizer.from_texts(texts, special_tokens=special_tokens, unknown=unknown)
    if kind == "hf":
        raise ConfigError("kind 'hf' is not trained: point load_tokenizer at a directory holding tokenizer.json")
    if vocab_size is None:
        raise ConfigError(f"a {kind} tokenizer needs vocab_size")
    if kind == "wordpiece":  # the text read once for its characters, then again to train on
        characters = _reading(items, encoding_errors, progress, what="reading the text for its characters")
        inner = wordpiece_inner_pieces(characters, lowercase=lowercase)
        return train_wordpiece(texts, vocab_size=vocab_size, lowercase=lowercase, special_tokens=special_tokens,
                               show_progress=progress, inner_pieces=inner)
    return train_bpe(texts, vocab_size=vocab_size, special_tokens=special_tokens, show_progress=progress)


def _reading(items: list[str | os.PathLike], errors: EncodingErrors, progress: bool, *,
             what: str = "reading the text") -> Iterable[str]:
    """The texts of `items` (`iter_texts`), with a bar named `what` that moves by each file's bytes (a text's
    characters) as it is read: a large corpus is read for a while before the merges begin."""
    sizes = [_size(item) if isinstance(item, os.PathLike) else len(item) for item in items]
    with tqdm(total=sum(sizes), unit="B", unit_scale=True, desc=what, disable=not progress,
              leave=False) as bar:
        for size, text in zip(sizes, iter_texts(items, errors=errors), strict=True):
            yield text
            bar.update(size)


def _size(path: os.PathLike) -> int:
    """A file's size in bytes; 0 for one that cannot be read (reading it says why, naming it)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level stand-ins back to bytes: printable bytes stand for themselves, the others are
    shifted past 255 (so byte 0x20, a space, shows as 'Ġ' and 0x0a, a newline, as 'Ċ').
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    shifted = (b for b in range(256) if b not in printable)
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(shifted)}


SENTENCEPIECE_SPACE = "▁"  # SentencePiece's mark of a space, written into the word after it ('▁cat')


def token_texts(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str | bytes]:
    """The text each token stands for (a byte-level 'Ġcat' is ' cat', a SentencePiece '▁cat' after the first token
    too, a WordPiece '##ing' is 'ing'), or its bytes where a byte-level piece holds only part of a character (an
    emoji split over two tokens). The first token's '▁' is the one the tokenizer puts before a text: no text.
    """
    table = _byte_level_table()
    prefix = getattr(tokenizer, "continuing_prefix", None)  # a Tokenizer of one's own may not say
    texts: list[str | bytes] = []
    for n, (i, piece) in enumerate(zip(ids, tokenizer.pieces(ids), strict=True)):
        shown = tokenizer.decode([i], skip_special=False)
        if "\ufffd" in shown and all(c in table for c in piece):  # part of a character: its bytes
            texts.append(bytes(table[c] for c in piece))
        elif prefix and piece.startswith(prefix) and shown.startswith(prefix):  # decoded alone, it keeps its mark
            texts.append(shown[len(prefix):])
        elif n and piece.startswith(SENTENCEPIECE_SPACE) and not shown.startswith(" "):  # decoders strip a text's
            texts.append(" " + shown)  # first space, which a piece decoded alone starts with
        else:
            texts.append(shown)
    return texts


def explain(tokenizer: Tokenizer, text: str) -> str:
    """A table of how `text` is tokenized: each id, its vocabulary piece and the text it stands for (the
    bytes, for a byte-level piece that holds only part of a character).
    """
    ids = tokenizer.encode(text)
    per_token = f", {len(text) / len(ids):.2f} characters per token" if ids else ""
    lines = [f"{len(text)} characters -> {len(ids)} tokens{per_token}", "ids: " + " ".join(map(str, ids))]
    if ids:
        pieces = [p if p.isprintable() and not p.isspace() else repr(p) for p in tokenizer.pieces(ids)]
        width = max(5, *(len(p) for p in pieces))
        lines.append(f"{'id':>8}  {'piece':<{width}}  text")
        for i, piece, shown in zip(ids, pieces, token_texts(tokenizer, ids), strict=True):
            lines.append(f"{i:>8}  {piece:<{width}}  {shown!r}")
    return "\n".join(lines)


_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "⏎"}  # how a picture draws white space (`readable`)
_SPACE_MARK = "␣"


def readable(text: str) -> str:
    """`text` as a picture labels a token: line breaks and tabs as visible marks, and spaces too where the text is
    nothing else (a token that is only white space is never drawn blank)."""
    if text.strip() == "":
        return "".join(_VISIBLE.get(c, _SPACE_MARK) for c in text)
    return "".join(_VISIBLE.get(c, c) for c in text)
