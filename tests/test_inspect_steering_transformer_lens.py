"""Activation addition against TransformerLens on a random GPT-2 and a Llama-style model (the same Hugging Face
weights loaded by both, `transformer_lens_pairs`): the contrast vector equals the difference of `run_with_cache`'s
`hook_resid_pre`, and steering with it (position-aligned, as ActAdd adds it, and a (C,) vector from a position on)
equals `run_with_hooks` adding the same vector at the same hook. Skipped where TransformerLens is not installed."""

import pytest
import torch
from transformer_lens_pairs import lens_pair, transformer_lens

from attnkit.inspect.steering import contrast_vector, steering

transformer_lens()

PROMPT = torch.tensor([[5, 17, 33, 8, 61, 4, 9]])
POSITIVE, NEGATIVE = torch.tensor([[12, 40, 7]]), torch.tensor([[90, 3, 7]])  # a contrast pair of 3 tokens


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    return lens_pair(request.param, tmp_path_factory.mktemp(request.param))


def _adding(vector, coeff, start):
    """A TransformerLens hook adding coeff * vector at positions start.. (a (n, C) vector: start .. start + n - 1)."""
    def hook(resid, hook):  # (B, T, C)
        resid = resid.clone()
        if vector.dim() == 1:
            resid[:, start:] += coeff * vector
        else:
            resid[:, start:start + vector.shape[0]] += coeff * vector[: resid.shape[1] - start]
        return resid

    return hook


@pytest.mark.parametrize("layer", [0, 1])
def test_steering_equals_run_with_hooks_adding_the_vector(pair, layer):
    model, bridge = pair
    point, hook_name = f"blocks.{layer}.resid_pre", f"blocks.{layer}.hook_resid_pre"
    ours = contrast_vector(model, point, POSITIVE, NEGATIVE)  # (3, C)
    with torch.no_grad():
        reads = [bridge.run_with_cache(ids)[1][hook_name][0] for ids in (POSITIVE, NEGATIVE)]  # (3, C) each
    torch.testing.assert_close(ours, reads[0] - reads[1], rtol=1e-5, atol=2e-5)
    with torch.no_grad():
        plain = model(PROMPT).logits
    for vector, coeff, start in ((ours, 4.0, 0), (ours, -2.0, 2), (ours.mean(0), 3.0, 4)):
        with steering(model, point, vector, coeff=coeff, start=start), torch.no_grad():
            steered = model(PROMPT).logits
        with torch.no_grad():
            theirs = bridge.run_with_hooks(PROMPT, fwd_hooks=[(hook_name, _adding(vector, coeff, start))])
        assert (steered - plain).abs().max() > 1e-3  # the vector moves the output
        torch.testing.assert_close(steered, theirs, rtol=1e-5, atol=5e-5, msg=f"{tuple(vector.shape)} from {start}")
