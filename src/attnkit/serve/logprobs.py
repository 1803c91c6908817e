"""Log-probabilities in the OpenAI API's shapes: completions' `logprobs: N` (and `echo`), chat's `logprobs: true` with
`top_logprobs: N`, whole and streamed.

Each number is the model's own log-softmax over the logits the token was drawn from, taken before anything reshapes
them: before `logit_bias`, the temperature, top-k and top-p (vLLM's default, its "raw" log-probabilities). So they
say what the model predicts whatever the sampling settings did with it, and a test can recompute them from one
forward pass over the prompt and the tokens; a token forced by `logit_bias` may show a low log-probability.

A token's log-probability goes out with the text that holds it: streamed, in the chunk whose text completes the
token's text (text held back, as a possible start of a stop string, keeps its tokens back with it); a token whose
text a stop string cuts off entirely is not reported, one the cut goes through is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnkit.generate.sampling import token_logprobs


@dataclass(frozen=True)
class Scored:
    """One token of a choice's text: its log-probability (None for a prompt's first token, which nothing predicts),
    the likeliest alternatives [(token, logprob), ...] (None there too), and where its text starts and ends in the
    choice's text."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None
    start: int
    end: int


class ChoiceScores:
    """One choice's scored tokens as they come (`add`), given out as the choice's text settles (`settled`)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.entries: list[Scored] = []
        self.given = 0  # entries given out so far

    def add(self, token: int, logprob: float | None, top: list[tuple[int, float]] | None) -> None:
        start = self.entries[-1].end if self.entries else 0
        self.tokens.append(token)
        end = len(self.tokenizer.decode(self.tokens))
        self.entries.append(Scored(token, logprob, top, start, max(start, end)))

    def settled(self, length: int, *, final: bool = False) -> list[Scored]:
        """The entries not yet given out whose text lies within the text's first `length` characters; with `final`
        (the text is whole: `length` is its length), also those whose text a stop string cut through."""
        begin = self.given
        while self.given < len(self.entries):
            entry = self.entries[self.given]
            if not (entry.end <= length or (final and entry.start < length)):
                break
            self.given += 1
        return self.entries[begin:self.given]


@torch.inference_mode()
def prompt_scores(model: nn.Module, ids: list[int], top: int, tokenizer) -> ChoiceScores:
    """The prompt's tokens scored by one forward pass (`echo` with `logprobs`): each token's log-probability given
    the tokens before it; the first has none."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device)).logits[0, :-1]  # (T - 1, V): the predictions of tokens 1..T-1
    logprobs, values, top_ids = token_logprobs(logits, torch.tensor(ids[1:], device=device), top)
    scores = ChoiceScores(tokenizer)
    scores.add(ids[0], None, None)
    for token, logprob, alternatives, alternative_logprobs in zip(ids[1:], logprobs.tolist(), top_ids.tolist(),
                                                                  values.tolist(), strict=True):
        scores.add(token, logprob, list(zip(alternatives, alternative_logprobs, strict=True)))
    return scores


def token_text(tokenizer, token: int) -> str:
    """A token's text, special tokens shown."""
    return tokenizer.decode([token], skip_special=False)


def completion_logprobs(tokenizer, entries: list[Scored], offsets: list[int]) -> dict:
    """Completions' `logprobs` object; each entry's text offset counts from its own offset in `offsets` (0 for the
    echoed prompt's tokens, the echoed prompt's length for the completion's)."""
    return {"tokens": [token_text(tokenizer, e.token) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.top is None else {token_text(tokenizer, t): lp for t, lp in e.top}
                             for e in entries],
            "text_offset": [offset + e.start for e, offset in zip(entries, offsets, strict=True)]}


def chat_logprobs(tokenizer, entries: list[Scored]) -> dict:
    """Chat completions' `logprobs` object: `content`, one entry per token with its `top_logprobs`."""

    def one(token: int, logprob: float) -> dict:
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top or ()]}
                        for e in entries], "refusal": None}
