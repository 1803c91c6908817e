r"""A reward model (`reward`): the first half of RLHF as Llama 2 trains it (Touvron et al. 2023, sec. 3.2.2; Ouyang et
al. 2022, sec. 3.5), as TRL's RewardTrainer runs it: a decoder whose next-token head is replaced by a scalar one,
trained on preference pairs to score the chosen response above the rejected.

    data     preference pairs in TRL's layout, read and batched as DPO reads them (`attnkit.data.preferences`):
             (B, 2, T), the chosen row at [:, 0], the rejected at [:, 1]; an optional "margin" per pair
    reward   r(x, y): the scalar head (`DecoderSequenceClassifier`, one output) at the last token of prompt + response
             + EOS (the whole sequence, as TRL appends EOS), dropout off (TRL's disable_dropout)
    loss     the binary ranking loss (Llama 2's eq. 1, with its margin m(r) from the raters' scale; InstructGPT's eq. 1
             without it):
                 L = -log sigmoid(r(x, y_chosen) - r(x, y_rejected) - m)
             and, with `center_rewards` c > 0 (TRL's center_rewards_coefficient, Eisenstein et al. 2023), plus
                 c * mean((r(x, y_chosen) + r(x, y_rejected))^2), which keeps the rewards centred on 0
    metrics  as TRL logs them: accuracy (the share of pairs whose chosen scores higher), margin (the mean of r_chosen -
             r_rejected), mean_reward; every step, and on the held-out pairs at each evaluation with val_loss

A run starts from a decoder (`--init-from` an lm, chat or dpo run, or a converted Llama or GPT-2): its body is copied,
the head starts fresh. It serves `reward` (`attnkit.load(run).reward(prompts, replies)`, a `Reward` each), which
best-of-N sampling reads (`attnkit.generate.best_of_n`). PPO, the other half of RLHF, is not implemented.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.chat_format import chat_template
from attnkit.checkpoint import TOKENIZER_DIR
from attnkit.data import IGNORE_INDEX
from attnkit.data.batching import pad
from attnkit.data.chat import check_messages, is_chat
from attnkit.data.preferences import PreferenceBatch, PreferenceRows, preference_rows, read_pairs, text_tokens
from attnkit.errors import ConfigError, InputError
from attnkit.models.modes import evaluating
from attnkit.run_settings import text_list
from attnkit.tasks.common import ONE_PROCESS, EpochTask, Shard, device_of
from attnkit.tasks.dpo import preference_split
from attnkit.tasks.lm import LM
from attnkit.tasks.registry import EvalContext, TaskContext, TaskSpec, register
from attnkit.tasks.report import EvalReport

log = logging.getLogger(__name__)

METRICS = ("accuracy", "margin", "mean_reward")  # TRL's RewardTrainer's names
LAYOUT = "pairs"  # task.json's key: whether the run learnt from "chat" pairs (messages) or "text" ones


@dataclass(frozen=True)
class RewardOptions:
    """What reward-model training alone reads (`TaskSpec.own_options`)."""

    center_rewards: float = 0.0
    """c * mean((r_chosen + r_rejected)^2) added to the loss, which keeps the rewards centred on 0 (TRL's
    center_rewards_coefficient; 0.01 is usual); 0: off"""

    def __post_init__(self) -> None:
        if not 0.0 <= self.center_rewards < float("inf"):
            raise ConfigError(f"center_rewards={self.center_rewards} must be a finite number >= 0 (0.01 is usual, 0 "
                              "is off)")


def ranking_loss(chosen: Tensor, rejected: Tensor, *, margins: Tensor | None = None,
                 center_rewards: float = 0.0) -> Tensor:
    """The mean binary ranking loss of pairs' rewards (module docstring), (B,) each -> a 0-dim tensor."""
    difference = chosen - rejected if margins is None else chosen - rejected - margins  # (B,)
    loss = -F.logsigmoid(difference).mean()
    if center_rewards:
        loss = loss + center_rewards * ((chosen + rejected) ** 2).mean()
    return loss


def reward_stats(chosen: Tensor, rejected: Tensor) -> dict[str, Tensor]:
    """TRL's metrics of pairs' rewards (B,) each, 0-dim tensors left on the device."""
    return dict(zip(METRICS, ((chosen > rejected).float().mean(), (chosen - rejected).mean(),
                              torch.cat([chosen, rejected]).mean()), strict=True))


def whole_sequences(batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
    """A preference batch's rows as whole sequences, prompt + response + its last token (the EOS or end of turn the
    rows' inputs leave out, as they feed next-token targets), and their attention masks. (B, 2, T) -> (2B, T + 1)
    ids, (2B, T + 1) bool masks, the chosen row of pair i at 2i, its rejected at 2i + 1."""
    inputs, labels = batch.input_ids.flatten(0, 1), batch.labels.flatten(0, 1)  # (2B, T)
    width = labels.shape[1]
    targets = labels != IGNORE_INDEX  # the response's tokens, each predicted at the position before it
    last = width - 1 - targets.flip(1).int().argmax(dim=1)  # (2B,) where the response's last token is predicted
    ids = torch.cat([inputs, inputs[:, -1:]], dim=1)  # (2B, T + 1); the column added is filler, after every mask
    rows = torch.arange(len(ids), device=ids.device)
    ids[rows, last + 1] = labels[rows, last]
    mask = torch.arange(width + 1, device=ids.device) <= (last + 1)[:, None]  # (2B, T + 1)
    return ids, mask


def batch_rewards(model: nn.Module, batch: PreferenceBatch) -> Tensor:
    """The rewards of a batch's pairs under `model`, in one forward over the 2B rows, dropout off. (B, 2, T) ->
    (B, 2): [:, 0] the chosen's, [:, 1] the rejected's."""
    ids, mask = whole_sequences(batch.to(device_of(model)))
    with evaluating(model):
        return model(ids, attention_mask=mask).logits.squeeze(-1).float().view(-1, 2)  # (2B, 1) -> (B, 2)


@torch.no_grad()
def reward_scores(model: nn.Module, data: PreferenceRows, options: RewardOptions) -> dict[str, float]:
    """The loss and TRL's metrics (`reward_stats`) over every pair of `data`."""
    batches = list(data.eval_batches())  # collated once: their rewards and their margins
    rewards = torch.cat([batch_rewards(model, batch) for batch in batches])  # (N, 2)
    margins = torch.cat([batch.margins for batch in batches]).to(rewards.device)  # (N,)
    chosen, rejected = rewards.unbind(1)
    loss = ranking_loss(chosen, rejected, margins=margins, center_rewards=options.center_rewards)
    return {"val_loss": loss.item(), **{name: value.item() for name, value in reward_stats(chosen, rejected).items()}}


class RewardTask(EpochTask):
    """Reward-model training: the ranking loss on a batch of pairs, epoch after epoch; the best checkpoint the one of
    the lowest loss on the held-out pairs."""

    name = "reward"
    metric = "val_loss"
    higher_is_better = False

    def __init__(self, train: PreferenceRows, val: PreferenceRows, *, options: RewardOptions,
                 layout: str = "text") -> None:
        super().__init__(train)
        self.val, self.options = val, options
        self.record = {LAYOUT: layout}  # saved in task.json: `reward` warns when asked to score the other layout

    def loss(self, model: nn.Module, batch: PreferenceBatch) -> Tensor:
        return self.loss_and_metrics(model, batch)[0]

    def loss_and_metrics(self, model: nn.Module, batch: PreferenceBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The batch's mean loss and TRL's metrics from the same forward (logged with the loss at every step)."""
        chosen, rejected = batch_rewards(model, batch).unbind(1)  # (B,) each, with gradients
        loss = ranking_loss(chosen, rejected, margins=batch.margins.to(chosen.device),
                            center_rewards=self.options.center_rewards)
        return loss, reward_stats(chosen.detach(), rejected.detach())

    def weight(self, batch: PreferenceBatch) -> int:
        return len(batch.input_ids)  # (B, 2, T): the loss is a mean over the B pairs

    def n_tokens(self, batch: PreferenceBatch) -> int:
        return int(batch.input_ids.numel())

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, Any]:
        """Every rank scores every held-out pair (they are few), so the ranks agree without a sum."""
        return reward_scores(model, self.val, self.options)


@dataclass(frozen=True)
class Reward:
    """One text's reward (`reward`); `truncated`: the text held more tokens than the model's window, and its reward
    was read at the last token of its first max_seq_len (as `Classification.truncated` says for a classifier)."""

    reward: float
    truncated: bool = False


def rows_of_pairs(pairs: list, *, template: Any, tokenizer: Any, seq_len: int, batch_size: int, seed: int = 0,
                  longer: str | None = "a longer --seq-len") -> PreferenceRows:
    """`preference_rows` for a model that reads whole sequences (`whole_sequences` adds each row's last token back):
    each cut to `seq_len` tokens, one fewer than the rows DPO's next-token targets read."""
    return preference_rows(pairs, template=template, tokenizer=tokenizer, seq_len=seq_len - 1, batch_size=batch_size,
                           seed=seed, longer=longer)


def _make(context: TaskContext) -> tuple[RewardTask, None]:
    if context.record is None:
        _needs_init_from(context.data, context.seed)
    if context.seq_len < 2:
        raise ConfigError(f"--seq-len {context.seq_len} leaves no room for a prompt and a response; give 2 or more")
    train, val = preference_split(context.data, context.seed, task="reward")
    rows = dict(template=context.chat_template, tokenizer=context.tokenizer, seq_len=context.seq_len,
                batch_size=context.batch_size, seed=context.seed)
    return RewardTask(rows_of_pairs(train, **rows), rows_of_pairs(val, **rows), options=context.data.options,
                      layout="chat" if train[0].is_chat else "text"), None


def _needs_init_from(data: Any, seed: int) -> NoReturn:
    """A reward model starts from a trained decoder (its body reads the text; the head is new)."""
    raise ConfigError("--task reward puts a reward head on a trained decoder: give --init-from RUN_DIR (an lm, chat "
                      "or dpo run, or a Hugging Face decoder directory)")


def _report(ctx: EvalContext) -> EvalReport:
    """Each file's ranking loss and TRL's metrics, its pairs rendered by the run's chat template."""
    template = chat_template(ctx.run / TOKENIZER_DIR, ctx.tokenizer.specials)
    options = ctx.options if ctx.options is not None else RewardOptions()
    rows = []
    for path in ctx.files:
        data = rows_of_pairs(read_pairs(path, encoding_errors=ctx.settings.encoding_errors), template=template,
                             tokenizer=ctx.tokenizer, seq_len=ctx.config.max_seq_len,
                             batch_size=ctx.settings.batch_size, longer=None)
        rows.append({"file": str(path), "pairs": len(data), **reward_scores(ctx.model, data, options)})
    return EvalReport("reward", str(ctx.run), rows, {"center_rewards": options.center_rewards},
                      columns=("file", "pairs", "val_loss", *METRICS))


@torch.inference_mode()
def reward(pipeline: Any, texts: str | Sequence[str], replies: str | Sequence[str] | None = None, *,
           batch_size: int = 16) -> list[Reward]:
    """The reward of each reply to its prompt, `texts` the prompts (one given once applies to every reply); without
    `replies`, of each text whole (`attnkit serve`'s POST /v1/reward). A prompt is plain text, read as the pairs'
    text is (`text_tokens`: the prompt's tokens, the reply's, EOS), or a chat, a list of messages, its reply the
    assistant's turn after them, rendered by the run's chat template as chat pairs are (`conversation_ids`). A
    sequence longer than the model's window is scored on its first max_seq_len tokens and its `Reward` says
    `truncated` (with a warning logged). Raises InputError for no text, as many prompts as replies wanted otherwise,
    a prompt neither text nor a chat, an empty prompt or text, or messages not laid out as a chat's."""
    one = isinstance(texts, str) or is_chat(texts)
    if not one and (not isinstance(texts, list | tuple) or not texts):
        raise InputError(f"reward() reads a text, a chat, or a non-empty list of them; got {texts!r:.60}")
    if replies is None:
        pieces = [(text, None) for text in ([texts] if one else texts)]
    else:
        replies = text_list(replies, what="replies")
        prompts = [texts] * len(replies) if one else list(texts)
        if len(prompts) != len(replies):
            raise InputError(f"reward() scores each reply to its prompt: give one prompt (a string or a chat) or one "
                             f"per reply; got {len(prompts)} prompts for {len(replies)} replies")
        pieces = list(zip(prompts, replies, strict=True))
    learnt, asked = pipeline.record.get(LAYOUT), {"chat" if is_chat(prompt) else "text" for prompt, _ in pieces}
    if learnt in ("chat", "text") and asked - {learnt}:
        log.warning("this reward model learnt from %s pairs and is asked to score %s, whose rewards it never learnt: "
                    "give %s", learnt, "plain text" if learnt == "chat" else "chats",
                    "chats (lists of messages; attnkit generate --chat)" if learnt == "chat" else "plain text")
    window, sequences = pipeline.config.max_seq_len, []
    for index, (prompt, reply) in enumerate(pieces):
        if is_chat(prompt):
            turn = [] if reply is None else [{"role": "assistant", "content": reply}]
            messages = [*check_messages(prompt, f"text {index}"), *turn]
            sequences.append(pipeline.chat_template.conversation_ids(pipeline.tokenizer, messages)[0])
            continue
        if not isinstance(prompt, str):
            raise InputError(f"text {index} is a {type(prompt).__name__}: give plain text (a string) or a chat (a "
                             'list of {"role": ..., "content": ...} messages)')
        if reply is None and not prompt:
            raise InputError(f"text {index} is empty: give a text to score, its prompt and reply together")
        prompt_ids, (reply_ids,) = text_tokens(pipeline.tokenizer, prompt, ["" if reply is None else reply],
                                               where=f"text {index}")
        sequences.append([*prompt_ids, *reply_ids])
    cut = sum(len(ids) > window for ids in sequences)
    if cut:
        log.warning("%d text(s) hold more than the model's %d tokens (a prompt with its reply) and are scored on "
                    "their first %d (each result says truncated): shorten them to score them whole", cut, window,
                    window)
    found = []
    for start in range(0, len(sequences), batch_size):
        chunk = [ids[:window] for ids in sequences[start:start + batch_size]]
        ids, mask = pad(chunk, pipeline.pad_id, device=pipeline.device)  # (B, T) each, right-padded
        found += pipeline.model(ids, attention_mask=mask).logits[:, 0].float().tolist()  # (B, 1) -> B rewards
    return [Reward(score, len(ids) > window) for score, ids in zip(found, sequences, strict=True)]


REWARD = register(TaskSpec(
    name="reward", help="a reward model (RLHF's first half): score the chosen responses above the rejected (decoder)",
    families=("decoder",), seed_draws_validation="without_val_data", head={"decoder_head": "reward", "n_classes": 1},
    make=_make, evaluate_files=_report, method="reward", pipeline=reward, training_text=_needs_init_from,
    options=("val_data", "val_fraction", "encoding_errors"), own_options=RewardOptions,
    default_model={**LM.default_model, "decoder_head": "reward", "n_classes": 1},  # for the record: a run starts from
    # --init-from, the model it reads
    eval_help='JSON Lines preference pairs ({"prompt", "chosen", "rejected"}): ranking loss and pairwise accuracy',
    eval_options=("batch_size",),
))
