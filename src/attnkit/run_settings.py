"""What every command that runs a trained model takes: how the run is loaded (`LoadSettings`; `DecodeSettings`
adds quantized weights and compilation, for models that decode) and the texts it reads (`InputSettings`, `read_inputs`,
`read_stdin`; `text_list`: the texts the Python API's methods take; beam search's settings, checked alike by the
command line, before its model loads, and the API: `beams_asked`, `check_search`, `check_beams_fit_context`, and
`refuse_beside_beams`, the options beam search does not take). A task's command (`attnkit.tasks.TaskCommand`)
builds its settings on these; `attnkit.options` turns their fields into its flags.
"""

from __future__ import annotations

import math
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


MAX_LENGTH_PENALTY = 100.0  # |length_penalty| past this makes length ** penalty overflow a float at long targets


def beams_asked(num_beams: object, num_return_sequences: object) -> bool:
    """Whether generation's settings ask for beam search: more than one beam, or more than one of its texts
    (`attnkit generate`'s flags and `Pipeline.generate`'s arguments alike). A bool asks too, so that `check_search`
    refuses it: True == 1 would otherwise pass for one beam and sample."""
    return any(isinstance(n, bool) or n != 1 for n in (num_beams, num_return_sequences))


def check_search(beam_size: int, length_penalty: float, *, vocab_size: int | None = None,
                 early_stopping: bool = True, num_return_sequences: int = 1, beam: str = "beam_size",
                 what: str = "source", flags: bool = False) -> None:
    """InputError for a beam size that is no positive integer or is wider than the vocabulary (`vocab_size`, when
    given: the first step proposes that many tokens, so wider beams start empty and only cost time), a length
    penalty that is not a finite number within +-MAX_LENGTH_PENALTY (nan, inf or 1e308 would make every score nan, 0
    or an overflow), an `early_stopping` that is not a bool (transformers' "never" would read as True), or a
    `num_return_sequences` that is no integer from 1 to the beam size (a search keeps that many hypotheses). `beam`:
    the beam size's name (`generate` calls it num_beams, as transformers does); `what`: what the search continues
    ("source": a translation's, "prompt": a decoder's); `flags`: the settings named as the command line's flags
    (`--num-beams 0`), checked before the model loads."""
    def named(name: str, value: object) -> str:
        return f"--{name.replace('_', '-')} {value}" if flags else f"{name}={value!r}"

    beam_name = f"--{beam.replace('_', '-')}" if flags else beam
    if not isinstance(early_stopping, bool):
        raise InputError(f"{named('early_stopping', early_stopping)} must be True or False (True: a {what} ends with "
                         f"{beam_name} finished hypotheses; False: while a live beam could still win)")
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise InputError(f"{named(beam, beam_size)} must be a positive integer (1 is greedy)")
    n = num_return_sequences
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= beam_size:
        samples = (f"; for {n} sampled texts of the prompt, give {named('num_samples', n)} instead"
                   if what == "prompt" and beam_size == 1 and isinstance(n, int) and n > 1 else "")
        raise InputError(f"{named('num_return_sequences', n)} must be an integer from 1 to {named(beam, beam_size)} "
                         f"(a search keeps {beam_name} hypotheses): give a smaller number or a wider beam{samples}")
    if vocab_size is not None and beam_size > vocab_size:
        vocabulary = "target vocabulary" if what == "source" else "vocabulary"
        raise InputError(f"{beam_name}={beam_size:,} is wider than the {vocabulary} ({vocab_size:,} tokens): give "
                         f"at most {vocab_size:,} (4 to 10 is usual)")
    if (isinstance(length_penalty, bool) or not isinstance(length_penalty, int | float)
            or not math.isfinite(length_penalty) or abs(length_penalty) > MAX_LENGTH_PENALTY):
        raise InputError(f"{named('length_penalty', length_penalty)} must be a finite number between "
                         f"-{MAX_LENGTH_PENALTY:g} and {MAX_LENGTH_PENALTY:g} (1: scores per token; 0: summed log "
                         "probabilities)")


def check_beams_fit_context(longest_prompt: int, max_new_tokens: int, context_len: int, *,
                            flags: bool = False) -> None:
    """InputError where the longest prompt (its length in tokens) and `max_new_tokens` outgrow the model's context
    (`context_len`, its max_seq_len): beam search keeps each hypothesis' whole text in the cache, and its window does
    not slide. `flags`: named as the command line's flag (--max-new-tokens)."""
    room = context_len + 1 - longest_prompt  # the most new tokens: the last is chosen, never fed
    if max_new_tokens > room:
        name = f"--max-new-tokens {max_new_tokens}" if flags else f"max_new_tokens={max_new_tokens}"
        fix = (f"shorten the prompt to {context_len} tokens or fewer" if room < 1  # no count of new tokens fits
               else f"give --max-new-tokens {room} or fewer, or shorten the prompt" if flags
               else f"give max_new_tokens <= {room}, or shorten the prompt")
        raise InputError(f"beam search keeps each hypothesis' whole text, but the longest prompt (length "
                         f"{longest_prompt}) and {name} outgrow the model's context of {context_len} (max_seq_len): "
                         f"{fix}")


MAX_DRAFT_TOKENS = 64  # past it, a draft that agrees that long would be the model worth running
DRAFT_TOKENS = 4  # the tokens a draft proposes a round where none are asked for (--draft-tokens, draft_tokens=)


def check_draft_tokens(draft_tokens: object, *, flags: bool = False) -> int:
    """The number of tokens a draft proposes a round: an integer from 1 to MAX_DRAFT_TOKENS. Raises InputError naming
    the value (as the flag --draft-tokens with `flags`) and the fix."""
    name = f"--draft-tokens {draft_tokens}" if flags else f"draft_tokens={draft_tokens!r}"
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise InputError(f"{name} must be an integer from 1 to {MAX_DRAFT_TOKENS} (the tokens the draft proposes a "
                         "round; 2 to 6 is usual)")
    return draft_tokens


def draft_tokens_flag(draft: str | None, draft_tokens: int | None) -> int:
    """The --draft-tokens a command decodes with (DRAFT_TOKENS where not given). Raises InputError where it is given
    without --draft (nothing would read it) or is out of range (`check_draft_tokens`)."""
    if draft is None and draft_tokens is not None:
        raise InputError(f"--draft-tokens {draft_tokens} is what a draft proposes a round: give --draft RUN too (a "
                         "smaller decoder run with the same tokenizer), or leave --draft-tokens out")
    return check_draft_tokens(DRAFT_TOKENS if draft_tokens is None else draft_tokens, flags=True)


def check_draft_fits_context(longest_prompt: int, max_new_tokens: int, context_len: int, *,
                             flags: bool = False) -> None:
    """InputError where the longest prompt (in tokens) and `max_new_tokens` outgrow `context_len` (the smaller
    max_seq_len of target and draft): speculative decoding keeps the whole text in both caches
    (`generate/speculative.py`)."""
    room = context_len + 1 - longest_prompt  # the most new tokens: the last is chosen, never fed
    if max_new_tokens > room:
        name = f"--max-new-tokens {max_new_tokens}" if flags else f"max_new_tokens={max_new_tokens}"
        raise InputError(f"speculative decoding keeps the whole text in both models' caches, but the longest prompt "
                         f"(length {longest_prompt}) and {name} outgrow the context of {context_len} (the smaller "
                         f"max_seq_len of the two): give at most {max(room, 0)} new tokens, or shorten the prompt")


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
# The options of NOT_BESIDE_BEAMS that beam sampling takes (do_sample beside num_beams, transformers' beam sample)
SAMPLED_BEAMS_TAKE = frozenset({"temperature", "top_k", "top_p", "min_p"})
# The options of NOT_BESIDE_BEAMS that one side alone takes; every other name is both a field of attnkit generate's
# settings and an argument of Pipeline.generate, each looked up strictly, so that a name renamed on either side without
# the table is an error, not an option let through beside beams
API_ONLY_BESIDE_BEAMS = frozenset({"logit_bias", "on_text", "lark"})  # attnkit generate's --grammar FILE is its lark=
CLI_ONLY_BESIDE_BEAMS = frozenset({"json"})  # JSON mode: the API's json_schema={"type": "object"}


def refuse_beside_beams(beams: str, options: Mapping[str, Any], *, flags: bool = False) -> None:
    """InputError naming the options of `options` ({name: value}, names of NOT_BESIDE_BEAMS; as flags with `flags`)
    that were set beside beam search (`beams`: "num_beams=4", "--num-beams 4"), in one line."""
    refuse_beside(f"{beams} (beam search)", NOT_BESIDE_BEAMS, options, flags=flags, why=(
        "it ranks whole texts by their log-probabilities, deterministically, and gives them whole at the end; drop "
        "them, or use one beam (sampling, greedy), which takes them"))


# The options speculative decoding (a draft model, `generate/speculative.py`) does not take: beam search has no one
# text to draft for; the penalties and n-gram blocking read the text so far, and a grammar its matcher's state, which
# change from one drafted position to the next within a round
NOT_BESIDE_DRAFT: dict[str, Callable[[Any], bool]] = {
    "num_beams": lambda n: n != 1, "num_return_sequences": lambda n: n != 1,
    "repetition_penalty": lambda r: r != 1.0, "presence_penalty": bool, "frequency_penalty": bool,
    "no_repeat_ngram_size": bool, "json": bool, "json_schema": _set, "regex": _set, "lark": _set, "grammar": _set,
}
API_ONLY_BESIDE_DRAFT = frozenset({"lark"})  # as beside beams: attnkit generate's --grammar FILE is its lark=
CLI_ONLY_BESIDE_DRAFT = frozenset({"json"})


def refuse_beside_draft(options: Mapping[str, Any], *, flags: bool = False) -> None:
    """InputError naming the options of `options` ({name: value}, names of NOT_BESIDE_DRAFT; as flags with `flags`)
    that were set beside a draft model, in one line."""
    refuse_beside("--draft (speculative decoding)" if flags else "draft= (speculative decoding)", NOT_BESIDE_DRAFT,
                  options, flags=flags, why=(
                      "the draft proposes one text's next tokens and the target keeps what it would choose itself, "
                      "with no beams, penalties or grammar between them; drop them, or generate without a draft"))


def refuse_beside(what: str, table: Mapping[str, Callable[[Any], bool]], options: Mapping[str, Any], *, flags: bool,
                  why: str) -> None:
    """InputError naming the options of `options` that `table`'s tests find set beside `what`, and `why`."""
    given = [name for name, value in options.items() if table[name](value)]
    if given:
        names = [f"--{name.replace('_', '-')}" for name in given] if flags else given
        raise InputError(f"{what} does not take {', '.join(names)}: {why}")


def check_prompt_bytes(limit: object) -> None:
    """InputError unless `limit` (--max-prompt-bytes) is a positive whole number of bytes."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"--max-prompt-bytes {limit!r} must be a positive number of bytes")


def read_stdin(limit: int) -> str:
    """Standard input as UTF-8 text, at most `limit` bytes (an InputError naming the first bad byte, a closed
    standard input, or more than `limit` bytes, otherwise: never read without bound)."""
    check_prompt_bytes(limit)
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
