"""Language-model data: a corpus tokenized once into a numpy memmap; batches are random windows of it.

    files --tokenize once--> lm-<key>.bin  (uint16 when the vocabulary fits, else uint32)
                             lm-<key>.json (tokenizer fingerprint, each file's size and mtime, token count, the
                                            .bin's SHA-256)

    token stream:  [ train: first (1 - val_fraction) of the tokens | val: the rest ]
    a batch:       B windows of T + 1 tokens, each inside one split; x = window[:-1], y = window[1:]

The cache is reused while the tokenizer and every file's size and mtime are unchanged and the .bin is the one
written (its SHA-256, checked when read back: `readback.digest`, as a checkpoint's files are), and rebuilt when any
of them changes. In a distributed run rank 0 alone builds or checks it (`token_cache`) and the other ranks read
the .bin it names (`LMData.prepare(cache=...)`). Files are joined with EOS between them (a single file is its
tokens alone, so one-file corpora such as Tiny Shakespeare give the classic stream and split). A tokenizer that
starts every text with BOS (`starts_with_bos`: a converted Llama's) gets BOS at the start of each file, as Hugging
Face's run_clm puts it before each document and as the model is prompted (`bos_first`); attnkit's own tokenizers
place none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from attnkit.data.corpus import file_manifest
from attnkit.errors import InputError, os_error_message
from attnkit.readback import digest as file_digest
from attnkit.readback import json_digest
from attnkit.textfiles import EncodingErrors, iter_texts, split_text
from attnkit.tokenize import CharTokenizer, HFTokenizer, Tokenizer

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # 2: the .bin's SHA-256 is in its .json
WARN_UNKNOWN, MAX_UNKNOWN = 0.001, 0.05  # shares of <unk> tokens over which a corpus is warned about, refused
_UNKNOWN_SAMPLE = 10_000_000  # tokens counted at most (evenly strided over a larger corpus)
_PIECE_CHARS = 1 << 20  # texts are encoded in pieces of about 1M characters, cut after a newline
_FLUSH_CHARS = 1 << 23  # and handed to the tokenizer about 8M characters at a time (it works in parallel)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def split_point(n_tokens: int, val_fraction: float) -> int:
    """How many of `n_tokens` go to training: the first `int(n * (1 - val_fraction))` (nanoGPT's split)."""
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    return int(n_tokens * (1.0 - val_fraction))


@dataclass
class LMData:
    """A token stream split into train and validation; see the module docstring.

    `tokens` is the whole stream, (N,) uint16/uint32, usually a read-only `np.memmap`.
    """

    tokens: np.ndarray
    n_train: int
    path: Path | None = None
    meta: dict = field(default_factory=dict)
    reused: bool = False
    bos_first: bool = False  # each file starts with BOS (`bos_first`)

    @property
    def train(self) -> np.ndarray:
        return self.tokens[: self.n_train]

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.n_train :]

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "val"):
            raise InputError(f"unknown split {name!r}; choose 'train' or 'val'")
        return self.train if name == "train" else self.val

    @classmethod
    def from_ids(cls, ids: Sequence[int] | np.ndarray, *, val_fraction: float = 0.1) -> LMData:
        """An in-memory stream (e.g. a synthetic task's), split like a prepared one."""
        ids = np.asarray(ids)
        if ids.size == 0:
            raise InputError("the token stream is empty")
        return cls(ids, split_point(ids.size, val_fraction))

    @classmethod
    def prepare(
        cls,
        files: Sequence[str | os.PathLike],
        tokenizer: Tokenizer,
        cache_dir: str | os.PathLike,
        *,
        val_fraction: float = 0.1,
        encoding_errors: EncodingErrors = "strict",
        progress: bool = True,
        cache: TokenCache | None = None,
    ) -> LMData:
        """Tokenize `files` into `cache_dir` (or reuse the cache there: `token_cache`) and split the stream. `cache`:
        the cache of these files and tokenizer that another process built or checked (rank 0 of a distributed run),
        read as it is where its .bin is here at its size (its SHA-256 is not computed again), else made here.

        Raises `InputError` for an unreadable, binary or non-UTF-8 file (see `textfiles.read_text`), for a
        corpus with no text at all, and when the cache cannot be written (a full disk: one line naming the fix).
        """
        if cache is None or not cache.present():
            cache = token_cache(files, tokenizer, cache_dir, encoding_errors=encoding_errors, progress=progress)
        meta = cache.meta
        tokens = np.memmap(cache.path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["n_tokens"],))
        _check_known(tokens, tokenizer, [Path(f) for f in files])
        return cls(tokens, split_point(meta["n_tokens"], val_fraction), cache.path, meta, cache.reused,
                   bos_first(tokenizer))

    def sample_batch(
        self, split: str, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`batch_size` random windows of `seq_len + 1` tokens from one split, drawn with `generator` (so
        saving and restoring its state resumes the exact sequence of batches).

        Returns x, y: int64 (B, T), y[:, t] = x[:, t + 1] (the next token). Raises `InputError` when the
        split is shorter than one window.
        """
        data = self.split(split)
        n_starts = self._n_starts(split, seq_len)
        starts = torch.randint(n_starts, (batch_size,), generator=generator).numpy()
        return _windows(data, starts, seq_len)

    def iter_eval_batches(
        self, split: str = "val", *, batch_size: int, seq_len: int, max_batches: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Deterministic evaluation: consecutive windows with stride `seq_len`, so every token is predicted
        once. With `max_batches`, that many batches of windows spread evenly over the whole split.
        """
        data = self.split(split)
        starts = np.arange(0, self._n_starts(split, seq_len), seq_len)
        if max_batches is not None and len(starts) > max_batches * batch_size:
            pick = np.linspace(0, len(starts) - 1, max_batches * batch_size).round().astype(np.int64)
            starts = starts[pick]
        for i in range(0, len(starts), batch_size):
            yield _windows(data, starts[i : i + batch_size], seq_len)

    def check_windows(self, seq_len: int) -> None:
        """Refuse, before training starts, a split too short for one window of `seq_len` tokens and its next token."""
        for split, name in (("train", "training"), ("val", "validation")):
            self._n_starts(split, seq_len, name=name)

    def _n_starts(self, split: str, seq_len: int, *, name: str | None = None) -> int:
        """Where a window of `seq_len` + 1 tokens may start in `split`; InputError naming the fixes that help (more
        text, a shorter window, and moving the split point when the stream holds two windows)."""
        n, need = len(self.split(split)), seq_len + 1
        if n < need:
            fixes = ["more text (--data)", "a shorter --seq-len"]
            if len(self.train) + len(self.val) >= 2 * need:
                fixes.append(f"a {'smaller' if split == 'train' else 'larger'} --val-fraction")
            raise InputError(f"the {name or split} split{self._of_files()} has {n} tokens, fewer than one window "
                             f"needs ({need}): give {', '.join(fixes[:-1])} or {fixes[-1]}")
        return n - seq_len

    def _of_files(self) -> str:
        """' of FILE' (' of N files (FIRST, ...)') for the files the stream was read from; '' for ids given."""
        files = [entry["path"] for entry in self.meta.get("files", [])]
        if not files:
            return ""
        return f" of {files[0]}" if len(files) == 1 else f" of {len(files)} files ({files[0]}, ...)"


@dataclass(frozen=True)
class TokenCache:
    """A corpus's tokens on disk (`token_cache`): the .bin, what its .json says of it, and whether it was there."""

    path: Path
    meta: dict
    reused: bool

    def present(self) -> bool:
        """Whether the .bin is here at the size its .json gives (another process's cache, on a shared disk)."""
        size = self.meta["n_tokens"] * np.dtype(self.meta["dtype"]).itemsize
        return self.path.is_file() and self.path.stat().st_size == size


def token_cache(files: Sequence[str | os.PathLike], tokenizer: Tokenizer, cache_dir: str | os.PathLike, *,
                encoding_errors: EncodingErrors = "strict", progress: bool = True) -> TokenCache:
    """The token cache of `files` in `cache_dir`: reused where it is fresh and whole (its SHA-256 checked), else
    built. Raises InputError as `LMData.prepare` does."""
    files = [Path(f) for f in files]
    if not files:
        raise InputError("no data files given")
    cache_dir = Path(cache_dir)
    with _writing_cache(cache_dir):
        cache_dir.mkdir(parents=True, exist_ok=True)
    identity = {
        "format": CACHE_FORMAT,
        "tokenizer": tokenizer.fingerprint(),
        "files": [str(f.resolve()) for f in files],
        "encoding_errors": encoding_errors,
    }
    if bos_first(tokenizer):  # named only where set: the caches of streams without BOS keep their keys
        identity["bos_first"] = True
    key = json_digest(identity)[:16]
    bin_path, meta_path = cache_dir / f"lm-{key}.bin", cache_dir / f"lm-{key}.json"
    expected = {
        **identity,
        "files": file_manifest(files),
        "vocab_size": tokenizer.vocab_size,
        "dtype": token_dtype(tokenizer.vocab_size).name,
    }
    meta = _fresh_meta(meta_path, bin_path, expected)
    reused = meta is not None
    if meta is None:
        _say_what_changed(meta_path, expected["files"])
        start = time.perf_counter()
        with _writing_cache(cache_dir):
            n_tokens, digest = _build(files, tokenizer, bin_path, encoding_errors, progress)
            meta = {**expected, "n_tokens": n_tokens, "sha256": digest}
            _write_json(meta_path, meta)
        n_bytes = sum(f["size"] for f in expected["files"])
        log.info(
            "tokenized %d files (%.1f MB) into %d tokens in %.1f s -> %s",
            len(files),
            n_bytes / 1e6,
            n_tokens,
            time.perf_counter() - start,
            bin_path,
        )
    else:
        log.info("reusing token cache %s (%d tokens)", bin_path, meta["n_tokens"])
    return TokenCache(bin_path, meta, reused)


def _windows(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    window = torch.from_numpy(np.asarray(data[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int64))  # (B, T+1)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()  # (B, T), (B, T)


def _say_what_changed(meta_path: Path, files: list[dict]) -> None:
    """Warn, naming each file, when a cache of these same files exists but a file's content changed since (its size
    or modification time differ): a file rewritten between runs is not taken silently."""
    try:
        before = {f["path"]: f for f in json.loads(meta_path.read_text(encoding="utf-8"))["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return  # no earlier cache of these files (or one not readable): nothing to compare
    for now in files:
        old = before.get(now["path"])
        if old is not None and (old.get("size"), old.get("mtime_ns")) != (now["size"], now["mtime_ns"]):
            log.warning("the data file %s changed since its tokens were cached (%s bytes then, %s now; modified "
                        "again): its new text is tokenized now", now["path"], f"{old.get('size'):,}",
                        f"{now['size']:,}")


def _check_known(tokens: np.ndarray, tokenizer: Tokenizer, files: Sequence[Path]) -> None:
    """Refuse a corpus the tokenizer mostly does not know (more than MAX_UNKNOWN of its tokens unknown: a run's
    tokenizer, built from other text, resumed on a file rewritten since), and warn over a smaller share."""
    unk = tokenizer.unk_id
    if unk is None or len(tokens) == 0:
        return
    sample = tokens[:: max(1, len(tokens) // _UNKNOWN_SAMPLE)]
    unknown = int(np.count_nonzero(sample == unk)) / len(sample)
    if unknown <= WARN_UNKNOWN:
        return
    names = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    message = (f"{unknown:.1%} of the tokens of {names} are {tokenizer.pieces([unk])[0]}: the tokenizer "
               f"({tokenizer.kind}, "
               f"{tokenizer.vocab_size} tokens) does not know much of this text; was the file rewritten since the "
               "tokenizer was built? Train a new run on it (not --resume or --init-from a run built on other text), "
               "or use a tokenizer that covers it (--tokenizer bpe)")
    if unknown > MAX_UNKNOWN:
        raise InputError(message)
    log.warning("%s", message)


def _fresh_meta(meta_path: Path, bin_path: Path, expected: dict) -> dict | None:
    """The cache's metadata if it matches `expected` and its .bin is the one it describes (its size and SHA-256),
    else None; a .bin or .json changed since they were written (cut off, edited) is said and rebuilt."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not JSON, not UTF-8
        return None
    if not isinstance(meta, dict) or any(meta.get(k) != v for k, v in expected.items()) or not bin_path.is_file():
        log.info("token cache %s is stale: rebuilding", bin_path)
        return None
    n_tokens, digest = meta.get("n_tokens"), meta.get("sha256")
    whole = (isinstance(n_tokens, int) and bin_path.stat().st_size == n_tokens * np.dtype(meta["dtype"]).itemsize
             and isinstance(digest, str) and file_digest(bin_path) == digest)
    if not whole:
        log.warning("token cache %s is not the one its %s describes (cut off or changed since it was written): "
                    "rebuilding it", bin_path, meta_path.name)
        return None
    return meta


@contextmanager
def _writing_cache(cache_dir: Path) -> Iterator[None]:
    """An OSError while writing the cache (a full disk, a read-only directory) becomes an InputError of one line
    naming the problem and the fix. (Reading the data files raises InputError of its own, `textfiles.read_text`.)"""
    try:
        yield
    except OSError as err:
        raise InputError(os_error_message(err, cache_dir, "writing the token cache in")) from None


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _build(
    files: list[Path], tokenizer: Tokenizer, bin_path: Path, errors: EncodingErrors, progress: bool
) -> tuple[int, str]:
    """Tokenize `files` into `bin_path` (written to a temporary file, then renamed); return the token count and
    the file's SHA-256."""
    dtype = token_dtype(tokenizer.vocab_size)
    tmp = bin_path.with_name(f"{bin_path.name}.{os.getpid()}.tmp")
    total = sum(f.stat().st_size for f in files)
    n_tokens, digest = 0, hashlib.sha256()
    try:
        with (
            open(tmp, "wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress, leave=False) as bar,
        ):
            for ids in _encode_files(files, tokenizer, errors, bar):
                block = memoryview(np.ascontiguousarray(ids, dtype=dtype))
                out.write(block)  # not tofile: its OSError lacks errno
                digest.update(block)
                n_tokens += ids.size
        if n_tokens == 0 and total == 0:
            raise InputError(f"no text in the {len(files)} data file(s) (first: {files[0]}): every one is empty")
        if n_tokens == 0:  # bytes read, no token made: a tokenizer whose vocabulary covers none of the text
            raise InputError(f"the tokenizer ({tokenizer.vocab_size} tokens) reads the {total:,} bytes of the "
                             f"{len(files)} data file(s) (first: {files[0]}) as no token at all: its vocabulary "
                             "covers none of this text; give a tokenizer made for it (--tokenizer bpe trains one)")
        os.replace(tmp, bin_path)
    finally:
        tmp.unlink(missing_ok=True)
    return n_tokens, digest.hexdigest()


def bos_first(tokenizer: Tokenizer) -> bool:
    """Whether a stream of `tokenizer`'s texts puts BOS at the start of each file: where the tokenizer starts every
    text with one (a converted Llama's, whose model was trained and is prompted so)."""
    return getattr(tokenizer, "starts_with_bos", False) and tokenizer.bos_id is not None


def _encode_files(files: list[Path], tokenizer: Tokenizer, errors: EncodingErrors, bar: tqdm) -> Iterator[np.ndarray]:
    """Token arrays for the files in order, with EOS between files when there are several and BOS at the start of
    each where `bos_first`. The tokenizer gets about _FLUSH_CHARS at a time, inside one large file too (its ids as
    Python lists stay that small), and the bar moves by the share of each file's bytes handed over."""
    sep = tokenizer.eos_id if len(files) > 1 else None
    bos = tokenizer.bos_id if bos_first(tokenizer) else None
    space_before_text = isinstance(tokenizer, HFTokenizer) and tokenizer.space_before_text
    pending: list[str | int] = []  # text pieces, and the special ids placed between them
    pending_chars = pending_bytes = 0
    started = False
    for path, text in zip(files, iter_texts(files, errors=errors), strict=True):
        size = path.stat().st_size
        if not text:
            log.debug("skipping empty file %s", path)
            pending_bytes += size
            continue
        if started and sep is not None:
            pending.append(sep)
        if bos is not None:
            pending.append(bos)
        started = True
        done = 0  # characters of this file handed over
        for piece in split_text(text, _PIECE_CHARS, space_before_text=space_before_text):
            pending.append(piece)
            pending_chars += len(piece)
            pending_bytes += size * (done + len(piece)) // len(text) - size * done // len(text)
            done += len(piece)
            if pending_chars >= _FLUSH_CHARS:
                yield from _encode_pending(pending, tokenizer)
                bar.update(pending_bytes)
                pending, pending_chars, pending_bytes = [], 0, 0
        pending_bytes += size - size * done // len(text)  # the spaces split_text left out between pieces
    yield from _encode_pending(pending, tokenizer)
    bar.update(pending_bytes)


def _encode_pending(pending: list[str | int], tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    texts = [p for p in pending if isinstance(p, str)]
    if isinstance(tokenizer, CharTokenizer):
        encoded = [tokenizer.encode_array(t) for t in texts]  # vectorised, no Python lists
    else:
        encoded = [np.array(ids, dtype=np.int64) for ids in tokenizer.encode_batch(texts)]
    encoded.reverse()
    for piece in pending:
        yield encoded.pop() if isinstance(piece, str) else np.array([piece], dtype=np.int64)
