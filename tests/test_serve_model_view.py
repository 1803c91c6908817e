"""The explorer's whole-model panel (/api/model): its stages' shapes are the config's, its numbers at the query token
are the model's own hidden states computed here block by block, and the sublayers' writes add up to the stream."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

from attnkit import build_model  # noqa: E402
from attnkit.checkpoint import load_model  # noqa: E402
from attnkit.config import ModelConfig  # noqa: E402
from attnkit.inspect.residual import residual_stream  # noqa: E402
from attnkit.tokenize import load_tokenizer  # noqa: E402
from attnkit.viz.labels import token_labels  # noqa: E402

TIMEOUT = 60
TEXT = "the cat sat"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run = tiny_run(tmp_path_factory.mktemp("model-view"), "decoder", position="rope")
    with running_server(run) as (url, _app):
        yield url, run


def _by_block(stages: list[dict], stage: str) -> list[dict]:
    return sorted((s for s in stages if s["stage"] == stage), key=lambda s: s["block"])


def test_the_stages_shapes_are_the_configs(served):
    url, run = served
    view = httpx.post(f"{url}/api/model", json={"text": TEXT}, timeout=TIMEOUT).json()
    model, config = load_model(run)[:2]
    length = len(TEXT)
    assert view["query"] == length - 1  # the last token by default
    assert [s["stage"] for s in view["stages"]] == ["tokens", "embedding", *["attn", "mlp", "block"] * config.n_layers,
                                                    "final_norm", "output", "softmax"]
    assert view["stages"][0]["label"] == f"tokens (T={length})"
    assert "RoPE" in view["stages"][1]["note"] and "pre-norm" in view["stages"][1]["note"]
    for attention in _by_block(view["stages"], "attn"):
        assert attention["weights_shape"] == [config.n_heads, length, length]
        assert attention["shape"] == [length, config.d_model] and f"{config.n_heads} heads" in attention["label"]
    for ffn in _by_block(view["stages"], "mlp"):
        assert f"{config.d_model} -> {config.d_ff} -> {config.d_model}" in ffn["label"]
    assert view["stages"][-2]["shape"] == [length, config.vocab_size]


def test_the_numbers_are_the_models_own_hidden_states(served):
    url, run = served
    model, _config = load_model(run)[:2]
    model.eval()
    tokenizer = load_tokenizer(run / "tokenizer")
    ids = torch.tensor([tokenizer.encode(TEXT)])
    query = 4
    view = httpx.post(f"{url}/api/model", json={"text": TEXT, "query": query}, timeout=TIMEOUT).json()
    stages = view["stages"]
    with torch.no_grad():  # the stream computed here without hooks: the stack's own pieces, block by block
        out = model(ids)
        x = model.stack.embeddings(ids, torch.arange(ids.shape[1])[None])  # (1, T, C)
        positions = model.stack.positions.prepare(torch.arange(ids.shape[1])[None])
        expected = [x[0, query].norm()]
        lens = [model.lm_head(model.stack.final_norm(x))[0, query].softmax(-1)]
        for block in model.stack.blocks:
            x, _ = block(x, positions=positions)
            expected.append(x[0, query].norm())
            lens.append(model.lm_head(model.stack.final_norm(x))[0, query].softmax(-1))
    shown = [stages[1]["norm"]] + [s["norm"] for s in _by_block(stages, "block")]
    torch.testing.assert_close(torch.tensor(shown), torch.stack(expected), atol=1e-4, rtol=1e-4)
    # block l's logit-lens token is what the stream after block l gives, not its neighbour's
    assert [s["lens"]["token"] for s in _by_block(stages, "block")] == token_labels(
        tokenizer, [int(p.argmax()) for p in lens[1:]])
    final = out.logits[0, query].softmax(-1).topk(5)
    assert [t["token"] for t in stages[-1]["top"]] == token_labels(tokenizer, final.indices.tolist())
    torch.testing.assert_close(torch.tensor([t["p"] for t in stages[-1]["top"]]), final.values, atol=1e-4, rtol=0)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_the_writes_add_up_to_the_next_stream(norm_position):
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=20, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16,
                         norm_position=norm_position)
    model = build_model(config).eval()
    read = residual_stream(model, torch.randint(0, 20, (1, 6)))
    assert read.stream.shape == (config.n_layers + 1, 1, 6, config.d_model)
    for layer, block in enumerate(model.stack.blocks):
        attn, mlp = (w for w in read.writes if w.block == layer)
        torch.testing.assert_close(attn.into, read.stream[layer])
        after = mlp.into + mlp.out if block.pre_norm else block.mlp_norm(mlp.into + mlp.out)
        torch.testing.assert_close(after, read.stream[layer + 1])  # the stream after block `layer`, not another
        if block.pre_norm:
            torch.testing.assert_close(read.stream[layer] + attn.out + mlp.out, read.stream[layer + 1])


def test_bad_requests_name_the_problem(served):
    url, _run = served
    far = httpx.post(f"{url}/api/model", json={"text": TEXT, "query": len(TEXT)}, timeout=TIMEOUT)
    assert far.status_code == 400 and f"Query token {len(TEXT)}" in far.json()["error"]["message"]
    negative = httpx.post(f"{url}/api/model", json={"text": TEXT, "query": -1}, timeout=TIMEOUT)
    assert negative.status_code == 400 and "query" in negative.json()["error"]["message"]


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    run = tiny_run(tmp_path_factory.mktemp("model-view-seq2seq"), "encoder-decoder", sharpen=3.0)
    with running_server(run) as (url, _app):
        yield url, run


def _stream_norms(stack, ids, query, context=None):
    """|x| at `query` after the embeddings and after each block, computed here with the stack's own pieces."""
    positions = torch.arange(ids.shape[1])[None]
    x = stack.embeddings(ids, positions)  # (1, T, C)
    norms = [x[0, query].norm()]
    for block in stack.blocks:
        x, _ = block(x, positions=stack.positions.prepare(positions) if stack.positions else None, context=context)
        norms.append(x[0, query].norm())
    return torch.stack(norms)


def test_a_translation_run_shows_the_encoders_and_the_decoders_stream(translator):
    """/api/model on a translation run: the source's stream through the encoder and the model's own greedy
    translation's stream through the decoder (cross-attention between its self-attention and FFN), each read at its
    last token, with the numbers the stacks compute here; the translation is the one the attention maps draw."""
    from attnkit.models.greedy import greedy_target

    url, run = translator
    model, config = load_model(run)[:2]
    model.eval()
    tokenizer = load_tokenizer(run / "tokenizer")
    source = [*tokenizer.encode(TEXT), tokenizer.eos_id]
    written = greedy_target(model, source, bos=tokenizer.bos_id, eos=tokenizer.eos_id,
                            max_length=min(64, config.max_seq_len - 1))
    assert written, "the tiny model writes EOS first: choose another TEXT"
    answer = httpx.post(f"{url}/api/model", json={"text": TEXT}, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    view = answer.json()
    target = [tokenizer.bos_id, *written]
    assert view["target_given"] is False and view["tokens"] == token_labels(tokenizer, target)
    maps = httpx.post(f"{url}/api/analyze", json={"text": TEXT}, timeout=TIMEOUT).json()["attention"]
    assert next(m for m in maps if m["kind"] == "causal")["query_tokens"] == view["tokens"]  # the page's rows
    assert view["source"]["tokens"] == token_labels(tokenizer, source)
    S, T = len(source), len(target)
    assert (view["query"], view["source"]["query"]) == (T - 1, S - 1)
    decoder, encoder = view["stages"], view["source"]["stages"]
    assert [s["stage"] for s in decoder] == ["tokens", "embedding", *["attn", "cross_attn", "mlp", "block"]
                                             * config.n_layers, "final_norm", "output", "softmax"]
    assert [s["stage"] for s in encoder] == ["tokens", "embedding", *["attn", "mlp", "block"] * config.n_layers,
                                             "final_norm", "memory"]
    for cross in _by_block(decoder, "cross_attn"):
        assert cross["weights_shape"] == [config.n_heads, T, S] and cross["shape"] == [T, config.d_model]
    assert all(a["weights_shape"] == [config.n_heads, S, S] for a in _by_block(encoder, "attn"))
    with torch.no_grad():
        src, tgt = torch.tensor([source]), torch.tensor([target])
        memory = model.encode(src)
        expected_source = _stream_norms(model.encoder, src, S - 1)
        expected_target = _stream_norms(model.decoder, tgt, T - 1, context=memory)
        final = model(src, tgt).logits[0, -1].softmax(-1).topk(5)
    shown = [encoder[1]["norm"]] + [s["norm"] for s in _by_block(encoder, "block")]
    torch.testing.assert_close(torch.tensor(shown), expected_source, atol=1e-4, rtol=1e-4)
    shown = [decoder[1]["norm"]] + [s["norm"] for s in _by_block(decoder, "block")]
    torch.testing.assert_close(torch.tensor(shown), expected_target, atol=1e-4, rtol=1e-4)
    assert [t["token"] for t in decoder[-1]["top"]] == token_labels(tokenizer, final.indices.tolist())
    attribution = view["attribution"]  # pre-norm: the writers' shares sum to the model's own logit difference
    assert any(name.startswith("decoder.blocks.0.cross_attn head") for name in attribution["shares"])
    assert sum(attribution["shares"].values()) == pytest.approx(attribution["total"], abs=1e-3)
    assert sum(s["dla"] for s in decoder if "dla" in s) + attribution["shares"]["bias"] == pytest.approx(
        attribution["total"], abs=1e-3)


def test_a_translation_runs_view_reads_a_given_target_at_the_chosen_tokens(translator):
    """Explorer.whole_model with a target: the decoder reads BOS and that target, at the query token asked, the
    encoder at the source token asked; tokens out of either range are refused by name."""
    from attnkit.errors import InputError

    _url, run = translator
    explorer = _explorer(run)
    tokenizer = explorer.tokenizer
    view = explorer.whole_model(TEXT, 1, target="a dog", source_query=2)
    target = [tokenizer.bos_id, *tokenizer.encode("a dog")]
    assert view["target_given"] is True and view["tokens"] == token_labels(tokenizer, target)
    assert (view["query"], view["source"]["query"]) == (1, 2)
    model = explorer.model
    with torch.no_grad():
        src, tgt = torch.tensor([[*tokenizer.encode(TEXT), tokenizer.eos_id]]), torch.tensor([target])
        expected_target = _stream_norms(model.decoder, tgt, 1, context=model.encode(src))
        expected_source = _stream_norms(model.encoder, src, 2)
    stages = view["stages"]
    torch.testing.assert_close(torch.tensor([stages[1]["norm"]] + [s["norm"] for s in _by_block(stages, "block")]),
                               expected_target, atol=1e-4, rtol=1e-4)
    stages = view["source"]["stages"]
    torch.testing.assert_close(torch.tensor([stages[1]["norm"]] + [s["norm"] for s in _by_block(stages, "block")]),
                               expected_source, atol=1e-4, rtol=1e-4)
    with pytest.raises(InputError, match="Query token 6 is out of range"):
        explorer.whole_model(TEXT, 6, target="a dog")
    with pytest.raises(InputError, match=f"Source token {len(TEXT) + 1} is out of range"):
        explorer.whole_model(TEXT, target="a dog", source_query=len(TEXT) + 1)


def test_the_served_view_reads_the_target_and_the_source_token_the_page_sends(translator):
    """/api/model passes the page's Target box and its chosen source token to the view (it read the model's own
    translation at the source's last token whatever the page sent)."""
    url, run = translator
    tokenizer = load_tokenizer(run / "tokenizer")
    body = {"text": TEXT, "target": "a dog", "query": 1, "source_query": 2}
    view = httpx.post(f"{url}/api/model", json=body, timeout=TIMEOUT).json()
    assert view["target_given"] is True
    assert view["tokens"] == token_labels(tokenizer, [tokenizer.bos_id, *tokenizer.encode("a dog")])
    assert (view["query"], view["source"]["query"]) == (1, 2)
    far = httpx.post(f"{url}/api/model", json={**body, "source_query": len(TEXT) + 1}, timeout=TIMEOUT)
    assert far.status_code == 400 and f"Source token {len(TEXT) + 1}" in far.json()["error"]["message"]


def _explorer(run):
    from attnkit import load
    from attnkit.serve.explorer import Explorer

    return Explorer(load(run), run, watch=run, experiments=None)


def test_the_page_draws_a_translation_runs_two_streams(translator):
    """The Explore tab of a translation run shows the whole-model panel: the encoder's stages, then the decoder's
    with a cross-attention stage in each block, as /api/model gives them."""
    from viz_browser import page_or_skip

    url, run = translator
    n_layers = load_model(run)[1].n_layers
    with page_or_skip(url + "/", "!!(window.attnkit && window.attnkit.state.model)") as browser:
        view = browser.evaluate("window.attnkit.state.model")
        assert not browser.evaluate("document.getElementById('model-panel').classList.contains('hidden')")
        headings = browser.evaluate("[...document.querySelectorAll('#flow h3')].map((h) => h.textContent)")
        assert [h.split(":")[0] for h in headings] == ["Encoder", "Decoder"]
        stages = browser.evaluate("document.querySelectorAll('#flow .stage').length")
        assert stages == len(view["source"]["stages"]) + len(view["stages"])
        assert browser.evaluate("document.querySelectorAll('#flow .stage.cross_attn').length") == n_layers


def test_a_recurrent_translation_run_is_refused_with_the_reason(tmp_path):
    from attnkit.checkpoint import save_model
    from attnkit.errors import InputError
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefgh tc")
    config = ModelConfig(family="recurrent-seq2seq", vocab_size=tokenizer.vocab_size, cell="gru", hidden_size=16,
                         attention="luong-dot")
    save_model(build_model(config), config, tmp_path)
    tokenizer.save(tmp_path / "tokenizer")
    with pytest.raises(InputError, match="encoder is recurrent"):
        _explorer(tmp_path).whole_model("a cat", target="a bag")


def test_the_explorer_reads_its_copy_of_the_weights_only_when_asked_for_numbers(served):
    """A server that only answers the API holds the weights once: the explorer's own copy (the model as stored) is
    read at the first analysis, not at start, and read inside the server's inference mode it still takes gradients."""
    _url, run = served
    explorer = _explorer(run)
    info = explorer.info()
    assert "model" not in vars(explorer)
    assert info["kinds"] == sorted({site.kind for site in explorer.sites}) and info["translator"] is False
    with torch.inference_mode():  # as the server's worker threads run the explorer
        explorer.analyze(TEXT)
    assert "model" in vars(explorer)
    assert not any(parameter.is_inference() for parameter in explorer.model.parameters())
