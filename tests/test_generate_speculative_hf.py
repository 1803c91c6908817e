"""Speculative decoding against transformers' assisted generation (generate(assistant_model=...)): a tiny random
GPT-2 or Llama target with a one-layer draft of its family, both converted with `attnkit.interop.hf`; greedy, both
write the target's own text, token for token."""

import pytest
import torch
from interop_models import PAD, hf_model

from attnkit.generate.speculative import speculative_generate
from attnkit.interop import hf

PROMPTS = [[5, 17, 33, 8, 61, 4], [42, 7], [9, 9, 80, 3, 11, 12, 13]]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_speculative_text_equals_transformers_assisted_generation(tmp_path, name):
    target_ref = hf_model(name, tmp_path / "target", seed=0)
    config = target_ref.config.__class__(**{**target_ref.config.to_dict(), "n_layer": 1, "num_hidden_layers": 1})
    draft_ref = hf_model(name, tmp_path / "draft", seed=1, config=config)
    target, draft = hf.load(tmp_path / "target"), hf.load(tmp_path / "draft")
    assert len(draft.model.stack.blocks) == 1
    for model in (target_ref, draft_ref):
        model.generation_config.eos_token_id = None  # the full 12 tokens, as attnkit writes without stop ids
    for prompt in PROMPTS:  # transformers' assisted generation takes one text at a time
        ours, stats = speculative_generate(target.model, draft.model, [prompt], max_new_tokens=12, draft_tokens=3,
                                           context_len=min(target.config.max_seq_len, draft.config.max_seq_len))
        with torch.no_grad():
            theirs = target_ref.generate(torch.tensor([prompt]), assistant_model=draft_ref, do_sample=False,
                                         max_new_tokens=12, pad_token_id=PAD)
        assert theirs[0, len(prompt):].tolist() == ours[0]
        assert stats.drafted > 0
