"""What every command that runs a trained model takes: how the run is loaded (`LoadSettings`; `DecodeSettings`
adds quantized weights and compilation, for models that decode) and the texts it reads (`InputSettings`, `read_inputs`,
`read_stdin`; `text_list`: the texts the Python API's methods take; `refuse_beside_beams`: the options beam search
does not take, refused alike by the command line and the API). A task's command (`attnkit.tasks.TaskCommand`)
builds its settings on these; `attnkit.options` turns their fields into its flags.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from attnkit.blocks import COMPILE_MODES
from attnkit.errors import InputError
from attnkit.options import one_flag
from attnkit.textfiles import EncodingErrors, decode_bytes, lines_of, read_lines

WeightDType = Literal["fp32", "bf16", "fp16"]  # what `--dtype` offers wherever weights are loaded or converted


@dataclass(frozen=True, kw_only=True)
class LoadSettings:
    """How a trained run is loaded (`attnkit.load`): what every command that runs a model takes. The command line
loads it (`attnkit.cli.load_pipeline`) and hands the pipeline to the task's command."""

    run: str  # run directory: config.json, model.safetensors, tokenizer/
    device: str | None = None  # cpu, cuda, cuda:1, ...; none: cuda when present, else cpu
    dtype: WeightDType | None = None  # the weights' type; none: as stored
    explain: bool = False  # print the inference plan (layouts, kernels, quantization, compilation) and why, on stderr
    verify: bool = False  # refuse a run whose files have no checksums (unverified) instead of warning

    def load_options(self) -> dict[str, Any]:
        """The keyword arguments of `attnkit.load` these settings stand for."""
        return {"device": self.device, "dtype": self.dtype, "verify": self.verify}


@dataclass(frozen=True, kw_only=True)
class DecodeSettings(LoadSettings):
    """Loading a model that decodes (generate, translate): also int8 weights and compilation, which make decoding
    faster."""

    int8: bool = False  # int8 weight-only linear layers (bf16 products): faster decoding, a little quality lost
    int8_dynamic: bool = False
    """int8 weights, and each product's input quantized to int8 as it runs (as llama.cpp's q8_0, at its quality;
    CPU, not with --compile): the fastest eager decoding of larger models"""
    int4: bool = False
    """4-bit weight-only linear layers in groups of 32 (bf16 products; CPU, AVX2 or AVX-512, else int8): a quarter of
    bf16's bytes, more quality lost (as llama.cpp's q4_0)"""
    compile: str | None = field(default=None, metadata={"const": "default", "choices": tuple(COMPILE_MODES)})
    """torch.compile the decoding step (decoders, fixed shapes) or each block: waits for compilation first, then
    decodes faster where overhead dominates (small models, bf16, --int8); bare --compile: default; max-autotune: a
    minute or more of kernel timing the first time, fastest for larger models"""

    def __post_init__(self) -> None:
        _ = self.quantize  # two forms given together are refused when the settings are built

    @property
    def quantize(self) -> str | None:
        """The `quantize` argument of `attnkit.load` the quantization flags stand for."""
        return one_flag("forms of quantized weights", int8=self.int8, int8_dynamic=self.int8_dynamic, int4=self.int4)

    def load_options(self) -> dict[str, Any]:
        return {**super().load_options(), "quantize": self.quantize, "compile": self.compile or False}


@dataclass(frozen=True, kw_only=True)
class InputSettings(LoadSettings):
    """A command that runs a model on texts: given one per --text, or a file's lines."""

    text: tuple[str, ...] = ()  # texts, one per value (repeatable); or --input
    input: str | None = None  # a UTF-8 file: one text per line ('-': standard input); or --text
    encoding_errors: EncodingErrors = "strict"  # --input: strict: not UTF-8 is an error; replace: bad bytes: U+FFFD
    batch_size: int = 32  # texts per forward pass


def read_inputs(settings: InputSettings) -> list[str]:
    """The texts of --text, or the lines of --input (a file, or standard input for '-'), read before the model
    loads."""
    if bool(settings.text) == (settings.input is not None):
        raise InputError("give the texts as --text TEXT... or as --input FILE (one per line; '-' reads standard "
                         "input), one of the two")
    if settings.text:
        return list(settings.text)
    if settings.input != "-":
        return read_lines(settings.input, errors=settings.encoding_errors)
    if sys.stdin is None or sys.stdin.closed:
        raise InputError("standard input is closed, so --input - has nothing to read: pipe the texts in "
                         "(... | attnkit COMMAND RUN --input -), or give --input FILE")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    text = decode_bytes(data, name="standard input", errors=settings.encoding_errors,
                        fix="convert it (iconv -t UTF-8), or pass --encoding-errors replace to substitute U+FFFD")
    if not text:
        raise InputError("standard input is empty: pipe the texts in, one per line")
    return lines_of(text)


def text_list(texts: object, *, what: str = "texts", required: bool = True, words: bool = False) -> list:
    """One text or a sequence of them, as a list: what a pipeline method (`generate`, `translate`, `classify`, `tag`)
    checks at its door. `required`: none at all is refused; `words`: an item may be a list of words (a tagger's text
    split already). Raises InputError naming what was given instead and what is taken."""
    taken = "a string or a list of strings" + (" (or of lists of words)" if words else "")
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, bytes | bytearray | Mapping) or not isinstance(texts, Iterable):
        raise InputError(f"{what} are {taken}; got {texts!r} ({type(texts).__name__})")
    items = list(texts)
    if required and not items:
        raise InputError(f"no {what} given: pass {taken}")
    for index, item in enumerate(items):
        split = words and isinstance(item, list | tuple) and all(isinstance(word, str) for word in item)
        if not isinstance(item, str) and not split:
            raise InputError(f"{what} are {taken}; item {index} is {item!r} ({type(item).__name__})")
    return items


def _set(value: Any) -> bool:
    return value is not None


# The options beam search does not take (the Python API's names; a flag is its name with dashes), each with the test
# of whether it was set: beam search ranks whole texts by their log-probabilities, so it neither samples nor
# streams, stops at strings or follows a constraint (it takes the repetition penalty and n-gram blocking, as
# transformers' beam search does, but not OpenAI's presence and frequency penalties, which transformers lacks)
NOT_BESIDE_BEAMS: dict[str, Callable[[Any], bool]] = {
    "temperature": lambda t: t not in (0, 1),  # 0 (greedy) and 1 leave the log-probabilities as they are
    "top_k": _set, "top_p": _set, "min_p": bool, "presence_penalty": bool, "frequency_penalty": bool,
    "logit_bias": bool, "num_samples": lambda n: n != 1, "stop": bool, "on_text": _set, "json": bool,
    "json_schema": _set, "regex": _set, "lark": _set, "grammar": _set,
}


def refuse_beside_beams(beams: str, options: Mapping[str, Any], *, flags: bool = False) -> None:
    """InputError naming the options of `options` ({name: value}, names of NOT_BESIDE_BEAMS; as flags with `flags`)
    that were set beside beam search (`beams`: "num_beams=4", "--num-beams 4"), in one line."""
    given = [name for name, value in options.items() if NOT_BESIDE_BEAMS[name](value)]
    if given:
        names = [f"--{name.replace('_', '-')}" for name in given] if flags else given
        raise InputError(f"{beams} (beam search) does not take {', '.join(names)}: it ranks whole texts by their "
                         "log-probabilities, deterministically, and gives them whole at the end; drop them, or use one "
                         "beam (sampling, greedy), which takes them")


def read_stdin(limit: int) -> str:
    """Standard input as UTF-8 text, at most `limit` bytes (an InputError naming the first bad byte, a closed
    standard input, or more than `limit` bytes, otherwise: never read without bound)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"--max-prompt-bytes {limit!r} must be a positive number of bytes")
    if sys.stdin is None or sys.stdin.closed:
        raise InputError("standard input is closed, so --prompt - has nothing to read: give the prompt as --prompt "
                         "TEXT, or pipe it in (... | attnkit generate RUN --prompt -)")
    if not hasattr(sys.stdin, "buffer"):  # already text (a StringIO standing in for it)
        return sys.stdin.read(limit)
    try:
        data = sys.stdin.buffer.read(limit + 1)
    except OSError as err:
        raise InputError(f"standard input cannot be read ({err.strerror or err}): give the prompt as --prompt "
                         "TEXT") from None
    if len(data) > limit:
        raise InputError(f"standard input holds more than {limit:,} bytes (--max-prompt-bytes): a prompt is read "
                         f"whole, so give a shorter one, or raise --max-prompt-bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"standard input is not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}): convert "
                         "it (iconv -t UTF-8), or give the prompt as --prompt TEXT") from None
