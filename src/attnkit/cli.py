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


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="run directory: config.json, model.safetensors, tokenizer/")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when present, else cpu)")
    p.add_argument("--dtype", help="fp32 | bf16 | fp16 (default: as stored)")


def _load_run(args: argparse.Namespace):
    from attnkit.generate import load

    return load(args.run, device=args.device, dtype=args.dtype)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained decoder, streaming the text as it comes")
    _add_run_args(p)
    p.add_argument("--prompt", required=True, help='the prompt; "-" reads it from stdin; "" starts from BOS')
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default 1)")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="sample among the most likely tokens that reach probability p")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (default 1: off)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, help="same seed, same text")
    p.add_argument("--stop", action="append", default=[], help="end the text at this string (repeatable)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="print tokens as they come (default; one sample only)")
    p.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    pipeline = _load_run(args)
    stream = args.stream and args.num_samples == 1

    def write(_: int, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    if stream:
        write(0, prompt)
    texts = pipeline.generate(
        prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, num_samples=args.num_samples,
        seed=args.seed, stop=args.stop, on_text=write if stream else None,
    )
    if stream:
        print()
        return 0
    for index, text in enumerate(texts):
        if args.num_samples > 1:
            print(f"--- sample {index + 1} ---")
        print(prompt + text)
    return 0


def _add_inputs(p: argparse.ArgumentParser, what: str) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", action="append", help=f"a text to {what} (repeatable)")
    source.add_argument("--input", help=f"a UTF-8 file: one text to {what} per line")


def _read_inputs(args: argparse.Namespace) -> list[str]:
    from attnkit.data.corpus import read_lines

    return args.text if args.text else read_lines(args.input)


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate with a trained encoder-decoder (greedy or beam search)")
    _add_run_args(p)
    _add_inputs(p, "translate")
    p.add_argument("--output", help="write one translation per line here (default: print them)")
    p.add_argument("--beam-size", type=int, default=1, help="1 is greedy (default)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam score = log p / length ** this")
    p.add_argument("--max-length", type=int, help="target tokens at most (default: 2 x source + 10)")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=_run_translate)


def _run_translate(args: argparse.Namespace) -> int:
    texts = _read_inputs(args)
    translations = _load_run(args).translate(
        texts, beam_size=args.beam_size, length_penalty=args.length_penalty, max_length=args.max_length,
        batch_size=args.batch_size, progress=args.input is not None,
    )
    if args.output:
        from attnkit.checkpoint import atomic_write

        atomic_write(args.output, "".join(f"{line}\n" for line in translations))
    else:
        print("\n".join(translations))
    return 0


def _add_classify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("classify", help="label texts with a trained encoder classifier")
    _add_run_args(p)
    _add_inputs(p, "classify")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=_run_classify)


def _run_classify(args: argparse.Namespace) -> int:
    for result in _load_run(args).classify(_read_inputs(args), batch_size=args.batch_size):
        print(f"{result.label}\t{result.probability:.4f}")
    return 0


_TRAIN_EPILOG = """\
examples:
  attnkit train --out runs/default                      # small decoder on the Python standard library
  attnkit train --data input.txt --tokenizer char --max-steps 2000 --out runs/shakespeare
  attnkit train --task translate --data multi30k --src-lang de --tgt-lang en --max-time 1h --out runs/de-en
  attnkit train --task classify --data sst2/stsa.binary.train --val-data sst2/stsa.binary.dev --out runs/sst2
  attnkit train --out runs/default --resume              # continue where it stopped (Ctrl-C saves first)

Every field of the model config and of the data and training settings can be set with --set KEY=VALUE.
"""


SUBCOMMANDS: list[SubcommandAdder] = [
    _add_presets, _add_tokenizer, _add_generate, _add_translate, _add_classify,
]


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
