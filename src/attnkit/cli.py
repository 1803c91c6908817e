"""The `attnkit` command line: parse, build a config, call the library. Each subcommand is one small function."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

SubcommandAdder = Callable[[argparse._SubParsersAction], None]


def _add_presets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="print the table of model presets (the lecture's comparison table)")
    p.set_defaults(func=_run_presets)


def _run_presets(args: argparse.Namespace) -> int:
    from attnkit import count_parameters, presets

    header = ("preset", "family", "params", "layers", "width", "heads/kv", "norm", "ffn", "positions", "score")
    rows = [header]
    for name in presets.names():
        c = presets.get(name)
        layers = f"{c.n_layers}+{c.decoder_layers}" if c.family == "encoder-decoder" else str(c.n_layers)
        rows.append((
            name, c.family, _human(count_parameters(c)), layers, str(c.d_model), f"{c.n_heads}/{c.kv_heads}",
            f"{c.norm_position} {c.norm}", c.activation, c.position, c.score,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _human(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.2f}{unit}"
    return str(count)


def _add_tokenizer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="train a tokenizer, or show how one splits a text")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="train a char or byte-level BPE tokenizer on text files")
    t.add_argument("--data", nargs="+", help="files, folders or globs (default: the Python standard library)")
    t.add_argument("--kind", default="bpe", help="char | bpe (default bpe)")
    t.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size, special tokens included")
    t.add_argument("--max-bytes", type=int, help="read at most about this many bytes of the corpus")
    t.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict")
    t.add_argument("--out", required=True, help="directory to save the tokenizer in")
    t.set_defaults(func=_run_tokenizer_train)
    e = tsub.add_parser("encode", help="print the ids and pieces of a text")
    e.add_argument("--tokenizer", required=True, help="a saved tokenizer directory, or one holding tokenizer.json")
    e.add_argument("--text", required=True)
    e.set_defaults(func=_run_tokenizer_encode)


def _run_tokenizer_train(args: argparse.Namespace) -> int:
    from attnkit.data.corpus import resolve_files
    from attnkit.tokenize import check_kind, train_tokenizer

    kind = check_kind(args.kind)
    files = resolve_files(args.data, max_bytes=args.max_bytes)
    tok = train_tokenizer(kind, files, vocab_size=args.vocab_size, encoding_errors=args.encoding_errors)
    tok.save(args.out)
    print(f"{tok.kind} tokenizer, {tok.vocab_size} tokens, from {len(files)} files -> {args.out}")
    return 0


def _run_tokenizer_encode(args: argparse.Namespace) -> int:
    from attnkit.tokenize import explain, load_tokenizer

    print(explain(load_tokenizer(args.tokenizer), args.text))
    return 0


SUBCOMMANDS: list[SubcommandAdder] = [_add_presets, _add_tokenizer]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    from attnkit.errors import AttnkitError

    try:
        return args.func(args)
    except AttnkitError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
