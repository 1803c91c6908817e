"""Training parity with transformers: on the same weights and batch, attnkit's loss and the gradient of every
parameter equal the reference's (GPT-2, Llama with grouped heads, BERT's masked LM, Marian). Gradients are carried
into the Hugging Face layout by the converter users export with (`to_hf_tensors`), so fused and transposed tensors
(GPT-2's c_attn, Conv1D weights) are compared as transformers holds them."""

import copy

import pytest
import torch
from interop_models import batch, hf_model

from attnkit.interop import hf
from attnkit.interop.hf_weights import add_prefix, to_hf_tensors
from attnkit.interop.keymaps import FAMILIES

TOLERANCE = dict(atol=1e-5, rtol=1e-4)


def _losses(name, reference, model):
    """(reference loss, attnkit loss) on one padded batch, with -100 at padding; eval mode (no dropout)."""
    ids, mask = batch(4)
    if name.startswith("marian"):
        tgt, tgt_mask = batch(5, length=7)
        labels = torch.roll(tgt, -1, dims=1).masked_fill(tgt_mask == 0, -100)
        return (reference(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask,
                          labels=labels).loss,
                model(ids, tgt, src_mask=mask, tgt_mask=tgt_mask, labels=labels).loss)
    labels = ids.masked_fill(mask == 0, -100)
    if name == "bert-mlm":
        return (reference(input_ids=ids, attention_mask=mask, labels=labels).loss,
                model(ids, attention_mask=mask, labels=labels).loss)
    shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)  # attnkit: the token after t
    return reference(input_ids=ids, attention_mask=mask, labels=labels).loss, model(ids, attention_mask=mask,
                                                                                    labels=shifted).loss


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert-mlm", "marian"])
def test_loss_and_every_gradient_equal_transformers(tmp_path, name):
    reference = hf_model(name, tmp_path)
    loaded = hf.load(tmp_path)
    model = loaded.model.eval()
    theirs, ours = _losses(name, reference, model)
    torch.testing.assert_close(ours, theirs, **TOLERANCE)
    theirs.backward()
    ours.backward()
    gradients = copy.deepcopy(model)  # the same modules holding the gradients, to be laid out as transformers' are
    with torch.no_grad():
        for parameter, grad in zip(model.parameters(), gradients.parameters(), strict=True):
            grad.copy_(parameter.grad)
    family = FAMILIES[loaded.model_type]
    ours_hf = add_prefix(to_hf_tensors(gradients, family, loaded.config), family)
    reference_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    compared = set(ours_hf) & set(reference_grads)
    uncompared = {n for n in set(reference_grads) - compared if not n.endswith("embed_positions.weight")}
    assert not uncompared  # every trained tensor (Marian's sinusoids, a fixed table in attnkit, aside)
    for tensor_name in sorted(compared):
        torch.testing.assert_close(ours_hf[tensor_name], reference_grads[tensor_name], **TOLERANCE,
                                   msg=lambda text, tensor_name=tensor_name: f"{tensor_name}: {text}")
