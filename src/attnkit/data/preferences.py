"""Preference pairs for Direct Preference Optimization and reward models: JSON Lines in TRL's layout, their tokens,
and their rows in batches.

One pair a line, a prompt and two responses to it, the preferred one first (TRL's preference data sets):

    {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}                       (plain text)
    {"prompt": [{"role": "user", "content": "Hi"}],                                          (conversational)
     "chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": [{"role": "assistant", "content": "Go."}]}

An optional "margin" (a number: how much more the chosen is preferred, Llama 2's margin from the raters' scale, as
TRL's RewardTrainer reads the column) is kept with the pair; the reward model's loss subtracts it, DPO reads none.
Plain text is read as text: the prompt's tokens, then the response's, then EOS. Chat messages are rendered with the
run's chat template (`tokenize_pair` does both; `preference_rows` fits the tokenized pairs to the model's window).
`PreferenceRows` serves the pairs in batches of two rows a pair, side by side: (B, 2, T), the chosen response's row at
[:, 0] and the rejected's at [:, 1], the response's tokens the only targets (prompt and padding -100). A batch's rows
split along B (a rank's share, a micro-batch) keep each pair whole.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.chat_format import ChatTemplate
from attnkit.data.batching import IGNORE_INDEX, BucketedData
from attnkit.data.chat import check_messages, json_record
from attnkit.data.lm import bos_first
from attnkit.errors import InputError
from attnkit.textfiles import EncodingErrors, read_text
from attnkit.tokenize import Tokenizer

log = logging.getLogger(__name__)

KEYS = ("prompt", "chosen", "rejected")
LAYOUT = ('{"prompt": "...", "chosen": "...", "rejected": "..."} (plain text), or each a list of chat messages '
          '({"role": ..., "content": ...}: the prompt\'s turns, and one assistant message for chosen and rejected)')


@dataclass(frozen=True)
class PreferencePair:
    """One line's pair: plain text (three strings) or chat messages (three lists), and where it was read."""

    where: str
    prompt: str | list[dict]
    chosen: str | list[dict]
    rejected: str | list[dict]
    margin: float = 0.0  # how much more the chosen is preferred (the line's "margin"; 0 where it gives none)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list)


def read_pairs(path: str | Path, *, encoding_errors: EncodingErrors = "strict") -> list[PreferencePair]:
    """The preference pairs of a JSON Lines file, one a line (blank lines skipped). Raises InputError naming the file
    and line of one that is not JSON, lacks a key, mixes text and messages, is in the other layout than the first
    line (plain text or messages), or whose two responses are the same."""
    found = []
    for number, line in enumerate(read_text(path, errors=encoding_errors).splitlines(), start=1):
        if line.strip():
            where = f"{path} line {number}"
            record = json_record(line, where, f"a preference file holds one JSON object a line, {LAYOUT}",
                                 whole_file=False)
            try:
                found.append(pair(record, where))
            except InputError as error:
                raise InputError(f"{where}: {error}") from None
            if found[-1].is_chat != found[0].is_chat:  # plain text is never rendered with the chat template
                kinds = ["chat messages" if p.is_chat else "plain text" for p in (found[-1], found[0])]
                raise InputError(f"{where} holds {kinds[0]} where {found[0].where} holds {kinds[1]}: a preference "
                                 "file holds one layout, since plain text is read as text and messages through the "
                                 "chat template; write every pair in one of them, or split the file by layout")
    if not found:
        raise InputError(f"{path} holds no preference pair: write one JSON object a line, {LAYOUT}")
    return found


def pair(record: object, where: str) -> PreferencePair:
    """One line's record as a pair. Raises InputError naming what is wrong and the layout to write."""
    if not isinstance(record, dict):
        raise InputError(f"holds a JSON {type(record).__name__}; write an object, {LAYOUT}")
    missing = [key for key in KEYS if key not in record]
    if missing == ["prompt"]:
        raise InputError('has no "prompt": write the shared prompt apart from the two responses (TRL\'s '
                         f'"implicit prompt" layout is not read), {LAYOUT}')
    if missing:
        raise InputError(f"has the keys {sorted(record)[:6]} but not {', '.join(missing)}: write {LAYOUT}")
    values = [record[key] for key in KEYS]
    if all(isinstance(v, str) for v in values):
        if not record["chosen"] or not record["rejected"]:
            raise InputError('"chosen" and "rejected" must be responses of one character or more')
        prompt, chosen, rejected = values
    elif all(isinstance(v, list) for v in values):
        prompt = check_messages(record["prompt"], "prompt")
        chosen, rejected = (_response(record[key], key) for key in ("chosen", "rejected"))
    else:
        kinds = ", ".join(f"{key}: {type(v).__name__}" for key, v in zip(KEYS, values, strict=True))
        raise InputError(f"mixes kinds ({kinds}): give all three as strings (plain text) or all three as lists of "
                         "chat messages")
    if chosen == rejected:
        raise InputError('"chosen" and "rejected" are the same response, so the pair prefers nothing: drop the line '
                         "or give two different responses")
    margin = record.get("margin", 0.0)
    # compared, not converted: an integer of 400 digits is no float, and NaN fails every comparison
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not abs(margin) <= sys.float_info.max:
        raise InputError(f'has "margin": {margin!r}; write a finite number (how much more the chosen is preferred, '
                         "e.g. 1 for slightly better, 3 for significantly better), or leave it out")
    return PreferencePair(where, prompt, chosen, rejected, float(margin))


def _response(value: object, key: str) -> list[dict]:
    """A conversational response: one assistant message."""
    messages = check_messages(value, key)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        raise InputError(f'"{key}" must hold one assistant message ([{{"role": "assistant", "content": ...}}]); '
                         f"got the roles {[m['role'] for m in messages]}")
    return messages


@dataclass(frozen=True)
class PreferenceBatch:
    """A batch of B pairs: input_ids and labels (B, 2, T), [:, 0] the chosen response's row and [:, 1] the
    rejected's, labels -100 but at the response's tokens. Pair i is [i]: any rows taken along B are whole pairs."""

    input_ids: Tensor
    labels: Tensor
    margins: Tensor  # (B,) float32: each pair's margin (`PreferencePair.margin`)

    def to(self, device: torch.device | str) -> PreferenceBatch:
        return PreferenceBatch(self.input_ids.to(device), self.labels.to(device), self.margins.to(device))


@dataclass(frozen=True)
class TokenizedPair:
    """A pair's token ids: the prompt's, and each response's (the tokens after the prompt, end of turn included)."""

    where: str
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    margin: float = 0.0


def response_row(prompt: Sequence[int], response: Sequence[int], width: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """The inputs and targets of prompt + response in a row of `width` positions: inputs the sequence but its last
    token, targets the next token at each position, -100 at the prompt's targets and the padding. (T,), (T,)"""
    ids = [*prompt, *response]
    inputs = torch.full((width,), pad_id, dtype=torch.int64)
    labels = torch.full((width,), IGNORE_INDEX, dtype=torch.int64)
    inputs[: len(ids) - 1] = torch.tensor(ids[:-1], dtype=torch.int64)
    # each response token is predicted at the position before it: the prompt's last, then the response's own
    labels[len(prompt) - 1 : len(ids) - 1] = torch.tensor(response, dtype=torch.int64)
    return inputs, labels


class PreferenceRows(BucketedData[PreferenceBatch]):
    """Tokenized pairs served as batches (`BucketedData`: pairs of similar length together), each as wide as its
    longest sequence less one (inputs drop the last token, targets the first)."""

    def __init__(self, pairs: list[TokenizedPair], *, pad_id: int, batch_size: int, seed: int = 0) -> None:
        lengths = [len(p.prompt) + max(len(p.chosen), len(p.rejected)) - 1 for p in pairs]
        super().__init__(lengths, batch_size=batch_size, seed=seed)
        self.pairs, self.pad_id = pairs, pad_id

    def collate(self, indices: Sequence[int]) -> PreferenceBatch:
        width = int(self.lengths[np.asarray(indices)].max())
        rows = [response_row(pair.prompt, response, width, self.pad_id)
                for pair in (self.pairs[i] for i in indices) for response in (pair.chosen, pair.rejected)]
        # (2B, T) -> (B, 2, T) each: a pair's chosen row, then its rejected
        inputs, labels = (torch.stack(column).view(len(indices), 2, width) for column in zip(*rows, strict=True))
        margins = torch.tensor([self.pairs[i].margin for i in indices], dtype=torch.float32)  # (B,)
        return PreferenceBatch(inputs, labels, margins)


def tokenize_pair(pair: PreferencePair, *, template: ChatTemplate, tokenizer: Tokenizer) -> TokenizedPair:
    """A pair's prompt and responses as tokens: plain text as text (BOS first where the tokenizer begins its texts
    with it, EOS after each response); messages as `template` renders the conversation (`conversation_ids`), each
    response the tokens it marks as the reply. Raises InputError naming the pair whose prompt is no token."""
    if pair.is_chat:
        (chosen, chosen_start), (rejected, rejected_start) = (
            _reply(template.conversation_ids(tokenizer, [*pair.prompt, *reply]))
            for reply in (pair.chosen, pair.rejected))
        if chosen[:chosen_start] != rejected[:rejected_start]:
            raise InputError(f"{pair.where}: the chat template renders the prompt otherwise before each response, so "
                             "the two do not answer one prompt; use a template that renders earlier turns alike")
        return TokenizedPair(pair.where, chosen[:chosen_start], chosen[chosen_start:], rejected[rejected_start:],
                             pair.margin)
    prompt, (chosen, rejected) = text_tokens(tokenizer, pair.prompt, [pair.chosen, pair.rejected], where=pair.where)
    return TokenizedPair(pair.where, prompt, chosen, rejected, pair.margin)


def text_tokens(tokenizer: Tokenizer, prompt: str, responses: Sequence[str], *,
                where: str) -> tuple[list[int], list[list[int]]]:
    """A plain-text prompt's tokens (BOS first where the tokenizer begins its texts with it) and each response's,
    EOS after each: how a preference pair's text is read, and how a reward model scores a reply. Raises InputError,
    naming `where`, for a prompt that is no token."""
    bos = [tokenizer.bos_id] if bos_first(tokenizer) else []
    eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    prompt_ids = bos + tokenizer.encode(prompt)
    if not prompt_ids:
        raise InputError(f"{where}: the prompt is no token; give a prompt the responses answer")
    return prompt_ids, [tokenizer.encode(response) + eos for response in responses]


def _reply(rendered: tuple[list[int], list[bool]]) -> tuple[list[int], int]:
    """A rendered conversation's ids and where its last reply starts (the last run of reply tokens, which ends it)."""
    ids, trained = rendered
    return ids, len(trained) - trained[::-1].index(False)


def preference_rows(pairs: list[PreferencePair], *, template: ChatTemplate, tokenizer: Tokenizer, seq_len: int,
                    batch_size: int, seed: int = 0, longer: str | None = "a longer --seq-len") -> PreferenceRows:
    """The pairs tokenized (`tokenize_pair`) and served in batches, each sequence cut to its first seq_len + 1
    tokens (the responses' ends cut, with one warning counting such pairs). Raises InputError naming a pair whose
    prompt leaves no room for a response token, or whose two responses are the same tokens (as read, or as cut);
    `longer`: how a longer window is asked for, in what is said."""
    tokenized, cut = [], []
    or_longer = f" or give {longer}" if longer else ""
    for pair in pairs:
        tokens = tokenize_pair(pair, template=template, tokenizer=tokenizer)
        room = seq_len + 1 - len(tokens.prompt)
        if room < 1:
            raise InputError(f"{pair.where}: its prompt holds {len(tokens.prompt)} tokens and the model reads "
                             f"{seq_len} at once, so no response token fits: shorten the prompt{or_longer}")
        was_cut = max(len(tokens.chosen), len(tokens.rejected)) > room
        if was_cut:
            cut.append(pair.where)
            tokens = TokenizedPair(pair.where, tokens.prompt, tokens.chosen[:room], tokens.rejected[:room],
                                   tokens.margin)
        if tokens.chosen == tokens.rejected:  # the texts differ (`pair`), their tokens do not: no preference to learn
            why = (f"in the {room} the model's window leaves after the prompt, so as cut the pair prefers nothing: "
                   f"shorten the prompt{or_longer}, or drop the line") if was_cut else (
                   "to this tokenizer (characters it does not know read alike), so the pair prefers nothing: drop the "
                   "line, or give responses that differ in what the tokenizer reads")
            raise InputError(f"{pair.where}: its two responses are the same {len(tokens.chosen)} tokens {why}")
        tokenized.append(tokens)
    if cut:
        log.warning("%d pair(s) hold more than %d tokens and their responses are cut to fit (%s%s)%s", len(cut),
                    seq_len + 1, cut[0], ", ..." if len(cut) > 1 else "", f"; give {longer}" if longer else "")
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0  # padding is never a target nor attended to
    return PreferenceRows(tokenized, pad_id=pad_id, batch_size=batch_size, seed=seed)
