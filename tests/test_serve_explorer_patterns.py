"""The explorer's attention patterns head by head (as circuitsvis draws them) and its direct logit attribution, in
a real headless Chromium: hovering a query token lights the keys by that token's row of the selected head's weights,
hovering a key lights the queries by its column, a head's thumbnail selects it; the whole-model panel writes each
stage's direct share of the top output's lead over the runner-up, and the shares sum to the model's own logit
difference."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")

from serve_helpers import running_server, tiny_run  # noqa: E402
from viz_browser import check_colour_bar  # noqa: E402

from attnkit.checkpoint import load_model  # noqa: E402
from attnkit.config import ModelConfig  # noqa: E402
from attnkit.models import build_model  # noqa: E402
from attnkit.serve.model_view import model_view  # noqa: E402
from attnkit.tokenize import CharTokenizer, load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run = tiny_run(tmp_path_factory.mktemp("patterns"), "decoder", sharpen=8.0)
    with running_server(run) as (url, _app):
        yield url, run


@pytest.fixture(scope="module")
def browser(served):
    from viz_browser import page_or_skip

    ready = "!!(window.attnkit && window.attnkit.state.pattern && window.attnkit.state.model)"
    with page_or_skip(served[0] + "/", ready) as chromium:
        yield chromium


def _hover(browser, selector: str) -> None:
    """A real mouse move onto the centre of the element (no click)."""
    box = browser.evaluate(f"(() => {{ const e = document.querySelector('{selector}'); e.scrollIntoView();"
                           " const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2];"
                           " })()")
    browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]})


def test_hovering_a_query_lights_the_keys_by_its_row_and_a_key_the_queries_by_its_column(browser):
    browser.click('#head-grid .head-thumb[data-head="1"]')
    assert browser.evaluate("window.attnkit.state.head") == 1
    assert browser.evaluate("document.querySelector('#head-grid .head-thumb.active').dataset.head") == "1"
    weights = browser.evaluate("window.attnkit.state.data.attention[0].weights[0][1]")  # layer 0, head 1: (T, T)
    _hover(browser, '#pattern-queries span[data-index="5"]')
    pattern = browser.wait("window.attnkit.state.pattern.side === 'query' && window.attnkit.state.pattern")
    assert pattern["index"] == 5
    assert pattern["shades"] == pytest.approx(weights[5], abs=1e-6)
    lit = browser.evaluate("[...document.querySelectorAll('#pattern-keys span')].map((s) => s.style.background)")
    assert [bool(c) for c in lit] == [True] * len(weights[5])
    assert lit[6:] == ["rgb(255, 255, 255)"] * (len(lit) - 6)  # the causal mask: nothing after the query
    strongest = max(range(6), key=lambda j: weights[5][j])
    assert lit[strongest] != "rgb(255, 255, 255)"
    _hover(browser, '#pattern-keys span[data-index="2"]')
    pattern = browser.wait("window.attnkit.state.pattern.side === 'key' && window.attnkit.state.pattern")
    assert pattern["shades"] == pytest.approx([row[2] for row in weights], abs=1e-6)
    assert browser.evaluate("document.querySelector('#pattern-queries span[data-index=\"1\"]').style.background") \
        == "rgb(255, 255, 255)"  # query 1 cannot see key 2
    _hover(browser, "h1")
    assert browser.wait("window.attnkit.state.pattern.side === null")


def test_each_head_has_a_thumbnail_of_its_own_pattern(browser):
    heads = len(browser.evaluate("window.attnkit.state.data.attention[0].heads"))
    assert browser.evaluate("document.querySelectorAll('#head-grid canvas').length") == heads
    pixels = browser.evaluate("[...document.querySelectorAll('#head-grid canvas')].map((c) =>"
                              " Array.from(c.getContext('2d').getImageData(0, 0, 72, 72).data).join(','))")
    assert len(set(pixels)) == heads  # the heads attend differently (sharpened q and k), so no two maps are alike


def test_the_whole_model_panel_writes_each_stages_direct_logit_attribution(browser, served):
    view = browser.wait("window.attnkit.state.model")
    attribution = view["attribution"]
    model, config = load_model(served[1])[:2]
    assert browser.evaluate("document.querySelectorAll('#flow .stage-dla').length") == 1 + 2 * config.n_layers
    assert browser.evaluate("document.querySelectorAll('#flow .dla-head').length") == config.n_layers * config.n_heads
    assert attribution["answer"] in browser.evaluate("document.getElementById('dla').textContent")
    ids = torch.tensor([load_tokenizer(served[1] / "tokenizer").encode(browser.evaluate("document.getElementById"
                                                                                         "('text').value"))])
    with torch.no_grad():
        top = model.eval()(ids).logits[0, view["query"]].topk(2).values
    assert attribution["total"] == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert sum(attribution["shares"].values()) == pytest.approx(attribution["total"], abs=1e-3)  # rounded to 1e-5
    stages = {(s["stage"], s.get("block")): s for s in view["stages"]}
    assert stages[("attn", 1)]["dla_heads"] == pytest.approx(
        [attribution["shares"][f"blocks.1.attn head {h}"] for h in range(config.n_heads)])


def test_direct_logit_attribution_is_absent_with_the_reason_for_a_post_norm_model():
    tokenizer = CharTokenizer("abcdefgh ")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                         n_layers=2, max_seq_len=16, norm_position="post")
    view = model_view(build_model(config).eval(), config, tokenizer, tokenizer.encode("abc dea"))
    assert "post-norm" in view["attribution"]["reason"]
    assert not any("dla" in stage for stage in view["stages"])


def test_a_long_texts_heatmap_and_lines_keep_every_token_legible_with_the_colour_scale_stated(browser):
    """90 tokens: the heatmap drew into a fixed 420-pixel canvas and lost its last rows and columns, and the lines
    view set 90 labels of 12 px in 400 px, one on another. The heatmap's canvas grows to hold every cell (at least 10
    px, its labels as large), its colour bar's ticks are the weights at their heights, and each line label has its
    own row."""
    text = ("abc def gh " * 9)[:90]
    browser.evaluate(f"document.getElementById('text').value = {text!r}; document.getElementById('analyze').click()")
    browser.wait(f"window.attnkit.state.data.tokens.length === {len(text)} && window.attnkit.state.pending === 0")
    heatmap = browser.evaluate("window.attnkit.state.heatmap")
    size = browser.evaluate("[document.getElementById('heatmap').width, document.getElementById('heatmap').height]")
    left, top, cell = heatmap["left"], heatmap["top"], heatmap["cell"]
    assert cell >= 10 and left + len(text) * cell <= size[0] and top + len(text) * cell <= size[1]
    corner = browser.evaluate(  # the last token on itself: a weight above 0 under the causal mask
        f"Array.from(document.getElementById('heatmap').getContext('2d').getImageData("
        f"{left + (len(text) - 0.5) * cell}, {top + (len(text) - 0.5) * cell}, 1, 1).data)")
    assert corner[3] == 255 and corner[:3] != [255, 255, 255]
    weights = browser.evaluate("window.attnkit.weights(window.attnkit.state.kind, window.attnkit.state.layer,"
                               " window.attnkit.state.head)")
    largest = max(max(row) for row in weights)
    assert heatmap["max"] == pytest.approx(largest, rel=1e-6)
    # each label the weight at the height it was drawn, the top the largest weight
    check_colour_bar(heatmap["ticks"], heatmap["barTop"], heatmap["barHeight"], largest)
    tops = browser.evaluate("[...document.querySelectorAll('#lines text[data-side=\"query\"]')]"
                            ".map((t) => t.getBoundingClientRect().top)")
    assert len(tops) == len(text) and min(b - a for a, b in itertools.pairwise(tops)) >= 12


def test_the_explorer_loads_and_analyses_with_nothing_in_the_console(served):
    """No script error, no failed request: the page's icon is inline, where the browser's own request for
    /favicon.ico was a 404 logged as an error on every load."""
    from viz_browser import Browser, chromium_or_reason

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    chromium = Browser(executable)
    try:
        chromium.call("Log.enable")
        chromium.call("Runtime.enable")
        chromium.call("Page.navigate", {"url": served[0] + "/"})
        chromium.wait("!!(window.attnkit && window.attnkit.state.model && window.attnkit.state.pending === 0)")
        chromium.evaluate("document.getElementById('text').value = 'he said \"<b>&amp;\"'; "
                          "document.getElementById('analyze').click()")
        chromium.wait("window.attnkit.state.data.tokens.length === 18 && window.attnkit.state.pending === 0")
        errors = [e["params"] for e in chromium.events if e.get("method") == "Runtime.exceptionThrown" or (
            e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        assert errors == []
    finally:
        chromium.close()


def test_the_page_opens_on_a_text_the_runs_tokenizer_reads(tmp_path):
    """A run of a synthetic task's alphabet (characters a-h, no space) opened on 'the cat sat on the mat' and an error
    naming a character the page had typed itself; its first text is one the tokenizer reads, and it is drawn."""
    import httpx

    from attnkit.checkpoint import save_model

    tokenizer = CharTokenizer("abcdefgh=")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                         n_layers=1, max_seq_len=32)
    save_model(build_model(config).eval(), config, tmp_path / "run")
    tokenizer.save(tmp_path / "run" / "tokenizer")
    with running_server(tmp_path / "run") as (url, _app):
        example = httpx.get(url + "/api/info", timeout=30).json()["example"]
        assert example and set(example) <= set("abcdefgh=")
        assert httpx.post(url + "/api/analyze", json={"text": example}, timeout=30).status_code == 200
        from viz_browser import page_or_skip

        with page_or_skip(url + "/", "!!(window.attnkit && window.attnkit.state.data)") as chromium:
            assert chromium.evaluate("document.getElementById('text').value") == example
            assert chromium.evaluate("document.getElementById('message').textContent") == ""


def test_the_logit_lens_tooltips_hold_tokens_with_quotes_whole(tmp_path):
    """Each logit-lens cell lists its top tokens in a title attribute; a token holding a double quote ended the
    attribute there (the page escaped &, < and > only), cutting the list and reading the rest as attributes."""
    from attnkit.checkpoint import save_model

    tokenizer = CharTokenizer("\"'<>&ab")
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32,
                         n_layers=1, max_seq_len=32)
    save_model(build_model(config).eval(), config, tmp_path / "run")
    tokenizer.save(tmp_path / "run" / "tokenizer")
    with running_server(tmp_path / "run") as (url, _app):
        from viz_browser import page_or_skip

        with page_or_skip(url + "/", "!!(window.attnkit && window.attnkit.state.inspect)") as chromium:
            chromium.call("Runtime.evaluate", {"awaitPromise": True, "expression": (
                "document.getElementById('text').value = 'a\"b<\\'&>\"'; window.attnkit.analyze()"
                ".then(() => window.attnkit.inspect())")})
            lens = chromium.wait("window.attnkit.state.inspect.text.length === 8 && window.attnkit.state.inspect.lens")
            titles = chromium.evaluate("[...document.querySelectorAll('#lens td')].map((td) => td.title)")
            names = chromium.evaluate("[...document.querySelectorAll('#lens td')].map((td) => td.getAttributeNames())")
    expected = ["\n".join(f"{token} {p:.3f}" for token, p in zip(lens["top"][layer][t], lens["top_p"][layer][t],
                                                               strict=True))
                for layer in range(len(lens["layers"])) for t in range(len(lens["tokens"]))]
    assert any('"' in title for title in expected)  # the case in question: a quote among the tops
    assert titles == expected
    assert all(sorted(n) == ["class", "style", "title"] for n in names)
