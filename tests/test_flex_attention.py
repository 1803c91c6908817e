"""FlexAttention (`layers/kernels.py`): every variant it expresses gives the reference path's output, and gradients
on CUDA (on the CPU torch 2.13's FlexAttention has no backward); its block mask is built once per shape.

The matrix (position scheme x mask x heads) runs flex_attention eagerly (its own reference implementation of the
same score_mod and block_mask, no compilation per case); one case runs it compiled, as training and inference do."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from attnkit import ModelConfig, build_model
from attnkit.errors import ConfigError
from attnkit.layers import kernels
from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask
from attnkit.layers.positions import ALiBi, RelativePositions, RotaryEmbedding

WIDTH, HEADS, LENGTH = 32, 4, 11
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _layer(position: str, *, n_kv_heads: int = HEADS, window: int | None = None,
           softcap: float | None = None) -> Attention:
    relative = {"none": None, "rope": RotaryEmbedding(WIDTH // HEADS), "alibi": ALiBi(HEADS),
                "relative": RelativePositions(4, WIDTH // HEADS)}[position]
    if relative is not None:
        relative.init_weights()
    torch.manual_seed(0)
    return Attention(WIDTH, HEADS, n_kv_heads=n_kv_heads, relative=relative, window=window, softcap=softcap).eval()


def _mask(kind: str, batch: int = 2) -> AttentionMask:
    """The forward pass's mask of `kind` over LENGTH queries at positions 0 .."""
    real = torch.ones(batch, LENGTH, dtype=torch.bool)
    real[1, :3] = False  # the second row left-padded
    documents = torch.tensor([[0] * 4 + [1] * 5 + [2] * 2, [0] * 7 + [1] * 4])[:batch]
    return {"causal": AttentionMask(LENGTH, causal=True),
            "padding": AttentionMask(LENGTH, attention_mask=real),
            "causal+padding": AttentionMask(LENGTH, causal=True, attention_mask=real),
            "prefix": AttentionMask(LENGTH, causal=True, prefix_len=torch.tensor([3, 6])[:batch]),
            "documents": AttentionMask(LENGTH, causal=True, documents=documents)}[kind]


def _reference_and_flex(layer: Attention, mask_kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, LENGTH, WIDTH, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference, _ = layer(x, mask=_mask(mask_kind), need_weights=True)  # the lecture's explicit path
        layer.flex_attention = True
        flex, weights = layer(x, mask=_mask(mask_kind))
        layer.flex_attention = False
    assert weights is None
    return reference, flex


@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention uncompiled: the same score_mod and block mask, its own reference implementation."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(kernels, "compiled_flex_attention", lambda: counted)
    return calls


CASES = [(position, mask, kv, window) for position, mask, kv, window in itertools.product(
    ("none", "rope", "alibi"), ("causal", "padding", "causal+padding", "prefix", "documents"), (HEADS, 2), (None, 4))]
DEFAULT = [("alibi", "causal", 2, None), ("alibi", "documents", HEADS, None), ("rope", "causal+padding", 2, 4),
           ("none", "prefix", HEADS, None), ("none", "padding", HEADS, 4), ("alibi", "causal+padding", 2, 4)]


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c in DEFAULT else pytest.mark.slow) for c in CASES],
                         ids=lambda c: "-".join(map(str, c)))
def test_flex_attention_gives_the_reference_output(case, eager_flex):
    position, mask_kind, n_kv_heads, window = case
    reference, flex = _reference_and_flex(_layer(position, n_kv_heads=n_kv_heads, window=window), mask_kind)
    plain_causal = mask_kind == "causal" and position != "alibi" and window is None
    assert len(eager_flex) == (0 if plain_causal else 1)  # plain causality stays on SDPA's causal kernel
    torch.testing.assert_close(flex, reference, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(("position", "mask_kind"), [("alibi", "causal+padding"), ("none", "documents"),
                                                      ("rope", "padding")])
def test_flex_attention_soft_caps_as_the_reference_path_does(position, mask_kind, eager_flex):
    """tanh soft-capping (Gemma 2) as a score_mod, before the position bias and the mask, as the reference path caps."""
    reference, flex = _reference_and_flex(_layer(position, softcap=0.5), mask_kind)
    assert len(eager_flex) == 1
    torch.testing.assert_close(flex, reference, atol=2e-6, rtol=1e-5)


def test_soft_capping_bounds_the_scores_and_vanishes_for_a_large_cap():
    """With cap c every score lies in (-c, c), so two visible keys' weights differ by at most e^(2c); a cap far above
    the scores changes nothing."""
    x = torch.randn(2, LENGTH, WIDTH, generator=torch.Generator().manual_seed(3)) * 4
    outputs = {}
    for cap in (None, 0.5, 1e6):
        layer = _layer("none", softcap=cap)
        with torch.no_grad():
            for parameter in layer.parameters():
                parameter.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(4))
            outputs[cap], weights = layer(x, need_weights=True)
        ratio = (weights.amax(-1) / weights.amin(-1)).max().item()
        assert ratio <= (math.exp(2 * 0.5) * 1.0001 if cap == 0.5 else float("inf")), ratio
        if cap is None:
            assert ratio > math.exp(1.0)  # uncapped, these scores spread far wider
    torch.testing.assert_close(outputs[1e6], outputs[None])


def test_shaws_relative_positions_stay_on_the_reference_path(eager_flex):
    """Shaw's value term reads the weights, which FlexAttention does not give: the layer takes the explicit path."""
    reference, flex = _reference_and_flex(_layer("relative"), "causal")
    assert not eager_flex
    torch.testing.assert_close(flex, reference)


def test_a_document_mask_lets_no_query_see_another_documents_key():
    documents = torch.tensor([[0, 0, 1, 1, 1, 2]])
    allowed = AttentionMask(6, causal=True, documents=documents).allowed(6)  # (1, 1, 6, 6)
    query, key = torch.arange(6)[:, None], torch.arange(6)[None, :]
    expected = (key <= query) & (documents[0][:, None] == documents[0][None, :])
    assert torch.equal(allowed[0, 0], expected)
    with pytest.raises(ValueError, match="run packed rows without one"):
        AttentionMask(1, start=5, causal=True, documents=documents[:, :1]).allowed(6)


def test_the_mask_mod_allows_what_the_mask_allows():
    """FlexAttention's mask_mod, read at every (b, q, kv), equals `allowed` for every part of the mask."""
    b, q, kv = torch.meshgrid(torch.arange(2), torch.arange(LENGTH), torch.arange(LENGTH), indexing="ij")
    for kind, window in itertools.product(("causal", "padding", "causal+padding", "prefix", "documents"), (None, 4)):
        mask = _mask(kind)
        expected = mask.allowed(LENGTH, window=window).expand(2, 1, LENGTH, LENGTH)[:, 0]
        got = mask.mask_mod(LENGTH, window=window)(b, torch.zeros_like(b), q, kv)
        assert torch.equal(got, expected), (kind, window)


def test_a_structural_block_mask_is_built_once_per_shape_and_a_batchs_once_per_pass(eager_flex, monkeypatch):
    built = []
    real_create = kernels.create_block_mask
    monkeypatch.setattr(kernels, "create_block_mask", lambda *a, **k: built.append(a[3:5]) or real_create(*a, **k))
    kernels.structural_block_mask.cache_clear()
    config = ModelConfig(family="decoder", vocab_size=20, d_model=WIDTH, n_layers=3, n_heads=HEADS, d_ff=64,
                         max_seq_len=16, position="rope", attention_window=4, dropout=0.0)
    model = kernels.use_flex_attention(build_model(config).eval(), True)
    ids = torch.randint(0, 20, (2, 9))
    with torch.no_grad():
        for _ in range(3):  # three steps, three layers each
            model(ids)
        assert built == [(9, 9)]
        model(ids, attention_mask=torch.ones(2, 9, dtype=torch.bool))  # a batch's padding: once for the 3 layers
    assert built == [(9, 9), (9, 9)] and len(eager_flex) == 12


@pytest.mark.slow  # compiling the kernel: about 10-30 s on 2 CPU cores
def test_compiled_flex_attention_gives_the_reference_output():
    """The compiled kernel itself (on the CPU: forward only), on ALiBi with padding and grouped heads."""
    reference, flex = _reference_and_flex(_layer("alibi", n_kv_heads=2), "causal+padding")
    torch.testing.assert_close(flex, reference, atol=2e-6, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEFAULT, ids=lambda c: "-".join(map(str, c)))
def test_flex_attention_gradients_equal_the_references_on_cuda(case):
    position, mask_kind, n_kv_heads, window = case
    layer = _layer(position, n_kv_heads=n_kv_heads, window=window).cuda()
    x = torch.randn(2, LENGTH, WIDTH, device="cuda", requires_grad=True)

    def grads(flex: bool) -> list[torch.Tensor]:
        layer.flex_attention = flex
        mask = _mask(mask_kind)
        mask = AttentionMask(mask.length, causal=mask.causal, device=torch.device("cuda"),
                             attention_mask=None if mask.attention_mask is None else mask.attention_mask.cuda(),
                             prefix_len=None if mask.prefix_len is None else mask.prefix_len.cuda(),
                             documents=None if mask.documents is None else mask.documents.cuda())
        out, _ = layer(x, mask=mask, need_weights=not flex)
        return [out, *torch.autograd.grad(out.square().sum(), [x, *layer.parameters()])]

    for got, expected in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def _decoder(**overrides) -> torch.nn.Module:
    settings = dict(family="decoder", vocab_size=20, d_model=WIDTH, n_layers=1, n_heads=HEADS, d_ff=64,
                    max_seq_len=16, dropout=0.0)
    return build_model(ModelConfig(**{**settings, **overrides}))


@pytest.mark.parametrize(("overrides", "packed", "on_gpu"), [
    (dict(position="alibi"), False, "FlexAttention"),
    (dict(position="rope", attention_window=8), False, "FlexAttention"),
    (dict(position="learned"), True, "FlexAttention"), (dict(position="learned"), False, "SDPA"),
    (dict(position="relative"), False, "the reference path"), (dict(score="additive"), False, "the reference path"),
    (dict(position="rope", attn_softcap=30.0), False, "FlexAttention")])
def test_the_training_plan_picks_the_kernel_per_variant_and_says_why(overrides, packed, on_gpu):
    from attnkit.train.plan import plan_training

    model = _decoder(**overrides)
    gpu = plan_training(model, family="decoder", device="cuda", free_memory=80 * 2**30, packed=packed)
    attention = next(c for c in gpu.choices if c.what == "attention")
    assert attention.choice.startswith(on_gpu) and gpu.flex_attention == (on_gpu == "FlexAttention"), attention
    gpu.prepare(model)
    assert all(m.flex_attention == gpu.flex_attention for m in model.modules() if isinstance(m, Attention))
    cpu = plan_training(model, family="decoder", device="cpu", packed=packed)
    assert not cpu.flex_attention  # no backward on the CPU
    on_cpu = next(c for c in cpu.choices if c.what == "attention").choice
    if "attn_softcap" in overrides or on_gpu == "the reference path":  # SDPA cannot soft-cap scores either
        assert on_cpu.startswith("the reference path"), on_cpu
    else:
        assert on_cpu.startswith("SDPA"), on_cpu
    if on_gpu == "FlexAttention":
        assert "no backward" in next(c for c in cpu.choices if c.what == "attention").why


def test_flex_attention_asked_for_where_it_cannot_train_is_refused_naming_the_fix():
    from attnkit.errors import ConfigError
    from attnkit.train.plan import plan_training

    with pytest.raises(ConfigError, match="no backward on the CPU.*--attention-kernel auto or sdpa"):
        plan_training(_decoder(position="alibi"), family="decoder", device="cpu", attention="flex")
    with pytest.raises(ConfigError, match="cannot express Shaw's relative positions"):
        plan_training(_decoder(position="relative"), family="decoder", device="cuda", attention="flex",
                      free_memory=80 * 2**30)
    with pytest.raises(ConfigError, match="no attention dropout"):
        plan_training(_decoder(position="alibi", attention_dropout=0.1), family="decoder", device="cuda",
                      attention="flex", free_memory=80 * 2**30)


@pytest.mark.slow  # tracing a 2-layer model: about 12 s on 2 CPU cores
def test_a_model_with_flex_attention_traces_as_one_graph_with_its_masks():
    """GPU training compiles the whole model (fullgraph): FlexAttention, ALiBi's score_mod and the document mask's
    block mask trace into one graph (a recording backend; on the CPU inductor's FlexAttention template is not the
    GPU's, so the graph runs as traced), with the reference path's logits."""
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    model = _decoder(position="alibi", n_layers=2).eval()
    ids = torch.randint(0, 20, (2, 13))
    documents = torch.tensor([[0] * 5 + [1] * 8, [0] * 9 + [1] * 4])
    with torch.no_grad():
        expected = model(ids, document_ids=documents).logits
        kernels.use_flex_attention(model, True)
        got = torch.compile(model, fullgraph=True, backend=recording)(ids, document_ids=documents).logits
    assert len(graphs) == 1
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_attnkit_train_attention_flex_on_the_cpu_is_one_line_naming_the_fix(tmp_path, capsys):
    from attnkit import cli

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 80)
    assert cli.main(["train", "--out", str(tmp_path / "run"), "--data", str(text), "--tokenizer", "char",
                     "--max-steps", "1", "--attention-kernel", "flex", "--no-progress", "--set", "position=alibi",
                     "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=32"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "no backward on the CPU" in errors[0] and "--attention-kernel auto or sdpa" in errors[0]


def test_a_soft_capped_decoder_decodes_with_its_cache_as_without_and_is_not_exported_as_another_model():
    from generate_models import greedy_without_cache, tiny_model

    from attnkit.generate import generate_tokens
    from attnkit.interop.hf_config import match_family
    from attnkit.interop.hf_weights import hf_tensor_names

    model, config = tiny_model(position="rope", attn_softcap=2.0)
    assert generate_tokens(model, [[1, 2, 3]], max_new_tokens=6, context_len=config.max_seq_len)[0] == \
        greedy_without_cache(model, [1, 2, 3], 6)
    state = model.state_dict()
    with pytest.raises(ConfigError, match="attn_softcap=2.0"):  # no Hugging Face layout soft-caps: refused
        match_family(config, lambda family: hf_tensor_names(state, family, config))
