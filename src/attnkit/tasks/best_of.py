"""Best-of-N sampling (rejection sampling): draw N replies to a prompt and keep the one a reward model scores highest
(Touvron et al. 2023, sec. 3.2.3, Llama 2's rejection sampling, which then fine-tunes on the kept replies; Nakano et
al. 2021's best-of-N). With the same N samples, the reply kept has the highest reward of them, so the expected reward
grows with N, at N times the decoding.

    policy.generate(prompt, num_samples=N, seed=s)   N replies, sample i drawn from its own generator (seed s + i)
    reward.reward(prompt, replies)                    a reward run (`attnkit train --task reward`) scores each
    best = argmax over the N rewards                  (the first of equal rewards)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from attnkit.data.chat import check_messages, is_chat
from attnkit.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BestOfN:
    """A prompt's N candidates, their rewards, and which one was kept (`best`)."""

    prompt: str | list[dict]  # a text, or a chat's messages
    texts: list[str]
    rewards: list[float]
    best: int

    @property
    def text(self) -> str:
        return self.texts[self.best]

    @property
    def reward(self) -> float:
        return self.rewards[self.best]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text, "reward": self.reward}


def check_best_of(n: object, *, flag: str = "n") -> int:
    """`n` as the number of candidates. Raises InputError, naming `flag`, for anything but an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        shown = f"{flag} {n}" if flag.startswith("--") else f"{flag}={n!r}"
        raise InputError(f"{shown}: best-of-N draws N candidates and keeps the best, so N must be an integer of 1 "
                         "or more (4 to 16 is usual; 1 is plain sampling)")
    return n


def best_of_n(policy: Any, reward: Any, prompts: str | Sequence[str] | list[dict] | Sequence[list[dict]], *, n: int,
              seed: int | None = None, **options: Any) -> list[BestOfN]:
    """Each prompt's `n` samples from `policy` (a decoder's `attnkit.generate.Pipeline`: its `generate` with
    num_samples=n, `seed` and `options`, the sampling settings), scored by `reward` (a reward run's pipeline), the
    best kept. With a seed, the same candidates and choice each time (sample i is seeded seed + i). A prompt may be
    a chat (a list of messages): it is rendered by the policy's chat template, its replies end at the template's end
    of turn and are kept as their content (`Pipeline.chat`), and the reward run scores them as the assistant's turn.

    Raises InputError for n < 1, for prompts that are not text (the reward model reads text), for a `reward` that
    does not serve rewards (MethodNotServed), or for options that choose no samples (beams, num_samples) or the same
    sample n times (temperature=0); and what `generate` raises for its settings."""
    check_best_of(n)
    taken = sorted(set(options) & {"num_samples", "num_beams", "num_return_sequences", "draft"})
    if taken:
        raise InputError(f"best_of_n draws its own n samples, so it does not take {', '.join(taken)}; leave them out")
    if n > 1 and options.get("temperature") == 0:
        raise InputError(f"temperature=0 decodes greedily, so the n={n} candidates would be one text n times: give a "
                         "temperature above 0 (1 samples the model as it is)")
    prompts = prompt_list(prompts)
    score = reward.reward  # MethodNotServed (an InputError) where `reward` is not a reward run, before any decoding
    found = []
    for prompt in prompts:
        candidates = samples(policy, prompt, n=n, seed=seed, options=options)
        rewards = [scored.reward for scored in score(prompt, candidates)]
        best = max(range(n), key=lambda i: (rewards[i], -i))  # the highest; the first of equal ones
        found.append(BestOfN(prompt, candidates, rewards, best))
        log.info("best of %d: candidate %d, reward %.4g (rewards %s)", n, best + 1, rewards[best],
                 ", ".join(f"{r:.4g}" for r in rewards))
    return found


def prompt_list(prompts: object) -> list[str | list[dict]]:
    """Prompts as a list of texts and chats: a text or a chat alone, or a non-empty list of them. Raises InputError
    naming anything else (token ids among them: the reward model reads text)."""
    found = [prompts] if isinstance(prompts, str) or is_chat(prompts) else (
        list(prompts) if isinstance(prompts, list | tuple) else [])
    wrong = [i for i, p in enumerate(found) if not isinstance(p, str) and not is_chat(p)]
    if not found or wrong:
        raise InputError(f"prompts are a text, a chat (a list of messages) or a non-empty list of them, which the "
                         f"reward model reads as text; got {prompts!r:.60}")
    return found


def samples(policy: Any, prompt: str | list[dict], *, n: int, seed: int | None, options: dict[str, Any]) -> list[str]:
    """`n` continuations of a text, or `n` replies to a chat (their content, as `Pipeline.chat` gives one)."""
    if not is_chat(prompt):
        return policy.generate(prompt, num_samples=n, seed=seed, **options)
    ids = policy.chat_template.chat_ids(policy.tokenizer, check_messages(prompt, "prompt"))
    return policy.chat_replies(ids, num_samples=n, seed=seed, **options)
