"""attnkit.inspect's gradient methods against TransformerLens on one random GPT-2 (Hugging Face weights loaded by
both, TransformerLens through its `TransformerBridge`, no weight processing): the gradient cache equals
`run_with_cache(incl_bwd=True)`'s; direct logit attribution per head equals the one built from TransformerLens's
own stacked head results and final-norm scale, and every writer's share its `decompose_resid` parts'; attribution
patching per head and per FFN and position equals `tools.analysis.attribution_patching.attribution_patch`'s node
scores (TransformerLens 4.3), and per head and position, for each head's output, queries, keys, values and pattern,
the same sum formed from its hooks' activations and gradients. Skipped where TransformerLens is not installed."""

import pytest
import torch
import torch.nn.functional as F
from interop_models import VOCAB
from transformer_lens_pairs import lens_pair, transformer_lens

from attnkit.inspect import Batch
from attnkit.inspect.attribution import attribute_heads, attribute_sublayers
from attnkit.inspect.gradients import backward_trace
from attnkit.inspect.logit_attribution import logit_attribution

transformer_lens()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return lens_pair("gpt2", tmp_path_factory.mktemp("gpt2"))


IDS = torch.tensor([[5, 17, 33, 8, 61, 4, 9], [42, 7, 90, 3, 3, 18, 12]])
CORRUPTED = torch.tensor([[5, 17, 70, 8, 61, 4, 9], [42, 7, 71, 3, 3, 18, 12]])  # position 2 substituted
ANSWER, WRONG = 11, 43
POINTS = {"blocks.0.attn.z": "blocks.0.attn.hook_z", "blocks.1.resid_pre": "blocks.1.hook_resid_pre",
          "blocks.0.mlp.hidden": "blocks.0.mlp.hook_post", "blocks.1.attn.pattern": "blocks.1.attn.hook_pattern"}


def test_the_gradient_cache_equals_transformer_lens(pair):
    model, bridge = pair
    loss, cache = bridge.run_with_cache(IDS, return_type="loss", incl_bwd=True)

    def metric(output):  # TransformerLens's loss: the mean next-token cross-entropy
        return F.cross_entropy(output.logits[:, :-1].reshape(-1, VOCAB), IDS[:, 1:].reshape(-1))

    found = backward_trace(model, IDS, metric=metric, names=list(POINTS))
    assert found.value == pytest.approx(float(loss), abs=1e-5)
    for ours, theirs in POINTS.items():
        expected = cache[f"{theirs}_grad"].reshape(found.grads[ours].shape)
        torch.testing.assert_close(found.grads[ours], expected, rtol=1e-4, atol=1e-6)


def _logit_difference(logits):
    """The metric TransformerLens's attribution patching differentiates: the batch's mean logit difference."""
    return logits[:, -1, ANSWER].mean() - logits[:, -1, WRONG].mean()


def test_direct_logit_attribution_per_head_equals_transformer_lens(pair):
    model, bridge = pair
    answer, wrong = torch.tensor([5, 6]), torch.tensor([7, 8])
    _, cache = bridge.run_with_cache(IDS)
    heads, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True, apply_ln=False)  # (N, B, C)
    scale = cache["ln_final.hook_scale"][:, -1]  # (B, 1): the final LayerNorm's scale, frozen
    norm = model.stack.final_norm
    centred = heads - heads.mean(-1, keepdim=True)
    direction = model.lm_head.weight[answer] - model.lm_head.weight[wrong]  # (B, C)
    expected = (centred / scale * norm.weight * direction).sum(-1)  # (N, B)
    found = logit_attribution(model, IDS, answer=answer, wrong=wrong)
    sites = [label[1:].split("H") for label in labels]  # "L1H3" -> layer 1, head 3
    ours = torch.stack([found[f"blocks.{layer}.attn head {head}"] for layer, head in sites])
    torch.testing.assert_close(ours, expected.detach().float(), rtol=1e-4, atol=1e-5)


def test_every_writers_direct_share_equals_transformer_lens_decompose_resid(pair):
    """The embeddings, the positions, each sublayer (a sublayer's heads and o_proj bias together) through the final
    LayerNorm with its scale frozen: TransformerLens's `decompose_resid` parts, each dotted with the same direction."""
    model, bridge = pair
    answer, wrong = torch.tensor([5, 6]), torch.tensor([7, 8])
    _, cache = bridge.run_with_cache(IDS)
    parts, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)  # (N, B, C)
    scale = cache["ln_final.hook_scale"][:, -1]  # (B, 1)
    direction = model.lm_head.weight[answer] - model.lm_head.weight[wrong]  # (B, C)
    centred = parts - parts.mean(-1, keepdim=True)
    theirs = dict(zip(labels, (centred / scale * model.stack.final_norm.weight * direction).sum(-1), strict=True))
    found = logit_attribution(model, IDS, answer=answer, wrong=wrong, positions=True)
    ours = {"embed": found["embed"], "pos_embed": found["pos_embed"]}
    for layer in (0, 1):
        ours[f"{layer}_attn_out"] = sum(found[n] for n in found.names if n.startswith(f"blocks.{layer}.attn "))
        ours[f"{layer}_mlp_out"] = found[f"blocks.{layer}.mlp"]
    assert list(ours) == labels
    for name in labels:
        torch.testing.assert_close(ours[name], theirs[name].detach().float(), rtol=1e-4, atol=1e-5, msg=name)


def test_attribution_patching_equals_transformer_lens_attribution_patch(pair):
    """TransformerLens scores each node (a head at a position, an FFN's output at a position) with
    (a_clean - a_corrupted) . d metric / d a at the corrupted run, per pair of prompts, averaged; attnkit reports the
    same sums as shares of the clean - corrupted gap, a head's over every position."""
    from transformer_lens.tools.analysis.attribution_patching import attribution_patch

    model, bridge = pair
    nodes = attribution_patch(bridge, IDS, CORRUPTED, _logit_difference).node_scores
    theirs = {"heads": torch.zeros(2, 4), "ffns": torch.zeros(2, IDS.shape[1])}  # (L, H), (L, T)
    for node, score in nodes.items():
        if node.kind == "attn_head_out":
            theirs["heads"][node.layer, node.head] += score
        elif node.kind == "mlp_out":
            theirs["ffns"][node.layer, node.position] += score
    heads = attribute_heads(model, Batch((IDS,)), Batch((CORRUPTED,)), answer=ANSWER, wrong=WRONG)
    sublayers = attribute_sublayers(model, Batch((IDS,)), Batch((CORRUPTED,)), answer=ANSWER, wrong=WRONG)
    gap = heads.clean - heads.corrupted
    ffns = [i for i, row in enumerate(sublayers.rows) if row.endswith(".mlp")]
    torch.testing.assert_close(heads.restored * gap, theirs["heads"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sublayers.restored[ffns] * gap, theirs["ffns"], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def gpt2_and_llama(request, pair, tmp_path_factory):
    return pair if request.param == "gpt2" else lens_pair("llama", tmp_path_factory.mktemp("llama"))


def test_attribution_patching_per_position_and_head_equals_transformer_lens(gpt2_and_llama):
    """Each head's output, queries, keys, values and pattern at each (query) position: attnkit's
    `attribute_heads(by_position=True, point=)` against the same sum, (a_clean - a_corrupted) . d metric / d a at the
    corrupted run, formed from TransformerLens's hooks (`cache_activation_and_gradient` at `hook_z`, `hook_q`,
    `hook_k`, `hook_v`, `hook_pattern`, a pattern summed over its keys); a head's output also against
    `attribution_patch`'s node scores, which are per head and position. On the Llama-style model (GQA 4/2) keys and
    values are estimated per key/value head, as TransformerLens's hooks hold them."""
    from transformer_lens.tools.analysis.attribution_patching import attribution_patch, cache_activation_and_gradient

    model, bridge = gpt2_and_llama
    kv_heads = model.stack.blocks[0].self_attn.n_kv_heads
    hooks = {point: [f"blocks.{layer}.attn.hook_{point}" for layer in (0, 1)] for point in ("z", "q", "k", "v",
                                                                                            "pattern")}
    names = [name for names in hooks.values() for name in names]
    _, clean_cache = bridge.run_with_cache(IDS, names_filter=names)
    # the embeddings cached too: the most upstream point's gradient is not delivered (its hook never fires), and
    # layer 0's q, k and v would be it
    found = cache_activation_and_gradient(bridge, CORRUPTED, _logit_difference, names_filter=[*names, "hook_embed"])
    nodes = attribution_patch(bridge, IDS, CORRUPTED, _logit_difference).node_scores
    from_nodes = torch.zeros(2, IDS.shape[1], 4)  # (L, T, H)
    for node, score in nodes.items():
        if node.kind == "attn_head_out":
            from_nodes[node.layer, node.position, node.head] += score
    for point, names in hooks.items():
        theirs = []
        for name in names:
            effect = (clean_cache[name] - found.activations[name]) * found.gradients[name]
            theirs.append(effect.sum((0, 3)).T if point == "pattern" else effect.sum((0, 3)))  # (T, H)
        ours = attribute_heads(model, Batch((IDS,)), Batch((CORRUPTED,)), answer=ANSWER, wrong=WRONG,
                               by_position=True, point=point)
        heads = kv_heads if point in ("k", "v") else 4
        assert ours.columns == "position x head" and ours.restored.shape == (2, IDS.shape[1], heads), point
        effects = ours.restored * (ours.clean - ours.corrupted)  # the shares back in the metric's units
        torch.testing.assert_close(effects, torch.stack(theirs), rtol=1e-4, atol=1e-6, msg=point)
        assert float(effects.abs().max()) > 1e-3, point  # some head at some position moves the answer
    z = attribute_heads(model, Batch((IDS,)), Batch((CORRUPTED,)), answer=ANSWER, wrong=WRONG, by_position=True)
    torch.testing.assert_close(z.restored * (z.clean - z.corrupted), from_nodes, rtol=1e-4, atol=1e-6)
