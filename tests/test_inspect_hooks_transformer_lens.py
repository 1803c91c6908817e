"""attnkit.inspect's hooks and activation analyses against TransformerLens on a random GPT-2 and a Llama-style model
(GQA 4/2, RoPE, RMSNorm), the same Hugging Face weights loaded by both (TransformerLens through its
`TransformerBridge`, no weight processing): every cached activation equals `run_with_cache`'s; activation patching
of the stream, of each block's writers and of each head's output, queries, keys, values and pattern equals
`transformer_lens.patching`'s; the logit lens equals `accumulated_resid`
through the final norm and the unembedding; ablations and other edits equal the same edit made by
`run_with_hooks`; head-type scores equal `head_detector.detect_head`'s; path patching equals
`get_act_patch_direct_path` where the FFNs write nothing. Skipped where TransformerLens is not installed."""

import pytest
import torch
from transformer_lens_pairs import lens_pair, transformer_lens

from attnkit.inspect import Batch, mean_ablate, patch, trace, zero_ablate
from attnkit.inspect.head_types import head_types, key_masks
from attnkit.inspect.logit_lens import logit_lens
from attnkit.inspect.patching import logit_differences, patch_heads, patch_stream
from attnkit.inspect.path_patching import path_patch

transformer_lens()

CLEAN = torch.tensor([[5, 17, 33, 8, 61, 4, 9], [42, 7, 90, 3, 3, 18, 12]])
CORRUPTED = torch.tensor([[5, 17, 70, 8, 61, 4, 9], [42, 7, 71, 3, 3, 18, 12]])  # position 2 substituted
OTHER = torch.tensor([[11, 12, 13, 14, 15, 16, 17], [20, 30, 40, 50, 60, 70, 80], [9, 8, 7, 6, 5, 4, 3]])
CAUSAL = torch.ones(7, 7).tril().bool()  # (T, S): the scores a causal model keeps

# attnkit's point -> TransformerLens's hook
POINTS = {"embed": "hook_embed", "blocks.0.resid_pre": "blocks.0.hook_resid_pre",
          "blocks.0.attn.q": "blocks.0.attn.hook_q", "blocks.0.attn.k": "blocks.0.attn.hook_k",
          "blocks.0.attn.v": "blocks.0.attn.hook_v", "blocks.0.attn.pattern": "blocks.0.attn.hook_pattern",
          "blocks.1.attn.pattern": "blocks.1.attn.hook_pattern", "blocks.1.attn.z": "blocks.1.attn.hook_z",
          "blocks.0.attn.out": "blocks.0.hook_attn_out", "blocks.0.mlp.hidden": "blocks.0.mlp.hook_post",
          "blocks.0.mlp.out": "blocks.0.hook_mlp_out", "blocks.1.resid_pre": "blocks.1.hook_resid_pre",
          "blocks.1.resid_post": "blocks.1.hook_resid_post", "final_norm": "ln_final.hook_out"}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    return lens_pair(request.param, tmp_path_factory.mktemp(request.param))


def test_the_cache_equals_run_with_cache(pair):
    model, bridge = pair
    _, cache = bridge.run_with_cache(CLEAN)
    found = trace(model, CLEAN)
    for ours, theirs in POINTS.items():
        torch.testing.assert_close(found[ours], cache[theirs], rtol=1e-5, atol=2e-5, msg=ours)
    # scores: attnkit's are before the causal mask, TransformerLens's after it; the kept ones agree
    torch.testing.assert_close(found["blocks.1.attn.scores"][..., CAUSAL],
                               cache["blocks.1.attn.hook_attn_scores"][..., CAUSAL], rtol=1e-5, atol=2e-5)
    if "pos_embed" in found.cache:  # GPT-2's absolute positions: one row for the batch, where TransformerLens repeats
        torch.testing.assert_close(found["pos_embed"].expand_as(cache["hook_pos_embed"]), cache["hook_pos_embed"])


def _target(model):
    """The clean answer and the corrupted run's at the last position, per row (B,) each."""
    with torch.no_grad():
        clean, corrupted = model(CLEAN).logits[:, -1], model(CORRUPTED).logits[:, -1]  # (B, V)
    answer, wrong = clean.argmax(-1), corrupted.argmax(-1)
    return answer, torch.where(wrong == answer, clean.topk(2).indices[:, 1], wrong)


def test_activation_patching_equals_transformer_lens_patching(pair):
    from transformer_lens import patching

    model, bridge = pair
    answer, wrong = _target(model)
    with torch.no_grad():
        clean, corrupted = (float(logit_differences(model(ids).logits, answer, wrong).mean())
                            for ids in (CLEAN, CORRUPTED))

    def restored(logits):  # the share of the logit difference a patch brings back, as attnkit reports it
        return (logit_differences(logits, answer, wrong).mean() - corrupted) / (clean - corrupted)

    _, clean_cache = bridge.run_with_cache(CLEAN)
    theirs = {"stream": patching.get_act_patch_resid_pre(bridge, CORRUPTED, clean_cache, restored),  # (L, T)
              "heads": patching.get_act_patch_attn_head_out_all_pos(bridge, CORRUPTED, clean_cache, restored)}  # (L, H)
    ours = {"stream": patch_stream(model, Batch((CLEAN,)), Batch((CORRUPTED,)), answer=answer, wrong=wrong),
            "heads": patch_heads(model, Batch((CLEAN,)), Batch((CORRUPTED,)), answer=answer, wrong=wrong)}
    for kind in ours:
        assert (ours[kind].clean, ours[kind].corrupted) == pytest.approx((clean, corrupted), abs=1e-5)
        torch.testing.assert_close(ours[kind].restored, theirs[kind], rtol=1e-4, atol=1e-4, msg=kind)
    assert float(theirs["stream"][0, 2]) == pytest.approx(1.0, abs=1e-4)  # the corrupted token's own embedding


def test_patching_each_sublayer_and_each_head_at_each_position_equals_transformer_lens(pair):
    """TransformerLens's `get_act_patch_attn_out`, `get_act_patch_mlp_out` (layer x position) and
    `get_act_patch_attn_head_out_by_pos` (layer x position x head) against `patch_stream(point=)` and
    `patch_heads(by_position=True)`."""
    from transformer_lens import patching

    model, bridge = pair
    answer, wrong = _target(model)
    clean_batch, corrupted_batch = Batch((CLEAN,)), Batch((CORRUPTED,))
    heads = patch_heads(model, clean_batch, corrupted_batch, answer=answer, wrong=wrong, by_position=True)
    clean, corrupted = heads.clean, heads.corrupted

    def restored(logits):
        return (logit_differences(logits, answer, wrong).mean() - corrupted) / (clean - corrupted)

    _, clean_cache = bridge.run_with_cache(CLEAN)
    theirs = {"attn.out": patching.get_act_patch_attn_out(bridge, CORRUPTED, clean_cache, restored),  # (L, T)
              "mlp.out": patching.get_act_patch_mlp_out(bridge, CORRUPTED, clean_cache, restored)}
    for point, table in theirs.items():
        ours = patch_stream(model, clean_batch, corrupted_batch, answer=answer, wrong=wrong, point=point)
        assert ours.rows == [f"blocks.{i}.{point.removesuffix('.out')}" for i in range(2)]
        torch.testing.assert_close(ours.restored, table, rtol=1e-4, atol=1e-4, msg=point)
    every = patching.get_act_patch_block_every(bridge, CORRUPTED, clean_cache, restored)  # (3, L, T): in, attn, mlp
    block_by_block = patch_stream(model, clean_batch, corrupted_batch, answer=answer, wrong=wrong,
                                  point=("resid_pre", "attn.out", "mlp.out"))
    assert block_by_block.rows == [f"blocks.{i}{part}" for i in range(2) for part in ("", ".attn", ".mlp")]
    torch.testing.assert_close(block_by_block.restored, every.transpose(0, 1).flatten(0, 1), rtol=1e-4, atol=1e-4)
    by_position = patching.get_act_patch_attn_head_out_by_pos(bridge, CORRUPTED, clean_cache, restored)  # (L, T, H)
    assert heads.columns == "position x head" and heads.restored.shape == by_position.shape
    torch.testing.assert_close(heads.restored, by_position, rtol=1e-4, atol=1e-4)
    assert float(by_position.abs().max()) > 0.05  # some head at some position carries part of the answer


def test_patching_each_heads_queries_keys_values_and_pattern_equals_transformer_lens(pair):
    """TransformerLens's `get_act_patch_attn_head_all_pos_every` (out, q, k, v, pattern: (5, L, H)) and
    `get_act_patch_attn_head_by_pos_every` ((5, L, T, H), a pattern by its query position) against
    `patch_heads(point=)` and `patch_heads(point=, by_position=True)`. On the Llama-style model (GQA 4/2) keys and
    values are patched per key/value head, each shared by two query heads, as TransformerLens patches them (its table
    pads those two columns with zeros)."""
    from transformer_lens import patching

    model, bridge = pair
    answer, wrong = _target(model)
    clean_batch, corrupted_batch = Batch((CLEAN,)), Batch((CORRUPTED,))
    ours = {point: patch_heads(model, clean_batch, corrupted_batch, answer=answer, wrong=wrong, point=point)
            for point in ("z", "q", "k", "v", "pattern")}
    clean, corrupted = ours["z"].clean, ours["z"].corrupted

    def restored(logits):
        return (logit_differences(logits, answer, wrong).mean() - corrupted) / (clean - corrupted)

    _, clean_cache = bridge.run_with_cache(CLEAN)
    theirs = patching.get_act_patch_attn_head_all_pos_every(bridge, CORRUPTED, clean_cache, restored)  # (5, L, H)
    kv_heads = model.stack.blocks[0].self_attn.n_kv_heads
    for index, (point, found) in enumerate(ours.items()):
        assert found.restored.shape[1] == (kv_heads if point in ("k", "v") else 4), point
        torch.testing.assert_close(found.restored, theirs[index, :, : found.restored.shape[1]], rtol=1e-4,
                                   atol=1e-4, msg=point)
        assert float(found.restored.abs().max()) > 0.01, point  # each patch moves the answer somewhere
    assert bool((theirs[2:4, :, kv_heads:] == 0).all())  # TransformerLens's padding of the key/value heads
    by_position = patching.get_act_patch_attn_head_by_pos_every(bridge, CORRUPTED, clean_cache, restored)  # (5,L,T,H)
    for index, point in enumerate(ours):  # each head at each (query) position alone
        found = patch_heads(model, clean_batch, corrupted_batch, answer=answer, wrong=wrong, point=point,
                            by_position=True)
        torch.testing.assert_close(found.restored, by_position[index, ..., : found.restored.shape[-1]], rtol=1e-4,
                                   atol=1e-4, msg=point)


def test_patching_an_encoder_equals_transformer_lens_where_both_patch_the_same_activation(tmp_path):
    """A converted BERT (post-norm, bidirectional) read at the corrupted position: the stream entering each block,
    each FFN's output and each head's output, queries, keys and values patched equal TransformerLens's patching
    through its bridge. Two of its BERT hooks are other activations: `hook_attn_out` is the attention sublayer after
    its residual add and norm (attnkit's `attn.out` is `o_proj`'s output, the bridge's `attn.o.hook_out`), and an
    edit of `hook_pattern` changes nothing there (each head's pattern patched restores 0 in TransformerLens)."""
    from transformer_lens import patching

    model, bridge = lens_pair("bert-mlm", tmp_path)
    with torch.no_grad():
        clean_logits, corrupted_logits = model(CLEAN).logits[:, 2], model(CORRUPTED).logits[:, 2]  # (B, V)
    answer, wrong = clean_logits.argmax(-1), corrupted_logits.argmax(-1)
    target = {"answer": answer, "wrong": wrong, "position": 2}
    clean_batch, corrupted_batch = Batch((CLEAN,)), Batch((CORRUPTED,))
    stream = patch_stream(model, clean_batch, corrupted_batch, **target, point=("resid_pre", "attn.out", "mlp.out"))
    heads = {point: patch_heads(model, clean_batch, corrupted_batch, **target, point=point)
             for point in ("z", "q", "k", "v", "pattern")}
    clean, corrupted = stream.clean, stream.corrupted
    assert clean - corrupted > 0.5  # the corruption moves the answer: shares of a real difference

    def restored(logits):
        return (logit_differences(logits, answer, wrong, 2).mean() - corrupted) / (clean - corrupted)

    _, clean_cache = bridge.run_with_cache(CLEAN)
    every = patching.get_act_patch_block_every(bridge, CORRUPTED, clean_cache, restored)  # (3, L, T)
    ours = stream.restored.unflatten(0, (2, 3)).transpose(0, 1)  # (3, L, T): in, attn, mlp
    for index in (0, 2):  # the stream entering each block and each FFN's output
        torch.testing.assert_close(ours[index], every[index], rtol=1e-4, atol=1e-4, msg=str(index))
    assert float((ours[1] - every[1]).abs().max()) > 0.01  # another activation: see the docstring
    theirs = patching.get_act_patch_attn_head_all_pos_every(bridge, CORRUPTED, clean_cache, restored)  # (5, L, H)
    for index, point in enumerate(("z", "q", "k", "v")):
        torch.testing.assert_close(heads[point].restored, theirs[index], rtol=1e-4, atol=1e-4, msg=point)
    assert float(theirs[4].abs().max()) < 1e-5 and float(heads["pattern"].restored.abs().max()) > 0.01


def test_the_logit_lens_equals_the_accumulated_residual_stream_unembedded(pair):
    model, bridge = pair
    _, cache = bridge.run_with_cache(CLEAN)
    stream, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)  # (L + 1, B, T, C), final norm each
    with torch.no_grad():
        theirs = bridge.unembed(stream)  # (L + 1, B, T, V)
    lens = logit_lens(model, CLEAN)
    assert labels == ["0_pre", "1_pre", "final_post"] and len(lens.layers) == 3
    torch.testing.assert_close(lens.logits, theirs, rtol=1e-5, atol=5e-5)


def _setting(index, value):
    """An edit that sets activation[index] to value (a function of the activation), taken by attnkit as
    (activation, point) and by TransformerLens as (activation, hook=point): the same function serves both."""
    def edit(activation, hook):
        activation = activation.clone()
        activation[index] = value(activation[index])
        return activation
    return edit


def _edits(model):
    """(attnkit's point, its edit, TransformerLens's hook, its function), each pair doing the same thing."""
    with torch.no_grad():
        reference = trace(model, OTHER, names=["blocks.0.attn.z"])["blocks.0.attn.z"]  # (3, T, H, D)
    every = slice(None)
    pushed = _setting((every, 4), lambda x: x + torch.linspace(-1, 1, x.shape[-1]))  # (B, T, C): position 4 moved
    doubled_q = _setting((every, every, 3), lambda x: 2 * x)  # (B, T, H, D): head 3's queries
    neurons_off = _setting((..., slice(0, 8)), torch.zeros_like)  # (B, T, d_ff): the first 8 neurons

    def sharper(scores, hook):  # (B, H, T, S); TransformerLens's are masked already, attnkit's after the point
        return torch.where(CAUSAL, scores * 3.0, scores)

    uniform = _setting((every, 1), lambda x: (CAUSAL / CAUSAL.sum(-1, keepdim=True)).expand_as(x))  # (B, T, S)

    return [
        ("blocks.1.attn.z", zero_ablate(head=2), "blocks.1.attn.hook_z", _setting((every, every, 2), torch.zeros_like)),
        ("blocks.0.attn.z", mean_ablate(reference, head=1), "blocks.0.attn.hook_z",
         _setting((every, every, 1), lambda x: reference[:, :, 1].mean((0, 1)).expand_as(x))),
        ("blocks.0.attn.z", patch(reference[:2], head=0, position=5), "blocks.0.attn.hook_z",
         _setting((every, 5, 0), lambda x: reference[:2, 5, 0])),
        ("blocks.0.attn.v", zero_ablate(head=1), "blocks.0.attn.hook_v", _setting((every, every, 1), torch.zeros_like)),
        ("blocks.1.resid_pre", pushed, "blocks.1.hook_resid_pre", pushed),
        ("blocks.0.attn.q", doubled_q, "blocks.0.attn.hook_q", doubled_q),
        ("blocks.0.mlp.hidden", neurons_off, "blocks.0.mlp.hook_post", neurons_off),
        ("blocks.1.attn.scores", lambda scores, _: scores * 3.0, "blocks.1.attn.hook_attn_scores", sharper),
        ("blocks.1.attn.pattern", uniform, "blocks.1.attn.hook_pattern", uniform),  # head 1 even over what it sees
    ]


def test_ablations_and_edits_equal_run_with_hooks(pair):
    model, bridge = pair
    with torch.no_grad():
        plain = model(CLEAN).logits
    for point, edit, hook_name, hook in _edits(model):
        ours = trace(model, CLEAN, names=[], edits={point: edit}).output.logits
        with torch.no_grad():
            theirs = bridge.run_with_hooks(CLEAN, fwd_hooks=[(hook_name, hook)])
        assert (ours - plain).abs().max() > 1e-3, point  # the edit changes the output
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=5e-5, msg=point)


def test_head_type_scores_equal_transformer_lens_head_detector(pair):
    """TransformerLens's `detect_head` ("mul") is the weight on the type's keys summed over every query, over the
    number of queries; attnkit's is the same sum over the queries that have such keys (module head_types), so the
    two differ by that count alone."""
    from transformer_lens.head_detector import detect_head

    model, bridge = pair
    prompt = " ".join(f"w{i}" for i in [5, 17, 33, 8, 61, 5, 17, 33, 8, 61, 40, 5])  # repeats: duplicates, induction
    tokens = bridge.to_tokens(prompt)  # (1, T), BOS first
    found = head_types(model, tokens)
    for kind in ("previous", "duplicate", "induction"):
        theirs = detect_head(bridge, prompt, f"{kind}_token_head" if kind != "induction" else "induction_head")
        counted = int(key_masks(tokens)[kind].any(-1).sum())  # queries that have such keys
        torch.testing.assert_close(found.scores[kind] * counted / tokens.shape[1], theirs, rtol=1e-5, atol=1e-6,
                                   msg=kind)


def _silent_ffns(gpt2):
    for block in gpt2.transformer.h:  # each FFN's output projection zero: the blocks write attention alone
        block.mlp.c_proj.weight.zero_()
        block.mlp.c_proj.bias.zero_()


@pytest.fixture(scope="module")
def attention_only(tmp_path_factory):
    return lens_pair("gpt2", tmp_path_factory.mktemp("silent"), prepare=_silent_ffns)


@pytest.mark.parametrize("via", ["q", "k", "v"])
def test_path_patching_equals_direct_path_patching_where_the_ffns_write_nothing(attention_only, via):
    """TransformerLens's `get_act_patch_direct_path` adds the sender's clean-minus-corrupted write to the receiver's
    own copy of the stream (the edge alone); attnkit's path patching (Wang et al. 2022) lets the FFNs between
    recompute, so paths through them count too. With FFNs that write nothing the two are one intervention."""
    from transformer_lens import patching

    model, bridge = attention_only
    answer, wrong = _target(model)

    def metric(logits):
        return logit_differences(logits, answer, wrong).mean()

    _, clean_cache = bridge.run_with_cache(CLEAN)
    _, corrupted_cache = bridge.run_with_cache(CORRUPTED)
    theirs = patching.get_act_patch_direct_path(bridge, CORRUPTED, clean_cache, corrupted_cache, metric, src_layer=0,
                                                src_head=1, component=via, verbose=False)[1]  # (H,): into layer 1
    ours = torch.tensor([path_patch(model, Batch((CLEAN,)), Batch((CORRUPTED,)), sender=("blocks.0.attn", 1),
                                    receiver=("blocks.1.attn", head), via=via,
                                    metric=lambda logits: float(metric(logits))).patched for head in range(4)])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
