"""The attention page in a real headless Chromium: it draws a heatmap, a click on another head changes the picture,
hovering a token shows what it attends to, the views switch, and the weights it draws are the model's."""

import io
import json

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from attnkit.config import ModelConfig
from attnkit.models import build_model
from attnkit.tokenize import CharTokenizer
from attnkit.viz import attention_maps, write_page

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz ")
    torch.manual_seed(0)
    config = ModelConfig(family="encoder-decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=64,
                         n_layers=2, max_seq_len=64)
    model = build_model(config).eval()
    maps = attention_maps(model, tokenizer, TEXT, target="a dog sat")
    return write_page(maps, tmp_path_factory.mktemp("page") / "attention.html"), maps


@pytest.fixture(scope="module")
def browser(page):
    from viz_browser import Browser, chromium_or_reason

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    chromium = Browser(executable)
    chromium.open(page[0])
    yield chromium
    chromium.close()


def _heatmap(browser) -> np.ndarray:
    """The heatmap canvas as the screen shows it, (h, w, 3) in [0, 1]."""
    box = browser.evaluate("(() => { const r = document.getElementById('heatmap').getBoundingClientRect();"
                           " return [r.left, r.top, r.width, r.height]; })()")
    left, top, width, height = (int(round(v)) for v in box)
    shot = imread(io.BytesIO(browser.screenshot()), format="png")[..., :3]
    return shot[top:top + height, left:left + width]


def test_heatmap_is_drawn_and_a_click_on_another_head_changes_it(browser):
    before = _heatmap(browser)
    assert before.shape[0] > 100 and before.std() > 0.1  # cells of several colours, not a blank canvas
    browser.click('#heads button[data-head="2"]')
    assert browser.evaluate("window.attnkit.state.head") == 2
    after = _heatmap(browser)
    assert after.shape == before.shape and np.abs(after - before).mean() > 0.005


def test_the_page_draws_the_models_weights(browser, page):
    _, maps = page
    for view, expected in enumerate(maps):
        for layer_index, layer in enumerate(expected.layers):
            for head in (None, 1):
                call = f"window.attnkit.weights({view}, {layer_index}, {json.dumps(head)})"
                drawn = browser.evaluate(f"Array.from({call})")
                np.testing.assert_allclose(np.array(drawn).reshape(expected.weights.shape[2:]),
                                           expected.head_weights(layer, head), rtol=1e-6, atol=1e-7)


def test_hovering_a_token_shows_what_it_attends_to_and_views_switch(browser, page):
    _, maps = page
    cross = [m.kind for m in maps].index("cross")
    browser.evaluate(f"(() => {{ const s = document.getElementById('view'); s.value = '{cross}';"
                     " s.dispatchEvent(new Event('change')); })()")
    assert browser.evaluate("window.attnkit.state.view") == cross
    # the heatmap says which axis is which (it said nothing: the PNGs name theirs)
    assert browser.evaluate("document.getElementById('axes').textContent").startswith("rows: target tokens (queries)")
    box = browser.evaluate("(() => { const r = document.querySelector('#lines text[data-side=\"query\"]')"
                           ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]})
    summary = browser.evaluate("document.getElementById('summary').textContent")
    assert summary.startswith(json.dumps(maps[cross].query_tokens[0]) + " attends to:")
    assert browser.evaluate("document.querySelectorAll('#lines line').length") > 0


def test_model_view_shows_every_layer_and_head_and_a_click_picks_one(browser, page):
    """BertViz's model view: one small map per layer and head of the chosen kind, each scaled to its own largest
    weight; a click on one shows that layer and head in the head view and the heatmap."""
    _, maps = page
    self_view = [m.kind for m in maps].index("self")
    browser.evaluate(f"(() => {{ const s = document.getElementById('view'); s.value = '{self_view}';"
                     " s.dispatchEvent(new Event('change')); })()")
    n_layers, n_heads = maps[self_view].weights.shape[:2]
    assert browser.evaluate("document.querySelectorAll('#model canvas').length") == n_layers * n_heads
    thumbnail = '#model canvas[data-layer="1"][data-head="2"]'
    browser.evaluate(f"document.querySelector('{thumbnail}').scrollIntoView()")  # below the fold: in view to click
    browser.click(thumbnail)
    assert browser.evaluate("[window.attnkit.state.layer, window.attnkit.state.head]") == [1, 2]
    assert browser.evaluate("document.getElementById('layer').value") == "1"
    assert browser.evaluate("document.querySelector('#heads button.selected').dataset.head") == "2"
    assert browser.evaluate("document.querySelectorAll('#model canvas.selected').length") == 1
    browser.evaluate("window.scrollTo(0, 0)")  # the other tests read the page from its top


def test_shift_click_shows_several_heads_at_once_each_in_its_colour(browser, page):
    """BertViz's head view draws several heads at once, each head's lines in its colour: a shift-click adds a head
    to the one shown, another takes it away; the heatmap is the selected heads' mean."""
    _, maps = page
    self_view = [m.kind for m in maps].index("self")
    browser.evaluate(f"(() => {{ const s = document.getElementById('view'); s.value = '{self_view}';"
                     " s.dispatchEvent(new Event('change')); })()")
    browser.click('#heads button[data-head="0"]')
    for head in (2, 3, 3):  # add 2, add 3, take 3 away
        box = browser.evaluate(f"(() => {{ const r = document.querySelector('#heads button[data-head=\"{head}\"]')"
                               ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            browser.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                      "clickCount": 1, "modifiers": 8})  # 8: shift
    assert browser.evaluate("window.attnkit.state.head") == [0, 2]
    assert sorted(browser.evaluate("[...document.querySelectorAll('#heads button.selected')]"
                                   ".map((b) => b.dataset.head)")) == ["0", "2"]
    colours = browser.evaluate("[...new Set([...document.querySelectorAll('#lines line')]"
                               ".map((l) => l.getAttribute('stroke')))]")
    assert sorted(colours) == ["#1f77b4", "#2ca02c"]  # heads 0 and 2 of the palette
    drawn = browser.evaluate(f"Array.from(window.attnkit.weights({self_view}, 0, [0, 2]))")
    expected = maps[self_view].weights[0, [0, 2]].mean(axis=0)
    np.testing.assert_allclose(np.array(drawn).reshape(expected.shape), expected, rtol=1e-6, atol=1e-7)
    browser.click('#heads button[data-head="mean"]')


def test_a_one_row_heatmap_leaves_its_colour_scale_room_for_its_labels(tmp_path):
    """A translation of one token is a heatmap one row tall; its colour scale still spaces its five tick labels
    (14 px each) apart instead of drawing them over each other."""
    from viz_browser import Browser, chromium_or_reason

    from attnkit.viz import AttentionMaps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    weights = np.array([[[[0.2, 0.3, 0.5]]]], dtype=np.float32)  # (L, H, T, S) = (1, 1, 1, 3)
    path = write_page([AttentionMaps("cross", weights, ("x",), ("a", "b", "<eos>"), (0,), (0,))],
                      tmp_path / "attention.html")
    chromium = Browser(executable)
    try:
        chromium.open(path)
        ticks = chromium.evaluate("window.attnkit.scale")  # where the page drew the scale: top and height in px
        assert ticks["height"] >= 5 * 20
        assert ticks["labels"] == ["0", "0.1", "0.2", "0.3", "0.4", "0.5"]
    finally:
        chromium.close()


def test_a_scale_of_small_weights_labels_each_tick_differently(tmp_path):
    """Over 60 keys the largest weight is about 0.03: ticks printed to two decimals read 0.00 0.01 0.01 0.02 0.03,
    one label for two colours; they are round weights that tell them apart."""
    from viz_browser import Browser, chromium_or_reason

    from attnkit.viz import AttentionMaps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    weights = np.full((1, 1, 2, 60), 0.5 / 59, dtype=np.float32)
    weights[..., 0] = 0.5 / 59 + 0.016  # largest 0.0245: ticks 0.006 apart
    keys = tuple(f"k{j}" for j in range(60))
    path = write_page([AttentionMaps("cross", weights, ("x", "y"), keys, (0,), (0,))], tmp_path / "attention.html")
    chromium = Browser(executable)
    try:
        chromium.open(path)
        labels = chromium.evaluate("window.attnkit.scale.labels")
        assert labels == ["0", "0.005", "0.01", "0.015", "0.02", "0.0245"]  # the top: the largest weight
    finally:
        chromium.close()


def test_each_colour_scale_label_is_the_weight_at_its_height(tmp_path):
    """Ticks at quarters of the largest weight were printed rounded: for 0.05, 0.0125 0.025 0.0375 read 0.01 0.03
    0.04, steps of 0.02 and 0.01 on a bar of equal steps. Each tick is now a round weight printed as it is, at the
    height that weight has on the bar, and the top says the largest weight."""
    from viz_browser import Browser, check_colour_bar, chromium_or_reason

    from attnkit.viz import AttentionMaps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    chromium = Browser(executable)
    try:
        for largest in (0.05, 0.5, 0.9, 0.0123):
            weights = np.array([[[[largest, 1 - largest], [0.3, 0.7]]]], dtype=np.float32)
            weights = weights * (largest / weights.max())  # the map's largest weight is `largest`
            path = write_page([AttentionMaps("cross", weights, ("x", "y"), ("a", "b"), (0,), (0,))],
                              tmp_path / f"{largest}.html")
            chromium.open(path)
            scale = chromium.evaluate("window.attnkit.scale")
            check_colour_bar(scale["ticks"], scale["top"], scale["height"], largest)
    finally:
        chromium.close()


def test_long_token_labels_fit_the_head_view(tmp_path):
    """A token of 35 characters (a code tokenizer's run of '=' or a long word piece) stood past the head view's
    130-pixel columns and was cut off at the page's edge and the SVG's; each column is as wide as its longest
    label."""
    from viz_browser import Browser, chromium_or_reason

    from attnkit.viz import AttentionMaps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    queries, keys = ("a", "=" * 35, "bb"), ("ThisIsAVeryLongTokenLabelIndeed_xx", "y", "z", "<eos>")
    weights = np.full((1, 1, 3, 4), 0.25, dtype=np.float32)
    path = write_page([AttentionMaps("cross", weights, queries, keys, (0,), (0,))], tmp_path / "attention.html")
    chromium = Browser(executable)
    try:
        chromium.open(path)
        inside = chromium.evaluate(
            "(() => { const svg = document.getElementById('lines').getBoundingClientRect();"
            " return [...document.querySelectorAll('#lines text[data-side]')].map((t) => {"
            " const r = t.getBoundingClientRect();"
            " return r.left >= svg.left - 0.5 && r.right <= svg.right + 0.5 && r.left >= 0; }); })()")
        assert inside == [True] * (len(queries) + len(keys))
    finally:
        chromium.close()


def test_a_long_texts_heatmap_labels_are_no_taller_than_its_cells(tmp_path):
    """Beyond about 53 tokens a cell shrank to its least, 12 px, while the labels stayed 14 px tall, each over its
    neighbours; the labels are now at most a cell tall."""
    from viz_browser import Browser, chromium_or_reason

    from attnkit.viz import AttentionMaps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    tokens = tuple(f"t{i}" for i in range(100))
    weights = np.full((1, 1, 100, 100), 0.01, dtype=np.float32)
    path = write_page([AttentionMaps("self", weights, tokens, tokens, (0,), (0,))], tmp_path / "attention.html")
    chromium = Browser(executable)
    try:
        chromium.open(path)
        drawn = chromium.evaluate("window.attnkit.heatmap")
        width = chromium.evaluate("document.getElementById('heatmap').width")
    finally:
        chromium.close()
    assert drawn is not None and drawn["cell"] >= 12
    assert drawn["labelPx"] <= drawn["cell"]
    assert width >= 100 * drawn["cell"]  # every column drawn: the figure grows rather than squeezing its cells


@pytest.mark.parametrize(("largest", "labels"), [(0.37, ["0", "0.1", "0.2", "0.3", "0.37"]), (0.0, ["all zero"])])
def test_the_colour_scales_top_says_the_largest_weight_and_a_map_of_zeros_says_so(tmp_path, largest, labels):
    """A map up to 0.37 showed 0 0.1 0.2 0.3 and a top that read as nothing; a map of zeros drew a scale of 0 alone
    (the explorer's: up to 1e-9, or a script that never ended)."""
    from viz_browser import Browser, chromium_or_reason

    from attnkit.viz import AttentionMaps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    weights = np.array([[[[largest, 0.0], [0.0, largest / 2]]]], dtype=np.float32)
    path = write_page([AttentionMaps("cross", weights, ("x", "y"), ("a", "b"), (0,), (0,))], tmp_path / "page.html")
    chromium = Browser(executable)
    try:
        chromium.open(path)
        assert chromium.evaluate("window.attnkit.scale.labels") == labels
    finally:
        chromium.close()
