"""Chat (instruction) fine-tuning (`chat`: a decoder learns an assistant's replies), as torchtune's and litgpt's
instruction tuning and TRL's SFTTrainer with `assistant_only_loss` do it.

    data         JSON Lines conversations (`attnkit.data.chat`: messages, prompt/completion, Alpaca's or ShareGPT's
                 layout)
    rendered     with the chat template the run's model chats in (its tokenizer's, else the default format), the
                 one `attnkit serve` renders chats with (`ChatTemplate.conversation_ids`)
    loss         next-token cross-entropy on the assistant's tokens alone; the prompts' labels are -100
    batches      one conversation a row, padded at its end (causal attention never sees the padding), or several a
                 row with a document mask (--pack-conversations; `data/packing.py`); a conversation longer than the
                 window is cut to its first seq_len + 1 tokens
    evaluation   loss and perplexity on the validation conversations' replies (training and `attnkit eval`, which
                 leaves out a conversation whose first reply lies past the window with --skip-long, as training does)

A run starts from a decoder's weights (`--init-from` a run, a converted Llama or GPT-2) or from scratch, and serves
`generate` and the chat API as an lm run does; `attnkit chat RUN` holds a multi-turn chat with it
(`attnkit.tasks.chat_session`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from attnkit.chat_format import ChatTemplate, chat_template
from attnkit.checkpoint import TOKENIZER_DIR
from attnkit.data import IGNORE_INDEX
from attnkit.data.chat import ChatRows, Conversation, filled, read_conversations
from attnkit.data.packing import PackedBatch, pack_rows
from attnkit.errors import InputError
from attnkit.tasks.chat_session import ChatSettings, run_chat
from attnkit.tasks.common import ONE_PROCESS, EpochTask, Shard, device_of, rows_of, split, summed_nll, take_rows
from attnkit.tasks.lm import LM
from attnkit.tasks.registry import EvalContext, TaskCommand, TaskContext, TaskSpec, register
from attnkit.tasks.report import EvalReport
from attnkit.tokenize import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatOptions:
    """What chat fine-tuning alone reads (`TaskSpec.own_options`)."""

    pack_conversations: Literal["off", "on"] = field(default="off", metadata={"const": "on"})
    """on (bare --pack-conversations): several conversations a row, each attending within itself (a document mask),
    instead of one a row padded at its end: fewer padding positions where conversations are short"""
    skip_long: Literal["off", "on"] = field(default="off", metadata={"const": "on"})
    """on (bare --skip-long): leave out, with one warning counting them, the conversations whose first reply starts
    past the window (--seq-len), as TRL and torchtune drop them, instead of refusing the run"""


LONGER_SEQ_LEN = "a longer --seq-len (at most the model's max_seq_len)"  # how training reads more of a conversation


def conversation_rows(conversations: list[Conversation], *, template: ChatTemplate, tokenizer: Tokenizer,
                      seq_len: int, packed: bool, batch_size: int, seed: int = 0, batch_tokens: int | None = None,
                      skip_long: bool = False, longer: str | None = LONGER_SEQ_LEN) -> ChatRows:
    """The conversations rendered and tokenized (`conversation_ids`), cut to their first seq_len + 1 tokens, in
    rows of seq_len positions. Raises InputError naming a conversation that fails to render, or whose window holds
    no reply token (nothing of it would be learnt or scored), unless `skip_long`: such conversations are then left
    out, counted in one warning (InputError where none is left). `longer`: how a longer window is asked for, in what
    is said (None where it cannot be: `attnkit eval` reads the model's whole window)."""
    ids: list[int] = []
    trained: list[bool] = []
    cut, cut_off, skipped = [], [], []
    for conversation in conversations:
        try:
            tokens, replies = template.conversation_ids(tokenizer, conversation.messages, conversation.tools)
        except InputError as error:
            raise InputError(f"{conversation.where}: {error}") from None
        start = len(ids)
        stop = start + min(len(tokens), seq_len + 1)
        if not any(replies[1 : stop - start]):
            if skip_long:
                skipped.append(conversation.where)
                continue
            raise InputError(f"{conversation.where}: its first reply starts past the first {seq_len} tokens the "
                             "model reads at once, so it would read none of its replies: shorten the conversation's "
                             f"prompt, {f'give {longer}, or' if longer else 'or give'} --skip-long to leave such "
                             "conversations out")
        if len(tokens) > seq_len + 1:
            cut_off.append(conversation.where)
        ids += tokens
        trained += replies
        cut.append((start, stop))
    if skipped and not cut:
        raise InputError(f"every conversation's first reply starts past the first {seq_len} tokens ({skipped[0]}"
                         f"{', ...' if len(skipped) > 1 else ''}): none is left to read; give "
                         f"{f'{longer} or ' if longer else ''}shorter prompts")
    if skipped:
        log.warning("%d conversation(s) left out (--skip-long): their first reply starts past the first %d tokens "
                    "(%s%s)", len(skipped), seq_len, skipped[0], ", ..." if len(skipped) > 1 else "")
    if cut_off:
        log.warning("%d conversation(s) hold more than %d tokens and are cut to their first %d (%s%s)%s", len(cut_off),
                    seq_len + 1, seq_len + 1, cut_off[0], ", ..." if len(cut_off) > 1 else "",
                    f"; give {longer} to learn the rest" if longer else "")
    pieces = np.array(cut, dtype=np.int64).reshape(-1, 2)  # (P, 2) start, stop
    rows = pack_rows(np.asarray(ids, dtype=np.int64), pieces, seq_len, packed=packed,
                     trained=np.asarray(trained, dtype=bool))
    return ChatRows(rows, batch_size=batch_size, seed=seed, batch_tokens=batch_tokens)


def _forward(model: nn.Module, batch: PackedBatch, packed: bool, **kwargs: Any) -> Any:
    """The model on a batch: packed rows with their positions and documents; padded rows as they are."""
    device = device_of(model)
    layout = dict(position_ids=batch.position_ids.to(device), document_ids=batch.document_ids.to(device)) if (
        packed) else {}
    return model(batch.input_ids.to(device), **layout, **kwargs)


@torch.inference_mode()
def reply_scores(model: nn.Module, data: ChatRows, *, packed: bool, shard: Shard = ONE_PROCESS) -> dict[str, float]:
    """Loss and perplexity over the reply tokens of every conversation of `data`; `shard`: this rank's rows of each
    batch (`rows_of`), the sums added up over the ranks."""
    total, count, first = 0.0, 0, 0  # first: the index of the batch's first row
    for whole in data.eval_batches():
        rows, counts = rows_of(shard, len(whole.labels), first)
        first += len(whole.labels)
        batch = take_rows(whole, rows)
        logits = _forward(model, batch, packed).logits  # (B, T, V)
        if counts:
            total += summed_nll(logits, batch.labels)
            count += int((batch.labels != IGNORE_INDEX).sum())
    total, count = shard.sum(total, count)
    return {"val_loss": total / count, "val_ppl": math.exp(min(total / count, 50.0))}


class ChatTask(EpochTask):
    """Chat fine-tuning: the loss on the replies' tokens, epoch after epoch over the conversations."""

    name = "chat"
    metric = "val_loss"
    higher_is_better = False

    def __init__(self, train: ChatRows, val: ChatRows, *, packed: bool, stops: tuple[str, ...] = (),
                 stop_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(train)
        self.val = val
        self.packed = packed  # the training plan's attention choice reads it: a document mask in every batch
        self.stops = stops  # where a reply ends in the run's template, beside EOS (the sample after training)
        self.stop_ids = stop_ids  # the template's end of turn, where a token (`ChatTemplate.turn_end_ids`)

    def loss(self, model: nn.Module, batch: PackedBatch) -> Tensor:
        return _forward(model, batch, self.packed, labels=batch.labels.to(device_of(model)), return_logits=False).loss

    def weight(self, batch: PackedBatch) -> int:
        return int((batch.labels != IGNORE_INDEX).sum())

    def n_tokens(self, batch: PackedBatch) -> int:
        """The conversations' tokens (padding not counted), so tokens/s compares padded and packed rows."""
        return int(filled(batch.document_ids, batch.labels).sum())

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, float]:
        return reply_scores(model, self.val, packed=self.packed, shard=shard)

    def prompt_ids(self) -> list[int]:
        """The first validation conversation up to its first reply, as its template renders it with its special
        tokens (`ChatTemplate.prompt_ids`, as `attnkit serve` and `attnkit generate --chat` read a chat): a prompt for
        a sample of a reply (`attnkit train` shows one at the end, as for lm)."""
        first = int(np.flatnonzero(self.val.rows.labels[0] != IGNORE_INDEX)[0])  # the position that predicts it
        return self.val.rows.input_ids[0, : first + 1].tolist()


def _conversations(data: Any, seed: int) -> tuple[list[Conversation], list[Conversation]]:
    """The training and validation conversations the data settings name (without --val-data: `val_fraction` of
    the training files' held out)."""
    if not data.data:
        raise InputError("--task chat needs --data FILE.jsonl: conversations, one JSON object a line")
    read = [c for path in data.data for c in read_conversations(path, encoding_errors=data.encoding_errors)]
    if data.val_data:
        return read, [c for path in data.val_data for c in read_conversations(
            path, encoding_errors=data.encoding_errors)]
    if len(read) < 2:
        raise InputError(f"{data.data[0]} holds one conversation: give two or more (one is held out to validate), "
                         "or --val-data FILE")
    return split(read, data.val_fraction, seed)


def _make(context: TaskContext) -> tuple[ChatTask, None]:
    train, val = _conversations(context.data, context.seed)
    packed = context.data.options.pack_conversations == "on"
    rows = dict(template=context.chat_template, tokenizer=context.tokenizer, seq_len=context.seq_len, packed=packed,
                batch_size=context.batch_size, seed=context.seed,
                skip_long=context.data.options.skip_long == "on")
    return ChatTask(conversation_rows(train, batch_tokens=context.data.batch_tokens, **rows),
                    conversation_rows(val, **rows), packed=packed, stops=context.chat_template.stops,
                    stop_ids=context.chat_template.turn_end_ids(context.tokenizer)), None


def _training_text(data: Any, seed: int) -> list[str]:
    """What a new tokenizer learns: the training conversations in the default format (a new model has no other)."""
    return [ChatTemplate().render(c.messages, add_generation_prompt=False) for c in _conversations(data, seed)[0]]


def _report(ctx: EvalContext) -> EvalReport:
    """Each file's reply loss and perplexity, its conversations rendered by the run's chat template, one a row
    (`conversations`: those scored); with --skip-long (given, else the run's own setting), the conversations whose
    first reply starts past the model's window are left out (`left_out`, and one warning) instead of refused."""
    template = chat_template(ctx.run / TOKENIZER_DIR, ctx.tokenizer.specials)
    skip_long = ctx.options is not None and ctx.options.skip_long == "on"
    rows = []
    for path in ctx.files:
        conversations = read_conversations(path, encoding_errors=ctx.settings.encoding_errors)
        data = conversation_rows(conversations, template=template, tokenizer=ctx.tokenizer,
                                 seq_len=ctx.config.max_seq_len, packed=False, batch_size=ctx.settings.batch_size,
                                 skip_long=skip_long, longer=None)
        scored = len(data.rows.input_ids)  # one conversation a row (not packed)
        rows.append({"file": str(path), "conversations": scored, "left_out": len(conversations) - scored,
                     "reply_tokens": data.rows.real_tokens, **reply_scores(ctx.model, data, packed=False)})
    return EvalReport("chat", str(ctx.run), rows, {"template": "the run's own" if template.source else "default"},
                      columns=("file", "conversations", "left_out", "reply_tokens", "val_loss", "val_ppl"))


CHAT = register(TaskSpec(
    name="chat", help="chat fine-tuning: the loss on the assistant's replies (decoder)", families=("decoder",),
    seed_draws_validation="without_val_data", head={"decoder_head": "lm"}, make=_make, evaluate_files=_report,
    method="generate", training_text=_training_text,
    options=("val_data", "val_fraction", "batch_tokens", "encoding_errors"), own_options=ChatOptions,
    default_model=LM.default_model,  # lm's: a chat model is a language model that learns replies
    eval_help="JSON Lines conversations: loss and perplexity on the assistant's replies",
    eval_options=("batch_size",),
    command=TaskCommand("chat", "chat with a decoder run, turn after turn: your turns from standard input, its "
                        "replies streamed in its chat template (/reset, /exit)", ChatSettings, run_chat),
))
