"""attnkit's integrated gradients against Captum's `LayerIntegratedGradients` (Kokhlikyan et al. 2020, the reference
implementation PyTorch users reach for), on the same model, tokens and target: Captum hooks the token-embedding table
itself, interpolates between the embeddings of the input and of a baseline input, and sums the gradient by the same
midpoint rule (`method="riemann_middle"`); the baseline's token row is set to zero so that its embedding is attnkit's
default zero baseline. Skipped where Captum is not installed (`pip install --no-deps --target /tmp/captumpkgs captum`
and `PYTHONPATH=/tmp/captumpkgs`)."""

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.inspect.integrated_gradients import integrated_gradients
from attnkit.models import build_model

captum_attr = pytest.importorskip("captum.attr", reason=(
    "Captum is not installed (pip install captum; it is no dependency of attnkit, only its reference here)"))

VOCAB, STEPS = 30, 16
CASES = {
    "decoder, RoPE": dict(family="decoder", position="rope"),
    "decoder, learned positions": dict(family="decoder", position="learned"),
    "classifier": dict(family="encoder", encoder_head="classify", n_classes=3),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_integrated_gradients_equal_captum_layer_integrated_gradients(kind):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=24, max_seq_len=16, n_layers=2,
                                    **CASES[kind])).double().eval()  # float64: the two sums agree to its precision
    table = model.stack.embeddings.token  # the module whose output is the `embed` point
    with torch.no_grad():
        table.weight[0] = 0.0  # token 0 embeds to zeros: Captum's baseline input, attnkit's zero baseline
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    target, position = torch.tensor([1, 2]), 3
    classifier = kind == "classifier"

    def logits(tokens):  # (B, V) at the position read, or the classifier's (B, classes)
        out = model(tokens).logits
        return out if classifier else out[:, position]

    lens = captum_attr.LayerIntegratedGradients(logits, table)
    theirs, delta = lens.attribute(ids, baselines=torch.zeros_like(ids), target=target, n_steps=STEPS,
                                   method="riemann_middle", return_convergence_delta=True)  # (B, T, C), (B,)
    ours = integrated_gradients(model, ids, target=target, position=position, steps=STEPS)
    assert float(theirs.abs().max()) > 1e-3  # attributions of a real size
    torch.testing.assert_close(ours.attributions["embed"], theirs, rtol=1e-9, atol=1e-12)
    # Captum's convergence delta is the sum of attributions minus f(x) - f(baseline): attnkit's completeness gap.
    # Captum runs the two ends as a batch of their own, and the norms compute in float32 (layers/norms.py), so the
    # ends' logits round apart by about float32's precision
    assert float(delta.abs().max()) > 1e-6  # 16 steps leave a gap to compare
    torch.testing.assert_close(ours.completeness_gap(), delta, rtol=0, atol=1e-7)
