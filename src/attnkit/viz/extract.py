"""A model's attention over one text as `AttentionMaps`, from the model as it runs (its fast path included).

    decoder LM          text (BOS text where the tokenizer starts its texts with BOS) -> causal self-attention
    decoder tagger      [CLS] text [SEP] (a converted one: as its tokenizer frames it) -> causal self-attention
    encoder             [CLS] text [SEP] (a converted one: as its tokenizer frames it) -> self-attention
    encoder-decoder     source EOS -> encoder self-attention
    (Transformer or     BOS target -> decoder causal self-attention
     recurrent)         target rows x source columns -> cross-attention (the alignment, Bahdanau et al. 2015, fig. 3)

Tokens are laid out as the training data lays them out (`attnkit.tasks.reading.text_frame`). A cross-attention row
is labelled with the target token written at that step (the decoder reads BOS y1 .. yn and writes y1 .. yn EOS), so
the row of "chat" is the attention that wrote "chat". The weights are recomputed on request
(`models/attention_capture.py`): the model keeps none of them, and only the layers asked for are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from attnkit.errors import InputError
from attnkit.models.attention_capture import AttentionSite, attention_sites, capture_attention
from attnkit.models.greedy import check_fits, translation_pair
from attnkit.models.modes import evaluating
from attnkit.tasks.reading import Frame, text_frame
from attnkit.tokenize import Tokenizer, encode_some
from attnkit.viz.labels import token_labels
from attnkit.viz.maps import AttentionMaps


def is_translator(model: nn.Module) -> bool:
    """Whether `model` reads a source and writes a target (`encode` and `decode`, as encoder-decoders have)."""
    return callable(getattr(model, "encode", None)) and callable(getattr(model, "decode", None))


@torch.no_grad()
def attention_maps(
    model: nn.Module,
    tokenizer: Tokenizer,
    text: str,
    *,
    target: str | None = None,
    translate: bool = False,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    max_length: int = 64,
    context: int | None = None,
    frame: Frame = "attnkit",
) -> list[AttentionMaps]:
    """The attention of `model` over `text`, one `AttentionMaps` per kind it has (self, causal, cross).

    For a translation model `text` is the source and `target` its translation, or with `translate=True` the
    model's own greedy translation (at most `max_length` tokens: BOS and they must fit the model's context), whose
    last row is labelled with what the model writes next (EOS, unless cut short). `layers` and `heads` pick model
    indices (default all). `context`: the model's max_seq_len, where the tokens it reads (the text as framed, the
    source with EOS, the target with BOS) must fit, as generation holds a prompt to it. A text the model reads alone
    is framed as it learned to read one (`text_frame`, with `frame` the run's `frame_of`): a converted Llama's after
    BOS, a tagger's between its marks, a converted tagger's as its own tokenizer frames it.
    Raises `InputError` for an empty text, a text of no token (a tokenizer that skips unknown characters dropped every
    one), a text longer than `context`, a layer or head out of range, a model without attention, or a
    target/translate for a model that does not translate.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError("the text is empty; give a text whose attention to draw (--text \"...\")")
    translator = is_translator(model)
    if (target is not None or translate) and not translator:
        raise InputError(
            "--target and --translate need a translation model (an encoder-decoder run); this model reads one "
            "text: give --text alone"
        )
    if translator and target is None and not translate:
        raise InputError("a translation model attends from a target to the source: give --target TEXT or --translate")
    if target is not None and translate:
        raise InputError("give --target TEXT or --translate, not both")
    sites = attention_sites(model)
    if not sites:
        raise InputError(f"this model ({type(model).__name__}) has no attention to draw; train one with attention")
    with evaluating(model):  # dropout off while read (a greedy translation too); its modes given back after
        device = next(model.parameters()).device
        if translator:
            pair = translation_pair(model, tokenizer, text, None if translate else target, max_length=max_length,
                                    instead="give --target TEXT instead", context=context)  # the source checked first
            source, decoder_input = pair.source, pair.decoder_input
            tokens = {"self": (source, source), "causal": (decoder_input, decoder_input),
                      "cross": (pair.predicted, source)}
            src = torch.tensor([source], device=device)  # (1, S)
            tgt = torch.tensor([decoder_input], device=device)  # (1, T)
            run = partial(model, src, tgt)
        else:
            text_ids = encode_some(tokenizer, text, "the text")  # refused before framing: marks alone are no text
            before, after = text_frame(model, tokenizer, frame)
            ids = [*before, *text_ids, *after]
            tokens = {"self": (ids, ids), "causal": (ids, ids)}
            check_fits(ids, "text", context)
            inputs = torch.tensor([ids], device=device)
            run = partial(model, inputs)
        chosen = _choose(sites, layers, heads)
        with capture_attention(model, sites=chosen) as captured:
            output = run()
        if translator and translate:  # the last row writes what the model writes next: EOS, or more when cut short
            tokens["cross"] = ([*pair.written, int(output.logits[0, -1].argmax())], pair.source)
        return [_maps(kind, captured, [s for s in chosen if s.kind == kind], tokens[kind], tokenizer, heads)
                for kind in ("self", "causal", "cross") if any(s.kind == kind for s in chosen)]


def _choose(sites: list[AttentionSite], layers: Sequence[int] | None, heads: Sequence[int] | None):
    """The sites of the asked layers; InputError naming the valid range for a layer or head out of it."""
    n_layers = max(s.layer for s in sites) + 1
    for layer in layers or ():
        if not 0 <= layer < n_layers:
            raise InputError(f"layer {layer} is out of range: this model's layers are 0..{n_layers - 1}")
    n_heads = min(_heads(s.module) for s in sites)
    for head in heads or ():
        if not 0 <= head < n_heads:
            raise InputError(f"head {head} is out of range: this model's heads are 0..{n_heads - 1}")
    chosen = [s for s in sites if layers is None or s.layer in layers]
    if not chosen:
        raise InputError("no layer chosen: give at least one layer (--layers 0 1)")
    return chosen


def _heads(module: nn.Module) -> int:
    return getattr(module, "n_heads", 1)  # a recurrent decoder's attention has one head


def _maps(kind, captured, sites, tokens, tokenizer, heads) -> AttentionMaps:
    """Stack the captured weights of `sites` (one kind) into (L, H, T, S) for the first (only) sequence."""
    per_layer = [torch.cat(captured[s], dim=2)[0] for s in sites]  # each (H, T, S); a recurrent site: per step
    weights = torch.stack(per_layer).float()  # (L, H, T, S)
    n_heads = weights.shape[1]
    head_ids = list(heads) if heads is not None else list(range(n_heads))
    weights = weights[:, head_ids]
    query_ids, key_ids = tokens
    return AttentionMaps(kind, weights.cpu().numpy(), token_labels(tokenizer, query_ids),
                         token_labels(tokenizer, key_ids), [s.layer for s in sites], head_ids)
