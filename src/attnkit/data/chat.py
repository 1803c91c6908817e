"""Conversations for chat fine-tuning: JSON Lines read in the layouts the field uses, and their rows in batches.

One conversation a line (or a JSON file holding a list of them), in any of four layouts (TRL's conversational and
prompt-completion data sets, Alpaca's, and ShareGPT's as axolotl and LLaMA-Factory read it):

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, {"role": "assistant", ...}]}
    {"prompt": "...", "completion": "..."}          (each may also be a list of messages, as TRL takes them)
    {"instruction": "...", "input": "...", "output": "..."}   (input may be empty or absent)
    {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}   (from: system, human
                                                    or gpt, also user or assistant; a "system" key beside them is
                                                    a system turn first where the turns begin with none, and null
                                                    is none, as LLaMA-Factory reads it; LLaMA-Factory's
                                                    function_call and observation turns are an assistant's tool
                                                    calls and a tool's result, and its "tools", a JSON string
                                                    of the functions offered, rendered before the turns)

A turn may carry axolotl's `"weight": 0` or `1`: an assistant's turn of weight 0 is read (its tokens stay in the
prompt of the turns after it) but not learnt; weight 1 is the default, and is refused on a turn that is not the
assistant's, since chat fine-tuning learns the assistant's turns alone.

Each becomes a list of messages; `ChatTemplate.conversation_ids` (attnkit.chat_format) renders and tokenizes it, the
assistant's tokens marked, and `ChatRows` lays the conversations in rows (`pack_rows`: one per row, padded at the
end, or packed with a document mask) and serves them in batches, an epoch's order a function of seed and epoch.
A row padded at its end needs no mask: a decoder's causal attention never looks ahead at the padding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.data.batching import IGNORE_INDEX, BucketedData
from attnkit.data.packing import PackedBatch, PackedRows
from attnkit.errors import InputError
from attnkit.textfiles import EncodingErrors, read_text

ROLES = ("system", "developer", "user", "assistant", "tool")
LAYOUTS = ('{"messages": [{"role": ..., "content": ...}, ...]}', '{"prompt": ..., "completion": ...}',
           '{"instruction": ..., "input": ..., "output": ...}', '{"conversations": [{"from": ..., "value": ...}, ...]}')
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "function_call": "assistant", "observation": "tool"}  # the last two LLaMA-Factory's tool turns


@dataclass(frozen=True)
class Conversation:
    """One line's messages, and where it was read (`FILE line N`, named in what is said about it)."""

    where: str
    messages: list[dict]
    tools: tuple[dict, ...] = ()  # the functions offered ({"type": "function", "function": {...}}), where any


def read_conversations(path: str | Path, *, encoding_errors: EncodingErrors = "strict") -> list[Conversation]:
    """The conversations of a JSON Lines file, one a line (blank lines skipped), or of a JSON file holding a list of
    them (Alpaca's alpaca_data.json). Raises InputError naming the file and line (or item) of one that is not JSON,
    in none of the layouts, or holds no reply."""
    text = read_text(path, errors=encoding_errors)
    if text.lstrip().startswith("["):
        return _listed(path, text)
    found = _read((f"{path} line {number}",
                   json_record(line, f"{path} line {number}", "a chat file holds one JSON object a line",
                               whole_file=False))
                  for number, line in enumerate(text.splitlines(), start=1) if line.strip())
    if not found:
        raise InputError(f"{path} holds no conversation: write one JSON object a line, {' or '.join(LAYOUTS)}")
    return found


def _listed(path: str | Path, text: str) -> list[Conversation]:
    """The conversations of a JSON file that holds a list of records."""
    records = json_record(text, str(path), "give a JSON list of conversations, or JSON Lines, one a line",
                          whole_file=True)
    found = _read((f"{path} item {number}", record) for number, record in enumerate(records, start=1))
    if not found:
        raise InputError(f"{path} holds an empty list: give conversations, {' or '.join(LAYOUTS)}")
    return found


def _read(records: Iterable[tuple[str, object]]) -> list[Conversation]:
    """The conversation of each (source, record), read one after another; InputError naming the first bad source."""
    found = []
    for source, record in records:
        try:
            found.append(Conversation(source, conversation(record), offered_tools(record)))
        except InputError as error:
            raise InputError(f"{source}: {error}") from None
    return found


def json_record(text: str, source: str, fix: str, *, whole_file: bool) -> object:
    """The value of JSON `text`; InputError naming `source`, why Python's reader refused it (where, for a text that
    is not JSON: the line too in a `whole_file`; nesting too deep; a number too long to read) and `fix`."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        if isinstance(error, json.JSONDecodeError):
            why = f"{error.msg} at " + (f"line {error.lineno}, " if whole_file else "") + f"column {error.colno}"
        else:
            why = "nested too deeply" if isinstance(error, RecursionError) else "a number too long to read"
        raise InputError(f"{source} is not JSON ({why}): {fix}") from None


def conversation(record: object) -> list[dict]:
    """One line's record as messages ({"role", "content"}, an assistant's `tool_calls` kept). Raises InputError
    naming what is wrong."""
    if not isinstance(record, dict):
        raise InputError(f"holds a JSON {type(record).__name__}; write an object, {' or '.join(LAYOUTS)}")
    if "messages" in record:
        messages = check_messages(record["messages"], "messages")
    elif "prompt" in record and "completion" in record:
        messages = [*_turns(record["prompt"], "prompt", "user"), *_turns(record["completion"], "completion",
                                                                          "assistant")]
    elif "instruction" in record and "output" in record:
        asked = "\n\n".join(part for part in (_text(record, "instruction"), _text(record, "input")) if part)
        messages = [{"role": "user", "content": asked}, {"role": "assistant", "content": _text(record, "output")}]
    elif "conversations" in record:
        messages = _sharegpt_turns(record["conversations"])
        system = _text(record, "system") if record.get("system") is not None else ""  # null: none (a data set's gap)
        if system and messages[0]["role"] != "system":  # a system turn of the conversation's own is read instead
            messages.insert(0, {"role": "system", "content": system})
    else:
        raise InputError(f"has the keys {sorted(record)[:6]}, none of the layouts: {' or '.join(LAYOUTS)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise InputError("holds no assistant turn: chat fine-tuning learns the assistant's replies; add one")
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise InputError('gives each assistant turn "weight": 0, so nothing is learnt from it: give a reply weight 1 '
                         "(or leave its weight out), or leave the conversation out")
    return messages


def offered_tools(record: dict) -> tuple[dict, ...]:
    """The functions a record offers: its "tools", a list (OpenAI's messages layout) or a JSON string of one
    (LLaMA-Factory's ShareGPT layout), each `{"type": "function", "function": {...}}` or a bare function
    (`{"name": ..., "parameters": ...}`, LLaMA-Factory's, wrapped so). InputError for anything else."""
    tools = record.get("tools") or ()
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except (ValueError, RecursionError):
            tools = None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
        raise InputError(f'"tools" must be a list of functions (or LLaMA-Factory\'s JSON string of one), each '
                         f'{{"name": ..., "parameters": {{...}}}}; got {record["tools"]!r:.60}')
    wrapped = tuple(t if "function" in t else {"type": "function", "function": t} for t in tools)
    if not all(isinstance(t["function"], dict) and isinstance(t["function"].get("name"), str) for t in wrapped):
        raise InputError(f'"tools" holds a function without a string "name"; got {record["tools"]!r:.60}')
    return wrapped


def _turns(value: object, key: str, role: str) -> list[dict]:
    """A prompt's or completion's turns: a string is one turn of `role`, a list its messages."""
    return [{"role": role, "content": value}] if isinstance(value, str) else check_messages(value, key)


def is_chat(value: object) -> bool:
    """Whether `value` is one chat (a non-empty list of message objects), not a text or a list of texts."""
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(m, dict) for m in value)


def check_messages(value: object, key: str) -> list[dict]:
    """`value` as a list of messages, each an object with a role among `ROLES` and a string content (null only beside
    an assistant's tool_calls); InputError naming `key` and the message that is not."""
    if not isinstance(value, list) or not value:
        raise InputError(f'"{key}" must be a list of messages ({{"role": ..., "content": ...}}), not {value!r:.60}')
    messages = []
    for index, message in enumerate(value):
        where = f'"{key}"[{index}]'
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InputError(f"{where} must be an object with a role among {', '.join(ROLES)}; got {message!r:.60}")
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            raise InputError(f"{where}'s content must be a string (null only beside tool_calls); got {content!r:.60}")
        check_weight(message, where)
        messages.append(message)
    return messages


def check_weight(message: dict, where: str) -> None:
    """InputError naming `where` for axolotl's per-turn `weight` other than 0 or 1, or 1 on a turn that is not the
    assistant's (which chat fine-tuning never learns)."""
    if "weight" not in message:
        return
    weight = message["weight"]
    if isinstance(weight, bool) or weight not in (0, 1):
        raise InputError(f'{where}\'s "weight" must be 0 (not learnt) or 1 (learnt); got {weight!r:.60}')
    if weight and message["role"] != "assistant":
        raise InputError(f'{where} is a {message["role"]} turn of "weight": 1, but chat fine-tuning learns the '
                         'assistant\'s turns alone: give it weight 0 or leave its weight out')


def _sharegpt_turns(value: object) -> list[dict]:
    """ShareGPT's turns ({"from": "human" | "gpt" | "system", "value": ...}) as messages; InputError naming the turn
    that is not one."""
    if not isinstance(value, list) or not value:
        raise InputError(f'"conversations" must be a list of turns ({{"from": "human", "value": ...}}), not '
                         f"{value!r:.60}")
    messages = []
    for index, turn in enumerate(value):
        said = turn.get("from") if isinstance(turn, dict) else None
        if not isinstance(said, str) or said not in SHAREGPT_ROLES or not isinstance(turn.get("value"), str):
            raise InputError(f'"conversations"[{index}] must be an object with "from" among '
                             f'{", ".join(SHAREGPT_ROLES)} and a string "value"; got {turn!r:.60}')
        where = f'"conversations"[{index}]'
        message = ({"role": "assistant", "content": None, "tool_calls": _function_calls(turn["value"], where)}
                   if said == "function_call" else {"role": SHAREGPT_ROLES[said], "content": turn["value"]})
        if "weight" in turn:
            message["weight"] = turn["weight"]
        check_weight(message, where)
        messages.append(message)
    return messages


def _function_calls(value: str, where: str) -> list[dict]:
    """A LLaMA-Factory function_call turn's JSON (`{"name": ..., "arguments": {...}}`, or a list of them) as an
    assistant's `tool_calls`, as LLaMA-Factory's templates read it; InputError naming `where` for any other value."""
    try:
        calls = json.loads(value)
    except (ValueError, RecursionError):
        calls = None
    calls = calls if isinstance(calls, list) else [calls]
    if not calls or not all(isinstance(c, dict) and isinstance(c.get("name"), str) and "arguments" in c
                            for c in calls):
        raise InputError(f'{where} is a function_call whose "value" must be JSON of a call, {{"name": ..., '
                         f'"arguments": {{...}}}}, or a list of them, as LLaMA-Factory reads it; got {value!r:.60}')
    return [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]


def _text(record: dict, key: str) -> str:
    value = record.get(key, "")
    if not isinstance(value, str):
        raise InputError(f'"{key}" must be a string; got {value!r:.60}')
    return value


def filled(documents: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The positions each row's conversations fill, padding left out: (R, T) document ids and labels -> (R,). A row's
    padding is its last document when none of that document's labels is learnt (every conversation has a reply
    token in its window: `conversation_rows` refuses one that has none)."""
    last = documents[:, -1:]  # (R, 1)
    in_last = documents == last  # (R, T)
    padded = ~((labels != IGNORE_INDEX) & in_last).any(dim=1)  # (R,)
    return torch.where(padded, (~in_last).sum(dim=1), torch.full_like(padded, documents.shape[1], dtype=torch.int64))


class ChatRows(BucketedData[PackedBatch]):
    """Rows of conversations (`pack_rows` with the assistant's tokens as the only targets) served as batches: each
    batch as wide as its longest row, rows of similar length together (`BucketedData`)."""

    def __init__(self, rows: PackedRows, *, batch_size: int, seed: int = 0, batch_tokens: int | None = None) -> None:
        lengths = filled(torch.from_numpy(rows.documents), torch.from_numpy(rows.labels)).numpy()  # (R,)
        super().__init__(lengths, batch_size=batch_size, seed=seed, batch_tokens=batch_tokens)
        self.rows = rows

    def collate(self, indices: Sequence[int]) -> PackedBatch:
        width = int(self.lengths[np.asarray(indices)].max())
        batch = self.rows.batch(np.asarray(indices))
        return PackedBatch(*(t[:, :width] for t in (batch.input_ids, batch.labels, batch.document_ids,
                                                     batch.position_ids)))  # (B, T) each
