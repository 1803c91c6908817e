"""The explorer page's playground in a real headless Chromium: a streamed completion and a streamed chat (two turns,
the conversation carried) give the text a non-streamed request with the same seed gives, at temperature 0 and above;
the probabilities the page shades and lists on hover are the API's logprobs; a run that does not generate says so."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

TIMEOUT = 60


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run = tiny_run(tmp_path_factory.mktemp("playground"), "decoder", sharpen=8.0)
    with running_server(run) as (url, _app):
        yield url


@pytest.fixture(scope="module")
def browser(served):
    from viz_browser import served_page

    chromium, reason = served_page(served + "/", "!!(window.attnkit && window.attnkit.playground"
                                   " && window.attnkit.playground.state.model)", width=1200, height=900)
    if chromium is None:
        pytest.skip(f"no headless browser: {reason}")
    chromium.click('#tabs button[data-tab="playground"]')
    yield chromium
    chromium.close()


def _ask(browser, mode: str, text: str, **controls) -> dict:
    """Set the playground's controls, press Send and wait for the reply; the page's record of it."""
    values = {"pg-mode": mode, "pg-input": text, **{f"pg-{k.replace('_', '-')}": v for k, v in controls.items()}}
    browser.evaluate(f"(() => {{ for (const [id, v] of Object.entries({json.dumps(values)})) {{"
                     " const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event('change')); }"
                     " document.getElementById('pg-stream').checked = true; })()")
    before = browser.evaluate("window.attnkit.playground.state.replies.length")
    browser.click("#pg-send")
    browser.wait(f"window.attnkit.playground.state.replies.length === {before + 1}")
    assert browser.evaluate("document.getElementById('pg-status').textContent") == ""
    return browser.evaluate("window.attnkit.playground.state.replies.at(-1)")


def _shaded(browser) -> list[tuple[str, float]]:
    """The last reply's token spans: (text, probability) as the page drew them."""
    return browser.evaluate("Array.from(document.querySelectorAll('#pg-transcript .turn.reply:last-of-type .pg-token'))"
                            ".map(s => [s.textContent, Number(s.dataset.p)])")


def test_a_streamed_completion_is_the_apis_text_with_its_probabilities(browser, served):
    settings = {"temperature": 0, "top_p": 1, "max_tokens": 12, "seed": 0}
    reply = _ask(browser, "completion", "the cat", top_logprobs=3, **settings)
    whole = httpx.post(f"{served}/v1/completions", json={"model": "decoder", "prompt": "the cat", "logprobs": 3,
                                                         **settings}, timeout=TIMEOUT).json()["choices"][0]
    assert reply["text"] == whole["text"] and len(whole["text"]) == 12 and reply["finish"] == "length"
    assert reply["chunks"] > 12  # streamed: a chunk per token, then the finish reason
    assert [e["token"] for e in reply["entries"]] == whole["logprobs"]["tokens"]
    assert [e["logprob"] for e in reply["entries"]] == pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-6)
    for entry, top in zip(reply["entries"], whole["logprobs"]["top_logprobs"], strict=True):
        assert dict(entry["top"]) == pytest.approx(top, abs=1e-6) and len(entry["top"]) == 3
    shaded = _shaded(browser)
    assert "".join(text for text, _ in shaded) == whole["text"]
    assert [p for _, p in shaded] == pytest.approx([math.exp(lp) for lp in whole["logprobs"]["token_logprobs"]],
                                                   rel=1e-6)
    caption = browser.evaluate("document.querySelector('#pg-transcript .turn.reply:last-of-type .settings')"
                               ".textContent")
    assert caption.startswith("temperature 0 · top_p 1 · max_tokens 12 · seed 0 · 12 tokens")


def test_hovering_a_token_lists_its_likeliest_alternatives(browser, served):
    reply = browser.evaluate("window.attnkit.playground.state.replies.at(-1)")
    browser.click("#pg-transcript .turn.reply:last-of-type .pg-token:nth-of-type(3)")  # the mouse moves over it first
    assert browser.evaluate("!document.getElementById('pg-tip').classList.contains('hidden')")
    rows = browser.evaluate("Array.from(document.querySelectorAll('#pg-tip tr'))"
                            ".map(r => [r.className, ...Array.from(r.cells).map(c => c.textContent)])")
    entry = reply["entries"][2]
    assert [row[1] for row in rows] == [t.replace(" ", "␣").replace("\n", "⏎") for t, _ in entry["top"]]
    shown = [float(row[2].rstrip("%")) for row in rows]  # three significant digits
    assert shown == pytest.approx([100 * math.exp(lp) for _, lp in entry["top"]], rel=5e-3)
    assert [row[0] for row in rows].count("chosen") == 1 and rows[0][0] == "chosen"  # greedy: the first is chosen


def test_a_streamed_chat_carries_the_conversation_and_equals_the_api(browser, served):
    browser.click("#pg-clear")
    settings = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 8, "seed": 7}
    first = _ask(browser, "chat", "hi there", top_logprobs=2, **settings)
    second = _ask(browser, "chat", "and then?", top_logprobs=2, **settings)
    history = [{"role": "user", "content": "hi there"}]
    for reply, message in ((first, "hi there"), (second, "and then?")):
        if message != "hi there":
            history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": message}]
        whole = httpx.post(f"{served}/v1/chat/completions", json={
            "model": "decoder", "messages": history, "logprobs": True, "top_logprobs": 2, **settings},
            timeout=TIMEOUT).json()["choices"][0]
        assert reply["text"] == whole["message"]["content"]
        content = whole["logprobs"]["content"]
        assert [e["token"] for e in reply["entries"]] == [e["token"] for e in content]
        assert [e["logprob"] for e in reply["entries"]] == pytest.approx([e["logprob"] for e in content], abs=1e-6)
    assert browser.evaluate("window.attnkit.playground.state.messages.length") == 4
    roles = browser.evaluate("Array.from(document.querySelectorAll('#pg-transcript .role')).map(e => e.textContent)")
    assert roles == ["user", "assistant", "user", "assistant"]
    assert "".join(t for t, _ in _shaded(browser)) == second["text"]


def test_a_run_that_does_not_generate_says_so(browser, tmp_path):
    classifier = tiny_run(tmp_path, "encoder", n_classes=3)
    with running_server(classifier) as (url, _app):
        browser.call("Page.navigate", {"url": url + "/"})
        note = browser.wait("(() => { const e = document.getElementById('pg-unavailable');"
                            " return e && !e.classList.contains('hidden') && e.textContent; })()")
        assert "does not generate text" in note and "encoder" in note
        assert browser.evaluate("document.getElementById('pg-body').classList.contains('hidden')")
