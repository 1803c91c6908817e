"""attnkit serve's prefix cache over HTTP: requests that share a system prompt get the answers they get without the
cache (at temperature 0 and sampled with a seed), /metrics counts the reused tokens, and --no-prefix-cache turns it
off."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is in the dev extras")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

import attnkit  # noqa: E402

TIMEOUT = 60
SYSTEM = "answer in short lines; say so when unsure. "  # 43 characters: 2 blocks of 16 and a part


def metric(url: str, name: str) -> float | None:
    for line in httpx.get(f"{url}/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith(f"attnkit_{name} "):
            return float(line.split()[1])
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("prefix-cache"), "decoder")


def answers(client) -> list[str]:
    texts = []
    for question, settings in (("who are you?", {"temperature": 0}), ("what is this?", {"temperature": 0.9,
                                                                                         "seed": 4})):
        texts.append(client.completions.create(model="decoder", prompt=SYSTEM + question, max_tokens=10,
                                               **settings).choices[0].text)
        chat = client.chat.completions.create(model="decoder", max_tokens=8, **settings, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        texts.append(chat.choices[0].message.content)
    return texts


def test_shared_system_prompts_reuse_their_blocks_and_answer_as_without_the_cache(run):
    pipeline = attnkit.load(run, device="cpu")
    with running_server(run) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        cached = answers(client)
        hits, queried = metric(url, "prefix_cache_hits_total"), metric(url, "prefix_cache_queries_total")
        assert hits >= 2 * 32 and hits < queried  # the second completion and chat reused at least 2 blocks each
        assert metric(url, "prefix_cache_hit_rate") == pytest.approx(hits / queried, abs=1e-6)
    assert cached[0] == pipeline.generate(SYSTEM + "who are you?", max_new_tokens=10, temperature=0)[0]
    assert cached[2] == pipeline.generate(SYSTEM + "what is this?", max_new_tokens=10, temperature=0.9, seed=4)[0]
    with running_server(run, prefix_cache=False) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        assert answers(client) == cached
        assert metric(url, "prefix_cache_hits_total") is None
