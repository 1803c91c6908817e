"""Hook points and the trace: with nothing attached, or only reading, the model runs as it does without them (to the
bit, on its fast kernels); the pattern read equals `need_weights`'s; edits do what an independent change of the
weights does; every family has its points."""

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.errors import InputError
from attnkit.generate.pipeline import Pipeline
from attnkit.inspect import hook_points, hooked, mean_ablate, patch, resample_ablate, trace, zero_ablate
from attnkit.inspect.circuits import composition_scores, full_ov
from attnkit.inspect.head_types import head_types
from attnkit.inspect.importance import head_importance
from attnkit.inspect.inputs import lm_batch
from attnkit.inspect.logit_lens import logit_lens
from attnkit.inspect.patching import patch_heads
from attnkit.inspect.sae import point_activations
from attnkit.layers.attention import Attention
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq

FAMILIES = ("decoder", "encoder", "encoder-decoder")


def _config(family: str, **fields):
    head = {"encoder_head": "mlm"} if family == "encoder" else {}
    return ModelConfig(family=family, vocab_size=40, d_model=16, n_heads=4, d_ff=32, max_seq_len=16, n_layers=2,
                       position="learned", **head, **fields)


def _model(family: str, **fields):
    torch.manual_seed(0)
    return build_model(_config(family, **fields)).eval()


def _inputs(family: str, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (2, 8), generator=generator)
    return (ids, ids[:, :6].flip(1)) if family == "encoder-decoder" else (ids,)


def _recurrent():
    torch.manual_seed(0)
    return recurrent_seq2seq(src_vocab_size=30, tgt_vocab_size=30, embedding_dim=8, hidden=8, encoder_hidden=8,
                             n_layers=1, cell="gru", attention="bahdanau").eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_reading_the_stream_changes_no_bit_and_keeps_the_fast_kernels(family, monkeypatch):
    model, inputs = _model(family), _inputs(family)
    with torch.no_grad():
        before = model(*inputs).logits
    names = [n for n in hook_points(model) if not n.endswith(("scores", "pattern"))]

    def refuse(*args, **kwargs):
        raise AssertionError("the reference path ran, though no point read the weights")

    monkeypatch.setattr(Attention, "_reference", refuse)
    read = trace(model, *inputs, names=names)
    monkeypatch.undo()
    assert torch.equal(read.output.logits, before)
    assert set(read.cache) == set(names)
    with torch.no_grad():
        assert torch.equal(model(*inputs).logits, before)  # nothing left attached
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_pattern_read_is_the_weights_need_weights_returns(family):
    model, inputs = _model(family), _inputs(family)
    with torch.no_grad():
        expected = model(*inputs, need_weights=True)
    read = trace(model, *inputs, names=lambda n: n.endswith("pattern"))
    prefix = "decoder." if family == "encoder-decoder" else ""
    for layer, weights in enumerate(expected.attentions):
        torch.testing.assert_close(read[f"{prefix}blocks.{layer}.attn.pattern"], weights["self"])
        if "cross" in weights:
            torch.testing.assert_close(read[f"{prefix}blocks.{layer}.cross_attn.pattern"], weights["cross"])
    assert read.output.attentions is None  # the caller did not ask for weights, and gets none
    again = trace(model, *inputs, names=["blocks.0.attn.pattern" if not prefix else "decoder.blocks.0.attn.pattern"],
                  need_weights=True)
    assert again.output.attentions is not None


def test_the_recurrent_decoders_steps_are_joined_into_its_alignment():
    model = _recurrent()
    src, tgt = torch.randint(0, 30, (2, 6)), torch.randint(0, 30, (2, 5))
    with torch.no_grad():
        expected = model(src, tgt, need_weights=True).attentions[0]["cross"]  # (B, 1, T, S)
    read = trace(model, src, tgt)
    torch.testing.assert_close(read["decoder.attn.pattern"], expected)
    assert read["decoder.attn.out"].shape == (2, 5, 8) and read["encoder.out"].shape == (2, 6, 8)


def test_zero_ablating_a_head_equals_zeroing_its_columns_of_o_proj():
    model, (ids,) = _model("decoder"), _inputs("decoder")
    ablated = trace(model, ids, names=[], edits={"blocks.1.attn.z": zero_ablate(head=2)}).output.logits
    attention = model.stack.blocks[1].self_attn
    with torch.no_grad():
        attention.o_proj.weight[:, 2 * attention.head_dim:3 * attention.head_dim] = 0
        expected = model(ids).logits
    torch.testing.assert_close(ablated, expected)
    assert not torch.allclose(ablated, trace(_model("decoder"), ids, names=[]).output.logits)


def test_patching_the_stream_at_the_first_block_replays_the_other_input():
    model = _model("decoder")
    (clean,), (corrupt,) = _inputs("decoder", 1), _inputs("decoder", 2)
    source = trace(model, clean, names=["blocks.0.resid_pre"])
    patched = trace(model, corrupt, names=[], edits={"blocks.0.resid_pre": patch(source["blocks.0.resid_pre"])})
    torch.testing.assert_close(patched.output.logits, source.output.logits)
    one = trace(model, corrupt, names=["blocks.0.resid_pre"],
                edits={"blocks.0.resid_pre": patch(source["blocks.0.resid_pre"], position=3)})["blocks.0.resid_pre"]
    base = trace(model, corrupt, names=["blocks.0.resid_pre"])["blocks.0.resid_pre"]
    assert torch.equal(one[:, 3], source["blocks.0.resid_pre"][:, 3])
    assert torch.equal(one[:, :3], base[:, :3]) and torch.equal(one[:, 4:], base[:, 4:])


def test_a_negative_head_or_position_counts_from_the_end_as_in_python():
    model, (ids,) = _model("decoder"), _inputs("decoder")  # (2, 8)
    source = trace(model, ids.flip(1), names=["blocks.0.attn.z"])["blocks.0.attn.z"]  # (B, T, H, D)
    for edit, same in ((zero_ablate(position=-1), zero_ablate(position=7)), (zero_ablate(head=-1), zero_ablate(head=3)),
                       (patch(source, head=-2, position=-3), patch(source, head=2, position=5))):
        found, expected = (trace(model, ids, names=["blocks.0.attn.z"], edits={"blocks.0.attn.z": e})["blocks.0.attn.z"]
                           for e in (edit, same))
        assert torch.equal(found, expected)
    with pytest.raises(InputError, match=r"position -9 is out of range at blocks.0.attn.z: it has 8 \(positions 0..7, "
                       "or -8..-1 from the end"):
        trace(model, ids, edits={"blocks.0.attn.z": zero_ablate(position=-9)})


def test_mean_and_resample_ablation_replace_by_the_reference_batch():
    model, (ids,) = _model("decoder"), _inputs("decoder")
    reference = trace(model, ids, names=["blocks.0.attn.z"])["blocks.0.attn.z"]  # (B, T, H, D)
    edited = trace(model, ids, names=["blocks.0.attn.z"],
                   edits={"blocks.0.attn.z": mean_ablate(reference, head=1)})["blocks.0.attn.z"]
    torch.testing.assert_close(edited[:, :, 1], reference[:, :, 1].mean(dim=(0, 1)).expand(2, 8, -1))
    assert torch.equal(edited[:, :, 0], reference[:, :, 0])
    one_row = reference[:1]
    resampled = trace(model, ids, names=["blocks.0.attn.z"],
                      edits={"blocks.0.attn.z": resample_ablate(one_row, head=1)})["blocks.0.attn.z"]
    assert torch.equal(resampled[:, :, 1], one_row[:, :, 1].expand(2, -1, -1))


def test_scores_can_be_edited_on_the_reference_path():
    model, (ids,) = _model("decoder"), _inputs("decoder")

    def uniform(scores, point):
        return torch.zeros_like(scores)

    read = trace(model, ids, names=["blocks.0.attn.pattern"], edits={"blocks.0.attn.scores": uniform})
    pattern = read["blocks.0.attn.pattern"][0, 0]  # causal and uniform: row t is 1 / (t + 1) over keys 0..t
    expected = torch.tril(torch.ones(8, 8)) / torch.arange(1, 9).unsqueeze(1)
    torch.testing.assert_close(pattern, expected)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_a_pattern_edit_replaces_the_weights_the_values_are_summed_with(n_kv_heads):
    """An edit of attn.pattern is what the head sums its values with: head 1 made uniform over the keys it sees, its
    output at each query is the mean of those keys' values (the value heads repeated for grouped queries), the other
    heads' outputs are unchanged, and the pattern read after the edit is the edited one."""
    model, (ids,) = _model("decoder", **({"n_kv_heads": n_kv_heads} if n_kv_heads else {})), _inputs("decoder")
    uniform = torch.tril(torch.ones(8, 8)) / torch.arange(1, 9).unsqueeze(1)  # (T, S): row t is 1 / (t + 1) on 0..t

    def flatten(pattern, point):  # (B, H, T, S)
        pattern = pattern.clone()
        pattern[:, 1] = uniform
        return pattern

    names = ["blocks.0.attn.pattern", "blocks.0.attn.v", "blocks.0.attn.z"]
    plain = trace(model, ids, names=names)
    read = trace(model, ids, names=names, edits={"blocks.0.attn.pattern": flatten})
    v = read["blocks.0.attn.v"]  # (B, S, Hkv, D)
    group = 4 // v.shape[2]  # query heads (4) per value head
    expected = torch.cumsum(v[:, :, 1 // group], dim=1) / torch.arange(1, 9).view(1, 8, 1)  # (B, T, D): running means
    torch.testing.assert_close(read["blocks.0.attn.z"][:, :, 1], expected)
    for head in (0, 2, 3):
        torch.testing.assert_close(read["blocks.0.attn.z"][:, :, head], plain["blocks.0.attn.z"][:, :, head])
    torch.testing.assert_close(read["blocks.0.attn.pattern"][:, 1], uniform.expand(2, 8, 8))


def test_bad_names_and_edits_are_refused_with_the_fix():
    model, (ids,) = _model("decoder"), _inputs("decoder")
    with pytest.raises(InputError, match="no hook point 'blocks.9.attn.z'"):
        trace(model, ids, names=["blocks.9.attn.z"])
    src, tgt = torch.randint(0, 30, (2, 6)), torch.randint(0, 30, (2, 5))
    with pytest.raises(InputError, match="decoder.attn.pattern is read, not rebuilt .*; edit decoder.attn.z"):
        trace(_recurrent(), src, tgt, edits={"decoder.attn.pattern": zero_ablate()})
    with pytest.raises(InputError, match="pos_embed is read, not rebuilt .*; edit blocks.0.resid_pre, the tokens and "
                       "positions together"):
        trace(model, ids, edits={"pos_embed": zero_ablate()})
    with pytest.raises(InputError, match="has no heads"):
        trace(model, ids, edits={"blocks.0.resid_post": zero_ablate(head=1)})
    with pytest.raises(InputError, match="head 7 is out of range"):
        trace(model, ids, edits={"blocks.0.attn.z": zero_ablate(head=7)})
    with pytest.raises(InputError, match="same length"):
        trace(model, ids[:, :4], edits={"blocks.0.attn.z": patch(torch.zeros(2, 8, 4, 4))})
    with hooked(model, capture=["embed"]) as cache:
        pass
    assert cache == {}


def test_a_pipeline_is_traced_as_its_model():
    model, (ids,) = _model("decoder"), _inputs("decoder")
    pipeline = Pipeline(model, _config("decoder"))
    assert list(hook_points(pipeline)) == list(hook_points(model))
    torch.testing.assert_close(trace(pipeline, ids, names=["blocks.1.attn.z"])["blocks.1.attn.z"],
                               trace(model, ids, names=["blocks.1.attn.z"])["blocks.1.attn.z"], rtol=0, atol=0)
    with pytest.raises(InputError, match="reads a torch model .* or a pipeline from attnkit.load; got a str"):
        trace("runs/gpt", ids)
    batch, other = lm_batch(ids), lm_batch(ids.flip(1))
    torch.testing.assert_close(head_importance(pipeline, batch).scores, head_importance(model, batch).scores)
    torch.testing.assert_close(logit_lens(pipeline, ids).logits, logit_lens(model, ids).logits)
    patched = patch_heads(pipeline, batch, other, answer=1, wrong=2)
    torch.testing.assert_close(patched.restored, patch_heads(model, batch, other, answer=1, wrong=2).restored)
    assert composition_scores(pipeline).rows == composition_scores(model).rows
    torch.testing.assert_close(full_ov(pipeline, "blocks.0.attn").dense(), full_ov(model, "blocks.0.attn").dense())
    assert head_types(pipeline, ids).types == head_types(model, ids).types
    torch.testing.assert_close(next(point_activations(pipeline, [batch], "blocks.0.resid_post")),
                               next(point_activations(model, [batch], "blocks.0.resid_post")))


@pytest.mark.parametrize(("edit", "said"), [
    (lambda a, p: 3, "returned int; an edit returns a tensor like the activation"),
    (lambda a, p: a.double(), "returned torch.float64 on cpu, the activation is torch.float32 on cpu"),
    (lambda a, p: a.long(), "returned torch.int64"),
    (lambda a, p: a[:, :2], r"returned shape \(2, 2, 4, 4\), not the point's \(2, 8, 4, 4\)"),
    (0, "is 0 \\(int\\); an edit is a function"),
])
def test_an_edit_that_returns_no_like_tensor_is_refused_by_name(edit, said):
    model, (ids,) = _model("decoder"), _inputs("decoder")
    with pytest.raises(InputError, match=said):
        trace(model, ids, edits={"blocks.0.attn.z": edit})


@pytest.mark.parametrize(("point", "edit", "said"), [
    ("blocks.0.resid_post", lambda: mean_ablate(torch.zeros(3, 5, 7)), r"its width is 7, the run's 16"),
    ("blocks.0.resid_post", lambda: mean_ablate(torch.zeros(5, 16)), "2 axes where the run has 3"),  # was averaged
    ("blocks.0.attn.z", lambda: mean_ablate(torch.zeros(3, 5, 2, 4), head=1), "its heads is 2, the run's 4"),
    ("blocks.0.attn.z", lambda: resample_ablate(torch.zeros(3, 8, 4, 5)), "its width is 5, the run's 4"),
    ("blocks.0.attn.z", lambda: zero_ablate(head=1.0), "head=1.0 must be a whole number"),
    ("blocks.0.attn.z", lambda: zero_ablate(position=0.5), "position=0.5 must be a whole number"),
    ("blocks.0.attn.z", lambda: patch([0.0], head=1), "the patch's source is a list"),
])
def test_references_of_another_shape_and_indices_that_are_not_whole_numbers_are_refused(point, edit, said):
    model, (ids,) = _model("decoder"), _inputs("decoder")
    with pytest.raises(InputError, match=said):
        trace(model, ids, edits={point: edit()})


@pytest.mark.parametrize(("names", "said"), [
    ([3], r"a hook point's name is a string \('blocks.0.attn.z'\); got 3 \(int"),
    (3, "points are picked by a name, a list of names"),
    ([("blocks.0.attn.z",)], "got \\('blocks.0.attn.z',\\) \\(tuple"),
])
def test_names_that_are_not_strings_are_refused(names, said):
    model, (ids,) = _model("decoder"), _inputs("decoder")
    with pytest.raises(InputError, match=said):
        trace(model, ids, names=names)
    with pytest.raises(InputError, match="a hook point's name is a string"):
        trace(model, ids, edits={3: zero_ablate()})


def test_calls_whose_activations_do_not_join_are_refused_and_the_body_error_is_kept():
    """A context joins its calls along the query axis (a KV-cached decoder's stream: the prompt, then each step);
    calls that do not join (the pattern's keys grow with the cache, another batch size) are an InputError naming the
    shapes and the fix, not torch's concatenation error, and an error inside the context is the one raised."""
    from attnkit.models.decoder import allocate_cache_for

    model, (ids,) = _model("decoder"), _inputs("decoder")
    cache = allocate_cache_for(model.stack, 2, 16)
    with hooked(model, capture=["blocks.0.resid_post"]) as read:
        model(ids[:, :5], cache=cache)
        model(ids[:, 5:6], cache=cache)
    torch.testing.assert_close(read["blocks.0.resid_post"], trace(model, ids[:, :6], names=["blocks.0.resid_post"])[
        "blocks.0.resid_post"])  # the steps join into the whole sequence's stream
    cache = allocate_cache_for(model.stack, 2, 16)
    with pytest.raises(InputError, match=r"blocks.0.attn.pattern was read in 2 calls of shapes \(2, 4, 5, 5\), "
                       r"\(2, 4, 1, 6\), which do not join .* each step of a KV-cached decoder, in its own trace"):
        with hooked(model, capture=["blocks.0.attn.pattern"]):
            model(ids[:, :5], cache=cache)
            model(ids[:, 5:6], cache=cache)
    with pytest.raises(InputError, match=r"resid_post was read in 2 calls of shapes \(2, 8, 16\), \(1, 8, 16\)"):
        with hooked(model, capture=["blocks.0.resid_post"]):
            model(ids)
            model(ids[:1])
    with pytest.raises(ZeroDivisionError), hooked(model, capture=["blocks.0.resid_post"]):
        model(ids)
        model(ids[:1])
        1 / 0  # noqa: B018 -- the body's own error, raised past the calls that do not join
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_an_analysis_runs_without_dropout_and_leaves_the_model_training():
    """The analyses switch dropout off while they run and give each module back the mode it had, also when they
    fail, so analysing a model mid-training neither reads a dropped-out model nor leaves it training without dropout.
    An SAE's activations were read with dropout on (spliced_loss reads them without)."""
    from attnkit.inspect.attribution import attribute_heads, attribute_stream, attribute_sublayers
    from attnkit.inspect.inputs import Batch
    from attnkit.inspect.integrated_gradients import integrated_gradients
    from attnkit.inspect.logit_attribution import logit_attribution
    from attnkit.inspect.patching import patch_stream
    from attnkit.inspect.path_patching import path_patch
    from attnkit.inspect.probes import word_states
    from attnkit.inspect.residual import residual_stream
    from attnkit.inspect.sae import SAEConfig, SAEMetrics, SparseAutoencoder, spliced_loss
    from attnkit.tokenize import CharTokenizer

    model, (ids,) = _model("decoder", dropout=0.5), _inputs("decoder")
    model.train()
    model.stack.blocks[0].eval()  # a module a user froze in eval mode keeps it
    clean, corrupted = Batch((ids,)), Batch((ids.flip(1),))
    sae = SparseAutoencoder(SAEConfig(16, 32, hook_name="blocks.1.resid_post"))
    metrics, reference = SAEMetrics(1.0, 0.0, 1.0, 0.0), torch.randn(8, 16)
    analyses = {
        "importance": lambda: head_importance(model, lm_batch(ids)).scores,
        "logit lens": lambda: logit_lens(model, ids).logits,
        "head types": lambda: head_types(model, ids).scores["previous"],
        "patching": lambda: patch_heads(model, clean, corrupted, answer=1, wrong=2).restored,
        "attribution": lambda: attribute_heads(model, clean, corrupted, answer=1, wrong=2).restored,
        "dla": lambda: logit_attribution(model, ids, answer=1, wrong=2).values,
        "integrated gradients": lambda: integrated_gradients(model, ids, target=1, steps=4).tokens["embed"],
        "residual": lambda: residual_stream(model, ids).stream,
        "sae spliced loss": lambda: torch.tensor(spliced_loss(model, sae, [lm_batch(ids)], metrics,
                                                              reference).spliced_loss),
        "sae activations": lambda: torch.cat(list(point_activations(model, [lm_batch(ids)], "blocks.1.resid_post"))),
        "stream patching": lambda: patch_stream(model, clean, corrupted, answer=1, wrong=2).restored,
        "path patching": lambda: torch.tensor(path_patch(
            model, clean, corrupted, sender=("blocks.0.attn", 0), receiver=("blocks.1.attn", 0), via="q",
            metric=lambda logits: float(logits[:, -1, 1].mean() - logits[:, -1, 2].mean())).patched),
        "stream attribution": lambda: attribute_stream(model, clean, corrupted, answer=1, wrong=2).restored,
        "sublayer attribution": lambda: attribute_sublayers(model, clean, corrupted, answer=1, wrong=2).restored,
        "probe states": lambda: word_states(model, CharTokenizer("abcdefgh "), [(["abc", "de"], ["X", "Y"])],
                                            max_len=16).states["blocks.1.resid_post"],
    }
    for name, analysis in analyses.items():
        first, second = analysis(), analysis()
        torch.testing.assert_close(first, second, equal_nan=True, msg=f"{name} read a model with dropout on")
        assert model.training and model.stack.blocks[1].training, f"{name} left the model in eval mode"
        assert not model.stack.blocks[0].training, f"{name} set a module's mode it did not find"
    failing = {  # each fails inside, after it has set the model's modes
        "patching": lambda: patch_heads(model, clean, corrupted, answer=10 ** 6, wrong=2),
        "logit lens": lambda: logit_lens(model, ids + 10 ** 6),  # ids past the vocabulary
        "sae activations": lambda: list(point_activations(model, [lm_batch(ids), ids], "blocks.1.resid_post")),
    }
    for name, analysis in failing.items():
        with pytest.raises((InputError, IndexError, RuntimeError)):
            analysis()
        assert model.training and model.stack.blocks[1].training, f"{name} failing left the model in eval mode"
        assert not model.stack.blocks[0].training, f"{name} failing set a module's mode it did not find"
