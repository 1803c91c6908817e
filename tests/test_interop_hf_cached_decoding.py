"""Decoding through the KV cache equals transformers' decoding through its own cache, step by step: the logits of a
prefill and of each single-token step after it, for GPT-2, Llama (grouped-query), Mistral with a window narrower
than the sequence (so steps drop keys from the rolling cache) and Marian (cross-attention read from the cache)."""

import pytest
import torch
from interop_models import VOCAB, hf_model, mistral_config

from attnkit.interop import hf

# past_key_values, which every transformers from 4.40 takes (5.x names it `cache` and warns of the old name)
pytestmark = pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
PREFILL, LENGTH = 4, 11


def _ids(seed: int, length: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(3, vocab, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["gpt2", "llama", "llama-tied", "mistral-narrow"])
def test_decoder_steps_equal_transformers_cached_steps(tmp_path, name):
    config = mistral_config(sliding_window=3) if name == "mistral-narrow" else None
    reference = hf_model(name.removesuffix("-narrow"), tmp_path, config=config)
    model = hf.load(tmp_path).model
    ids = _ids(0, LENGTH)
    cache = model.allocate_cache(2, LENGTH)
    with torch.no_grad():
        theirs = reference(ids[:, :PREFILL], use_cache=True)
        ours = model(ids[:, :PREFILL], cache=cache)
        torch.testing.assert_close(ours.logits, theirs.logits, **TOLERANCE)
        for t in range(PREFILL, LENGTH):
            theirs = reference(ids[:, t : t + 1], past_key_values=theirs.past_key_values, use_cache=True)
            ours = model(ids[:, t : t + 1], cache=cache)
            torch.testing.assert_close(ours.logits, theirs.logits, **TOLERANCE)
    assert cache.length == LENGTH


def test_marian_decoder_steps_equal_transformers_cached_steps(tmp_path):
    reference = hf_model("marian-two-vocabularies", tmp_path)
    model = hf.load(tmp_path).model
    src, tgt = _ids(1, 9), _ids(2, 7, vocab=reference.config.decoder_vocab_size)
    src_mask = torch.ones(2, 9, dtype=torch.long)
    src_mask[1, 6:] = 0
    cache = model.allocate_cache(2, 7)
    with torch.no_grad():
        encoded = reference.get_encoder()(input_ids=src, attention_mask=src_mask)
        memory = model.encode(src, src_mask=src_mask.bool())
        torch.testing.assert_close(memory[src_mask.bool()], encoded.last_hidden_state[src_mask.bool()], **TOLERANCE)
        past = None
        for t in range(7):
            theirs = reference(encoder_outputs=encoded, attention_mask=src_mask, decoder_input_ids=tgt[:, t : t + 1],
                               past_key_values=past, use_cache=True)
            past = theirs.past_key_values
            ours = model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask.bool(), cache=cache)
            torch.testing.assert_close(ours.logits, theirs.logits, **TOLERANCE)
