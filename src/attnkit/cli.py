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


SUBCOMMANDS: list[SubcommandAdder] = [_add_presets]


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
