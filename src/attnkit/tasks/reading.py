"""How a model reads one text: the stack that reads it, how that stack learned to lay a text out, and the ids put
around the text so it reads it so, as a run's task.json says (`frame_of`: attnkit's framing, or a converted model's
tokenizer's own). `attnkit inspect` (its probes included), `attnkit viz` and the explorer of `attnkit serve` all
frame a text here.

    layout    model                                         before        text    after
    marked    an encoder, a tagger (decoder or encoder)     `frame_ids`: attnkit's CLS/BOS and SEP/EOS, or
                                                            with frame "own" its tokenizer's own (a converted tagger's)
    source    an encoder-decoder's encoder                  -             text    EOS
    stream    a language model (windows of a token stream)  BOS where its training stream put one first
                                                            (`data.lm.bos_first`: a converted Llama), else nothing
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from torch import nn

from attnkit.data.labelled import frame_ids
from attnkit.data.lm import bos_first
from attnkit.errors import CheckpointError, InputError
from attnkit.models.stack import TransformerStack
from attnkit.tasks.registry import CONVERTED
from attnkit.tokenize import Tokenizer, require_id

Frame = Literal["attnkit", "own"]
FRAME = "frame"  # the task.json key: attnkit's framing (`frame_ids`) or its tokenizer's own (a converted tagger's)


def reading_stack(model: nn.Module) -> TransformerStack:
    """The stack that reads a text: an encoder-decoder's encoder, else the model's one stack. Raises InputError for a
    model without a Transformer stack (a recurrent one), naming the models that have one."""
    stack = getattr(model, "encoder", None) or getattr(model, "stack", None)
    if not isinstance(stack, TransformerStack):
        raise InputError(f"this reads a Transformer stack's states, and {type(model).__name__} has none: give a "
                         "decoder, an encoder or an encoder-decoder run (its encoder's states are read)")
    return stack


def text_layout(model: nn.Module) -> str:
    """How the reading stack learned to read a text: "marked", between a start and an end mark as `align` lays it
    out (an encoder's windows, CLS ... SEP; a tagger's words); "source", the text and EOS (an encoder-decoder's
    encoder, Transformer or recurrent); "stream", the text alone (a language model's windows of a token stream, a
    recurrent language model's included)."""
    if getattr(model, "encoder", None) is not None:
        return "source"
    if hasattr(model, "lm_head") and not isinstance(getattr(model, "stack", None), TransformerStack):
        return "stream"
    return "stream" if reading_stack(model).causal and hasattr(model, "lm_head") else "marked"


def text_frame(model: nn.Module, tokenizer: Tokenizer, frame: Frame = "attnkit") -> tuple[list[int], list[int]]:
    """(before, after): the ids around a text as the reading stack learned to read it (`text_layout`; module
    docstring). `frame`: a run's `frame_of`, "own" for a converted tagger. Raises InputError naming a missing
    token."""
    layout = text_layout(model)
    if layout == "marked":
        return frame_ids(tokenizer, own=frame == "own")
    if layout == "source":
        return [], [require_id(tokenizer, "eos")]
    return ([tokenizer.bos_id] if bos_first(tokenizer) else []), []


def frame_of(record: Mapping[str, Any], where: str | Path) -> Frame:
    """How a run frames its text, as its task.json (`record`, read from `where`) says (a tagger's and a masked LM's
    record it; `text_frame` takes it for every run): "own" (its tokenizer's own framing) for a model converted from
    Hugging Face (`task_record`'s CONVERTED: GPT2ForTokenClassification learned its texts with nothing added,
    BertForTokenClassification with CLS and SEP), "attnkit" (`frame_ids`) for any other that does not say. Raises
    CheckpointError for a value that is neither."""
    found = record.get(FRAME, "own" if record.get(CONVERTED) else "attnkit")
    if found not in get_args(Frame):
        raise CheckpointError(f"{where} has {FRAME}={found!r}, which is none of {', '.join(get_args(Frame))}: the file "
                              "is damaged; put back the run's own one")
    return found
