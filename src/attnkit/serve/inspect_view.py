"""The explorer's inspect panels: head importance and the logit lens of the served run on the page's text, computed
by `attnkit.inspect` as `attnkit inspect RUN heads` and `... logit-lens` compute them, the text read as that command
reads it (`attnkit.inspect.command.text_batch`: a decoder predicts each next token, an encoder reads [CLS] text
[SEP], a translation run reads its source and the page's target, or its own greedy translation).

    heads   the loss change when each head is ablated (zeroed), every attention sublayer x head (Michel et al. 2019);
            without targets (a classifier) the KL of the output from the model's own
    lens    each layer's residual stream read through the final norm and the output layer (nostalgebraist 2020):
            its top tokens at each position and the rank of the model's final answer there (0: already first); a
            decoder's over the whole text, as `... logit-lens` reads it, so its last column is what follows the text
"""

from __future__ import annotations

import math

from torch import nn

from attnkit.errors import InputError
from attnkit.inspect.command import Loaded, text_batch
from attnkit.inspect.importance import head_importance
from attnkit.inspect.logit_lens import logit_lens
from attnkit.tasks.reading import Frame, text_frame, text_layout
from attnkit.tokenize import Tokenizer
from attnkit.viz.labels import token_labels

LENS_TOP = 3  # tokens the logit lens lists per layer and position


def inspect_view(model: nn.Module, tokenizer: Tokenizer, *, family: str, max_len: int, text: str,
                 target: str | None = None, frame: Frame = "attnkit") -> dict:
    """The two panels' numbers for `text` (a translation run's source; `target` its translation, None: the model's
    own), framed as `frame` says (the run's `frame_of`: a converted tagger's as its own tokenizer frames a text).
    The logit lens is None, with `lens_note` saying why, for a model without an output layer over a Transformer stack
    (a classifier, the recurrent seq2seq). Raises InputError for a text the model cannot score."""
    if not text.strip():
        raise InputError("the Text box is empty: type a text to inspect")
    loaded = Loaded(model, tokenizer, family, max_len, next(model.parameters()).device, frame=frame)
    if loaded.translates:
        text = pair_line(text, target)
    elif text_layout(model) == "stream" and len(text_frame(model, tokenizer, frame)[0] + tokenizer.encode(text)) < 2:
        raise InputError("head importance and the logit lens score each next token: type two tokens or more")
    batch = text_batch(loaded, text)
    importance = head_importance(model, batch)
    view = {"heads": {"sites": importance.sites, "metric": importance.metric, "baseline": importance.baseline,
                      "scores": [[_number(v) for v in row] for row in importance.scores.tolist()]},
            "lens": None}
    read = text_batch(loaded, text, prompt=True) if loaded.causal else batch  # a decoder's whole text: the last
    # row is what follows it (any other family reads the text as head importance did; a translator's again would
    # translate it twice)
    try:
        lens = logit_lens(model, *read.args)
    except InputError as err:
        view["lens_note"] = str(err)
        return view
    inputs = read.args[-1][0].tolist()  # the stream's own tokens (a translation's target side)
    top = lens.logits[:, 0].float().softmax(-1).topk(LENS_TOP, dim=-1)  # (L + 1, T, k) each
    view["lens"] = {
        "layers": [_layer_label(name) for name in lens.layers],
        "tokens": token_labels(tokenizer, inputs),
        "answer": token_labels(tokenizer, lens.answer[0].tolist()),
        "top": [[token_labels(tokenizer, ids) for ids in layer] for layer in top.indices.tolist()],
        "top_p": [[[round(p, 4) for p in ps] for ps in layer] for layer in top.values.tolist()],
        "rank": lens.ranks()[:, 0].tolist(),  # (L + 1, T)
        "p_answer": [[round(p, 4) for p in layer] for layer in lens.probabilities()[:, 0].tolist()],
    }
    return view


def pair_line(source: str, target: str | None) -> str:
    """A translation run's text: a SOURCE<TAB>TARGET line, as `attnkit inspect` reads them (no target: its own)."""
    source, given = source.replace("\t", " "), (target or "").replace("\t", " ")
    return f"{source}\t{given}" if given.strip() else source


def _layer_label(name: str) -> str:
    """`blocks.0.resid_pre` -> "embeddings", `decoder.blocks.2.resid_post` -> "block 2"."""
    index = name.rpartition("blocks.")[2].split(".")[0]
    return "embeddings" if name.endswith("resid_pre") else f"block {index}"


def _number(value: float) -> float | None:
    """A score as JSON has it: NaN (a site with fewer heads) is null."""
    return None if math.isnan(value) else round(value, 5)
