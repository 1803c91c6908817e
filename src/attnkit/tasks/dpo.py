r"""Direct Preference Optimization (`dpo`: Rafailov et al. 2023, "Direct Preference Optimization: Your Language
Model is Secretly a Reward Model"): learning from human preferences, the lectures' "other stuff" after fine-tuning,
without a reward model and without reinforcement learning, as TRL's DPOTrainer, torchtune and litgpt run it.

    data       preference pairs, JSON Lines in TRL's layout (`attnkit.data.preferences`): a prompt, the chosen and the
               rejected response; plain text, or chat messages rendered with the run's chat template
    log-probs  log pi(y | x) summed over the response's tokens alone (the prompt's and the padding's left out), for
               the policy (the model that trains) and the reference (the frozen model it started from: with LoRA the
               same model with its adapters off, as TRL does, so no second copy; else the --init-from weights)
    loss       with the implicit reward r(x, y) = beta * (log pi(y | x) - log pi_ref(y | x)) (the paper's eq. 5),

                   L = -log sigmoid(r(x, y_chosen) - r(x, y_rejected))                       (eq. 7, "sigmoid")

               cDPO's label smoothing e (the pair's label flipped with probability e; Mitchell 2023):
                   L = -(1 - e) log sigmoid(z) - e log sigmoid(-z),   z = r_chosen - r_rejected
               IPO (Azar et al. 2023, eq. 17), its log-ratios averaged over the response's tokens as TRL's:
                   L = ((log-ratio_chosen / n_chosen - log-ratio_rejected / n_rejected) - 1 / (2 beta))^2
    metrics    as TRL logs them: rewards/chosen, rewards/rejected (the mean implicit rewards), rewards/accuracies (the
               share of pairs whose chosen reward is the higher), rewards/margins; at every step with the training
               loss (from the same forward), and with val_loss on the held-out pairs at each evaluation

A run starts from a decoder (`--init-from` an lm or chat run, a converted Llama or GPT-2), and serves `generate` and
the chat API as the run it started from did.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.chat_format import chat_template
from attnkit.checkpoint import TOKENIZER_DIR
from attnkit.data import IGNORE_INDEX
from attnkit.data.preferences import PreferenceBatch, PreferencePair, PreferenceRows, preference_rows, read_pairs
from attnkit.errors import ConfigError, InputError
from attnkit.layers.lora import adapters_off
from attnkit.models.modes import evaluating
from attnkit.tasks.common import ONE_PROCESS, EpochTask, Shard, device_of, split
from attnkit.tasks.lm import LM
from attnkit.tasks.registry import EvalContext, TaskContext, TaskSpec, register
from attnkit.tasks.report import EvalReport

LossType = Literal["sigmoid", "ipo"]
REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")


@dataclass(frozen=True)
class DPOOptions:
    """What preference training alone reads (`TaskSpec.own_options`)."""

    beta: float = 0.1  # how far the model may move from the reference: the implicit reward's scale (0.1 to 0.5 usual)
    loss_type: LossType = "sigmoid"  # sigmoid: DPO's loss; ipo: IPO's squared loss (Azar et al. 2023)
    smoothing: float = 0.0
    """cDPO's label smoothing: the share of pairs taken as mislabelled, in [0, 0.5) (TRL's label_smoothing; sigmoid
    loss only)"""

    def __post_init__(self) -> None:
        if not 0 < self.beta < math.inf:
            raise ConfigError(f"beta={self.beta} must be a finite number above 0 (0.1 is usual): it scales the "
                              "implicit reward")
        if not 0.0 <= self.smoothing < 0.5:
            raise ConfigError(f"smoothing={self.smoothing} must lie in [0, 0.5): the share of pairs taken as "
                              "mislabelled (0: plain DPO)")
        if self.smoothing and self.loss_type != "sigmoid":
            raise ConfigError(f"smoothing applies to the sigmoid loss; drop it, or use loss_type=sigmoid (not "
                              f"{self.loss_type})")


def response_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """log p(response | prompt): each row's target log-probabilities summed over the targets that are not -100 (the
    response's). (N, T, V), (N, T) -> (N,) float32"""
    nll = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                          reduction="none")  # (N*T,): 0 at ignored targets
    return -nll.view(labels.shape).sum(dim=1)


@dataclass(frozen=True)
class PreferenceLoss:
    """Each pair's loss and implicit rewards beta * (log pi - log pi_ref) (detached), (B,) each."""

    losses: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor


def preference_loss(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor,
                    reference_rejected: Tensor, *, beta: float, loss_type: LossType = "sigmoid", smoothing: float = 0.0,
                    chosen_tokens: Tensor | None = None, rejected_tokens: Tensor | None = None) -> PreferenceLoss:
    """DPO's loss (module docstring) from summed response log-probs, (B,) each. `chosen_tokens`, `rejected_tokens`:
    the responses' token counts (B,), which IPO averages over. Raises ConfigError for IPO without them."""
    chosen_ratio = policy_chosen - reference_chosen  # (B,) log pi / pi_ref of the chosen response
    rejected_ratio = policy_rejected - reference_rejected
    if loss_type == "sigmoid":
        z = beta * (chosen_ratio - rejected_ratio)
        losses = -F.logsigmoid(z) * (1 - smoothing) - F.logsigmoid(-z) * smoothing
    elif chosen_tokens is None or rejected_tokens is None:
        raise ConfigError("the ipo loss averages over the responses' tokens: give chosen_tokens and rejected_tokens")
    else:
        delta = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    return PreferenceLoss(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def reward_tensors(scores: PreferenceLoss) -> dict[str, Tensor]:
    """TRL's reward metrics over a set of pairs, 0-dim tensors left on the device (the trainer reads them with the
    loss): the mean chosen and rejected rewards, the share of pairs whose chosen reward is the higher, the mean
    margin."""
    margins = scores.chosen_rewards - scores.rejected_rewards  # (B,)
    return dict(zip(REWARDS, (scores.chosen_rewards.mean(), scores.rejected_rewards.mean(),
                              (margins > 0).float().mean(), margins.mean()), strict=True))


def reward_metrics(scores: PreferenceLoss) -> dict[str, float]:
    """`reward_tensors` read as numbers."""
    return {name: value.item() for name, value in reward_tensors(scores).items()}


def batch_logprobs(model: nn.Module, batch: PreferenceBatch) -> Tensor:
    """The summed response log-probs of a batch's pairs under `model`, in one forward over the 2B rows (as TRL's
    `concatenated_forward`), with dropout off (as the paper's code and TRL's `disable_dropout`: the log-ratio of a
    policy still equal to its reference is 0, not noise). (B, 2, T) -> (B, 2): [:, 0] the chosen's, [:, 1] the
    rejected's."""
    device = device_of(model)
    ids, labels = batch.input_ids.to(device).flatten(0, 1), batch.labels.to(device).flatten(0, 1)  # (2B, T)
    with evaluating(model):
        return response_logprobs(model(ids).logits, labels).view(-1, 2)  # (2B,) -> (B, 2)


class Reference:
    """The frozen model DPO measures the policy against: the policy itself with its LoRA adapters off (no second
    copy), else the starting weights, which `load` builds once, on first use (`TaskContext.reference`)."""

    def __init__(self, load: Callable[[], nn.Module] | None) -> None:
        self.load = load
        self.model: nn.Module | None = None

    @torch.no_grad()
    def logprobs(self, policy: nn.Module, batch: PreferenceBatch) -> Tensor:
        """The reference's summed response log-probs of `batch`'s pairs (B, 2). Raises ConfigError where the policy
        has no adapters and no starting weights were given."""
        with adapters_off(policy) as adapted:
            if adapted:
                return batch_logprobs(policy, batch)
        if self.model is None:
            if self.load is None:
                raise ConfigError("--task dpo trains a model against the weights it starts from: give --init-from "
                                  "RUN_DIR (an lm or chat run, or a Hugging Face decoder directory)")
            self.model = self.load().to(device_of(policy)).eval().requires_grad_(False)
        return batch_logprobs(self.model, batch)


def reference_logprobs(model: nn.Module, reference: Reference, data: PreferenceRows) -> list[Tensor]:
    """The reference's summed response log-probs of each of `data`'s evaluation batches, in their fixed order, (B, 2)
    each: the reference is frozen, so these serve every evaluation of the same pairs."""
    return [reference.logprobs(model, batch) for batch in data.eval_batches()]


@torch.no_grad()
def preference_scores(model: nn.Module, references: list[Tensor], data: PreferenceRows,
                      options: DPOOptions) -> dict[str, float]:
    """The loss and TRL's reward metrics (`reward_metrics`) over every pair of `data`, against the reference's
    log-probs of its evaluation batches (`reference_logprobs`)."""
    scores = [pair_scores(batch_logprobs(model, batch), reference, batch, options)
              for batch, reference in zip(data.eval_batches(), references, strict=True)]
    joined = PreferenceLoss(*(torch.cat([getattr(s, f) for s in scores]) for f in ("losses", "chosen_rewards",
                                                                                  "rejected_rewards")))
    return {"val_loss": joined.losses.mean().item(), **reward_metrics(joined)}


def pair_scores(policy: Tensor, reference: Tensor, batch: PreferenceBatch, options: DPOOptions) -> PreferenceLoss:
    """`preference_loss` of a batch from its pairs' summed log-probs (B, 2) under the policy and the reference."""
    tokens = (batch.labels != IGNORE_INDEX).sum(dim=-1).to(policy.device)  # (B, 2, T) -> (B, 2) response tokens
    (policy_chosen, policy_rejected), (reference_chosen, reference_rejected) = policy.unbind(1), reference.unbind(1)
    chosen_tokens, rejected_tokens = tokens.unbind(1)  # (B,) each
    return preference_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta=options.beta,
                           loss_type=options.loss_type, smoothing=options.smoothing, chosen_tokens=chosen_tokens,
                           rejected_tokens=rejected_tokens)


class DPOTask(EpochTask):
    """Preference training: DPO's loss on a batch of pairs, epoch after epoch; the best checkpoint the one of the
    lowest loss on the held-out pairs."""

    name = "dpo"
    metric = "val_loss"
    higher_is_better = False

    def __init__(self, train: PreferenceRows, val: PreferenceRows, *, options: DPOOptions, reference: Reference,
                 stops: tuple[str, ...] = (), stop_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(train)
        self.val, self.options, self.reference = val, options, reference
        self.stops, self.stop_ids = stops, stop_ids  # where a sample's reply ends, as chat's (`ChatTask`)
        self.val_references: list[Tensor] | None = None  # the reference's log-probs of `val`, read at the first
        # evaluation: frozen, it scores the held-out pairs alike at every one

    def loss(self, model: nn.Module, batch: PreferenceBatch) -> Tensor:
        return self.loss_and_metrics(model, batch)[0]

    def loss_and_metrics(self, model: nn.Module, batch: PreferenceBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The batch's mean loss and its pairs' reward metrics from the same forward: the trainer logs them with the
        loss at every step, as TRL does."""
        policy = batch_logprobs(model, batch)  # (B, 2) with gradients
        scores = pair_scores(policy, self.reference.logprobs(model, batch), batch, self.options)
        return scores.losses.mean(), reward_tensors(scores)

    def weight(self, batch: PreferenceBatch) -> int:
        return len(batch.input_ids)  # (B, 2, T): the loss is a mean over the B pairs

    def n_tokens(self, batch: PreferenceBatch) -> int:
        return int(batch.input_ids.numel())

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, Any]:
        """Every rank scores every held-out pair (they are few), so the ranks agree without a sum."""
        if self.val_references is None:
            self.val_references = reference_logprobs(model, self.reference, self.val)
        return preference_scores(model, self.val_references, self.val, self.options)

    def prompt_ids(self) -> list[int]:
        """The first held-out pair's prompt: what the sample after training answers."""
        return list(self.val.pairs[0].prompt)


def preference_split(data: Any, seed: int, *, task: str = "dpo") -> tuple[list[PreferencePair], list[PreferencePair]]:
    """The training and held-out pairs the data settings name (without --val-data: `val_fraction` held out), for
    `--task task` (dpo, reward). Raises InputError without --data, for a file of one pair and no --val-data, or for
    files of chat pairs beside files of plain-text ones (each file is of one layout, `read_pairs`)."""
    if not data.data:
        raise InputError(f'--task {task} needs --data FILE.jsonl: preference pairs, one {{"prompt", "chosen", '
                         '"rejected"} object a line')
    files = [(path, read_pairs(path, encoding_errors=data.encoding_errors)) for path in (*data.data, *data.val_data)]
    layouts = {"chat messages" if pairs[0].is_chat else "plain text": path for path, pairs in files if pairs}
    if len(layouts) > 1:
        raise InputError(f"{layouts['chat messages']} holds chat messages and {layouts['plain text']} plain text: "
                         f"--task {task} learns from pairs of one layout (--data and --val-data alike); convert one")
    read = [p for path, pairs in files[:len(data.data)] for p in pairs]
    if data.val_data:
        return read, [p for path, pairs in files[len(data.data):] for p in pairs]
    if len(read) < 2:
        raise InputError(f"{data.data[0]} holds one pair: give two or more (some are held out to validate), or "
                         "--val-data FILE")
    return split(read, data.val_fraction, seed)


def _make(context: TaskContext) -> tuple[DPOTask, None]:
    if context.reference is None:
        _needs_init_from(context.data, context.seed)
    train, val = preference_split(context.data, context.seed)
    rows = dict(template=context.chat_template, tokenizer=context.tokenizer, seq_len=context.seq_len,
                batch_size=context.batch_size, seed=context.seed)
    return DPOTask(preference_rows(train, **rows), preference_rows(val, **rows), options=context.data.options,
                   reference=Reference(context.reference), stops=context.chat_template.stops,
                   stop_ids=context.chat_template.turn_end_ids(context.tokenizer)), None


def _needs_init_from(data: Any, seed: int) -> NoReturn:
    """A new model has no reference to prefer against: refused where its tokenizer would be trained (`training_text`)
    and, with a tokenizer given, where the task is made."""
    raise ConfigError("--task dpo fine-tunes a trained model against itself as it started: give --init-from RUN_DIR "
                      "(an lm or chat run, or a Hugging Face decoder directory)")


def _report(ctx: EvalContext) -> EvalReport:
    """Each file's DPO loss and reward metrics against the run's reference (`EvalContext.reference`), its pairs
    rendered by the run's chat template."""
    template = chat_template(ctx.run / TOKENIZER_DIR, ctx.tokenizer.specials)
    options = ctx.options if ctx.options is not None else DPOOptions()
    reference = Reference(ctx.reference)
    rows = []
    for path in ctx.files:
        data = preference_rows(read_pairs(path, encoding_errors=ctx.settings.encoding_errors), template=template,
                               tokenizer=ctx.tokenizer, seq_len=ctx.config.max_seq_len,
                               batch_size=ctx.settings.batch_size, longer=None)
        references = reference_logprobs(ctx.model, reference, data)
        rows.append({"file": str(path), "pairs": len(data), **preference_scores(ctx.model, references, data, options)})
    return EvalReport("preference", str(ctx.run), rows, {"beta": options.beta, "loss_type": options.loss_type},
                      columns=("file", "pairs", "val_loss", *REWARDS))


DPO = register(TaskSpec(
    name="dpo", help="preference fine-tuning (DPO): prefer the chosen responses over the rejected (decoder)",
    families=("decoder",), seed_draws_validation="without_val_data", head={"decoder_head": "lm"}, make=_make,
    evaluate_files=_report, method="generate", training_text=_needs_init_from, reference_copy=True,
    options=("val_data", "val_fraction", "encoding_errors"), own_options=DPOOptions, default_model=LM.default_model,
    eval_help='JSON Lines preference pairs ({"prompt", "chosen", "rejected"}): DPO loss and reward accuracy against '
              "the reference",
    eval_options=("batch_size",),
))
