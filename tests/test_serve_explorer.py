"""The explorer page of attnkit serve in a real headless Chromium: the heatmap, one head's computation and the next
token's probabilities render from the model's numbers and change when the controls move; head importance and the
logit lens are attnkit.inspect's numbers for the page's text; the training tab follows a metrics.jsonl as it grows;
the experiments tab shows results and plots. Translation and classifier runs get their
own views (cross-attention, class probabilities)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from matplotlib.image import imread  # noqa: E402
from serve_helpers import running_server, tiny_run  # noqa: E402

from attnkit.generate.sampling import SamplingConfig, process_logits  # noqa: E402

EXPERIMENTS = Path(__file__).resolve().parents[1] / "docs" / "experiments"
TIMEOUT = 60


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("explorer")
    watched = root / "training"
    watched.mkdir()
    run = tiny_run(root, "decoder", sharpen=8.0)
    with running_server(run, watch=str(watched), experiments=str(EXPERIMENTS)) as (url, _app):
        yield url, watched, run


@pytest.fixture(scope="module")
def browser(served):
    from viz_browser import served_page

    chromium, reason = served_page(served[0] + "/", "!!(window.attnkit && window.attnkit.state.steps"
                                   " && document.querySelector('#step-table'))", width=1400, height=1800)
    if chromium is None:
        pytest.skip(f"no headless browser: {reason}")
    yield chromium
    chromium.close()


def _canvas(browser, element: str) -> np.ndarray:
    """The element as the screen shows it. Measured once every request is answered: a view of an earlier test's
    text still on its way (the step table, the model view) is drawn above the panel when it comes, moving the element
    between the measurement and the screenshot (the crop then held another part of the page)."""
    browser.wait("window.attnkit.state.pending === 0")
    box = browser.evaluate(f"(() => {{ const r = document.getElementById('{element}').getBoundingClientRect();"
                           " return [r.left, r.top, r.width, r.height]; })()")
    left, top, width, height = (int(round(v)) for v in box)
    shot = imread(io.BytesIO(browser.screenshot()), format="png")[..., :3]
    return shot[top:top + height, left:left + width]


def test_the_last_token_is_the_first_query(browser):
    # under the causal mask token 0 sees only itself: its step table would teach nothing
    last = len(browser.evaluate("window.attnkit.state.data.tokens")) - 1
    assert browser.evaluate("window.attnkit.state.steps.query") == last
    assert browser.evaluate("document.getElementById('query').value") == str(last)


def test_the_whole_model_panel_draws_each_stage_at_the_query_token(browser):
    view = browser.wait("window.attnkit.state.model")
    last = len(browser.evaluate("window.attnkit.state.data.tokens")) - 1
    assert view["query"] == last
    assert browser.evaluate("document.querySelectorAll('#flow .stage').length") == len(view["stages"])
    assert browser.evaluate("document.querySelectorAll('#flow .stage-plus').length") == 4  # 2 blocks x (attn, FFN)
    assert "(4, " in browser.evaluate("document.querySelector('#flow .stage.attn .shape').textContent")
    browser.evaluate("(() => { const s = document.getElementById('query'); s.value = '3';"
                     " s.dispatchEvent(new Event('change')); })()")
    moved = browser.wait("(() => { const m = window.attnkit.state.model; return m.query === 3 && m; })()")
    assert moved["stages"][1]["norm"] != view["stages"][1]["norm"]  # another token's embedding
    assert "query token 3" in browser.evaluate("document.getElementById('flow-where').textContent")
    browser.evaluate(f"(() => {{ const s = document.getElementById('query'); s.value = '{last}';"
                     " s.dispatchEvent(new Event('change')); })()")
    browser.wait(f"window.attnkit.state.model.query === {last} && window.attnkit.state.steps.query === {last}")


def test_the_heatmap_is_drawn_and_another_head_changes_it(browser):
    before = _canvas(browser, "heatmap")
    assert before.shape[0] > 100 and before.std() > 0.05
    browser.click('#heads button[data-head="2"]')
    assert browser.evaluate("window.attnkit.state.head") == 2
    after = _canvas(browser, "heatmap")
    assert np.abs(after - before).mean() > 0.002
    browser.click('#heads button[data-head="mean"]')
    mean = np.array(browser.evaluate("window.attnkit.weights(0, 0, null)"))
    heads = np.array(browser.evaluate("window.attnkit.state.data.attention[0].weights[0]"))
    np.testing.assert_allclose(mean, heads.mean(axis=0), atol=1e-6)
    lines = browser.evaluate("document.querySelectorAll('#lines line').length")
    assert lines >= len(browser.evaluate("window.attnkit.state.data.tokens"))


def test_the_step_by_step_numbers_are_the_models_and_follow_the_query(browser, served):
    browser.click('#heads button[data-head="1"]')
    browser.evaluate("(() => { const s = document.getElementById('query'); s.value = '5';"
                     " s.dispatchEvent(new Event('change')); })()")
    steps = browser.wait("(() => { const s = window.attnkit.state.steps;"
                           " return s && s.query === 5 && s.head === 1 && s; })()")
    rows = browser.evaluate("document.querySelectorAll('#step-table tr').length")
    assert rows == 1 + len(steps["key_tokens"])  # a header and a row per key
    assert browser.evaluate("document.querySelectorAll('#step-table tr.masked').length") == len(
        steps["key_tokens"]) - 6  # causal: keys after query 5 are masked
    scores = np.array(steps["dots"]) * steps["scale"]
    np.testing.assert_allclose(scores, steps["scores"], atol=1e-5)
    visible = np.array(steps["mask"])
    expected = np.exp(scores - scores[visible].max()) * visible
    np.testing.assert_allclose(steps["weights"], expected / expected.sum(), atol=1e-5)
    np.testing.assert_allclose(steps["weights"], steps["model_weights"], atol=1e-5)
    np.testing.assert_allclose(steps["output"], np.array(steps["weights"]) @ np.array(steps["v"]), atol=1e-5)
    assert steps["matches_model"] and "1/sqrt(8)" in browser.evaluate("document.getElementById('steps').textContent")
    shown = browser.evaluate("document.getElementById('step-q').textContent")
    browser.evaluate("(() => { const s = document.getElementById('query'); s.value = '2';"
                     " s.dispatchEvent(new Event('change')); })()")
    browser.wait("window.attnkit.state.steps.query === 2")
    assert browser.evaluate("document.getElementById('step-q').textContent") != shown


def _set(browser, control: str, value) -> None:
    browser.evaluate(f"(() => {{ const e = document.getElementById('{control}'); e.value = '{value}';"
                     " e.dispatchEvent(new Event('input')); })()")


def test_the_next_token_probabilities_reshape_as_sampling_does(browser):
    _set(browser, "temperature", 1)
    _set(browser, "topk", 0)
    _set(browser, "topp", 1)
    shown = browser.evaluate("Array.from(document.querySelectorAll('#next .reshaped-p')).map(e => e.textContent)")
    assert len(shown) == 15
    logits = torch.tensor([browser.evaluate("window.attnkit.state.data.next.logits")])
    for temperature, top_k, top_p in ((0.5, 0, 1.0), (1.5, 5, 1.0), (1.0, 0, 0.6), (0.7, 8, 0.9)):
        _set(browser, "temperature", temperature)
        _set(browser, "topk", top_k)
        _set(browser, "topp", top_p)
        drawn = np.array(browser.evaluate("window.attnkit.state.reshaped"))
        config = SamplingConfig(temperature=temperature, top_k=top_k or None, top_p=top_p if top_p < 1 else None)
        expected = process_logits(logits, config).softmax(dim=-1)[0].numpy()
        np.testing.assert_allclose(drawn, expected, atol=1e-6)
    reshaped = browser.evaluate("Array.from(document.querySelectorAll('#next .reshaped-p')).map(e => e.textContent)")
    assert reshaped != shown and sum(float(p) > 0 for p in reshaped) <= 8  # top-k 8 left at most 8 tokens


def test_generating_steps_one_token_at_a_time(browser):
    _set(browser, "temperature", 0)
    before = browser.evaluate("window.attnkit.state.data.tokens.length")
    best = browser.evaluate("window.attnkit.state.data.next.texts[0]")
    text = browser.evaluate("document.getElementById('text').value")
    browser.click("#step-generate")
    browser.wait(f"window.attnkit.state.data.tokens.length === {before + 1}")
    assert browser.evaluate("document.getElementById('text').value") == text + best


def test_the_training_tab_follows_metrics_as_they_are_written(browser, served):
    metrics = served[1] / "metrics.jsonl"
    with metrics.open("w") as out:
        for step in range(1, 21):
            out.write(json.dumps({"kind": "train", "step": step, "loss": 4.0 / step, "lr": 1e-3, "tokens": 256}) + "\n")
    browser.click('#tabs button[data-tab="training"]')
    browser.wait("window.attnkit.state.training.records.length === 20")
    browser.wait("document.querySelectorAll('#charts canvas').length >= 3")
    with metrics.open("a") as out:
        out.write(json.dumps({"kind": "train", "step": 21, "loss": 0.1, "lr": 1e-3, "tokens": 256}) + "\n")
    browser.wait("window.attnkit.state.training.records.length === 21", seconds=15)
    title = browser.evaluate("document.querySelector('#charts h3').textContent")
    assert title.startswith("loss") and "0.1000" in title


@pytest.mark.skipif(not EXPERIMENTS.is_dir(), reason="docs/experiments is not in this checkout")
def test_the_experiments_tab_shows_results_and_plots(browser):
    browser.click('#tabs button[data-tab="experiments"]')
    names = browser.wait("(() => { const h = document.querySelectorAll('.experiment h3');"
                           " return h.length && Array.from(h).map(e => e.textContent); })()")
    assert len(names) == len(list(EXPERIMENTS.glob("*/results.json")))
    browser.wait("Array.from(document.querySelectorAll('.experiment img'))"
                   ".some(i => i.complete && i.naturalWidth > 0)")
    browser.click('#tabs button[data-tab="explore"]')


def test_inspect_answers_what_attnkit_inspect_computes_on_the_runs_model(served):
    from attnkit.checkpoint import load_model
    from attnkit.inspect import lm_batch
    from attnkit.inspect.importance import head_importance
    from attnkit.tokenize import load_tokenizer
    from attnkit.viz.labels import token_labels

    url, _, run = served
    text = "the cat sat"
    view = httpx.post(f"{url}/api/inspect", json={"text": text}, timeout=TIMEOUT).json()
    model, tokenizer = load_model(run)[0], load_tokenizer(run / "tokenizer")
    ids = tokenizer.encode(text)
    expected = head_importance(model, lm_batch(torch.tensor([ids])))
    assert view["heads"]["sites"] == expected.sites == ["blocks.0.attn", "blocks.1.attn"]
    np.testing.assert_allclose(view["heads"]["scores"], expected.scores.numpy(), atol=2e-5)
    assert view["heads"]["metric"] == "loss" and view["heads"]["baseline"] == pytest.approx(expected.baseline)
    lens = view["lens"]
    # the whole text, as attnkit inspect ... logit-lens reads it: the last column is what follows the text
    assert lens["layers"] == ["embeddings", "block 0", "block 1"] and len(lens["tokens"]) == len(ids)
    with torch.no_grad():
        own = model(torch.tensor([ids])).logits[0].softmax(-1)  # (T, V): the model's own answer, read directly
    assert lens["answer"] == token_labels(tokenizer, own.argmax(-1).tolist())
    assert lens["rank"][-1] == [0] * len(lens["tokens"])  # the last layer is the model's own output
    np.testing.assert_allclose(lens["top_p"][-1], own.topk(3, dim=-1).values.numpy(), atol=1e-4)
    np.testing.assert_allclose(lens["p_answer"][-1], own.max(-1).values.numpy(), atol=1e-4)
    assert [len(row) for row in lens["rank"]] == [len(ids)] * 3 and min(map(min, lens["rank"])) >= 0
    short = httpx.post(f"{url}/api/inspect", json={"text": "a"}, timeout=TIMEOUT)
    assert short.status_code == 400 and "two tokens or more" in short.json()["error"]["message"]


def test_the_inspect_panel_draws_head_importance_and_the_logit_lens(browser):
    view = browser.wait("window.attnkit.state.inspect")
    n_layers, n_tokens = len(view["lens"]["layers"]), len(view["lens"]["tokens"])
    assert browser.evaluate("document.querySelectorAll('#lens tr').length") == n_layers + 2  # tokens, answer rows
    assert browser.evaluate("document.querySelectorAll('#lens td').length") == n_layers * n_tokens
    browser.evaluate("document.getElementById('inspect-panel').scrollIntoView()")
    heatmap = _canvas(browser, "importance")
    assert heatmap.shape[0] > 60 and heatmap.std() > 0.05
    browser.evaluate("window.scrollTo(0, 0); document.getElementById('text').value = 'a mat on a cat'")
    browser.click("#analyze")
    browser.wait("document.getElementById('inspect-status').textContent.includes('earlier text')")
    browser.evaluate("document.getElementById('inspect-panel').scrollIntoView()")  # a click lands where it shows
    browser.click("#inspect")
    again = browser.wait("(() => { const v = window.attnkit.state.inspect;"
                           " return v.text === 'a mat on a cat' && v; })()")
    assert len(again["lens"]["tokens"]) == len("a mat on a cat")
    assert browser.evaluate("document.querySelectorAll('#lens td').length") == n_layers * len("a mat on a cat")
    assert browser.evaluate("document.getElementById('inspect-status').textContent") == "for: a mat on a cat"
    browser.evaluate("window.scrollTo(0, 0)")


def test_translation_and_classifier_runs_get_their_views(tmp_path):
    translator = tiny_run(tmp_path, "encoder-decoder")
    with running_server(translator) as (url, _app):
        info = httpx.get(f"{url}/api/info", timeout=TIMEOUT).json()
        assert info["translator"] and "cross" in info["kinds"]
        maps = httpx.post(f"{url}/api/analyze", json={"text": "a cat", "target": "un chat"}, timeout=TIMEOUT).json()
        cross = next(m for m in maps["attention"] if m["kind"] == "cross")
        assert cross["key_tokens"][:5] == ["a", "␣", "c", "a", "t"] and len(cross["query_tokens"]) == len("un chat") + 1
        steps = httpx.post(f"{url}/api/step", json={"text": "a cat", "target": "un chat", "kind": "cross", "layer": 1,
                                                    "head": 3, "query": 2}, timeout=TIMEOUT).json()
        assert steps["matches_model"] and all(steps["mask"])
        bad = httpx.post(f"{url}/api/step", json={"text": "a cat", "head": 9}, timeout=TIMEOUT)
        assert bad.status_code == 400 and "head 9" in bad.json()["error"]["message"]
        view = httpx.post(f"{url}/api/inspect", json={"text": "a cat", "target": "un chat"}, timeout=TIMEOUT).json()
        assert "decoder.blocks.1.cross_attn" in view["heads"]["sites"]
        assert view["lens"]["tokens"] == ["<bos>", "u", "n", "␣", "c", "h", "a", "t"]  # the target's side
    classifier = tiny_run(tmp_path, "encoder", n_classes=3)
    with running_server(classifier) as (url, _app):
        answer = httpx.post(f"{url}/api/analyze", json={"text": "a cat"}, timeout=TIMEOUT).json()
        assert sorted(answer["classes"]) == ["0", "1", "2"] and sum(answer["classes"].values()) == pytest.approx(1)
        assert answer["attention"][0]["kind"] == "self" and "next" not in answer
        view = httpx.post(f"{url}/api/inspect", json={"text": "a cat"}, timeout=TIMEOUT).json()
        assert view["heads"]["metric"] == "kl" and view["lens"] is None and "output layer" in view["lens_note"]


def test_an_encoders_text_framed_beyond_the_context_is_refused_as_viz_refuses_it(tmp_path):
    """The explorer holds what a model reads to its context (16 here) as `attnkit viz` does: an encoder's text of 16
    characters framed with BOS and EOS is 18 tokens, drawn before with rotary positions the model never used that
    far."""
    encoder = tiny_run(tmp_path, "encoder", n_classes=3, max_seq_len=16, position="rope")
    with running_server(encoder) as (url, _app):
        assert httpx.post(f"{url}/api/analyze", json={"text": "a cat"}, timeout=TIMEOUT).status_code == 200
        framed = httpx.post(f"{url}/api/analyze", json={"text": "a cat on the mat"}, timeout=TIMEOUT)
        assert framed.status_code == 400, framed.text[:300]
        assert framed.json()["error"]["message"].startswith(
            "the text has 16 tokens, 18 with the <cls> and <sep> the model reads with it; the explorer draws at most "
            "16 (the model's max_seq_len): shorten it by 2 tokens")


SOURCE_TOO_LONG = ("the text has 16 tokens, 17 with the <eos> the model reads with it; the explorer draws at most 16 "
                   "(the model's max_seq_len): shorten it by 1 token")


def test_a_translators_source_beyond_the_context_is_refused_before_any_translation_step(tmp_path, monkeypatch):
    """A translator's source of 16 characters with EOS is 17 tokens, beyond its context of 16: it is refused with the
    length message before the model's own translation is decoded (up to 64 forward passes were spent first, and the
    refusal came after, or, with learned positions, the embedding's own message)."""
    from attnkit.models import greedy

    steps: list[int] = []
    decode = greedy.greedy_target
    monkeypatch.setattr(greedy, "greedy_target", lambda *args, **kwargs: steps.append(1) or decode(*args, **kwargs))
    translator = tiny_run(tmp_path, "encoder-decoder", max_seq_len=16, position="rope")
    with running_server(translator) as (url, _app):
        httpx.post(f"{url}/api/analyze", json={"text": "a cat"}, timeout=TIMEOUT)  # drawn, or its translation empty
        assert steps  # the model's own translation of a source that fits is decoded
        steps.clear()
        for path in ("/api/analyze", "/api/model"):
            long = httpx.post(f"{url}{path}", json={"text": "a cat on the mat"}, timeout=TIMEOUT)
            assert long.status_code == 400, long.text[:300]
            assert long.json()["error"]["message"].startswith(SOURCE_TOO_LONG)
        inspected = httpx.post(f"{url}/api/inspect", json={"text": "a cat on the mat"}, timeout=TIMEOUT)
        assert inspected.status_code == 400, inspected.text[:300]  # the same check of the source, before any step
        assert inspected.json()["error"]["message"].startswith(SOURCE_TOO_LONG)
        assert not steps


def test_the_explorer_reads_a_converted_taggers_text_as_its_tokenizer_frames_it(tmp_path, monkeypatch):
    """The explorer's inspect panel read a converted GPT-2 tagger's text (hf_source.json, no task.json) between BOS
    and EOS it never saw, where attnkit inspect reads it as its own tokenizer frames it (nothing added)."""
    import attnkit.serve.inspect_view as view_module
    from attnkit.generate import load
    from attnkit.serve.explorer import Explorer

    run = tiny_run(tmp_path, "decoder", decoder_head="tag", n_classes=3)
    (run / "hf_source.json").write_text(json.dumps({"model_type": "gpt2"}))
    pipeline = load(run)
    read = []
    batch_of = view_module.text_batch
    monkeypatch.setattr(view_module, "text_batch", lambda *args, **kwargs: read.append(batch_of(*args, **kwargs))
                        or read[-1])
    Explorer(pipeline, run, watch=tmp_path, experiments=None).inspect("a cat")
    assert read and all(batch.args[0][0].tolist() == pipeline.tokenizer.encode("a cat") for batch in read)


def test_the_next_token_is_read_after_the_text_as_generation_prompts_it(tmp_path):
    """The explorer's next-token panel read a converted Llama's text (its tokenizer starts every text with BOS)
    without the BOS that generation puts first, so it showed another distribution than a completion draws from."""
    from attnkit.generate import load
    from attnkit.serve.explorer import Explorer

    run = tiny_run(tmp_path, "decoder")
    pipeline = load(run)
    pipeline.tokenizer.starts_with_bos = True  # as a converted Llama's tokenizer
    explorer = Explorer(pipeline, run, watch=tmp_path, experiments=None)
    shown = explorer.analyze("a cat")["next"]
    ids = pipeline.prompt_ids("a cat", index=0)
    assert ids[0] == pipeline.tokenizer.bos_id
    with torch.no_grad():
        logits = explorer.model(torch.tensor([ids])).logits[0, -1].float()  # (V,)
    top = torch.topk(logits, len(shown["ids"]))
    assert shown["ids"] == top.indices.tolist()
    assert shown["logits"] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_the_token_list_the_maps_and_the_next_token_panel_read_the_same_framed_text(tmp_path):
    """A converted Llama's text (its tokenizer starts every text with BOS): the token list showed the bare text beside
    maps that include <bos>; a text of max_seq_len tokens passed the explorer's check and was refused by the maps'
    in other words, while the next-token panel cut it to its last max_seq_len ids, dropping the BOS. Now all three
    read the framed ids, and a text too long framed is refused naming the BOS it is read with."""
    from attnkit.errors import InputError
    from attnkit.generate import load
    from attnkit.serve.explorer import Explorer

    run = tiny_run(tmp_path, "decoder", position="learned", max_seq_len=12)
    pipeline = load(run)
    pipeline.tokenizer.starts_with_bos = True  # as a converted Llama's tokenizer
    explorer = Explorer(pipeline, run, watch=tmp_path, experiments=None)
    text = "a" * 11  # 12 tokens with BOS: the model's whole context
    shown = explorer.analyze(text)
    ids = pipeline.prompt_ids(text, index=0)
    assert shown["ids"] == ids and ids[0] == pipeline.tokenizer.bos_id and len(ids) == 12
    assert shown["tokens"] == shown["attention"][0]["query_tokens"] == ["<bos>", *"a" * 11]
    with torch.no_grad():
        logits = explorer.model(torch.tensor([ids])).logits[0, -1].float()  # (V,)
    assert shown["next"]["ids"] == torch.topk(logits, len(shown["next"]["ids"])).indices.tolist()
    with pytest.raises(InputError) as refused:
        explorer.analyze(text + "a")
    assert str(refused.value) == ("the text has 12 tokens, 13 with the <bos> the model reads with it; the explorer "
                                  "draws at most 12 (the model's max_seq_len): shorten it by 1 token")


def test_a_text_the_tokenizer_drops_whole_is_refused_naming_its_characters(tmp_path):
    """A text whose every character the tokenizer skips reached the model as no ids: the explorer answered
    "input_ids must hold integer token ids ... dtype torch.float32"."""
    from attnkit.errors import InputError
    from attnkit.generate import load
    from attnkit.serve.explorer import Explorer

    run = tiny_run(tmp_path, "decoder")
    pipeline = load(run)
    pipeline.tokenizer.unknown = "skip"
    explorer = Explorer(pipeline, run, watch=tmp_path, experiments=None)
    for read in (explorer.analyze, explorer.whole_model, explorer.inspect):
        with pytest.raises(InputError, match=r"the text \('ZZZ'\) has no token: .*unknown characters 'Z' skipped"):
            read("ZZZ")


def test_the_first_text_is_one_a_skipping_tokenizer_reads():
    """A tokenizer that skips what it does not know reads the example as no tokens, not as UNK: the page opened on a
    text it then refused ("has no token")."""
    from attnkit.serve.explorer import EXAMPLE, first_text
    from attnkit.tokenize import CharTokenizer

    digits = CharTokenizer("0123456789", unknown="skip")
    assert first_text(digits) == "01234567"
    assert first_text(CharTokenizer(set(EXAMPLE), unknown="skip")) == EXAMPLE


def test_the_inspect_panels_read_a_one_token_text_after_bos(tmp_path):
    """A converted Llama reads a text of one token after BOS, two tokens, the first predicting the second, as attnkit
    inspect heads scores it; the explorer counted the bare text's tokens and refused it ("type two tokens or more")."""
    from attnkit.errors import InputError
    from attnkit.generate import load
    from attnkit.serve.explorer import Explorer
    from attnkit.viz.labels import token_labels

    run = tiny_run(tmp_path, "decoder")
    pipeline = load(run)
    explorer = Explorer(pipeline, run, watch=tmp_path, experiments=None)
    with pytest.raises(InputError, match="two tokens or more"):
        explorer.inspect("a")  # no BOS: one token, nothing to predict
    pipeline.tokenizer.starts_with_bos = True  # as a converted Llama's tokenizer
    view = explorer.inspect("a")
    assert view["lens"]["tokens"] == token_labels(pipeline.tokenizer, [pipeline.tokenizer.bos_id,
                                                                       *pipeline.tokenizer.encode("a")])
