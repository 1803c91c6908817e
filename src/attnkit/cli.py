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
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
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
    p.add_argument("--int8", action="store_true",
                   help="int8 weight-only linear layers (bf16 products): faster decoding, a little quality lost")
    p.add_argument("--compile", nargs="?", const="default", choices=["default", "max-autotune"],
                   help="torch.compile the decoding step (decoders, fixed shapes) or each block: waits for "
                   "compilation first, then decodes faster where overhead dominates (small models, bf16, --int8); "
                   "max-autotune: a minute or more of kernel timing the first time, fastest for larger models")


def _load_run(args: argparse.Namespace):
    from attnkit.generate import load

    return load(args.run, device=args.device, dtype=args.dtype, quantize="int8" if args.int8 else None,
                compile=args.compile or False)


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
    from attnkit.textfiles import read_lines

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


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a model (lm, translate or classify), with checkpoints and resume",
        description="Train a decoder LM, an encoder-decoder translator or an encoder classifier. Progress is "
        "shown; metrics.jsonl, a loss plot and checkpoints go to --out. Ctrl-C finishes the step, saves and exits.",
        epilog=_TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to train")
    what.add_argument("--task", choices=["lm", "translate", "classify"],
                      help="lm: next-token prediction (decoder); translate: encoder-decoder; classify: encoder "
                      "(default lm, or the resumed run's)")
    what.add_argument("--preset", help="start from a model preset (see `attnkit presets`), e.g. gpt2-tiny")
    what.add_argument("--config", dest="config_file", metavar="FILE.json", help="start from a model config file")
    what.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override any model, data or training setting, e.g. --set n_layers=6 (repeatable)")
    data = p.add_argument_group("data")
    data.add_argument("--data", nargs="+", metavar="PATH",
                      help="lm: text files, folders or globs (default: the Python standard library's source); "
                      "translate: a folder with train.SRC/train.TGT, a TSV file or two line-aligned files; "
                      "classify: a '<label> <text>' file or a CSV/TSV with a header; any task: synthetic:NAME")
    data.add_argument("--val-data", nargs="+", metavar="PATH",
                      help="validation data (translate, classify); default: val.* in the --data folder, else a "
                      "held-out --set val_fraction of the training data")
    data.add_argument("--src-lang", help="translate from a folder: source file suffix, e.g. de")
    data.add_argument("--tgt-lang", help="translate from a folder: target file suffix, e.g. en")
    data.add_argument("--tokenizer", help="char | bpe (trained on the training text) | a saved tokenizer directory "
                      "(default bpe)")
    data.add_argument("--vocab-size", type=int, help="BPE vocabulary size (default 2048)")
    data.add_argument("--seq-len", type=int, help="lm: context length; translate/classify: longest sequence kept "
                      "(default: the model's max_seq_len)")
    data.add_argument("--max-bytes", type=int, help="lm: read at most about this many bytes of text "
                      "(default: all of --data; 3 MB of the standard library)")
    data.add_argument("--encoding-errors", choices=["strict", "replace"],
                      help="strict: a file that is not UTF-8 is an error (default); replace: bad bytes become U+FFFD")
    run = p.add_argument_group("run directory")
    run.add_argument("--out", default="runs/default", help="run directory (default runs/default)")
    run.add_argument("--resume", nargs="?", const=True, default=False, metavar="PATH",
                     help="continue the run in --out, or the run or checkpoint at PATH (e.g. runs/x/best)")
    run.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    run.add_argument("--device", help="cpu, cuda or cuda:N (default: CUDA when available)")
    run.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                     help="log progress lines instead of drawing a progress bar")
    run.add_argument("--sample-tokens", type=int, default=200,
                     help="lm: tokens of sample text printed after training (0: none)")
    opt = p.add_argument_group("training (defaults from TrainConfig; on resume, the run's own)")
    opt.add_argument("--max-steps", type=int, help="optimizer steps; also the cosine schedule's length (default 1000)")
    opt.add_argument("--max-time", type=_duration, metavar="DURATION",
                     help="stop after this much training time, e.g. 300, 90s, 5m, 1h; the cosine schedule then "
                     "ends when either budget does")
    opt.add_argument("--batch-size", type=int, help="sequences per micro-batch (default 16)")
    opt.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    opt.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    opt.add_argument("--warmup", type=int, help="linear warmup steps (default 100)")
    opt.add_argument("--schedule", choices=["cosine", "noam", "constant"],
                     help="cosine: warmup then cosine decay to lr/10; noam: Vaswani et al.'s warmup then "
                     "1/sqrt(step); constant: warmup then flat (default cosine)")
    opt.add_argument("--weight-decay", type=float, help="AdamW decay of weight matrices; never of norms, biases or "
                     "embeddings (default 0.1)")
    opt.add_argument("--clip", type=float, help="max gradient norm, 0 disables (default 1.0)")
    opt.add_argument("--dtype", choices=["fp32", "bf16", "bf16-master"],
                     help="bf16: autocast on CPU or CUDA; bf16-master: a bf16 copy of the model computes, fp32 master "
                     "weights and AdamW state are updated and saved (default fp32)")
    opt.add_argument("--compile", action="store_true", default=None,
                     help="torch.compile each transformer block: faster on GPUs, a few percent on CPUs, and the "
                     "first steps wait for compilation")
    opt.add_argument("--eval-every", type=int, help="steps between evaluations and checkpoints (default 200)")
    opt.add_argument("--keep", type=int, help="checkpoints kept besides best/ (default 3)")
    opt.add_argument("--seed", type=int, help="seed of initialisation, data order and dropout (default 1337)")
    opt.add_argument("--logger", choices=["jsonl", "tensorboard"],
                     help="tensorboard: metrics also to RUN/tensorboard/ (pip install 'attnkit[tensorboard]')")
    opt.add_argument("--no-instruments", dest="instruments", action="store_false", default=None,
                     help="log no attention entropy, residual or gradient norms per layer at evaluations")
    p.set_defaults(func=_run_train)


_TRAIN_DATA_FLAGS = ("data", "val_data", "src_lang", "tgt_lang", "tokenizer", "vocab_size", "seq_len", "max_bytes",
                     "encoding_errors")
_TRAIN_FLAGS = ("max_steps", "max_time", "batch_size", "grad_accum", "lr", "warmup", "schedule", "weight_decay",
                "clip", "dtype", "compile", "eval_every", "keep", "seed", "logger",
                "instruments")


def _duration(text: str) -> float:
    """'300', '90s', '5m', '1.5h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    scale = units.get(text[-1:].lower(), 1)
    try:
        seconds = float(text[:-1] if text[-1:].lower() in units else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration; write e.g. 300, 90s, 5m or 1h") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be positive")
    return seconds


def _run_train(args: argparse.Namespace) -> int:
    from attnkit.generate import greedy_translate
    from attnkit.train import TrainRequest, prepare

    request = TrainRequest(
        out=args.out, task=args.task, preset=args.preset, config_file=args.config_file, overrides=args.overrides,
        data={k: getattr(args, k) for k in _TRAIN_DATA_FLAGS if getattr(args, k) is not None},
        settings={k: getattr(args, k) for k in _TRAIN_FLAGS if getattr(args, k) is not None},
        resume=args.resume, overwrite=args.overwrite, device=args.device, progress=args.progress,
    )
    trainer = prepare(request, translate=greedy_translate)
    result = trainer.fit()
    if result.signal is not None:
        return 128 + result.signal
    if not trainer.parallel.writes:  # under torchrun, rank 0 alone prints
        return 0
    summary = "  ".join(f"{k} {v:.4g}" for k, v in result.evaluation.items())
    speed = f"{result.tokens_per_second:,.0f} tokens/s"
    print(f"trained {result.step} steps in {result.elapsed:.0f} s ({speed}); validation: {summary}")
    from attnkit.viz import plot_run_instruments

    if plot_run_instruments(args.out) is not None:
        print(f"training instruments per layer: {args.out}/plots/instruments.png")
    if trainer.task.name == "lm" and args.sample_tokens > 0:
        from attnkit.generate import sample_after_training

        prompt = trainer.tokenizer.decode(trainer.task.prompt_ids())
        print("sample (prompt from the validation text, then the model's continuation):")
        print(sample_after_training(args.out, prompt=prompt, max_new_tokens=args.sample_tokens))
    print(f"saved to {args.out} (best checkpoint: {args.out}/best); resume with: attnkit train --out {args.out} "
          "--resume --max-steps N")
    return 0


_CONVERT_EPILOG = """\
examples:
  attnkit convert --from-hf path/to/gpt2 --out runs/gpt2       # then: attnkit generate --run runs/gpt2 --prompt ...
  attnkit convert --run runs/shakespeare --to-hf exported/      # transformers: AutoModel.from_pretrained("exported")

Reads GPT-2, Llama, BERT (BertModel, BertForSequenceClassification, BertForMaskedLM) and Marian directories
written by save_pretrained; nothing is downloaded.
"""


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert", help="convert Hugging Face model directories to attnkit runs and back",
        epilog=_CONVERT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", metavar="DIR", help="a Hugging Face model directory (config.json + safetensors)")
    source.add_argument("--run", metavar="RUN", help="an attnkit run directory to write out for Hugging Face")
    p.add_argument("--out", metavar="RUN", help="with --from-hf: the run directory to create (runs/NAME)")
    p.add_argument("--to-hf", metavar="DIR", help="with --run: the Hugging Face model directory to create")
    p.add_argument("--allow-pickle", action="store_true",
                   help="read pytorch_model.bin, a pickle (only from a source you trust), with "
                        "torch.load(weights_only=True)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="with --from-hf: the run's weight type (default fp32)")
    p.set_defaults(func=_run_convert)


def _run_convert(args: argparse.Namespace) -> int:
    from attnkit.errors import InputError
    from attnkit.generate.pipeline import parse_dtype
    from attnkit.interop import hf

    if args.from_hf:
        if not args.out or args.to_hf:
            raise InputError("--from-hf DIR writes a run: give --out runs/NAME (and no --to-hf)")
        loaded = hf.convert_from_hf(args.from_hf, args.out, allow_pickle=args.allow_pickle,
                                    dtype=parse_dtype(args.dtype))
        print(f"converted {loaded.architecture} from {args.from_hf} to {args.out}")
    else:
        if not args.to_hf or args.out:
            raise InputError("--run RUN writes a Hugging Face directory: give --to-hf DIR (and no --out)")
        architecture = hf.convert_to_hf(args.run, args.to_hf)
        print(f"wrote {args.run} as a {architecture} to {args.to_hf}")
    return 0


def _add_viz(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("viz", help="draw a run's attention over a text (PNGs and an HTML page) and its instruments")
    p.add_argument("--run", required=True, help="run directory: config.json, model.safetensors, tokenizer/")
    p.add_argument("--text", "--source", dest="text", help="the text (a translation run's source); none: only "
                   "the training instruments plot (plots/instruments.png)")
    p.add_argument("--target", help="translation runs: the target whose alignment with the source to draw")
    p.add_argument("--translate", action="store_true", help="translation runs: the model's own greedy translation")
    p.add_argument("--layers", type=int, nargs="+", help="layers to draw (default all)")
    p.add_argument("--heads", type=int, nargs="+", help="heads to draw (default all)")
    p.add_argument("--out", help="directory for the pictures and attention.html (default RUN/viz)")
    p.add_argument("--per-head", action=argparse.BooleanOptionalAction, default=True,
                   help="one PNG per layer and head besides the grid and each layer's mean (default on)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.set_defaults(func=_run_viz)


def _run_viz(args: argparse.Namespace) -> int:
    from attnkit.viz import VizSettings, run_viz

    result = run_viz(VizSettings(
        run=args.run, text=args.text, target=args.target, translate=args.translate,
        layers=tuple(args.layers) if args.layers else None, heads=tuple(args.heads) if args.heads else None,
        out=args.out, per_head=args.per_head, device=args.device,
    ))
    for path in [*result.pngs, result.page, result.instruments]:
        if path is not None:
            print(path)
    return 0


SUBCOMMANDS: list[SubcommandAdder] = [
    _add_presets, _add_tokenizer, _add_generate, _add_translate, _add_classify, _add_train, _add_convert, _add_viz,
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
