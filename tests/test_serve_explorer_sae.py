"""The explorer's SAE panel (`attnkit serve RUN --sae DIR`): an SAE that `attnkit inspect RUN sae` trained is read on
the page's text. /api/sae's features per token are the saved SAE's own encoding of the model's activations at its
point, recomputed here; each listed feature's contexts are the ones saved beside it; an SAE of a point the run has
not, or a malformed features.json, is refused on load; the page lists a token's features and a feature's contexts in
a headless Chromium."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

from attnkit.checkpoint import load_model  # noqa: E402
from attnkit.errors import CheckpointError, InputError  # noqa: E402
from attnkit.inspect.command import InspectSettings, run_inspect  # noqa: E402
from attnkit.inspect.sae import load_sae  # noqa: E402
from attnkit.inspect.tracing import trace  # noqa: E402
from attnkit.serve.sae_view import SAEView  # noqa: E402
from attnkit.tokenize import load_tokenizer  # noqa: E402

POINT = "blocks.1.resid_post"
TEXTS = ("the cat sat on the mat.", "a dog ran to the park, and the cat saw it!", "on the mat sat a cat.") * 4
TEXT = "the dog sat on the cat"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("sae-explorer")
    run = tiny_run(root, "decoder")
    run_inspect(InspectSettings(run=str(run), analysis="sae", text=TEXTS, point=POINT, k=4, features=64, steps=30,
                                out=str(root / "inspect")))
    return run, root / "inspect" / "sae"


def test_the_sae_endpoint_answers_the_saved_saes_features_and_contexts(trained):
    run, directory = trained
    with running_server(run, sae=str(directory)) as (url, _app):
        info = httpx.get(f"{url}/api/info", timeout=30).json()
        answer = httpx.post(f"{url}/api/sae", json={"text": TEXT}, timeout=60).json()
    assert info["sae"] == POINT
    model, _ = load_model(run)
    tokenizer = load_tokenizer(run / "tokenizer")
    ids = tokenizer.encode(TEXT)
    features = load_sae(directory).encode(trace(model.eval(), torch.tensor([ids]), names=[POINT])[POINT][0])  # (T, F)
    assert len(answer["tokens"]) == len(ids) == len(answer["per_token"])
    for row, expected in zip(answer["per_token"], features, strict=True):
        assert [e["feature"] for e in row] == expected.topk(len(row)).indices.tolist()
        assert [e["activation"] for e in row] == pytest.approx(expected.topk(len(row)).values.tolist(), abs=1e-3)
        assert len(row) == min(5, int((expected > 0).sum()))  # the k = 4 active, or five of more
    saved = {e["feature"]: e for e in json.loads((directory / "features.json").read_text())}
    assert answer["features"] and answer["contexts_saved"]
    for feature, listed in answer["features"].items():
        assert listed["top"] == [[pytest.approx(v, abs=1e-4), c] for v, c in saved[int(feature)]["top"]]
        assert all("[" in context for _, context in listed["top"])  # the token read, in brackets


def test_an_explorer_without_an_sae_says_how_to_serve_one(tmp_path):
    with running_server(tiny_run(tmp_path, "decoder")) as (url, _app):
        answer = httpx.post(f"{url}/api/sae", json={"text": TEXT}, timeout=30)
    assert answer.status_code == 400 and "--sae" in answer.json()["error"]["message"]


def test_an_sae_of_another_point_or_malformed_contexts_is_refused_on_load(trained, tmp_path):
    run, directory = trained
    model, config = load_model(run)
    tokenizer = load_tokenizer(run / "tokenizer")
    other = tmp_path / "other"
    shutil.copytree(directory, other)
    cfg = json.loads((other / "cfg.json").read_text())
    cfg["hook_name"] = cfg["meta"]["hook_name"] = "blocks.7.resid_post"
    (other / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="blocks.7.resid_post, which this run has not"):
        SAEView(other, model, tokenizer, family=config.family, max_len=config.max_seq_len)
    shutil.copy(directory / "cfg.json", other / "cfg.json")
    with pytest.raises(CheckpointError, match="has no cfg.json: an SAE's directory holds"):
        SAEView(tmp_path, model, tokenizer, family=config.family, max_len=config.max_seq_len)
    (tmp_path / "cfg.json").write_text("{}")
    with pytest.raises(CheckpointError, match="has no sae_weights.safetensors: an SAE's directory holds"):
        SAEView(tmp_path, model, tokenizer, family=config.family, max_len=config.max_seq_len)
    (other / "features.json").write_text(json.dumps([{"feature": 10_000, "frequency": 0.1, "top": []}]))
    with pytest.raises(CheckpointError, match="features.json"):
        SAEView(other, model, tokenizer, family=config.family, max_len=config.max_seq_len)


def test_the_page_lists_a_tokens_features_and_a_features_contexts(trained, tmp_path):
    from viz_browser import page_or_skip

    run, directory = trained
    with running_server(run, sae=str(directory)) as (url, _app), page_or_skip(
            url + "/", "!!(window.attnkit && window.attnkit.state.sae)", width=1300, height=2600) as browser:
        browser.evaluate("window.attnkit.showSaeToken(2)")
        shown = browser.evaluate("[...document.querySelectorAll('#sae-token-features tr[data-feature]')]"
                                 ".map((tr) => Number(tr.dataset.feature))")
        answer = json.loads(browser.evaluate("JSON.stringify(window.attnkit.state.sae)"))
        chosen = next(f for f in reversed(shown) if str(f) in answer["features"])  # one with saved contexts
        browser.evaluate(f"document.querySelector('#sae-token-features tr[data-feature=\"{chosen}\"]').click()")
        contexts = browser.evaluate("document.getElementById('sae-contexts').textContent")
        browser.evaluate("document.getElementById('sae-panel').scrollIntoView()")
        (tmp_path / "sae-panel.png").write_bytes(browser.screenshot())
    assert shown == [e["feature"] for e in answer["per_token"][2]]
    assert f"feature {chosen}:" in contexts
    assert all(context in contexts for _, context in answer["features"][str(chosen)]["top"])


def test_a_translation_runs_decoder_features_are_read_over_the_typed_target(tmp_path):
    run = tiny_run(tmp_path, "encoder-decoder")
    point = "decoder.blocks.0.resid_post"
    run_inspect(InspectSettings(run=str(run), analysis="sae", text=("the cat sat\tthe dog ran",) * 4, point=point,
                                k=4, features=32, steps=10, out=str(tmp_path / "inspect")))
    model, config = load_model(run)
    tokenizer = load_tokenizer(run / "tokenizer")
    view = SAEView(tmp_path / "inspect" / "sae", model.eval(), tokenizer, family=config.family,
                   max_len=config.max_seq_len)
    answer = view.read("the cat", "the dog")
    source = torch.tensor([tokenizer.encode("the cat") + [tokenizer.eos_id]])
    target = torch.tensor([[tokenizer.bos_id, *tokenizer.encode("the dog")]])  # teacher forcing: BOS + target
    activations = trace(model, source, target, names=[point])[point][0]  # (T, C)
    expected = load_sae(tmp_path / "inspect" / "sae").encode(activations)
    assert answer["tokens"][0] == "<bos>" and len(answer["per_token"]) == target.shape[1]
    for row, features in zip(answer["per_token"], expected, strict=True):
        assert [e["feature"] for e in row] == features.topk(len(row)).indices.tolist()


def test_a_decoders_text_beyond_the_context_is_refused_not_cut(trained):
    """The SAE view reads a decoder's whole text, as attnkit inspect reads a prompt: one longer than the context is
    refused naming its length, where its tokens past the context were dropped unsaid."""
    run, directory = trained
    model, config = load_model(run)
    view = SAEView(directory, model.eval(), load_tokenizer(run / "tokenizer"), family=config.family,
                   max_len=config.max_seq_len)
    fits = "ab" * (config.max_seq_len // 2)
    assert len(view.read(fits)["tokens"]) == len(load_tokenizer(run / "tokenizer").encode(fits))
    with pytest.raises(InputError, match=f"more than the {config.max_seq_len} this run reads"):
        view.read(fits + "abc")
