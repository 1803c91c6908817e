"""Circuits in the weights and path patching: the QK and OV matrices reproduce the scores and outputs the model
computes (MHA, GQA with RoPE at each offset, cross-attention), a factored matrix's singular values and norm equal the
dense product's, and on the two-layer attention-only induction model (the recipe of test_inspect_analyses.py) the
previous-token head's K-composition into the induction head ranks first, and path patching the layer-0 heads through
the induction head's keys, and not its queries, restores most of the repeated half's advantage."""

import json

import pytest
import torch

from attnkit.checkpoint import save_model
from attnkit.config import ModelConfig
from attnkit.errors import InputError
from attnkit.inspect.circuits import FactoredMatrix, composition_score, composition_scores, full_ov, head_weights
from attnkit.inspect.command import InspectSettings, run_inspect
from attnkit.inspect.head_types import head_types
from attnkit.inspect.induction import InductionTask, attention_only_decoder, train_induction
from attnkit.inspect.inputs import Batch
from attnkit.inspect.path_patching import loss_metric, path_patch
from attnkit.inspect.tracing import trace
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq
from attnkit.tokenize import CharTokenizer

TASK = InductionTask(vocab_size=24, half=8, shortest=4, batch=32)


@pytest.fixture(scope="module")
def induction_model():
    torch.manual_seed(0)
    model = attention_only_decoder(vocab_size=TASK.vocab_size, d_model=32, n_heads=(4, 1), max_seq_len=2 * TASK.half)
    train_induction(model, TASK, steps=400, lr=1e-2)
    return model


def _decoder(**options):
    torch.manual_seed(0)
    config = ModelConfig(family=options.pop("family", "decoder"), vocab_size=30, d_model=32, n_heads=4, d_ff=32,
                         max_seq_len=16, n_layers=2, bias=False, **options)
    return build_model(config).eval()


def test_a_factored_matrix_gives_the_dense_products_singular_values_and_norm():
    generator = torch.Generator().manual_seed(0)
    left, right = torch.randn(3, 40, 6, generator=generator), torch.randn(3, 6, 50, generator=generator)
    matrix = FactoredMatrix(left, right)
    dense = left @ right  # (3, 40, 50)
    torch.testing.assert_close(matrix.singular_values(), torch.linalg.svdvals(dense)[:, :6], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(matrix.norm(), torch.linalg.matrix_norm(dense), rtol=1e-5, atol=1e-4)
    other = FactoredMatrix(torch.randn(50, 4, generator=generator), torch.randn(4, 30, generator=generator))
    torch.testing.assert_close((matrix @ other).dense(), dense @ other.dense(), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(matrix.T.dense(), dense.mT)
    score = composition_score(matrix, FactoredMatrix(right.mT, left.mT))
    expected = torch.linalg.matrix_norm(dense @ dense.mT) / torch.linalg.matrix_norm(dense) ** 2
    torch.testing.assert_close(score, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("options", [{}, {"n_kv_heads": 2, "position": "rope", "norm": "rms"}, {"n_kv_heads": 1},
                                     {"score": "bilinear"}])
def test_qk_and_ov_reproduce_the_scores_and_outputs_the_model_computes(options):
    """Unfolded (fold_norms=False), the circuits act on the normed stream: x W_QK x^T / sqrt(D) are the scores the
    model forms (RoPE: at each query-key offset) and sum_h A_h x W_OV^h is the sublayer's output."""
    model = _decoder(**options)
    ids = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
    read = trace(model, ids, names=["blocks.1.resid_pre", "blocks.1.attn.scores", "blocks.1.attn.pattern",
                                    "blocks.1.attn.out"])
    normed = model.stack.blocks[1].attn_norm(read["blocks.1.resid_pre"])  # (B, T, C)
    weights = head_weights(model, "blocks.1.attn", fold_norms=False)
    scale = getattr(model.stack.blocks[1].self_attn.score, "scale", 1.0)  # 1/sqrt(D); a bilinear score has none
    scores = read["blocks.1.attn.scores"]  # (B, H, T, S)
    for offset in (0, 3):
        qk = head_weights(model, "blocks.1.attn", fold_norms=False, offset=offset).qk().dense()  # (H, C, C)
        expected = torch.einsum("btc,hcd,bsd->bhts", normed, qk, normed) * scale
        query = torch.arange(offset, 9)
        torch.testing.assert_close(scores[:, :, query, query - offset], expected[:, :, query, query - offset],
                                   rtol=1e-4, atol=1e-4)
    out = torch.einsum("bhts,bsc,hcd->btd", read["blocks.1.attn.pattern"], normed, weights.ov().dense())
    torch.testing.assert_close(out, read["blocks.1.attn.out"], rtol=1e-4, atol=1e-4)
    assert any("RoPE" in n for n in weights.notes) == ("position" in options)


def test_composition_reaches_cross_attention_from_the_encoder_and_the_decoder():
    model = _decoder(family="encoder-decoder")
    found = composition_scores(model)
    pairs = {(r["sender"], r["receiver"], r["kind"]) for r in found.rows}
    assert ("encoder.blocks.1.attn", "decoder.blocks.0.cross_attn", "k") in pairs  # keys read the encoder's output
    assert ("decoder.blocks.0.attn", "decoder.blocks.0.cross_attn", "q") in pairs  # queries read the decoder's stream
    assert ("decoder.blocks.0.attn", "decoder.blocks.0.cross_attn", "k") not in pairs
    assert ("decoder.blocks.1.attn", "decoder.blocks.0.cross_attn", "q") not in pairs  # a later writer
    # q, k, v: encoder 0 -> 1, decoder 0 -> 1 (self and cross into self); q: each earlier decoder sublayer into a
    # cross-attention (4); k, v: both encoder layers into both cross-attentions (8); 16 head pairs each
    assert len(found.rows) == 16 * (3 * 3 + 4 + 8)
    assert all(0 <= r["score"] <= 1 for r in found.rows)
    assert found.table("k", "encoder.blocks.0.attn", "encoder.blocks.1.attn").shape == (4, 4)


def test_the_full_ov_circuit_is_embeddings_through_the_head_to_the_logits():
    model = _decoder(tie_embeddings=False, norm="rms")
    circuit = full_ov(model, "blocks.0.attn", fold_norms=False)
    assert circuit.shape == (4, 30, 30)
    weights = head_weights(model, "blocks.0.attn", fold_norms=False)
    expected = model.stack.embeddings.token.weight @ weights.ov().dense() @ model.lm_head.weight.T  # (H, V, V)
    torch.testing.assert_close(circuit.dense(), expected, rtol=1e-4, atol=1e-5)


def test_circuits_refuse_a_recurrent_model_and_name_the_reason():
    model = recurrent_seq2seq(src_vocab_size=10, tgt_vocab_size=10, embedding_dim=8, hidden=8, encoder_hidden=8,
                              n_layers=1, cell="gru", attention="luong-dot")
    with pytest.raises(InputError, match="weight-space circuits read .* recurrent cell mixes"):
        composition_scores(model)
    ids = Batch((torch.tensor([[3, 4, 5]]), torch.tensor([[1, 6, 7]])))
    with pytest.raises(InputError, match="path patching follows a Transformer head's output .* recurrent cell mixes "
                       r"\(use the activation analyses: patch, attribute, heads\)"):
        path_patch(model, ids, ids, sender=("decoder.attn", 0), receiver=("decoder.attn", 0), via="q",
                   metric=loss_metric(torch.tensor([[6, 7, 2]])))
    with pytest.raises(InputError, match="no attention sublayer"):
        head_weights(_decoder(), "blocks.7.attn")
    with pytest.raises(InputError, match="not a bilinear form"):
        head_weights(_decoder(score="additive"), "blocks.0.attn")


def test_the_previous_token_heads_k_composition_into_the_induction_head_ranks_first(induction_model):
    """The strongest composition is layer 0's K-composition into the induction head, sent by one of layer 0's two most
    previous-token heads. Which of the two comes first is not the claim: in this model their previous-token scores
    (0.29-0.30, against 0.24 for the other two) and their compositions differ by less than the rounding of different
    kernels (AVX-512 and AVX2 trainings put a different one of them first)."""
    held_out = TASK.ids(torch.Generator().manual_seed(5), batch=32)
    found = head_types(induction_model, held_out)
    top = composition_scores(induction_model).rows[0]
    assert (top["sender"], top["receiver"], top["receiver head"], top["kind"]) == ("blocks.0.attn", "blocks.1.attn",
                                                                                   0, "k")
    most_previous = found.scores["previous"][0].argsort(descending=True)[:2].tolist()  # layer 0's two most previous
    assert top["sender head"] in most_previous


def _odd_positions_corrupted():
    """Clean: x_0..x_(n-1) twice. Corrupted: the first half's odd positions replaced. A second-half query x_i (i odd)
    then finds no key whose predecessor is x_i, though the token after it, x_(i+1), is intact: only the keys' record
    of each position's predecessor (the previous-token heads' output) is lost."""
    n = TASK.half
    clean = TASK.ids(torch.Generator().manual_seed(5), batch=32)
    odd = torch.arange(1, n, 2)
    shift = 1 + torch.randint(0, TASK.vocab_size - 1, (32, len(odd)), generator=torch.Generator().manual_seed(3))
    corrupted = clean.clone()
    corrupted[:, odd] = (clean[:, odd] + shift) % TASK.vocab_size  # a different token at each
    labels = torch.full_like(clean[:, 1:], -100)
    scored = torch.tensor([n + i for i in range(1, n - 1, 2)])  # input n + i (token x_i, i odd) predicts x_(i+1)
    labels[:, scored] = clean[:, 1:][:, scored]
    return Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],)), loss_metric(labels)


def test_path_patching_the_previous_token_heads_through_the_induction_keys_restores_the_answer(induction_model):
    clean, corrupted, metric = _odd_positions_corrupted()
    layer0 = ("blocks.0.attn", [0, 1, 2, 3])
    found = {via: path_patch(induction_model, clean, corrupted, sender=layer0, receiver=("blocks.1.attn", 0), via=via,
                             metric=metric) for via in "qkv"}
    assert found["k"].clean > found["k"].corrupted
    assert found["k"].restored > 0.6  # most of the repeated half's advantage, through the keys alone
    assert abs(found["q"].restored) < 0.1  # the queries read the current token, which the corruption kept
    assert found["v"].restored < 0.5 * found["k"].restored
    single = [path_patch(induction_model, clean, corrupted, sender=("blocks.0.attn", h),
                         receiver=("blocks.1.attn", 0), via="k", metric=metric).restored for h in range(4)]
    assert all(0 < share < found["k"].restored for share in single)  # each carries part of it


def test_path_patching_refuses_a_path_that_runs_backwards(induction_model):
    clean, corrupted, metric = _odd_positions_corrupted()
    with pytest.raises(InputError, match="earlier sublayer"):
        path_patch(induction_model, clean, corrupted, sender=("blocks.1.attn", 0), receiver=("blocks.0.attn", 1),
                   via="k", metric=metric)


def test_inspect_circuits_writes_the_composition_table_of_a_gqa_rope_run(tmp_path):
    tokenizer = CharTokenizer("abcdefgh ")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_kv_heads=2,
                         position="rope", d_ff=32, n_layers=2, max_seq_len=16)
    tokenizer.save(tmp_path / "run" / "tokenizer")
    save_model(build_model(config), config, tmp_path / "run")
    paths = run_inspect(InspectSettings(run=str(tmp_path / "run"), analysis="circuits", out=str(tmp_path / "out")))
    report = json.loads(paths[0].read_text())
    assert len(report["rows"]) == 3 * 4 * 4  # q, k and v from each layer-0 head into each layer-1 head
    assert [r["score"] for r in report["rows"]] == sorted((r["score"] for r in report["rows"]), reverse=True)
    assert "RoPE" in report["summary"]["notes"] and "2 key/value heads" in report["summary"]["notes"]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("options, note", [
    ({"family": "encoder", "norm_position": "post", "n_classes": 3}, "post-norm"),
    ({"position": "alibi"}, "ALiBi"),
    ({"position": "relative"}, "RelativePositions"),
    ({"score": "bilinear"}, "pre-norm"),
    ({"attention_window": 4}, "sliding window"),
])
def test_composition_scores_on_each_kind_of_transformer_say_what_the_weights_leave_out(options, note):
    found = composition_scores(_decoder(**options))
    assert len(found.rows) == 3 * 4 * 4 and all(0 <= r["score"] <= 1 for r in found.rows)
    assert any(note in n for n in found.notes), found.notes


def test_the_full_ov_circuit_refuses_what_has_no_product_of_matrices():
    with pytest.raises(InputError, match="nonlinear transform"):
        full_ov(_decoder(family="encoder", encoder_head="mlm", mlm_transform=True), "blocks.0.attn")
    with pytest.raises(InputError, match="full OV circuit"):
        full_ov(_decoder(family="encoder-decoder"), "decoder.blocks.0.cross_attn")


def test_the_circuits_picture_shares_one_scale_and_keeps_every_title_inside(tmp_path, monkeypatch):
    """Q-, K- and V-composition scores (each in [0, 1]) are drawn on one 0-1 scale, so that colours compare across
    the three panels, and the spectra's panel title stays within the picture (it ran past its right edge)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnkit.inspect import command

    drawn = []
    monkeypatch.setattr(command, "write_report", lambda out, name, **parts: drawn.append(parts["figure"]) or [])
    tokenizer = CharTokenizer("abcdefgh ")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=32,
                         n_layers=2, max_seq_len=16)
    tokenizer.save(tmp_path / "run" / "tokenizer")
    save_model(build_model(config), config, tmp_path / "run")
    run_inspect(InspectSettings(run=str(tmp_path / "run"), analysis="circuits", out=str(tmp_path / "out")))
    (figure,) = drawn
    figure.tight_layout()
    renderer = FigureCanvasAgg(figure).get_renderer()
    panels = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.images[0].get_clim() for ax in panels[:3]] == [(0.0, 1.0)] * 3
    width = figure.bbox.width
    for ax in panels:
        extent = ax.title.get_window_extent(renderer)
        assert 0 <= extent.x0 and extent.x1 <= width, f"{ax.get_title()!r} runs past the picture"
