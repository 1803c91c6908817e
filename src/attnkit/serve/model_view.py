"""The explorer's whole-model panel: the stages a text passes through, each with its tensor shape for this text, and
for one query token the numbers a learner can read at each stage (Transformer Explainer's data flow, with attnkit's
own residual-stream reading, `attnkit.inspect.residual`):

    tokens (T) -> token embedding + positions (T, C) -> per block: attention (H, T, S) -> + residual
               -> FFN C -> d_ff -> C -> + residual -> final norm -> output layer (T, V) -> softmax

    norm        |stream| at the query token after the embeddings and after each block
    write       |sublayer output| and its share |out| / |stream it adds to|
    lens        the logit lens's top token after each block (the stream read through the final norm and the output
                layer, `attnkit.inspect.logit_lens.unembedding`), ending with the model's own top 5
    dla         direct logit attribution (`attnkit.inspect.logit_attribution`): how much the embeddings, each head
                and each FFN write directly towards the model's top output over its runner-up at the query token;
                the shares sum to that logit difference (absent, with the reason, where the logit is no such sum)
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.errors import InputError
from attnkit.inspect.logit_attribution import logit_attribution
from attnkit.inspect.logit_lens import unembedding
from attnkit.inspect.residual import residual_stream
from attnkit.tokenize import Tokenizer
from attnkit.viz.labels import token_labels

OUTPUT_TOP = 5  # tokens of the output distribution listed
POSITIONS = {  # what the position scheme does, and where (DESIGN.md: the position slot)
    "learned": ("token embedding + learned positions", "a learned vector per position, added to the embedding"),
    "sinusoidal": ("token embedding + sinusoidal positions", "fixed sines and cosines added (Vaswani et al. 2017)"),
    "rope": ("token embedding", "no positions added: RoPE rotates q and k inside each attention (Su et al. 2021)"),
    "alibi": ("token embedding", "no positions added: ALiBi biases each head's scores by distance (Press et al. 2022)"),
    "relative": ("token embedding", "no positions added: relative positions inside each attention (Shaw et al. 2018)"),
    "none": ("token embedding", "no positions at all: attention alone cannot tell the order"),
}
NORMS = {"layer": "LayerNorm", "rms": "RMSNorm"}


@torch.no_grad()
def model_view(model: nn.Module, config, tokenizer: Tokenizer, ids: list[int], query: int | None = None) -> dict:
    """The panel's stages for the token ids `ids` through a single-stack model (a decoder LM, an encoder), read at
    token `query` (None: the last). Raises InputError for an empty text or a query out of range."""
    if not ids:
        raise InputError("the text has no tokens: type a text")
    query = len(ids) - 1 if query is None else query
    if not 0 <= query < len(ids):
        raise InputError(f"Query token {query} is out of range: this text has {len(ids)} tokens (0..{len(ids) - 1})")
    device = next(model.parameters()).device
    read = residual_stream(model, torch.tensor([ids], device=device))
    stream = read.stream[:, 0]  # (L + 1, T, C)
    length, width = stream.shape[1:]
    try:
        _, unembed = unembedding(model)
    except InputError:
        unembed = None
    lens = unembed(stream[:, query]).float().softmax(-1) if unembed else None  # (L + 1, V)
    position_label, position_note = POSITIONS.get(config.position, (f"token embedding ({config.position})", ""))
    placement = "pre-norm: each sublayer reads a normed copy" if config.norm_position == "pre" else \
        "post-norm: the stream is normed after each residual sum"
    stages = [{"stage": "tokens", "label": f"tokens (T={length})", "shape": [length]},
              {"stage": "embedding", "label": position_label, "note": f"{position_note}; {placement} "
               f"({NORMS.get(config.norm, config.norm)})", "shape": [length, width], **_at(stream[0], query),
               **_lens(lens, 0, tokenizer)}]
    for write, after in zip(read.writes, [*read.writes[1:], None], strict=True):
        stages.append(_write_stage(model, config, write, query, length))
        if after is None or after.block != write.block:  # the block's last sublayer: the stream leaving it
            stages.append({"stage": "block", "block": write.block, "label": f"stream after block {write.block}",
                           "shape": [length, width], **_at(stream[write.block + 1], query),
                           **_lens(lens, write.block + 1, tokenizer)})
    if unembed is not None:
        if model.stack.final_norm is not None:
            stages.append({"stage": "final_norm", "label": f"final norm ({NORMS.get(config.norm, config.norm)})",
                           "shape": [length, width]})
        top = lens[-1].topk(min(OUTPUT_TOP, lens.shape[-1]))
        stages += [{"stage": "output", "label": f"output layer (T={length}, V={lens.shape[-1]})",
                    "shape": [length, lens.shape[-1]]},
                   {"stage": "softmax", "label": "softmax: next-token distribution" if model.stack.causal else
                    "softmax: the token distribution at this position", "shape": [length, lens.shape[-1]],
                    "top": [{"token": token, "p": round(p, 5)} for token, p in
                            zip(token_labels(tokenizer, top.indices.tolist()), top.values.tolist(), strict=True)]}]
    attribution = _attribution(model, tokenizer, ids, query, read.output, tokens=unembed is not None)
    for stage in stages:
        stage.update(_stage_shares(stage, attribution))
    return {"tokens": token_labels(tokenizer, ids), "query": query, "stages": stages, "attribution": attribution}


def _attribution(model: nn.Module, tokenizer: Tokenizer, ids: list[int], query: int, output, *, tokens: bool) -> dict:
    """Direct logit attribution of the top output over the runner-up at `query`: the two outputs, their logit
    difference, and each writer's share {name: value}; or {"reason": ...} where the model has none."""
    logits = output.logits[0].float()  # (T, V), a tagger's (T, labels), a classifier's (labels,)
    at = logits[query] if logits.dim() == 2 else logits
    if at.shape[-1] < 2:
        return {"reason": "one output only: there is no runner-up to compare with"}
    answer, wrong = at.topk(2).indices.tolist()
    device = next(model.parameters()).device
    try:
        found = logit_attribution(model, torch.tensor([ids], device=device), answer=answer, wrong=wrong,
                                  position=query)
    except InputError as err:
        return {"reason": str(err)}
    names = token_labels(tokenizer, [answer, wrong]) if tokens else [f"class {answer}", f"class {wrong}"]
    return {"answer": names[0], "wrong": names[1], "total": round(float(found.total[0]), 5),
            "shares": {name: round(float(value), 5) for name, value in zip(found.names, found.values[:, 0],
                                                                           strict=True)}}


def _stage_shares(stage: dict, attribution: dict) -> dict:
    """A stage's direct shares: the embeddings', an FFN's, an attention sublayer's per head (its bias beside)."""
    shares = attribution.get("shares")
    if shares is None:
        return {}
    if stage["stage"] == "embedding":
        return {"dla": shares["embed"]}
    if stage["stage"] == "mlp":
        return {"dla": shares[f"blocks.{stage['block']}.mlp"]}
    if stage["stage"] == "attn":
        site = f"blocks.{stage['block']}.attn"
        heads = [v for k, v in shares.items() if k.startswith(f"{site} head ")]
        return {"dla": round(sum(heads) + shares.get(f"{site} bias", 0.0), 5), "dla_heads": heads}
    return {}


def _write_stage(model: nn.Module, config, write, query: int, length: int) -> dict:
    """One sublayer's stage: its label and shapes from the module and the config, its write at the query token."""
    block = model.stack.blocks[write.block]
    out = {"stage": write.sublayer, "block": write.block, "shape": list(write.out.shape[1:]),
           "norm": round(float(write.out[0, query].float().norm()), 5),
           "share": round(float(write.share()[0, query]), 5)}
    if write.sublayer == "mlp":
        out["label"] = f"FFN {config.d_model} -> {config.d_ff} -> {config.d_model} ({config.activation})"
        return out
    attention = block.self_attn
    heads = f"{attention.n_heads} heads" + (f", {attention.n_kv_heads} key/value heads" if
                                            attention.n_kv_heads != attention.n_heads else "")
    out["label"] = f"attention: {heads}, " + ("causal" if block.causal else "both ways")
    out["weights_shape"] = [attention.n_heads, length, length]  # (H, T, S), S = T: self-attention
    return out


def _at(stream: torch.Tensor, query: int) -> dict:
    return {"norm": round(float(stream[query].float().norm()), 5)}  # (T, C) -> |x_query|


def _lens(lens: torch.Tensor | None, row: int, tokenizer: Tokenizer) -> dict:
    """The logit lens's top token at one stream (row 0: after the embeddings) and its probability."""
    if lens is None:
        return {}
    p, token = lens[row].max(-1)
    return {"lens": {"token": token_labels(tokenizer, [int(token)])[0], "p": round(float(p), 5)}}
