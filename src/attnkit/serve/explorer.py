"""The explorer's numbers: what the page at `/` draws, computed on the run's model as it is stored.

    analyze(text)      tokens and ids; every layer's and head's attention (`attnkit.viz.attention_maps`);
                       a language model's next-token logits; a classifier's class probabilities;
                       a translation run's cross-attention (over its own greedy translation unless a target is given)
    whole_model(text)  every stage from the tokens to the output, with shapes, and the residual stream's numbers at
                       one query token (`serve/model_view.py`); a translation run's two streams, the encoder's over
                       the source and the decoder's over a target (or over its own greedy translation)
    inspect(text)      head importance (layer x head) and the logit lens (each layer's top tokens, the final
                       answer's rank) by `attnkit.inspect` (`serve/inspect_view.py`)
    sae_features(text) each token's top features of the SAE served with --sae, and their top contexts
                       (`serve/sae_view.py`)
    step(text, ...)    one head's computation for one query token, step by step with the real numbers (lecture:
                       q and k, the scores q.k, the scale 1/sqrt(d), the mask, the softmax, the weighted sum of v)
    training_metrics   the watched run's metrics.jsonl from a line on (the page polls it while the run trains)
    experiments        the experiments' results.json and plots (docs/experiments)

The explorer reads its own copy of the model, as the checkpoint stores it (no fused projections, no int8), so its
projections are the lecture's q_proj, k_proj and v_proj; it reads it when the page first asks for numbers.
"""

from __future__ import annotations

import json
import math
from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from attnkit.checkpoint import TASK_FILE, load_run_model
from attnkit.errors import InputError
from attnkit.layers.attention import Attention, DotScore
from attnkit.models.attention_capture import attention_sites
from attnkit.models.greedy import EmptyTranslation, translation_pair
from attnkit.serve.inspect_view import inspect_view
from attnkit.serve.model_view import model_view, translation_view
from attnkit.serve.sae_view import SAEView
from attnkit.tasks.reading import frame_of, text_frame
from attnkit.tokenize import Tokenizer, encode_some
from attnkit.viz.extract import attention_maps, is_translator
from attnkit.viz.labels import token_labels

MAX_TEXT = 2000  # characters the explorer analyses at most (its pictures are for short texts)
EXAMPLE = "the cat sat on the mat"  # the page's first text, where the run's tokenizer reads it
MAX_TOKENS = 256  # tokens the explorer analyses at most: every layer's and head's (T, T) weights go to the page
ALL_LOGITS = 4096  # vocabularies up to this size send every logit; larger ones their top ALL_LOGITS
OWN_TRANSLATION_EMPTY = "type a translation in the Target box"  # the fix an empty own translation asks for
MAX_TRANSLATION = 64  # tokens of the model's own translation drawn at most (within its context, after BOS)
METRICS_LINES = 5000  # metrics.jsonl lines per answer at most


def first_text(tokenizer: Tokenizer) -> str:
    """The page's first text: EXAMPLE where `tokenizer` reads it, without an unknown token, else the first eight letters
    of its vocabulary (a character run of a synthetic task's alphabet), so the page opens on a picture, not on an
    error about a text it typed itself."""
    try:
        ids = tokenizer.encode(EXAMPLE)
        if ids and tokenizer.unk_id not in ids:  # no ids: a tokenizer that skips what it does not know
            return EXAMPLE
    except InputError:  # a character tokenizer that refuses characters outside its alphabet
        pass
    specials = {tokenizer.token_id(role) for role in tokenizer.specials}
    ids = range(min(tokenizer.vocab_size, 1024))  # a character vocabulary is short; a large one reads EXAMPLE
    pieces = [piece for i, piece in zip(ids, tokenizer.pieces(ids), strict=True) if i not in specials]
    return "".join(([p for p in pieces if p.isalpha()] or pieces)[:8])


class Explorer:
    """The model as stored, its tokenizer, and the directories the page's other tabs read."""

    def __init__(self, pipeline, run_dir: Path, *, watch: Path, experiments: Path | None,
                 sae: Path | None = None) -> None:
        self.pipeline = pipeline
        self.tokenizer = pipeline.tokenizer
        self.config = pipeline.config
        self.run_dir = run_dir
        self.watch = watch
        self.experiments_dir = experiments
        # what the page asks first, from the pipeline's model (the same layers, however the plan runs them)
        self.kinds = sorted({site.kind for site in attention_sites(pipeline.model)})
        self.translator = is_translator(pipeline.model)
        self.frame = frame_of(pipeline.record, run_dir / TASK_FILE)  # a converted tagger's text: its tokenizer's
        self.example = first_text(self.tokenizer)
        self.sae = None if sae is None else SAEView(sae, self.model, self.tokenizer, family=self.config.family,
                                                    max_len=self.config.max_seq_len, frame=self.frame)

    @cached_property
    def model(self) -> nn.Module:
        """The run's model as stored, read when the page first asks for numbers (at start with --sae, whose view
        reads it): a server that only answers the API holds one copy of the weights, not two, and starts without
        reading and checking them twice."""
        model, _, _ = load_run_model(self.run_dir, device=self.pipeline.device, dtype=self.pipeline.dtype)
        return model.eval()

    @cached_property
    def sites(self) -> list:
        return attention_sites(self.model)

    def info(self) -> dict:
        return {"family": self.config.family, "task": self.pipeline.task.name if self.pipeline.task else None,
                "methods": list(self.pipeline.methods), "translator": self.translator,
                "labels": self.pipeline.labels, "kinds": self.kinds, "vocab_size": self.config.vocab_size,
                "max_seq_len": self.config.max_seq_len, "sae": self.sae.point if self.sae else None,
                "example": self.example}

    @torch.no_grad()
    def analyze(self, text: str, target: str | None = None) -> dict:
        """Tokens, attention, and what the model predicts from `text` (see the module docstring)."""
        result: dict = {"ids": self._checked_ids(text)}
        result["tokens"] = token_labels(self.tokenizer, result["ids"])
        result["attention"] = [self._maps_json(m) for m in self._maps(text, target)] if self.sites else []
        if self.pipeline.methods == ("generate",):
            result["next"] = self._next_tokens(result["ids"])
        if self.pipeline.methods == ("classify",):
            (prediction,) = self.pipeline.classify(text)
            result["classes"] = prediction.probabilities
        return result

    def inspect(self, text: str, target: str | None = None) -> dict:
        """Head importance and the logit lens of `text` (a translator's over `target`, or its own translation when
        the page's Target box is empty): `serve/inspect_view.py`."""
        self._checked_ids(text)
        return inspect_view(self.model, self.tokenizer, family=self.config.family, max_len=self.config.max_seq_len,
                            text=text, target=target if self.translator else None, frame=self.frame)

    def sae_features(self, text: str, target: str | None = None) -> dict:
        """Each token's top features of the SAE served with --sae, and their saved contexts: `serve/sae_view.py`."""
        if self.sae is None:
            raise InputError("no sparse autoencoder is served: start attnkit serve with --sae DIR (the OUT/sae "
                             "directory attnkit inspect RUN sae writes)")
        self._checked_ids(text)
        return self.sae.read(text, target if self.translator else None)

    def whole_model(self, text: str, query: int | None = None, *, target: str | None = None,
                    source_query: int | None = None) -> dict:
        """Each stage of the model for `text`, with shapes, read at token `query` (None: the last):
        `serve/model_view.py`. A translation run shows both streams: the decoder's over `target` (the model's own
        greedy translation when it is None or blank; `target_given` says which), read at `query`, and the encoder's
        over the source `text`, read at `source_query`."""
        ids = self._checked_ids(text)
        if not self.translator:
            return model_view(self.model, self.config, self.tokenizer, ids, query)
        given = target is not None and bool(target.strip())
        if given:
            _check_text(target)
        pair = translation_pair(self.model, self.tokenizer, text, target if given else None,  # as the maps frame it
                                max_length=MAX_TRANSLATION,
                                instead=OWN_TRANSLATION_EMPTY, context=self.config.max_seq_len)
        view = translation_view(self.model, self.config, self.tokenizer, pair.source, pair.decoder_input, query,
                                source_query)
        return {**view, "target_given": given}

    def _checked_ids(self, text: str) -> list[int]:
        """The ids the model reads of `text`: framed as it learned to read one (`text_frame`: a converted Llama's
        after BOS, an encoder's between its marks, a translator's source before EOS), as the maps draw it and the
        next-token panel reads it. Raises InputError for an empty text, a text of no token, or one that framed is
        longer than the explorer draws (MAX_TOKENS, and the model's max_seq_len)."""
        _check_text(text)
        ids = encode_some(self.tokenizer, text, "the text")
        if not ids:
            raise InputError("the text is empty: type a text")
        before, after = text_frame(self.model, self.tokenizer, self.frame)
        framed = [*before, *ids, *after]
        most = min(MAX_TOKENS, self.config.max_seq_len)
        if len(framed) > most:
            marks = " and ".join(token_labels(self.tokenizer, [*before, *after]))
            read = f", {len(framed)} with the {marks} the model reads with it" if marks else ""
            why = " (the model's max_seq_len)" if most == self.config.max_seq_len else ""
            over = len(framed) - most
            raise InputError(f"the text has {len(ids)} tokens{read}; the explorer draws at most {most}{why}: shorten "
                             f"it by {over} token{'s' if over > 1 else ''}")
        return framed

    def _maps(self, text: str, target: str | None, layers=None):
        """The attention maps of `text` (a translator's over `target`, or over its own translation when the page's
        Target box is empty); refusals name the page's fields."""
        translator = self.translator
        target = target if translator and target and target.strip() else None
        try:
            return attention_maps(self.model, self.tokenizer, text, target=target, translate=translator and not target,
                                  layers=layers, max_length=MAX_TRANSLATION,
                                  context=self.config.max_seq_len,  # the text as framed, the source, the target
                                  frame=self.frame)
        except EmptyTranslation:
            raise EmptyTranslation(OWN_TRANSLATION_EMPTY) from None

    @staticmethod
    def _maps_json(maps) -> dict:
        return {"kind": maps.kind, "title": maps.title, "query_tokens": list(maps.query_tokens),
                "key_tokens": list(maps.key_tokens), "layers": list(maps.layers), "heads": list(maps.heads),
                "weights": maps.weights.round(6).tolist()}  # (L, H, T, S)

    def _next_tokens(self, ids: list[int]) -> dict:
        """The next token's logits after a text's `ids` as `_checked_ids` frames them, which is how generation reads
        a prompt (`Pipeline.prompt_ids`: BOS first where the tokenizer starts its texts with it, as a converted
        Llama's does): every token's, or the top ALL_LOGITS of a larger vocabulary."""
        device = next(self.model.parameters()).device
        logits = self.model(torch.tensor([ids], device=device)).logits[0, -1].float()  # (V,)
        top = torch.topk(logits, min(ALL_LOGITS, logits.shape[0]))
        chosen = top.indices.tolist()
        return {"ids": chosen, "logits": [round(v, 5) for v in top.values.tolist()],
                "tokens": token_labels(self.tokenizer, chosen),
                "texts": [self.tokenizer.decode([i]) for i in chosen], "complete": len(chosen) == logits.shape[0]}

    @torch.no_grad()
    def step(self, text: str, *, target: str | None = None, kind: str | None = None, layer: int = 0, head: int = 0,
             query: int = 0) -> dict:
        """One head's attention for one query token, each step with its numbers (see the module docstring)."""
        _check_text(text)
        sites = [s for s in self.sites if s.layer == layer and (kind is None or s.kind == kind)]
        if not sites:
            if not self.sites:
                raise InputError("this model has no attention to show step by step")
            layers = sorted({s.layer for s in self.sites})
            kinds = ", ".join(dict.fromkeys(s.kind for s in self.sites))
            raise InputError(f"no {kind + ' ' if kind else ''}attention at layer {layer}: this model's attention is at "
                             f"layers {layers[0]} to {layers[-1]}, of the kinds {kinds}; choose a Layer and Kind it "
                             "has")
        site = sites[0]
        module = site.module
        if not isinstance(module, Attention):
            raise InputError("the step-by-step view shows Transformer attention; this model's attention is "
                             "recurrent (its weights are on the heatmap)")
        if not 0 <= head < module.n_heads:
            raise InputError(f"head {head} is out of range: this model's heads are 0..{module.n_heads - 1}")
        seen: dict = {}

        def keep_inputs(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            if kwargs.get("cache") is None:  # the last whole pass is the one drawn (a translator's own translation
                seen.clear()  # is written first, a pass per token, each shorter than the one drawn)
                seen.update(kwargs, x=args[0])

        handle = module.register_forward_pre_hook(keep_inputs, with_kwargs=True)
        try:
            maps = {m.kind: m for m in self._maps(text, target, layers=[layer])}
        finally:
            handle.remove()
        drawn = maps[site.kind]
        if not 0 <= query < len(drawn.query_tokens):
            raise InputError(f"Query token {query} is out of range: this view has {len(drawn.query_tokens)} query "
                             f"tokens (0..{len(drawn.query_tokens) - 1}); choose one of them")
        steps = head_steps(module, seen, head, query)
        expected = drawn.head_weights(layer, head)[query]  # the model's own weights for this row
        steps["model_weights"] = [round(float(w), 6) for w in expected]
        steps["matches_model"] = bool(max(abs(a - b) for a, b in zip(steps["weights"], expected, strict=True)) < 1e-4)
        steps.update(kind=site.kind, layer=layer, head=head, query=query, query_token=drawn.query_tokens[query],
                     key_tokens=list(drawn.key_tokens))
        return steps

    def training_metrics(self, since: int = 0) -> dict:
        """The watched run's metrics.jsonl records from line `since` on (at most METRICS_LINES)."""
        path = self.watch / "metrics.jsonl"
        if not path.is_file():
            return {"run": str(self.watch), "records": [], "next": 0, "found": False}
        records, line_number = [], 0
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line_number, line in enumerate(lines, start=1):
                if line_number <= since or not line.endswith("\n"):  # a line still being written waits
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
                if len(records) == METRICS_LINES:
                    break
        return {"run": str(self.watch), "records": records, "next": since + len(records) if records else since,
                "found": True}

    def experiments(self) -> list[dict]:
        """Each experiment's results.json (verdict, claim, table rows, plot names), by name."""
        found = []
        if self.experiments_dir is None or not self.experiments_dir.is_dir():
            return found
        for path in sorted(self.experiments_dir.glob("*/results.json")):
            try:
                results = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            plots = [p for p in results.get("plots", []) if (path.parent / p).is_file()]
            found.append({key: results.get(key) for key in ("name", "claim", "lecture", "verdict", "reason",
                                                              "key_number", "rows")} | {
                "name": path.parent.name, "plots": plots})
        return found

    def experiment_plot(self, name: str, plot: str) -> Path:
        """The path of one listed plot; InputError for anything not listed (no path is read from the request)."""
        for experiment in self.experiments():
            if experiment["name"] == name and plot in experiment["plots"]:
                return self.experiments_dir / name / plot
        raise InputError(f"no plot {plot!r} in experiment {name!r}")


def head_steps(module: Attention, inputs: dict, head: int, query: int) -> dict:
    """q, k, v of one head recomputed from the attention's inputs, and each step for one query row (batch row 0)."""
    x = inputs["x"]  # (1, T, C)
    context = inputs.get("context")
    source = x if context is None else context  # (1, S, C)
    q = _heads(module.q_proj(x), module.n_heads, module.head_dim)  # (1, H, T, D)
    k = _heads(module.k_proj(source), module.n_kv_heads, module.head_dim)  # (1, Hkv, S, D)
    v = _heads(module.v_proj(source), module.n_kv_heads, module.head_dim)
    relative = module.relative if context is None else None
    if relative is not None and relative.rotates:
        positions = inputs.get("positions")
        if positions is None:
            positions = relative.prepare(torch.arange(x.shape[1], device=x.device)[None])
        q, k = relative.rotate(q, k, positions)
    kv_head = head // (module.n_heads // module.n_kv_heads)  # the key/value head this query head shares
    q_row = q[:, head:head + 1, query:query + 1]  # (1, 1, 1, D)
    keys, values = k[:, kv_head:kv_head + 1], v[:, kv_head:kv_head + 1]  # (1, 1, S, D)
    scores = module.score(q_row, keys)[0, 0, 0].float()  # (S,): scale included for dot scores
    dots = (keys[0, 0] @ q_row[0, 0, 0]).float()  # (S,) the plain dot products q.k
    mask = inputs.get("mask")  # the forward pass's AttentionMask: this row of it, for this layer's window
    allowed = mask.allowed(scores.shape[0], window=None if context is not None else module.window) if mask else None
    visible = torch.ones_like(scores, dtype=torch.bool) if allowed is None else allowed.reshape(
        -1, *allowed.shape[-2:])[0, query]  # (T, S) or (1, 1, T, S) -> (S,)
    weights = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)  # (S,)
    out = weights.to(values.dtype) @ values[0, 0]  # (D,)
    scale = module.score.scale if isinstance(module.score, DotScore) else None
    return {"score": module.score_kind, "head_dim": module.head_dim, "scale": scale,
            "scale_text": _scale_text(scale, module.head_dim), "q": _round(q_row[0, 0, 0]),
            "k": [_round(row) for row in keys[0, 0]], "v": [_round(row) for row in values[0, 0]],
            "dots": _round(dots), "scores": _round(scores), "mask": visible.tolist(),
            "weights": _round(weights), "output": _round(out)}


def _heads(x: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    batch, length, _ = x.shape
    return x.view(batch, length, n_heads, head_dim).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)


def _scale_text(scale: float | None, head_dim: int) -> str:
    if scale is None:
        return "none (the score function is learned)"
    if math.isclose(scale, 1 / math.sqrt(head_dim)):
        return f"1/sqrt({head_dim}) = {scale:.6f}"
    return f"{scale:.6f}"


def _round(values: torch.Tensor) -> list[float]:
    return [round(float(v), 6) for v in values.float().tolist()]


def _check_text(text: str) -> None:
    if len(text) > MAX_TEXT:
        raise InputError(f"the text has {len(text)} characters; the explorer reads at most {MAX_TEXT}")
