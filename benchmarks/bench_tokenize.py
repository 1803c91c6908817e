"""Tokenization throughput: preparing LM data (read, encode, write the memmap) against plain encoding.

    python -m benchmarks.bench_tokenize [--max-bytes N] [--repeats 3] [--out benchmarks/results/tokenize.json]

For each corpus (Tiny Shakespeare from ../shared/data when present, and the Python standard library's source)
and tokenizer (char, byte-level BPE), it times, best of `--repeats`:
  prepare      `LMData.prepare` into an empty cache: read the files, encode, write the .bin (what training pays)
  reuse        `LMData.prepare` again with the cache in place
  plain        the same texts, already in memory, encoded by the bare library: for BPE, Hugging Face
               `tokenizers` `encode_batch` (and `encode_batch_fast`, which skips offsets) on the whole file
               texts; for char, a Python dict lookup per character (nanoGPT's way)
Every BPE timing starts from a freshly loaded tokenizer, so no run profits from another's word cache.
Throughput is the corpus's size in bytes over the time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tokenizers

from attnkit.data.corpus import stdlib_files
from attnkit.data.lm import LMData
from attnkit.tokenize import CharTokenizer, HFTokenizer, train_bpe
from benchmarks.common import DATA, RESULTS

SHAKESPEARE = DATA / "tinyshakespeare" / "input.txt"


def best_time(setup: Callable[[], object], run: Callable[[object], object], repeats: int) -> float:
    """The shortest of `repeats` timings of `run(setup())` (the setup is not timed)."""
    times = []
    for _ in range(repeats):
        arg = setup()
        start = time.perf_counter()
        run(arg)
        times.append(time.perf_counter() - start)
    return min(times)


def fresh(tok: CharTokenizer | HFTokenizer) -> Callable[[], CharTokenizer | HFTokenizer]:
    """A factory of cold copies of `tok` (a Hugging Face tokenizer caches the words it has seen)."""
    if isinstance(tok, CharTokenizer):
        return lambda: tok
    state = tok._tok.to_str()
    return lambda: HFTokenizer(tokenizers.Tokenizer.from_str(state), kind=tok.kind, specials=tok.specials)


def measure(corpus: str, files: list[Path], tok: CharTokenizer | HFTokenizer, repeats: int) -> dict:
    texts = [f.read_text(encoding="utf-8") for f in files]
    mb = sum(f.stat().st_size for f in files) / 1e6

    def prepare(t: CharTokenizer | HFTokenizer) -> None:
        with tempfile.TemporaryDirectory() as cache:
            LMData.prepare(files, t, cache, progress=False)

    row = {"corpus": corpus, "tokenizer": f"{tok.kind} ({tok.vocab_size})", "files": len(files), "MB": round(mb, 2)}
    row["prepare_MB_s"] = round(mb / best_time(fresh(tok), prepare, repeats), 1)
    with tempfile.TemporaryDirectory() as cache:
        row["tokens"] = len(LMData.prepare(files, tok, cache, progress=False).tokens)
        row["reuse_s"] = round(
            best_time(lambda: None, lambda _: LMData.prepare(files, tok, cache, progress=False), repeats), 4
        )
    row["bytes_per_token"] = round(mb * 1e6 / row["tokens"], 2)
    if isinstance(tok, CharTokenizer):
        stoi = {c: i for i, c in enumerate(tok.alphabet)}
        row["plain_MB_s"] = round(
            mb / best_time(lambda: None, lambda _: [[stoi[c] for c in t] for t in texts], repeats), 1
        )
        return row
    raw = lambda: tokenizers.Tokenizer.from_str(tok._tok.to_str())  # noqa: E731  the bare library
    row["plain_MB_s"] = round(
        mb / best_time(raw, lambda r: r.encode_batch(texts, add_special_tokens=False), repeats), 1
    )
    fast = best_time(raw, lambda r: r.encode_batch_fast(texts, add_special_tokens=False), repeats)
    row["plain_fast_MB_s"] = round(mb / fast, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-bytes", type=int, default=None, help="cap the standard-library corpus")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "tokenize.json")
    args = parser.parse_args(argv)

    corpora = []
    if SHAKESPEARE.exists():
        corpora.append(("tinyshakespeare", [SHAKESPEARE.resolve()], 1024))
    corpora.append(("python-stdlib", stdlib_files(args.max_bytes), 8192))
    rows = []
    for name, files, vocab_size in corpora:
        texts = [f.read_text(encoding="utf-8") for f in files]
        start = time.perf_counter()
        bpe = train_bpe(texts, vocab_size=vocab_size)
        train_s = time.perf_counter() - start
        for tok in (CharTokenizer.from_texts(texts), bpe):
            row = measure(name, files, tok, args.repeats)
            if tok is bpe:
                row["bpe_train_s"] = round(train_s, 2)
            rows.append(row)
            print(json.dumps(row))

    columns = [
        "corpus",
        "tokenizer",
        "MB",
        "tokens",
        "bytes_per_token",
        "prepare_MB_s",
        "plain_MB_s",
        "plain_fast_MB_s",
        "reuse_s",
    ]
    widths = [max(len(c), *(len(str(r.get(c, "-"))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r.get(c, "-")).ljust(w) for c, w in zip(columns, widths, strict=True)))
    machine = {
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),  # other work on the machine skews the numbers
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
