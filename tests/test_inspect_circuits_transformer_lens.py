"""attnkit.inspect's weight-space circuits against TransformerLens on a random GPT-2 and a Llama-style model (GQA 4/2,
RoPE, RMSNorm), the same Hugging Face weights loaded by both (TransformerLens through its `TransformerBridge`, no
weight processing, so attnkit's norms are left unfolded too): each head's QK and OV singular values, the full OV
circuit's (W_E W_OV W_U), and Q-, K- and V-composition scores between every head of layer 0 and every head of layer 1
(`TransformerBridge.all_composition_scores`). TransformerLens's W_QK carries no rotation, which is attnkit's at its
default offset 0 (R(0) = I). Skipped where TransformerLens is not installed."""

import pytest
import torch
from transformer_lens_pairs import lens_pair, transformer_lens

from attnkit.inspect.circuits import composition_scores, full_ov, head_weights

transformer_lens()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    return lens_pair(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("layer", [0, 1])
def test_qk_and_ov_singular_values_equal_transformer_lens(pair, layer):
    model, bridge = pair
    weights = head_weights(model, f"blocks.{layer}.attn", fold_norms=False)
    with torch.no_grad():
        theirs = {"qk": bridge.QK[layer].S, "ov": bridge.OV[layer].S}  # (H, D)
    ours = {"qk": weights.qk().singular_values(), "ov": weights.ov().singular_values()}  # (H, D)
    for circuit in ("qk", "ov"):
        torch.testing.assert_close(ours[circuit], theirs[circuit], rtol=1e-5, atol=1e-5)


def test_full_ov_singular_values_equal_transformer_lens(pair):
    model, bridge = pair
    for layer in (0, 1):
        with torch.no_grad():
            theirs = (bridge.W_E @ bridge.OV[layer] @ bridge.W_U).S  # (H, D): rank D of a (V, V) matrix
        ours = full_ov(model, f"blocks.{layer}.attn", fold_norms=False).singular_values()
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)


def test_composition_scores_equal_transformer_lens(pair):
    model, bridge = pair
    found = composition_scores(model, fold_norms=False)
    for kind in "qkv":
        with torch.no_grad():
            theirs = bridge.all_composition_scores(kind.upper()).scores  # (L, H, L, H), zero where not composing
        ours = found.table(kind, "blocks.0.attn", "blocks.1.attn")  # (H sender, H receiver)
        torch.testing.assert_close(ours, theirs[0, :, 1, :], rtol=1e-5, atol=1e-6)
