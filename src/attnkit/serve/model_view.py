"""The explorer's whole-model panel: the stages a text passes through, each with its tensor shape for this text, and
for one query token the numbers a learner can read at each stage (Transformer Explainer's data flow, with attnkit's
own residual-stream reading, `attnkit.inspect.residual`):

    tokens (T) -> token embedding + positions (T, C) -> per block: attention (H, T, S) -> + residual
               -> FFN C -> d_ff -> C -> + residual -> final norm -> output layer (T, V) -> softmax

    an encoder-decoder (`translation_view`), two streams:
    source (S) -> embedding -> per block: attention -> FFN -> final norm -> memory (S, C)
    target (T) -> embedding -> per block: causal attention -> cross-attention (H, T, S) over the memory
               -> FFN -> final norm -> output layer (T, V) -> softmax

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
from attnkit.models.stack import TransformerStack
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
    query = _query(query, len(ids), "Query token")
    inputs = _tensor(model, ids)
    read = residual_stream(model, inputs)
    try:
        _, unembed = unembedding(model)
    except InputError:
        unembed = None
    stages = _stream_stages(model.stack, config, tokenizer, read, query, unembed, tokens="tokens (T={})")
    attribution = _attribution(model, tokenizer, (inputs,), query, read.output, tokens=unembed is not None)
    for stage in stages:
        stage.update(_stage_shares(stage, attribution, prefix=""))
    return {"tokens": token_labels(tokenizer, ids), "query": query, "stages": stages, "attribution": attribution}


@torch.no_grad()
def translation_view(model: nn.Module, config, tokenizer: Tokenizer, source: list[int], target: list[int],
                     query: int | None = None, source_query: int | None = None) -> dict:
    """An encoder-decoder's two streams (Vaswani et al. 2017, fig. 1): the decoder's over `target` (BOS and the
    tokens written, as it reads them) read at target token `query`, its blocks with cross-attention between
    self-attention and the FFN, then the output; and under "source" the encoder's over `source` (EOS included)
    read at `source_query`, ending in the memory every cross-attention reads (None: the last token of each).
    Raises InputError for a query out of range or a model whose stacks are not Transformer stacks."""
    if not isinstance(getattr(model, "encoder", None), TransformerStack):
        raise InputError("the whole-model view follows a Transformer's residual stream; this run's encoder is "
                         "recurrent (it has none): its attention is on the heatmap")
    query = _query(query, len(target), "Query token")
    source_query = _query(source_query, len(source), "Source token")
    src, tgt = _tensor(model, source), _tensor(model, target)  # (1, S), (1, T)
    read = residual_stream(model, src, tgt)  # the decoder's stream: the one that becomes tokens
    _, unembed = unembedding(model)
    stages = _stream_stages(model.decoder, config, tokenizer, read, query, unembed, tokens="target tokens (T={})",
                            context=len(source))
    attribution = _attribution(model, tokenizer, (src, tgt), query, read.output, tokens=True)
    for stage in stages:
        stage.update(_stage_shares(stage, attribution, prefix="decoder."))
    encoder = residual_stream(StackModel(model.encoder), src)
    source_stages = _stream_stages(model.encoder, config, tokenizer, encoder, source_query, None,
                                   tokens="source tokens (S={})")
    source_stages.append({"stage": "memory", "label": "memory: what every cross-attention reads as keys and values",
                          "shape": list(encoder.stream.shape[2:])})  # (S, C), as the final norm hands it on
    return {"tokens": token_labels(tokenizer, target), "query": query, "stages": stages, "attribution": attribution,
            "source": {"tokens": token_labels(tokenizer, source), "query": source_query, "stages": source_stages}}


class StackModel(nn.Module):
    """One Transformer stack as a model of its own (ids -> its stream), so that `residual_stream` reads an
    encoder-decoder's encoder as it reads a single-stack model."""

    def __init__(self, stack: TransformerStack) -> None:
        super().__init__()
        self.stack = stack

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.stack(ids)  # (B, S) -> (B, S, C)
        return hidden


def _stream_stages(stack: TransformerStack, config, tokenizer: Tokenizer, read, query: int, unembed,
                   *, tokens: str, context: int | None = None) -> list[dict]:
    """One stream's stages from `read` (`residual_stream`'s), its numbers at token `query`; with `unembed` (a stream
    that becomes tokens) the logit lens after each block and the output stages; `context`: the source's length (a
    decoder's cross-attention)."""
    stream = read.stream[:, 0]  # (L + 1, T, C)
    length, width = stream.shape[1:]
    lens = unembed(stream[:, query]).float().softmax(-1) if unembed else None  # (L + 1, V)
    position_label, position_note = POSITIONS.get(config.position, (f"token embedding ({config.position})", ""))
    placement = "pre-norm: each sublayer reads a normed copy" if config.norm_position == "pre" else \
        "post-norm: the stream is normed after each residual sum"
    stages = [{"stage": "tokens", "label": tokens.format(length), "shape": [length]},
              {"stage": "embedding", "label": position_label, "note": f"{position_note}; {placement} "
               f"({NORMS.get(config.norm, config.norm)})", "shape": [length, width], **_at(stream[0], query),
               **_lens(lens, 0, tokenizer)}]
    for write, after in zip(read.writes, [*read.writes[1:], None], strict=True):
        stages.append(_write_stage(stack, config, write, query, length, context))
        if after is None or after.block != write.block:  # the block's last sublayer: the stream leaving it
            stages.append({"stage": "block", "block": write.block, "label": f"stream after block {write.block}",
                           "shape": [length, width], **_at(stream[write.block + 1], query),
                           **_lens(lens, write.block + 1, tokenizer)})
    if stack.final_norm is not None:
        stages.append({"stage": "final_norm", "label": f"final norm ({NORMS.get(config.norm, config.norm)})",
                       "shape": [length, width]})
    if lens is not None:
        top = lens[-1].topk(min(OUTPUT_TOP, lens.shape[-1]))
        stages += [{"stage": "output", "label": f"output layer (T={length}, V={lens.shape[-1]})",
                    "shape": [length, lens.shape[-1]]},
                   {"stage": "softmax", "label": "softmax: next-token distribution" if stack.causal else
                    "softmax: the token distribution at this position", "shape": [length, lens.shape[-1]],
                    "top": [{"token": token, "p": round(p, 5)} for token, p in
                            zip(token_labels(tokenizer, top.indices.tolist()), top.values.tolist(), strict=True)]}]
    return stages


def _query(query: int | None, length: int, name: str) -> int:
    """The token a stream is read at (None: its last); InputError naming the range for one outside it."""
    query = length - 1 if query is None else query
    if not 0 <= query < length:
        raise InputError(f"{name} {query} is out of range: this text has {length} tokens (0..{length - 1})")
    return query


def _tensor(model: nn.Module, ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], device=next(model.parameters()).device)  # (1, T)


def _attribution(model: nn.Module, tokenizer: Tokenizer, inputs: tuple[torch.Tensor, ...], query: int, output, *,
                 tokens: bool) -> dict:
    """Direct logit attribution of the top output over the runner-up at `query` of the model's pass over `inputs`:
    the two outputs, their logit difference, and each writer's share {name: value}; or {"reason": ...} where the
    model has none."""
    logits = output.logits[0].float()  # (T, V), a tagger's (T, labels), a classifier's (labels,)
    at = logits[query] if logits.dim() == 2 else logits
    if at.shape[-1] < 2:
        return {"reason": "one output only: there is no runner-up to compare with"}
    answer, wrong = at.topk(2).indices.tolist()
    try:
        found = logit_attribution(model, *inputs, answer=answer, wrong=wrong, position=query)
    except InputError as err:
        return {"reason": str(err)}
    names = token_labels(tokenizer, [answer, wrong]) if tokens else [f"class {answer}", f"class {wrong}"]
    return {"answer": names[0], "wrong": names[1], "total": round(float(found.total[0]), 5),
            "shares": {name: round(float(value), 5) for name, value in zip(found.names, found.values[:, 0],
                                                                           strict=True)}}


def _stage_shares(stage: dict, attribution: dict, *, prefix: str) -> dict:
    """A stage's direct shares: the embeddings', an FFN's, an attention sublayer's per head (its bias beside); the
    writers' names start with `prefix` (an encoder-decoder's "decoder.")."""
    shares = attribution.get("shares")
    if shares is None:
        return {}
    if stage["stage"] == "embedding":
        return {"dla": shares["embed"]}
    if stage["stage"] == "mlp":
        return {"dla": shares[f"{prefix}blocks.{stage['block']}.mlp"]}
    if stage["stage"] in ("attn", "cross_attn"):
        site = f"{prefix}blocks.{stage['block']}.{stage['stage']}"
        heads = [v for k, v in shares.items() if k.startswith(f"{site} head ")]
        return {"dla": round(sum(heads) + shares.get(f"{site} bias", 0.0), 5), "dla_heads": heads}
    return {}


def _write_stage(stack: TransformerStack, config, write, query: int, length: int, context: int | None) -> dict:
    """One sublayer's stage: its label and shapes from the module and the config, its write at the query token;
    `context`: the source's length, which a cross-attention reads."""
    block = stack.blocks[write.block]
    out = {"stage": write.sublayer, "block": write.block, "shape": list(write.out.shape[1:]),
           "norm": round(float(write.out[0, query].float().norm()), 5),
           "share": round(float(write.share()[0, query]), 5)}
    if write.sublayer == "mlp":
        out["label"] = f"FFN {config.d_model} -> {config.d_ff} -> {config.d_model} ({config.activation})"
        return out
    attention = block.cross_attn if write.sublayer == "cross_attn" else block.self_attn
    heads = f"{attention.n_heads} heads" + (f", {attention.n_kv_heads} key/value heads" if
                                            attention.n_kv_heads != attention.n_heads else "")
    if write.sublayer == "cross_attn":
        out["label"] = f"cross-attention: {heads}, each target token over the {context} source tokens' memory"
        out["weights_shape"] = [attention.n_heads, length, context]  # (H, T, S)
        return out
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
