"""attnkit serve against bodies that schemathesis draws from the server's own OpenAPI document (GET /openapi.json,
made from the request models): bodies the schemas describe and bodies that break them (wrong types, values out of
range, missing and unknown fields). Every answer is a 2xx or an OpenAI-shaped 4xx, never a 5xx, and the server
stays up. The examples are few and the server's limits small (8 new tokens, 4 rows), so the module runs in
seconds."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")
schemathesis = pytest.importorskip("schemathesis", reason="in the dev extras")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from serve_helpers import running_server, tiny_run  # noqa: E402

TIMEOUT = 60
EXAMPLES = settings(max_examples=10, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))  # per endpoint and mode


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("property-runs")
    limits = dict(max_tokens=8, max_batch=4, max_queue=8, timeout=10)
    with running_server(tiny_run(root, "decoder"), **limits) as (lm, _), \
            running_server(tiny_run(root, "encoder", n_classes=3), **limits) as (clf, _):
        yield {"lm": lm, "clf": clf}


def operations(url: str) -> list:
    """The server's POST endpoints, from its own OpenAPI document."""
    schema = schemathesis.openapi.from_dict(httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json())
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("run", ["lm", "clf"])
def test_every_body_is_answered_2xx_or_4xx_never_5xx(servers, run, mode):
    url = servers[run]
    found = operations(url)
    assert {op.path for op in found} >= {"/api/analyze", "/v1/completions" if run == "lm" else "/v1/classify"}
    for operation in found:
        @EXAMPLES
        @given(case=operation.as_strategy(generation_mode=mode))
        def answered(case) -> None:
            response = case.call(base_url=url, timeout=TIMEOUT)
            assert response.status_code < 500, (case.path, case.body, response.text)
            if response.status_code >= 400:
                assert response.json()["error"]["message"] and "Traceback" not in response.text

        answered()
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["status"] == "ok"


def test_the_documents_largest_n_is_the_most_choices_a_request_may_take(servers):
    """The OpenAPI document's `n` maximum is what the server takes: --max-batch - 1 rows (3 of the 4 here), so that
    a body drawn from it is never refused for its `n`; one more is refused with 400 naming `n`."""
    url = servers["lm"]
    schemas = httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()["components"]["schemas"]
    assert {schemas[name]["properties"]["n"]["maximum"] for name in ("CompletionRequest", "ChatRequest")} == {3}
    body = {"prompt": "the cat", "max_tokens": 1}
    assert httpx.post(f"{url}/v1/completions", json={**body, "n": 3}, timeout=TIMEOUT).status_code == 200
    refused = httpx.post(f"{url}/v1/completions", json={**body, "n": 4}, timeout=TIMEOUT)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
