"""Attention maps from a run: the weights are the model's own, labels the tokenizer's pieces, the PNGs and the page
are written, and bad input gets clear errors."""

import base64
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.image import imread
from matplotlib.text import Text
from torch.testing import assert_close

from attnkit.checkpoint import save_model
from attnkit.cli import main
from attnkit.config import ModelConfig
from attnkit.data.lm import bos_first
from attnkit.errors import InputError
from attnkit.models import build_model
from attnkit.models.greedy import greedy_target
from attnkit.models.recurrent import recurrent_seq2seq
from attnkit.tokenize import CharTokenizer, train_tokenizer
from attnkit.viz import AttentionMaps, attention_maps, plot_grid, plot_head, token_labels, write_pngs
from attnkit.viz.heatmap import DPI, grid_figure
from attnkit.viz.run import VizSettings, run_viz

TEXT = "the cat sat on the mat because it was warm"
CORPUS = "the cat sat on the mat. the dog sat on the log. it was warm, because the sun was out.\n" * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS)
    return train_tokenizer("bpe", [path], vocab_size=300)


def _model(tokenizer, family, **kw):
    torch.manual_seed(0)
    config = ModelConfig(family=family, vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, max_seq_len=96, **kw)
    return build_model(config).eval(), config


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    """A saved run directory per family."""
    out = {}
    for family in ("decoder", "encoder", "encoder-decoder"):
        model, config = _model(tokenizer, family)
        directory = tmp_path_factory.mktemp(family)
        save_model(model, config, directory)
        tokenizer.save(directory / "tokenizer")
        out[family] = directory
    return out


def test_decoder_maps_are_the_reference_weights_with_the_tokenizers_pieces(tokenizer):
    model, _ = _model(tokenizer, "decoder")
    (maps,) = attention_maps(model, tokenizer, TEXT, layers=[1], heads=[0, 2])
    ids = tokenizer.encode(TEXT)
    reference = model(torch.tensor([ids]), need_weights=True).attentions[1]["self"][0]  # (H, T, T)
    assert maps.kind == "causal" and maps.layers == (1,) and maps.heads == (0, 2)
    assert_close(torch.from_numpy(maps.weights[0]), reference[[0, 2]].detach())
    pieces = [p.replace("Ġ", " ") for p in tokenizer.pieces(ids)]
    assert list(maps.query_tokens) == [p.replace(" ", "␣") if not p.strip() else p for p in pieces]
    assert "".join(maps.key_tokens) == TEXT


def test_encoder_frames_the_text_as_its_training_data(tokenizer):
    model, _ = _model(tokenizer, "encoder")
    (maps,) = attention_maps(model, tokenizer, TEXT)
    assert maps.kind == "self"
    first, last = tokenizer.pieces([tokenizer.cls_id, tokenizer.sep_id])
    assert maps.query_tokens[0] == first and maps.query_tokens[-1] == last
    assert maps.weights.shape == (2, 4, len(tokenizer.encode(TEXT)) + 2, len(tokenizer.encode(TEXT)) + 2)


def test_translation_maps_have_three_kinds_and_rows_of_written_tokens(tokenizer):
    model, _ = _model(tokenizer, "encoder-decoder")
    maps = {m.kind: m for m in attention_maps(model, tokenizer, TEXT, target="the dog sat")}
    assert set(maps) == {"self", "causal", "cross"}
    source = [*tokenizer.encode(TEXT), tokenizer.eos_id]
    written = tokenizer.encode("the dog sat")
    out = model(torch.tensor([source]), torch.tensor([[tokenizer.bos_id, *written]]), need_weights=True)
    assert_close(torch.from_numpy(maps["cross"].weights[1]), out.attentions[1]["cross"][0].detach())
    assert_close(torch.from_numpy(maps["self"].weights[0]), out.encoder_attentions[0]["self"][0].detach())
    assert maps["cross"].query_tokens[-1] == "<eos>" and maps["causal"].query_tokens[0] == "<bos>"
    assert maps["cross"].key_tokens == maps["self"].key_tokens


def test_attention_maps_read_a_training_model_without_dropout_and_leave_it_training(tokenizer):
    """attention_maps set the model to eval mode and left it there: a model drawn mid-training went on training
    without dropout. Its modes are given back (a block frozen in eval mode stays so), also on a refused request, and
    its greedy translation and maps are read without dropout."""
    model, _ = _model(tokenizer, "encoder-decoder", dropout=0.5)
    model.train()
    model.decoder.blocks[0].eval()
    drawn = [attention_maps(model, tokenizer, TEXT, translate=True, max_length=6) for _ in range(2)]
    for first, second in zip(*drawn, strict=True):
        assert first.query_tokens == second.query_tokens
        assert_close(first.weights, second.weights)
    with pytest.raises(InputError, match="layer 9 is out of range"):
        attention_maps(model, tokenizer, TEXT, target="the dog", layers=[9])
    assert model.training and model.encoder.training and not model.decoder.blocks[0].training


def test_translate_draws_the_models_own_greedy_translation(tokenizer):
    model, _ = _model(tokenizer, "encoder-decoder")
    maps = {m.kind: m for m in attention_maps(model, tokenizer, TEXT, translate=True, max_length=6)}
    source = torch.tensor([[*tokenizer.encode(TEXT), tokenizer.eos_id]])
    written = [tokenizer.bos_id]
    while len(written) <= 6:  # the greedy choices, replayed with whole forward passes
        token = int(model(source, torch.tensor([written])).logits[0, -1].argmax())
        if token == tokenizer.eos_id:
            break
        written.append(token)
    assert maps["causal"].query_tokens == tuple(token_labels(tokenizer, written))


def test_recurrent_translation_alignment_per_decoding_step():
    tokenizer = CharTokenizer("abcdefgh ")
    torch.manual_seed(0)
    model = recurrent_seq2seq(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
                              embedding_dim=16, hidden=16, encoder_hidden=8, n_layers=1, cell="gru",
                              attention="bahdanau", bidirectional=True).eval()
    (maps,) = attention_maps(model, tokenizer, "abc de", target="fgh")
    source = [*tokenizer.encode("abc de"), tokenizer.eos_id]
    out = model(torch.tensor([source]), torch.tensor([[tokenizer.bos_id, *tokenizer.encode("fgh")]]), need_weights=True)
    assert maps.kind == "cross" and maps.weights.shape == (1, 1, 4, 7)
    assert_close(torch.from_numpy(maps.weights[0]), out.attentions[0]["cross"][0].detach())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"text": "   "}, "the text is empty"),
    ({"layers": [2]}, "layer 2 is out of range: this model's layers are 0..1"),
    ({"heads": [-1]}, "head -1 is out of range: this model's heads are 0..3"),
    ({"heads": [4]}, "head 4 is out of range"),
    ({"translate": True}, "need a translation model"),
    ({"target": "x"}, "need a translation model"),
])
def test_bad_input_is_named(tokenizer, kwargs, message):
    model, _ = _model(tokenizer, "decoder")
    with pytest.raises(InputError, match=re.escape(message)):
        attention_maps(model, tokenizer, **{"text": TEXT, **kwargs})


def test_a_translation_model_needs_a_target(tokenizer):
    model, _ = _model(tokenizer, "encoder-decoder")
    with pytest.raises(InputError, match="--target TEXT or --translate"):
        attention_maps(model, tokenizer, TEXT)


def _not_blank(path: Path) -> np.ndarray:
    image = imread(path)[..., :3]
    assert image.std() > 0.05, f"{path} is blank"
    return image


@pytest.mark.slow  # draws every picture (8 s); the CLI test draws them too
def test_pngs_have_their_size_and_are_not_blank(tokenizer, tmp_path):
    model, _ = _model(tokenizer, "encoder-decoder")
    text = " ".join(["the cat sat on the mat"] * 10)  # about 60 tokens: each keeps a readable cell
    maps = {m.kind: m for m in attention_maps(model, tokenizer, text, target="the dog sat on the log")}
    n_source = len(maps["self"].key_tokens)
    assert n_source >= 60
    head = plot_head(maps["self"], 0, 1, tmp_path / "head.png")
    height, width, _ = _not_blank(head).shape
    assert width >= 0.2 * DPI * n_source and height >= 0.2 * DPI * n_source  # >= 0.2 inch per token
    grid = _not_blank(plot_grid(maps["cross"], tmp_path / "grid.png"))
    assert grid.shape[1] > grid.shape[0]  # 4 heads across, 2 layers down
    paths = write_pngs([maps["cross"]], tmp_path / "all", per_head=False)
    assert sorted(p.name for p in paths) == [
        "alignment.png", "cross_grid.png", "cross_layer0_mean.png", "cross_layer1_mean.png"]
    for path in paths:
        _not_blank(path)


def test_grid_scales_each_map_to_its_largest_weight_and_says_so_in_a_colour_bar():
    rng = np.random.default_rng(0)
    weights = rng.random((2, 3, 5, 5)).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)  # rows sum to 1
    tokens = ("a", "b", "c", "d", "<eos>")
    fig = grid_figure(AttentionMaps("self", weights, tokens, tokens, (0, 1), (0, 1, 2)))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # lays the figure out as saving it does
    *panels, bar = fig.axes
    assert len(panels) == 2 * 3
    for index, ax in enumerate(panels):  # each map scaled to 0..1 of its own largest weight
        np.testing.assert_allclose(ax.get_images()[0].get_array(), weights[index // 3, index % 3]
                                   / weights[index // 3, index % 3].max(), rtol=1e-6)
    assert bar.get_ylabel() == "weight / its map's largest" and bar.get_ylim() == (0.0, 1.0)
    right_of_maps = max(ax.get_window_extent(renderer).x1 for ax in panels)
    assert bar.get_window_extent(renderer).x0 > right_of_maps  # beside the maps, not over one
    assert bar.yaxis.label.get_window_extent(renderer).x1 <= fig.bbox.x1  # its label not cut off


def test_run_viz_writes_pictures_and_a_page_of_the_models_weights(runs, tokenizer, tmp_path):
    result = run_viz(VizSettings(run=str(runs["decoder"]), text=TEXT, heads=(1,), out=str(tmp_path)))
    assert result.page == tmp_path / "attention.html" and len(result.pngs) == 1 + 2 * 2
    html = result.page.read_text()
    data = json.loads(re.search(r'id="attnkit-data">(.*?)</script>', html, re.S).group(1))
    (view,) = data["views"]
    length = len(view["query_tokens"])
    embedded = np.frombuffer(base64.b64decode(view["weights"]), dtype="<f4").reshape(2, 1, length, length)
    np.testing.assert_array_equal(embedded, result.maps[0].weights)
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing fetched


def test_cli_viz(runs, tmp_path, capsys):
    out = tmp_path / "viz"
    assert main(["viz", "--run", str(runs["encoder-decoder"]), "--source", TEXT, "--target", "the dog",
                 "--layers", "1", "--no-per-head", "--out", str(out)]) == 0
    assert (out / "alignment.png").is_file() and (out / "attention.html").is_file()
    assert "alignment.png" in capsys.readouterr().out
    assert main(["viz", "--run", str(runs["decoder"]), "--text", TEXT, "--translate"]) == 2  # before it loads
    err = capsys.readouterr().err
    assert "--translate does not apply" in err and "it is for runs of translate" in err, err
    assert main(["viz", "--run", str(runs["decoder"]), "--text", TEXT, "--layers", "5"]) == 2
    assert "layer 5 is out of range" in capsys.readouterr().err


def test_maps_refuse_shapes_that_disagree():
    with pytest.raises(InputError, match="shape"):
        AttentionMaps("causal", np.zeros((1, 1, 2, 3)), ("a", "b"), ("a", "b"), (0,), (0,))


def test_run_viz_needs_something_to_draw(runs):
    with pytest.raises(InputError, match="nothing to draw: give --text TEXT"):
        run_viz(VizSettings(run=str(runs["decoder"])))
    with pytest.raises(InputError, match="give the source too"):
        run_viz(VizSettings(run=str(runs["encoder-decoder"]), target="the dog"))


@pytest.mark.parametrize("attention", ["bahdanau", "luong-dot", "none"])
def test_recurrent_seq2seq_run_draws_its_alignment(tmp_path, attention):
    tokenizer = CharTokenizer("abcdefgh")
    config = ModelConfig(family="recurrent-seq2seq", vocab_size=tokenizer.vocab_size, cell="gru", hidden_size=16,
                         attention=attention)
    save_model(build_model(config), config, tmp_path)
    tokenizer.save(tmp_path / "tokenizer")
    settings = VizSettings(run=str(tmp_path), text="abcd", target="dcba", per_head=False)
    if attention == "none":
        with pytest.raises(InputError, match="has no attention to draw"):
            run_viz(settings)
        return
    result = run_viz(settings)
    (maps,) = result.maps
    assert maps.kind == "cross" and maps.weights.shape == (1, 1, 5, 5)
    assert tmp_path / "viz" / "alignment.png" in result.pngs
    with pytest.raises(InputError, match="--from-token 1: this model's attention is cross-attention alone"):
        run_viz(dataclasses.replace(settings, from_token=1))  # no self-attention: it drew nothing, and said nothing


@pytest.mark.parametrize("n_tokens", [12, 200])
def test_one_head_grid_keeps_its_title_whole_and_clear_of_the_head_title(n_tokens):
    """A recurrent model's grid is one map (one layer, one head): its figure title fits the figure, above the
    head's title, for a short sentence and a long one."""
    weights = np.full((1, 1, n_tokens, n_tokens), 1.0 / n_tokens, dtype=np.float32)
    tokens = tuple(f"t{i}" for i in range(n_tokens))
    fig = grid_figure(AttentionMaps("cross", weights, tokens, tokens, (0,), (0,)))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # lays the figure out as saving it does
    (title,) = [text.get_window_extent(renderer) for text in fig.findobj(Text) if text.get_text().startswith("cross")]
    assert fig.bbox.x0 <= title.x0 and title.x1 <= fig.bbox.x1  # not cut off at either side
    head_title = fig.axes[0].title.get_window_extent(renderer)
    assert title.y0 >= head_title.y1  # above "head 0", not over it


@pytest.fixture(scope="module")
def endless_run(tmp_path_factory, tokenizer):
    """An untrained encoder-decoder of learned positions up to 16 that never writes EOS on its own."""
    torch.manual_seed(0)
    config = ModelConfig(family="encoder-decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, max_seq_len=16)
    model = build_model(config).eval()
    directory = tmp_path_factory.mktemp("endless")
    save_model(model, config, directory)
    tokenizer.save(directory / "tokenizer")
    return directory, model


def test_translate_stops_at_the_models_context_and_labels_the_last_row_with_what_it_writes(endless_run, tokenizer):
    """An own translation that never ends is cut where the model's context ends (not refused as a too-long input
    the user never gave), and the row after its last token is labelled with what the model writes there, not
    with an EOS it never wrote."""
    directory, model = endless_run
    result = run_viz(VizSettings(run=str(directory), text="the cat", translate=True, per_head=False,
                                 out=str(directory / "viz")))
    cross = next(m for m in result.maps if m.kind == "cross")
    source = [*tokenizer.encode("the cat"), tokenizer.eos_id]
    own = greedy_target(model, source, bos=tokenizer.bos_id, eos=tokenizer.eos_id, max_length=15)
    assert len(own) == 15  # BOS and 15 tokens fill the context of 16: the model never ended its translation
    with torch.no_grad():
        logits = model(torch.tensor([source]), torch.tensor([[tokenizer.bos_id, *own]])).logits  # (1, 16, V)
    next_token = int(logits[0, -1].argmax())
    assert next_token != tokenizer.eos_id
    assert cross.query_tokens == tuple(token_labels(tokenizer, [*own, next_token]))


def test_a_mean_over_some_heads_names_them(monkeypatch, tmp_path):
    """`--heads 1 3` draws the mean of heads 1 and 3: the title says so, not "mean over heads" (all of them)."""
    import attnkit.viz.heatmap as heatmap

    titles = []
    monkeypatch.setattr(heatmap, "save_figure", lambda fig, path: titles.append(fig.get_suptitle()))
    weights = np.full((1, 2, 3, 3), 1 / 3, dtype=np.float32)
    maps = AttentionMaps("cross", weights, ("a", "b", "c"), ("x", "y", "z"), (0,), (1, 3))
    heatmap.plot_head(maps, 0, None, tmp_path / "mean.png")
    heatmap.plot_alignment(maps, tmp_path / "alignment.png")
    assert titles == ["cross-attention, layer 0, mean over heads 1, 3",
                      "alignment: cross-attention, layer 0, mean over heads 1, 3"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cuda:7"], "--device cuda:7"),  # a CUDA device this machine lacks (none, or too few)
    (["--device", "tpu"], "--device 'tpu'"),
    (["--translate", "--max-length", "0"], "--max-length 0: give at least 1"),
])
def test_cli_viz_refuses_a_bad_device_or_length_in_one_line(runs, tmp_path, capsys, argv, message):
    """A device torch lacks was an AssertionError traceback from torch; --max-length 0 read as a model that writes
    EOS first."""
    code = main(["viz", "--run", str(runs["encoder-decoder"]), "--source", TEXT, "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing drawn


def test_a_second_draw_into_one_folder_leaves_no_picture_of_the_first(runs, tmp_path):
    """Pictures of heads the second call does not draw (of another text) are removed, not left beside the new
    ones as if they were of the same text; a file of the user's there is kept."""
    out = tmp_path / "viz"
    run_viz(VizSettings(run=str(runs["decoder"]), text=TEXT, heads=(0, 3), out=str(out)))
    assert (out / "causal_layer1_head3.png").is_file()
    (out / "notes.txt").write_text("mine")
    second = run_viz(VizSettings(run=str(runs["decoder"]), text="the dog", heads=(0,), per_head=False,
                                 out=str(out)))
    drawn = {path.name for path in [*second.pngs, second.page]}
    assert {p.name for p in out.iterdir()} == drawn | {"notes.txt", "viz.json"}


def test_a_draw_that_fails_leaves_the_folder_as_it_was(runs, tmp_path, monkeypatch):
    import attnkit.viz.run as viz_run

    out = tmp_path / "viz"
    run_viz(VizSettings(run=str(runs["decoder"]), text=TEXT, per_head=False, out=str(out)))
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(viz_run, "write_page", full_disk)
    with pytest.raises(Exception, match="No space left|space"):
        run_viz(VizSettings(run=str(runs["decoder"]), text="the dog", per_head=False, out=str(out)))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder-decoder"])
def test_a_text_longer_than_the_context_is_refused_as_generation_refuses_it(tokenizer, tmp_path, family):
    """Rotary positions would let the model read 100 tokens, but it was built (and trained) for 96: the picture
    would show attention it never computes in use. `attnkit generate` refuses such a prompt; so does viz."""
    model, config = _model(tokenizer, family, position="rope")
    save_model(model, config, tmp_path)
    tokenizer.save(tmp_path / "tokenizer")
    long_text = " ".join([TEXT] * 12)
    assert len(tokenizer.encode(long_text)) > config.max_seq_len
    target = {"target": "the dog"} if family == "encoder-decoder" else {}
    with pytest.raises(InputError, match=r"tokens; this model reads at most 96 \(max_seq_len\): shorten"):
        run_viz(VizSettings(run=str(tmp_path), text=long_text, out=str(tmp_path / "viz"), **target))
    assert not (tmp_path / "viz").exists()


@pytest.mark.parametrize("n_tokens", [6, 80])
def test_a_heatmaps_colour_bar_stands_beside_the_map_as_tall_as_it(monkeypatch, tmp_path, n_tokens):
    """On a long text's wide figure the bar was a share of the figure's width (0.7 inch at 80 tokens, 1.8 at 220)
    and ran past the map's bottom; it is a narrow bar beside the map, as tall as the map, with labels as large as
    the tokens'."""
    import attnkit.viz.heatmap as heatmap

    figures = []
    save = heatmap.save_figure
    monkeypatch.setattr(heatmap, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    weights = np.random.default_rng(0).dirichlet(np.ones(n_tokens), size=(1, 1, n_tokens)).astype(np.float32)
    tokens = tuple(f"t{i}" for i in range(n_tokens))
    maps = AttentionMaps("cross", weights, tokens, tokens, (0,), (0,))
    heatmap.plot_head(maps, 0, 0, tmp_path / "head.png")
    heatmap.plot_alignment(maps, tmp_path / "alignment.png")
    for fig in figures:
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)  # as saved
        image_ax, bar_ax = fig.axes
        image = image_ax.get_images()[0].get_window_extent(renderer)
        bar = bar_ax.get_window_extent(renderer)
        assert bar.x0 >= image.x1  # beside the map
        assert abs(bar.height - image.height) <= 0.05 * image.height  # as tall as the map
        assert bar.width <= 0.4 * DPI  # a narrow bar, however wide the figure
        assert min(label.get_fontsize() for label in bar_ax.get_yticklabels()) >= 8


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_a_text_of_bytes_that_are_not_utf8_is_one_line_not_a_traceback(runs, tmp_path, capsys, family):
    """A shell passes bytes that are not UTF-8 (`--text $'ab\\xffc'`) as a lone surrogate: the tokenizer's
    TypeError was a traceback."""
    text = b"ab\xffc".decode("utf-8", "surrogateescape")  # as Python reads the command line
    flag = "--source" if family == "encoder-decoder" else "--text"
    more = ["--target", "the dog"] if family == "encoder-decoder" else []
    code = main(["viz", "--run", str(runs[family]), flag, text, *more, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "not UTF-8" in err and "byte 0xff" in err and "Traceback" not in err


def test_the_char_tokenizer_names_bytes_that_are_not_utf8():
    with pytest.raises(InputError, match=r"not UTF-8 \(byte 0xff at character 2\)"):
        CharTokenizer("abc").encode(b"ab\xffc".decode("utf-8", "surrogateescape"))


def test_a_grid_makes_room_for_long_token_labels():
    """Labels of 35 characters left the grid's maps no room (matplotlib's layout gave up, the labels were cut at the
    figure's edges and the titles drawn over each other); the figure grows by the labels' length."""
    weights = np.random.default_rng(0).dirichlet(np.ones(4), size=(2, 2, 3)).astype(np.float32)
    queries, keys = ("a", "=" * 35, "bb"), ("ThisIsAVeryLongTokenLabelIndeed_xx", "y", "z", "<eos>")
    fig = grid_figure(AttentionMaps("cross", weights, queries, keys, (0, 1), (0, 1)))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # lays the figure out as saving it does
    panels = fig.axes[:-1]
    labels = [label for ax in panels for label in (*ax.get_xticklabels(), *ax.get_yticklabels()) if label.get_text()]
    assert len(labels) == 2 * len(queries) + 2 * len(keys)
    for label in labels:
        box = label.get_window_extent(renderer)
        assert box.x0 >= fig.bbox.x0 - 1 and box.y0 >= fig.bbox.y0 - 1, label.get_text()
    for ax in panels:
        assert ax.get_window_extent(renderer).width > 0.5 * DPI  # maps, not collapsed to nothing


@pytest.mark.parametrize("key_tokens", [("x", "y", "z"), ("ThisIsAVeryLongTokenLabelIndeed_xx", "y", "z"),
                                        tuple(f"k{j}" for j in range(100))])
def test_a_heatmaps_title_stays_inside_its_figure(monkeypatch, tmp_path, key_tokens):
    """A title centred on a small map beside long labels ran off the figure's right edge ("mean ov"); a long text's
    title was drawn over the top of its map (its room shrank with the labels' font). It lies inside the figure and
    above the map and everything drawn around it."""
    import attnkit.viz.heatmap as heatmap

    figures = []
    save = heatmap.save_figure
    monkeypatch.setattr(heatmap, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    queries = ("a", "=" * 35, "bb") if len(key_tokens) < 100 else tuple(f"q{i}" for i in range(100))
    weights = np.full((1, 2, len(queries), len(key_tokens)), 1 / len(key_tokens), dtype=np.float32)
    maps = AttentionMaps("cross", weights, queries, key_tokens, (0,), (1, 3))
    heatmap.plot_head(maps, 0, None, tmp_path / "mean.png")
    heatmap.plot_alignment(maps, tmp_path / "alignment.png")
    for fig in figures:
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)  # as saved
        (title,) = [t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle()]
        box = title.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, fig.get_suptitle()
        for ax in fig.axes:  # the map with its labels (an alignment's keys are on top) and the colour bar
            assert box.y0 >= ax.get_tightbbox(renderer).y1, (fig.get_suptitle(), len(key_tokens))


def test_a_text_too_long_is_refused_in_the_words_translation_uses(tokenizer):
    """viz's length check repeated models/greedy.py's: one check_fits words both."""
    from attnkit.models.greedy import check_fits

    model, _ = _model(tokenizer, "decoder")
    ids = tokenizer.encode(" ".join([TEXT] * 12))
    with pytest.raises(InputError) as expected:
        check_fits(ids, "text", 96)
    with pytest.raises(InputError) as found:
        attention_maps(model, tokenizer, " ".join([TEXT] * 12), context=96)
    assert str(found.value) == str(expected.value)


@pytest.mark.parametrize(("family", "head", "frame", "around"), [
    ("decoder", "lm", "attnkit", (["bos"], [])),  # a converted Llama: its texts start with BOS, as it generates
    ("decoder", "tag", "attnkit", (["cls"], ["sep"])),  # a decoder tagger reads its words between attnkit's marks
    ("decoder", "tag", "own", ([], [])),  # a converted GPT-2 tagger: its tokenizer adds nothing
    ("encoder", "tag", "own", (["bos", "cls"], ["sep", "eos"])),  # two marks on each side, its tokenizer's own
])
def test_a_text_is_drawn_as_the_model_reads_it(family, head, frame, around):
    """The maps' tokens are those the model reads (`text_frame`): a converted Llama's text was drawn without the BOS it
    always reads, a decoder tagger's without its marks, and a converted encoder's with attnkit's CLS and SEP in place
    of its tokenizer's own; the weights are the model's own over those tokens."""
    chars = CharTokenizer("abcdefgh ")
    before, after = ([chars.token_id(role) for role in side] for side in around)
    chars.starts_with_bos = before == [chars.bos_id]
    chars.own_frame = (tuple(before), tuple(after))
    fields = {"decoder_head" if family == "decoder" else "encoder_head": head}
    if head == "tag":
        fields["n_classes"] = 2
    model, _ = _model(chars, family, **fields)
    (maps,) = attention_maps(model, chars, "abc de", layers=[0], frame=frame)
    ids = [*before, *chars.encode("abc de"), *after]
    assert list(maps.query_tokens) == list(token_labels(chars, ids))
    reference = model(torch.tensor([ids]), need_weights=True).attentions[0]["self"][0]  # (H, T, T)
    assert_close(torch.from_numpy(maps.weights[0]), reference.detach())


def test_a_language_models_text_starts_with_bos_where_its_training_stream_did():
    """A language model's text is framed by the rule its training stream followed (`data.lm.bos_first`): a tokenizer
    of one's own that says it starts its texts with BOS but has none trained on texts with nothing before them, and
    its text is drawn so, where the drawing was refused for the missing BOS."""
    class NoBos(CharTokenizer):
        starts_with_bos = True

        def token_id(self, role: str) -> int | None:
            return None if role == "bos" else super().token_id(role)

    chars = NoBos("abcdefgh ")
    assert not bos_first(chars)
    model, _ = _model(chars, "decoder")
    (maps,) = attention_maps(model, chars, "abc de", layers=[0])
    assert list(maps.query_tokens) == list(token_labels(chars, chars.encode("abc de")))


@pytest.mark.parametrize("frame", ["attnkit", "own"])
def test_run_viz_frames_the_text_as_the_runs_task_json_says(tokenizer, tmp_path, frame):
    """`attnkit viz` reads a tagger's framing from its task.json (`frame_of`): a converted GPT-2 tagger's text is drawn
    with nothing around it, as its tokenizer gives it, and a tagger trained here between CLS and SEP."""
    model, config = _model(tokenizer, "decoder", decoder_head="tag", n_classes=2)
    save_model(model, config, tmp_path)
    tokenizer.save(tmp_path / "tokenizer")
    (tmp_path / "task.json").write_text(json.dumps({"task": "tag", "frame": frame}))
    (maps,) = run_viz(VizSettings(run=str(tmp_path), text=TEXT, layers=[0], out=str(tmp_path / "viz"))).maps
    around = [tokenizer.cls_id], [tokenizer.sep_id]
    if frame == "own":
        around = tokenizer.own_frame
    ids = [*around[0], *tokenizer.encode(TEXT), *around[1]]
    assert list(maps.query_tokens) == list(token_labels(tokenizer, ids))


def test_a_token_the_fonts_cannot_draw_is_labelled_by_its_code_point(tmp_path):
    """An emoji has no glyph in matplotlib's DejaVu Sans: its label was an empty box, and matplotlib warned once per
    picture drawn and saved (21 warnings for one text). A character no font of the figure holds is written as its
    code point between angle brackets, apart from the label's own text; Hebrew, Arabic and the whitespace marks,
    which the font holds, are drawn as they are."""
    import warnings

    from matplotlib import font_manager

    from attnkit.viz.heatmap import drawable

    emoji = "\N{SLIGHTLY SMILING FACE}"
    prop = font_manager.FontProperties()
    if ord(emoji) in font_manager.get_font(font_manager.findfont(prop)).get_charmap():
        pytest.skip("this machine's default font draws the emoji")
    tokens = ("he", f"x{emoji}", "שלום", "مرحبا", "␣↵")
    assert drawable(tokens[1]) == "x⟨U+1F642⟩" and [drawable(t) for t in tokens[2:]] == list(tokens[2:])
    weights = np.full((1, 2, len(tokens), len(tokens)), 1 / len(tokens), dtype=np.float32)
    maps = AttentionMaps("causal", weights, tokens, tokens, (0,), (0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a glyph matplotlib cannot find is a UserWarning
        written = write_pngs([maps], tmp_path, per_head=False)  # the grid and the layer's mean
    assert len(written) == 2
    fig = grid_figure(maps)
    labels = {label.get_text() for ax in fig.axes for label in ax.get_yticklabels()}
    assert "x⟨U+1F642⟩" in labels and "שלום" in labels


def test_a_font_put_first_in_rcparams_after_a_picture_is_drawn_draws_what_it_holds():
    """Which characters the fonts hold was cached on font.family alone ("sans-serif"), so a font a user put first
    in rcParams["font.sans-serif"] after the first picture was never consulted: its characters stayed code points."""
    import matplotlib as mpl
    from matplotlib import font_manager

    from attnkit.viz.heatmap import drawable

    stix = font_manager.findfont(font_manager.FontProperties(family="STIXGeneral"), fallback_to_default=False)
    character = "\N{SCRIPT SMALL G}"  # U+210A: in matplotlib's STIX fonts, not in DejaVu Sans
    if ord(character) not in font_manager.get_font(stix).get_charmap():
        pytest.skip("matplotlib's STIXGeneral here lacks U+210A")
    with mpl.rc_context({"font.family": ["sans-serif"], "font.sans-serif": ["DejaVu Sans"]}):
        assert drawable(f"a{character}") == "a⟨U+210A⟩"  # the first picture: DejaVu Sans lacks it
        mpl.rcParams["font.sans-serif"].insert(0, "STIXGeneral")
        assert drawable(f"a{character}") == f"a{character}"


@pytest.mark.parametrize(("family", "what"), [("decoder", "the text"), ("encoder", "the text"),
                                              ("encoder-decoder", "the source")])
def test_a_text_the_tokenizer_drops_whole_is_refused_naming_its_characters(family, what):
    """A text whose every character the tokenizer skips was read as its frame alone: a decoder's as no ids ("input_ids
    must hold integer token ids ... dtype torch.float32"), an encoder's as CLS SEP, a translator's source as EOS."""
    chars = CharTokenizer("abcdefgh ", unknown="skip")
    model, _ = _model(chars, family)
    target = {"target": "abc"} if family == "encoder-decoder" else {}
    with pytest.raises(InputError, match=rf"{what} \('XYZ'\) has no token: .*unknown characters 'XYZ' skipped"):
        attention_maps(model, chars, "XYZ", **target)


def test_cli_viz_from_token_draws_bertviz_head_view_per_layer_and_head_and_refuses_a_position_past_the_text(
        runs, tmp_path, capsys):
    out = tmp_path / "viz"
    code = main(["viz", "--run", str(runs["decoder"]), "--text", TEXT, "--heads", "1", "--from-token", "2",
                 "--out", str(out)])
    assert code == 0
    views = sorted(p.name for p in out.glob("*_from2.png"))
    assert views == ["causal_layer0_head1_from2.png", "causal_layer1_head1_from2.png"]
    assert imread(out / views[0]).shape[0] > 100  # a picture, not an empty file
    assert set(views) <= set(json.loads((out / "viz.json").read_text())["files"])  # removed by the next call
    code = main(["viz", "--run", str(runs["decoder"]), "--text", TEXT, "--from-token", "999", "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and "--from-token 999" in err and "Traceback" not in err
