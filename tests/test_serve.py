"""attnkit serve over real HTTP on 127.0.0.1: the official openai client, continuous batching that gives each request
the tokens it gets alone, a client that goes away, a full queue, and hostile bodies that each get a 4xx JSON error
while the server stays up."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is in the dev extras")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

import attnkit  # noqa: E402
from attnkit.errors import InputError  # noqa: E402
from attnkit.serve import ServeSettings, build_app  # noqa: E402

TIMEOUT = 60  # seconds any one request may take in these tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-runs")
    return {"lm": tiny_run(root, "decoder"), "clf": tiny_run(root, "encoder", n_classes=3),
            "tag": tiny_run(root / "tag", "encoder", encoder_head="tag", n_classes=3)}


@pytest.fixture(scope="module")
def server(runs):
    with running_server(runs["lm"], max_queue=64, max_batch=32) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def pipeline(runs):
    return attnkit.load(runs["lm"], device="cpu")


def test_openai_client_completion_equals_the_library(client, pipeline):
    answer = client.completions.create(model="decoder", prompt="the cat", max_tokens=12, temperature=0.8, seed=3)
    expected = pipeline.generate("the cat", max_new_tokens=12, temperature=0.8, seed=3)[0]
    assert answer.choices[0].text == expected
    assert answer.usage.prompt_tokens == len(pipeline.tokenizer.encode("the cat"))
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 12
    assert [m.id for m in client.models.list().data] == ["decoder"]


def test_openai_client_chat_renders_the_default_template(client, pipeline):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model="decoder", messages=messages, max_tokens=8, temperature=0)
    prompt = "System: be brief\nUser: hello\nAssistant:"
    expected = pipeline.generate(prompt, max_new_tokens=8, temperature=0, stop=["\nUser:", "\nSystem:"])[0]
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].message.role == "assistant"
    assert answer.usage.prompt_tokens == len(pipeline.tokenizer.encode(prompt))


def test_openai_client_streams_pieces_that_add_up(client, pipeline):
    stream = client.completions.create(model="decoder", prompt="a dog", max_tokens=15, seed=5, n=2, stream=True,
                                       stream_options={"include_usage": True})
    texts, reasons, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    expected = pipeline.generate("a dog", max_new_tokens=15, seed=5, num_samples=2)
    assert [texts[0], texts[1]] == expected
    assert set(reasons) == {0, 1} and usage.prompt_tokens == 5  # the prompt once, however many choices (OpenAI)
    assert usage.completion_tokens == 30 if set(reasons.values()) == {"length"} else usage.completion_tokens < 30
    chat = client.chat.completions.create(model="decoder", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=6, temperature=0, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in chat if c.choices]
    assert len(pieces) >= 2 and "".join(pieces) == pipeline.generate(
        "User: hi\nAssistant:", max_new_tokens=6, temperature=0, stop=["\nUser:", "\nSystem:"])[0]


def test_openai_client_errors(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="decoder", prompt="x", max_tokens=-3)
    assert bad.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="decoder", prompt="x", temperature=5)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-9", prompt="x")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.UnprocessableEntityError) as wrong:
        client.completions.create(model="decoder", prompt="x", extra_body={"n": "two"})
    assert wrong.value.body["param"] == "n"


async def _stream(url: str, body: dict) -> str:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http, http.stream("POST", f"{url}/v1/completions",
                                                                        json={**body, "stream": True}) as response:
        assert response.status_code == 200
        text, done = "", False
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        assert done, "the stream ended without [DONE]"
        return text


def test_32_concurrent_streams_each_equal_the_request_alone(server):
    url, app = server
    bodies = [{"prompt": ["the ", "a cat", "on a mat, ", "x"][i % 4] * (1 + i % 3), "max_tokens": 8 + (i * 5) % 17,
               "seed": i, "temperature": 0.0 if i % 5 == 0 else 1.0, "top_k": 10 if i % 3 == 0 else None}
              for i in range(32)]
    alone = [asyncio.run(_stream(url, body)) for body in bodies]
    sizes = []
    watching = threading.Event()

    def watch_batch() -> None:
        while not watching.is_set():
            sizes.append(app.state.scheduler.running_rows)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch_batch)
    watcher.start()

    async def together() -> list[str]:
        return await asyncio.gather(*(_stream(url, body) for body in bodies))

    try:
        concurrent = asyncio.run(together())
    finally:
        watching.set()
        watcher.join()
    assert concurrent == alone
    assert max(sizes) > 1, "the concurrent requests were never decoded in one batch"


def _slow_steps(scheduler, monkeypatch, seconds: float) -> None:
    """Each decoding step of `scheduler` takes `seconds` longer."""
    step = scheduler.decoding.step

    def slow_step(*args):
        time.sleep(seconds)
        return step(*args)

    monkeypatch.setattr(scheduler.decoding, "step", slow_step)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_frees_its_slot_and_is_counted_499(server, monkeypatch, caplog, stream):
    """A client that closes its connection mid-generation ends it, streamed or answered whole (which sends nothing
    before its end, so only the connection's close says the client has gone); its log line and counter say 499."""
    url, app = server
    scheduler = app.state.scheduler
    _slow_steps(scheduler, monkeypatch, 0.02)  # a step the client can outlast, however fast the machine
    gone_before = _counted(url, "/v1/completions", 499)
    body = json.dumps({"prompt": "the", "max_tokens": 90, "seed": 0, "ignore_eos": True, "stream": stream}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    host, port = url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO, logger="attnkit.serve"):
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as connection:
            connection.sendall(head + body)
            deadline = time.monotonic() + 20
            while scheduler.batch is None and time.monotonic() < deadline:
                time.sleep(0.005)
            scheduler.lock.acquire()  # hold generation still while the client leaves
            job = scheduler.batch.rows[0][0] if scheduler.batch is not None else None
        # the connection is closed here
        try:
            assert job is not None, "the request ended before the client left"
            deadline = time.monotonic() + 20
            while not job.cancelled.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert job.cancelled.is_set(), "the server did not notice the client leaving"
        finally:
            scheduler.lock.release()
        deadline = time.monotonic() + 20
        while (scheduler.running_rows or not _logged(caplog, "POST /v1/completions 499")) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    assert scheduler.running_rows == 0 and job.reasons == ["cancelled"] and job.produced < 90
    assert _logged(caplog, "POST /v1/completions 499")
    assert _counted(url, "/v1/completions", 499) == gone_before + 1


def _counted(url: str, path: str, status: int) -> int:
    """attnkit_requests_total of `path` and `status` in the server's /metrics."""
    prefix = f'attnkit_requests_total{{path="{path}",status="{status}"}} '
    lines = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text.splitlines()
    return next((int(line.removeprefix(prefix)) for line in lines if line.startswith(prefix)), 0)


def test_a_full_queue_answers_429_with_retry_after(server):
    url, app = server
    scheduler = app.state.scheduler

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            requests = [http.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 2}) for _ in range(80)]
            return await asyncio.gather(*requests)

    async def held() -> list[httpx.Response]:
        task = asyncio.ensure_future(many())
        deadline = time.monotonic() + 20
        while scheduler.queue_length < 64 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        scheduler.lock.release()
        return await task

    scheduler.lock.acquire()
    responses = asyncio.run(held())
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) >= 64 and statuses.count(429) >= 1 and set(statuses) == {200, 429}
    busy = next(r for r in responses if r.status_code == 429)
    assert busy.headers["retry-after"] == "1" and busy.json()["error"]["type"] == "rate_limit_error"


HOSTILE = {
    "huge max_tokens": (b'{"prompt": "a", "max_tokens": 1000000000000}', 400, "max_tokens"),
    "negative n": (b'{"prompt": "a", "n": -1}', 400, "n"),
    "negative top_k": (b'{"prompt": "a", "top_k": -5}', 400, "top_k"),
    "top_p zero": (b'{"prompt": "a", "top_p": 0}', 400, "top_p"),
    "string for an integer": (b'{"prompt": "a", "max_tokens": "12"}', 422, "max_tokens"),
    "number for the prompt": (b'{"prompt": 42}', 422, "prompt"),
    "object for the stop": (b'{"prompt": "a", "stop": {"x": 1}}', 422, "stop"),
    "missing prompt": (b'{"max_tokens": 3}', 422, "prompt"),
    "a list, not an object": (b'[1, 2, 3]', 422, None),
    "not JSON": (b'{"prompt": ', 400, None),
    "invalid UTF-8": (b'{"prompt": "\xff\xfe\xfa"}', 400, None),
    "deeply nested JSON": (b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", 400, None),
    "10 MB prompt": (b'{"prompt": "' + b"a" * 10_000_000 + b'"}', 413, None),
    "prompt beyond the context": (b'{"prompt": "' + b"a" * 5_000 + b'"}', 400, "prompt"),
    "n beyond the batch": (b'{"prompt": "a", "n": 100}', 400, "n"),
    "a lone surrogate in the prompt": (b'{"prompt": "A\\ud800B"}', 400, "prompt"),
    "a lone surrogate in a list": (b'{"prompt": ["ok", "\\udfff"]}', 400, "prompt"),
    "five stop strings": (b'{"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop"),
    "an empty prompt list": (b'{"prompt": []}', 400, "prompt"),
    "more prompts than the queue holds": (json.dumps({"prompt": ["a"] * 100}).encode(), 400, "prompt"),
    "subnormal temperature": (b'{"prompt": "a", "temperature": 1e-300}', 400, "temperature"),
    "subnormal top_p": (b'{"prompt": "a", "top_p": 1e-320}', 400, "top_p"),
    "seed beyond 64 bits": (b'{"prompt": "a", "seed": 100000000000000000000000000000}', 400, "seed"),
    "negative seed": (b'{"prompt": "a", "seed": -1}', 400, "seed"),
    "logit_bias beyond the vocabulary": (b'{"prompt": "a", "logit_bias": {"5000": 10}}', 400, "logit_bias"),
    "logit_bias not a token id": (b'{"prompt": "a", "logit_bias": {"a": 10}}', 400, "logit_bias"),
    "logit_bias beyond 100": (b'{"prompt": "a", "logit_bias": {"5": 101}}', 400, "logit_bias"),
    "logprobs beyond 20": (b'{"prompt": "a", "logprobs": 21}', 400, "logprobs"),
    "a token id beyond the vocabulary": (b'{"prompt": [1, 2, 5000]}', 400, "prompt"),
    "a negative token id": (b'{"prompt": [[1, 2], [-1]]}', 400, "prompt"),
    "best_of": (b'{"prompt": "a", "best_of": 3}', 400, "best_of"),
    "a misspelt field": (b'{"prompt": "a", "max_token": 3}', 400, "max_token"),
    "a number of 5,000 digits": (b'{"prompt": "a", "max_tokens": ' + b"9" * 5_000 + b"}", 400, None),
    "NaN temperature": (b'{"prompt": "a", "temperature": NaN}', 400, "temperature"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_body_gets_a_4xx_json_error(server, name):
    body, status, param = HOSTILE[name]
    response = httpx.post(f"{server[0]}/v1/completions", content=body, timeout=TIMEOUT,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and "Traceback" not in response.text and error["param"] == param
    assert httpx.get(f"{server[0]}/health", timeout=TIMEOUT).json()["status"] == "ok"


def test_every_hostile_body_at_once_leaves_a_running_stream_its_own_tokens(server, monkeypatch):
    """The hostile bodies above, sent together while a stream runs (its steps slowed, so that they arrive during
    it): each gets its own refusal, and the stream the text it gets alone."""
    url, app = server
    good = {"prompt": "the cat", "max_tokens": 40, "seed": 4, "temperature": 0.9, "ignore_eos": True}
    alone = asyncio.run(_stream(url, good))
    _slow_steps(app.state.scheduler, monkeypatch, 0.02)

    async def together() -> tuple[str, list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            stream = asyncio.ensure_future(_stream(url, good))
            refusals = await asyncio.gather(*(
                http.post(f"{url}/v1/completions", content=body, headers={"Content-Type": "application/json"})
                for body, _, _ in HOSTILE.values()))
            return await stream, refusals

    streamed, refusals = asyncio.run(together())
    assert streamed == alone
    assert [r.status_code for r in refusals] == [status for _, status, _ in HOSTILE.values()]
    assert [r.json()["error"]["param"] for r in refusals] == [param for _, _, param in HOSTILE.values()]


def test_refusals_say_what_is_wrong_and_neutral_values_of_unhonoured_fields_pass(server):
    url = server[0]

    def refusal(path: str, body: dict) -> str:
        response = httpx.post(f"{url}{path}", content=json.dumps(body), timeout=TIMEOUT)  # surrogates escaped
        assert response.status_code == 400, response.text
        return response.json()["error"]["message"]

    assert "at most 4 items" in refusal("/v1/completions", {"prompt": "a", "stop": list("abcde")})
    assert "at least 1 item" in refusal("/v1/completions", {"prompt": []})
    form = httpx.post(f"{url}/v1/completions", content="prompt=hi", timeout=TIMEOUT,
                      headers={"Content-Type": "application/x-www-form-urlencoded"})  # curl -d without -H
    assert form.status_code == 400 and form.json()["error"]["message"].endswith(
        "(it came as application/x-www-form-urlencoded); send a JSON object, with Content-Type: application/json")
    for field in ("temperature", "top_p", "presence_penalty"):  # NaN is no number: not "should be at most 2"
        nan = refusal("/v1/completions", {"prompt": "a", field: float("nan")})
        assert nan.startswith(f"{field}: NaN is not a JSON number")
    assert "queues at most 64 (--max-queue)" in refusal("/v1/completions", {"prompt": ["a"] * 65})
    assert "at once (32): ask for fewer, or serve with a larger --max-batch" in refusal(
        "/v1/completions", {"prompt": "a", "n": 33})
    assert "does not honour it; leave it out" in refusal("/v1/completions", {"prompt": "a", "best_of": 2})
    assert "fields it takes: " in refusal("/v1/completions", {"prompt": "a", "max_token": 3})
    for field, value in (("functions", [{"name": "f"}]), ("top_logprobs", 3), ("function_call", "auto")):
        assert field in refusal("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         field: value})
    json_mode = refusal("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                 "response_format": {"type": "json_object"}})  # its alphabet has no {
    assert json_mode.startswith("response_format: the JSON schema cannot start with this char tokenizer")
    lone = refusal("/v1/chat/completions", {"messages": [{"role": "user", "content": "A\ud800B"}]})
    assert lone.startswith("messages.0.content: the text holds a lone surrogate ('\\ud800') at character 1")
    neutral = {"prompt": "ab", "max_tokens": 2, "logprobs": None, "frequency_penalty": 0, "presence_penalty": 0.0,
               "logit_bias": {}, "echo": False, "best_of": 1, "suffix": "", "user": "someone"}
    assert httpx.post(f"{url}/v1/completions", json=neutral, timeout=TIMEOUT).status_code == 200


def test_a_chat_far_beyond_the_context_is_refused_from_its_head_and_a_chat_id_beyond_the_vocabulary_names_messages(
        server, pipeline, monkeypatch):
    """A chat's rendered text far longer than the context (96 tokens) is refused naming messages after tokenizing its
    head alone (32 characters a token, `tokenize.encode_head`): it was tokenized whole first, a megabyte body's cost in
    the request's size. A chat id beyond the model's vocabulary (a tokenizer larger than its embedding) is reported
    against messages, not prompt."""
    from attnkit.serve.chat import ChatTemplate

    url = server[0]
    encoded: list[int] = []
    encode = type(pipeline.tokenizer).encode
    monkeypatch.setattr(type(pipeline.tokenizer), "encode", lambda self, text: encoded.append(len(text)) or encode(
        self, text))
    response = httpx.post(f"{url}/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": [{"role": "user", "content": "a" * 20_000}], "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and "send shorter messages" in error["message"]
    assert encoded and max(encoded) <= 32 * 96
    monkeypatch.setattr(ChatTemplate, "prompt_ids", lambda self, tokenizer, prompt: [1, 5000])
    response = httpx.post(f"{url}/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and error["message"].startswith("messages: token id 5000 is beyond")


def test_one_poisoned_request_among_good_ones_fails_alone(server, monkeypatch):
    """Requests refused at the edge, and one that fails inside the scheduler (its sampling raises), sent together
    with good ones: each good one gets what it gets alone, each poisoned one its own error."""
    from attnkit.serve import batching

    url, app = server
    good = [{"prompt": "the cat"[: 3 + i], "max_tokens": 6 + i, "seed": i, "temperature": 0.8} for i in range(6)]
    alone = [httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT).json()["choices"][0]["text"]
             for body in good]
    sample = batching.select_next_in_groups

    def failing(logits, config, groups, **kwargs):  # the job seeded 77 samples to nothing
        if any(generator is not None and generator.initial_seed() == 77 for _, generator in groups):
            raise RuntimeError("probability tensor contains inf or nan")
        return sample(logits, config, groups, **kwargs)

    monkeypatch.setattr(batching, "select_next_in_groups", failing)
    poisoned = [{"prompt": "a", "temperature": 1e-300}, {"prompt": "a", "seed": 10**29},
                {"prompt": "a", "stop": list("abcde")}, {"prompt": "A\ud800"},
                {"prompt": "the", "max_tokens": 8, "seed": 77, "temperature": 0.8}]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            bodies = good[:3] + poisoned + good[3:]
            return await asyncio.gather(*(http.post(f"{url}/v1/completions", content=json.dumps(body))
                                          for body in bodies))

    responses = asyncio.run(together())
    answered = responses[:3] + responses[-3:]
    assert [r.status_code for r in answered] == [200] * 6
    assert [r.json()["choices"][0]["text"] for r in answered] == alone
    assert [r.status_code for r in responses[3:-3]] == [400, 400, 400, 400, 500]
    assert responses[-4].json()["error"]["type"] == "server_error" and "Traceback" not in responses[-4].text
    scheduler, deadline = app.state.scheduler, time.monotonic() + 20
    while (scheduler.running_rows or scheduler.queue_length) and time.monotonic() < deadline:
        time.sleep(0.02)  # the rows of a finished request leave the batch just after its answer
    assert scheduler.running_rows == 0 and scheduler.queue_length == 0


def test_a_body_sent_in_chunks_stops_at_the_limit_and_memory_stays_flat(server):
    psutil = pytest.importorskip("psutil")
    process = psutil.Process()
    before = process.memory_info().rss

    def chunks():
        for _ in range(200):  # 200 MB offered, no Content-Length
            yield b"a" * 1_000_000

    response = httpx.post(f"{server[0]}/v1/completions", content=chunks(), timeout=TIMEOUT)
    assert response.status_code == 413
    assert process.memory_info().rss - before < 150_000_000
    assert httpx.get(f"{server[0]}/health", timeout=TIMEOUT).status_code == 200


def test_health_metrics_and_unknown_paths(server):
    url = server[0]
    httpx.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 3}, timeout=TIMEOUT)
    metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    for name in ("attnkit_requests_total{", "attnkit_generated_tokens_total", "attnkit_tokens_per_second",
                 "attnkit_queue_length", "attnkit_batch_size"):
        assert name in metrics
    served = [line for line in metrics.splitlines() if line.startswith('attnkit_requests_total{path="/v1/completions"')]
    assert served and all(float(line.rsplit(" ", 1)[1]) >= 1 for line in served)
    from importlib.metadata import version  # vLLM's /version, which answered 404

    assert httpx.get(f"{url}/version", timeout=TIMEOUT).json() == {"version": version("attnkit")}
    missing = httpx.get(f"{url}/v2/nothing", timeout=TIMEOUT)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong = httpx.post(f"{url}/v1/classify", json={"input": "x"}, timeout=TIMEOUT)
    assert wrong.status_code == 404 and "/v1/completions" in wrong.json()["error"]["message"]
    for verb in ("GET", "DELETE"):  # a /v1/ name no endpoint has was a 405 to any verb but POST, as if it were one
        unknown = httpx.request(verb, f"{url}/v1/responses", timeout=TIMEOUT)
        assert unknown.status_code == 404 and "/v1/completions" in unknown.json()["error"]["message"]
        served = httpx.request(verb, f"{url}/v1/completions", timeout=TIMEOUT)
        assert served.status_code == 405 and served.headers["Allow"] == "POST"
        assert served.json()["error"]["type"] == "invalid_request_error"


def test_a_v1_endpoint_asked_with_a_verb_it_does_not_take_answers_405_naming_its_verbs(server):
    """/v1/models takes GET alone: a DELETE, PUT or POST of it answered 404 saying no endpoint /v1/models existed;
    /v1/chat/completions' 405 came without the Allow header a 405 must carry; and a HEAD or OPTIONS of a /v1/ name no
    endpoint has answered 405, where the guide says such a name is a 404 whatever the verb."""
    url = server[0]
    for verb in ("DELETE", "PUT", "POST"):
        models = httpx.request(verb, f"{url}/v1/models", timeout=TIMEOUT)
        assert models.status_code == 405 and models.headers["Allow"] == "GET", (verb, models.text)
        assert "/v1/models takes GET" in models.json()["error"]["message"]
    chat = httpx.get(f"{url}/v1/chat/completions", timeout=TIMEOUT)
    assert chat.status_code == 405 and chat.headers["Allow"] == "POST"
    for verb in ("HEAD", "OPTIONS"):
        assert httpx.request(verb, f"{url}/v1/responses", timeout=TIMEOUT).status_code == 404, verb
        served = httpx.request(verb, f"{url}/v1/completions", timeout=TIMEOUT)
        assert served.status_code == 405 and served.headers["Allow"] == "POST", verb


def test_version_answers_where_attnkit_runs_from_a_checkout_without_being_installed(runs, monkeypatch):
    """/version asked the installed package's metadata as the app was built: from a checkout (PYTHONPATH=src) there is
    none, and `attnkit serve` failed to start with PackageNotFoundError's traceback; it answers what `attnkit --version`
    prints there."""
    from importlib import metadata

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with running_server(runs["lm"]) as (url, _app):
        assert httpx.get(f"{url}/version", timeout=TIMEOUT).json() == {"version": "unknown (not installed)"}


def test_a_classifier_serves_its_task_and_embeddings_not_completions(runs):
    classifier = attnkit.load(runs["clf"], device="cpu")
    with running_server(runs["clf"]) as (url, _app):
        models = httpx.get(f"{url}/v1/models", timeout=TIMEOUT).json()["data"][0]
        assert models["task"] == "classify" and "/v1/classify" in models["endpoints"]
        answer = httpx.post(f"{url}/v1/classify", json={"input": ["a cat", "dogs"]}, timeout=TIMEOUT).json()
        expected = classifier.classify(["a cat", "dogs"])
        assert [d["result"]["label"] for d in answer["data"]] == [c.label for c in expected]
        probabilities = answer["data"][0]["result"]["probabilities"]
        assert probabilities == pytest.approx(expected[0].probabilities, abs=1e-6)
        embedded = httpx.post(f"{url}/v1/embeddings", json={"input": ["a cat", "a cat", "zzz"]}, timeout=TIMEOUT)
        vectors = [d["embedding"] for d in embedded.json()["data"]]
        assert len(vectors[0]) == 32 and vectors[0] == pytest.approx(vectors[1]) and vectors[0] != pytest.approx(
            vectors[2])
        assert sum(v * v for v in vectors[0]) == pytest.approx(1.0, abs=1e-5)
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "a"}, timeout=TIMEOUT)
        assert refused.status_code == 404 and "/v1/classify" in refused.json()["error"]["message"]


def test_texts_beyond_the_context_are_said_or_refused_and_every_endpoint_keeps_the_timeout(runs, monkeypatch):
    from attnkit.serve import state as served

    long = "a cat sat " * 20  # 200 characters: more than the context of 96
    with running_server(runs["clf"], timeout=0.5) as (url, app):
        classified = httpx.post(f"{url}/v1/classify", json={"input": ["a cat", long]}, timeout=TIMEOUT).json()
        assert [d["result"]["truncated"] for d in classified["data"]] == [False, True]
        embedded = httpx.post(f"{url}/v1/embeddings", json={"input": [long, "a cat"]}, timeout=TIMEOUT).json()
        assert [d["truncated"] for d in embedded["data"]] == [True, False]
        assert embedded["usage"]["prompt_tokens"] == 96 + 7
        refused = httpx.post(f"{url}/v1/embeddings", json={"input": "a", "dimensions": 8}, timeout=TIMEOUT)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "dimensions"
        app.state.model_lock.acquire()  # the model is busy for longer than the timeout
        try:
            for path in ("/v1/classify", "/v1/embeddings", "/api/analyze", "/api/inspect"):
                body = {"text": "a cat"} if path.startswith("/api") else {"input": "a cat"}
                late = httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)
                assert late.status_code == 504 and late.json()["error"]["type"] == "timeout_error", path
        finally:
            app.state.model_lock.release()
        turns = []
        monkeypatch.setattr(served, "TEXTS_PER_TURN", 2)
        original = attnkit.generate.Pipeline.classify

        def slow(self, texts, **kwargs):
            turns.append(len(texts))
            time.sleep(0.2)
            return original(self, texts, **kwargs)

        monkeypatch.setattr(attnkit.generate.Pipeline, "classify", slow)
        many = httpx.post(f"{url}/v1/classify", json={"input": ["a cat"] * 200}, timeout=TIMEOUT)
        assert many.status_code == 504 and "texts were read" in many.json()["error"]["message"]
        assert 1 <= len(turns) <= 4  # 0.5 s of 0.2 s turns: the model is not held for the 100 turns asked
    with running_server(runs["tag"]) as (url, _app):
        tagged = httpx.post(f"{url}/v1/tag", json={"input": ["a cat sat", "x " * 60]}, timeout=TIMEOUT)
        assert tagged.status_code == 400 and tagged.json()["error"]["param"] == "input"
        assert tagged.json()["error"]["message"].startswith("input[1]: ")
        assert "lie past the model's context of 96 tokens" in tagged.json()["error"]["message"]
        short = httpx.post(f"{url}/v1/tag", json={"input": "a cat sat"}, timeout=TIMEOUT).json()
        assert [w["word"] for w in short["data"][0]["result"]] == ["a", "cat", "sat"]


def test_serve_explain_logs_the_inference_plan_it_serves_with(runs, caplog):
    with caplog.at_level(logging.INFO, logger="attnkit.serve"):
        build_app(ServeSettings(run=str(runs["lm"]), explain=True))
    plans = [record.message for record in caplog.records if "inference plan for" in record.message]
    assert len(plans) == 1 and "q/k/v" in plans[0] and "fused" in plans[0] and "attention" in plans[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="attnkit.serve"):
        build_app(ServeSettings(run=str(runs["lm"])))
    assert not any("inference plan" in record.message for record in caplog.records)


def test_only_a_missing_serve_extra_is_said_to_need_fastapi(runs, monkeypatch):
    """Every ImportError on the way to the app was said to need FastAPI and uvicorn, hiding a fault in attnkit's
    own modules: only a missing fastapi, uvicorn or pydantic (ImportError.name) is named so."""
    import sys

    monkeypatch.setitem(sys.modules, "attnkit.serve.app", None)  # importing it fails: attnkit's own module
    with pytest.raises(ImportError) as raised:
        build_app(ServeSettings(run=str(runs["lm"])))
    assert raised.type is not InputError and raised.value.name == "attnkit.serve.app"
    monkeypatch.delitem(sys.modules, "attnkit.serve.app")
    monkeypatch.setitem(sys.modules, "fastapi", None)  # the extra not installed
    with pytest.raises(InputError, match=r"attnkit serve needs FastAPI and uvicorn: pip install 'attnkit\[serve\]'"):
        build_app(ServeSettings(run=str(runs["lm"])))


def test_another_host_needs_an_api_key_and_the_key_is_checked(runs, monkeypatch):
    monkeypatch.delenv("ATTNKIT_API_KEY", raising=False)
    with pytest.raises(InputError, match="--api-key"):
        build_app(ServeSettings(run=str(runs["lm"]), host="0.0.0.0"))
    with running_server(runs["lm"], api_key="sesame", timeout=0.5) as (url, app):
        assert httpx.get(f"{url}/v1/models", timeout=TIMEOUT).status_code == 401
        keyed = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", timeout=TIMEOUT, max_retries=0)
        assert keyed.models.list().data[0].id == "decoder"
        assert httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200  # liveness needs no key
        app.state.scheduler.lock.acquire()  # nothing is generated for longer than the 0.5 s timeout
        try:
            with pytest.raises(openai.APIStatusError) as late:
                keyed.completions.create(model="decoder", prompt="a", max_tokens=5)
        finally:
            app.state.scheduler.lock.release()
        assert late.value.status_code == 504


def test_the_port_and_host_are_checked_and_bound_before_the_run_loads(runs, monkeypatch, caplog):
    from types import SimpleNamespace

    import uvicorn

    import attnkit.serve as serving

    loaded = []
    app = SimpleNamespace(state=SimpleNamespace(close=lambda: None, drain=None))  # what serve() reads of the app
    monkeypatch.setattr(serving, "build_app", lambda settings: loaded.append(settings) or app)
    run = str(runs["lm"])
    for settings, message in ((dict(port=99999), "--port 99999 is no TCP port: give one from 1 to 65535, or 0"),
                              (dict(host="no-such-host.invalid"), "is neither an IP address nor a name"),
                              (dict(host="10.254.254.254", api_key="k"), "is not an address of this machine")):
        with pytest.raises(InputError, match=message):
            serving.serve(ServeSettings(run=run, **settings))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        busy_port = rf"port {port} on 127.0.0.1 is in use .* \(--port 0 takes any free one\)"
        with pytest.raises(InputError, match=busy_port):
            serving.serve(ServeSettings(run=run, port=port))
    assert loaded == []  # each refused before the run loads
    chosen = []
    def run_at_once(self, sockets) -> None:  # a server that started and stopped, as far as serve() can tell
        chosen.append(sockets[0].getsockname()[1])
        self.started = True

    monkeypatch.setattr(uvicorn.Server, "run", run_at_once)
    with caplog.at_level(logging.INFO, logger="attnkit.serve"):
        assert serving.serve(ServeSettings(run=run, port=0)) == 0
    assert chosen[0] != 0 and f"at http://127.0.0.1:{chosen[0]}/ " in caplog.text


def test_a_failure_inside_generation_answers_500_without_a_traceback_and_the_server_goes_on(server, monkeypatch):
    url, app = server
    decoding = app.state.scheduler.decoding

    def broken_step(window, cache):
        raise RuntimeError("a kernel failed deep inside")

    monkeypatch.setattr(decoding, "step", broken_step)
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 5}, timeout=TIMEOUT)
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
    assert "Traceback" not in response.text and "kernel" not in response.text
    monkeypatch.undo()
    again = httpx.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 5}, timeout=TIMEOUT)
    assert again.status_code == 200 and again.json()["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, on purpose
def test_health_answers_503_once_generation_has_stopped_and_a_request_is_refused_at_once(runs, monkeypatch):
    """/health speaks for the whole server: once the batching scheduler's thread has ended (an error its loop could
    not catch), no generation request would ever be answered, so /health says 503 (for an orchestrator to restart
    the server) and a generation request is refused at once instead of waiting out its timeout."""
    with running_server(runs["lm"], timeout=5.0) as (url, app):  # a refusal that failed to come: a 504 after 5 s
        scheduler = app.state.scheduler
        assert httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200

        def ended() -> None:
            raise SystemExit("the thread ends")  # not an Exception: past the loop's guard

        monkeypatch.setattr(scheduler, "_iteration", ended)
        with httpx.Client(timeout=0.5) as http, pytest.raises(httpx.TimeoutException):
            http.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 5})  # wakes it, and it ends
        scheduler._thread.join(timeout=TIMEOUT)
        health = httpx.get(f"{url}/health", timeout=TIMEOUT)
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 5}, timeout=TIMEOUT)
    assert health.status_code == 503 and "restart" in health.json()["error"]["message"]
    assert refused.status_code == 503 and refused.json()["error"]["message"] == health.json()["error"]["message"]


def test_a_shutdown_ends_a_task_request_at_its_next_turn_with_503(runs, monkeypatch):
    """An encoder's request of many texts, read a turn at a time, ends at the turn after the server is told to stop
    (what SIGINT and SIGTERM do first, `serve/server.py`), instead of reading every text before the server may go."""
    from attnkit.serve.routes import embeddings

    turns, embed = [], embeddings.embed

    def slow(pipeline, texts, start=0):
        turns.append(start)
        time.sleep(0.02)  # a turn the test can outlast, however fast the machine
        return embed(pipeline, texts, start)

    monkeypatch.setattr(embeddings, "embed", slow)
    answers = []
    with running_server(runs["clf"]) as (url, app):
        client = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{url}/v1/embeddings", json={"input": ["a cat"] * 16 * 100}, timeout=TIMEOUT)))
        client.start()
        deadline = time.monotonic() + TIMEOUT
        while len(turns) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        app.state.close()
        client.join(TIMEOUT)
    assert answers[0].status_code == 503 and "shutting down" in answers[0].json()["error"]["message"]
    assert 2 <= len(turns) < 100


def test_a_converted_runs_chat_template_renders_the_messages(tmp_path):
    from attnkit.serve.chat import chat_template

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat_template(tmp_path).render(messages) == "System: be brief\nUser: hi\nAssistant:"
    source = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": source, "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    template = chat_template(tmp_path)
    assert template.render(messages) == "<s><|system|>be brief</s><|user|>hi</s><|assistant|>"
    assert template.stops == ()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"}))
    with pytest.raises(Exception, match="unsafe|not safely|attribute"):
        chat_template(tmp_path).render(messages)  # the sandbox refuses a template reaching into Python


def test_streams_are_logged_and_counted_when_they_end_with_the_status_they_end_with(runs, pipeline, monkeypatch,
                                                                                     caplog):
    with running_server(runs["lm"], timeout=3.0) as (url, app):
        _slow_steps(app.state.scheduler, monkeypatch, 0.05)  # a stream that outlasts its headers, however fast
        bodies = []  # each stream's text
        with caplog.at_level(logging.INFO, logger="attnkit.serve"), httpx.Client(timeout=TIMEOUT) as http:
            for max_tokens in (10, 90):  # 0.5 s of steps; then 4.5 s, past the timeout (504 inside the stream)
                body = {"prompt": "the", "max_tokens": max_tokens, "stream": True, "seed": 0,
                        "logit_bias": {str(pipeline.tokenizer.eos_id): -100}}  # no EOS: every step it asks for
                with http.stream("POST", f"{url}/v1/completions", json=body) as response:
                    bodies.append("".join(response.iter_lines()))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(_logged(caplog, "POST /v1/completions")) < 2:
                time.sleep(0.05)
        metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    logged = _logged(caplog, "POST /v1/completions")
    (whole, whole_seconds), (late, late_seconds) = [line.split()[2:4] for line in logged]
    # the time to the stream's end, not to its headers: at least the sleeps of its 9 steps after the prefill
    assert whole == "200" and float(whole_seconds.rstrip("s")) >= 9 * 0.05
    assert '"timeout_error"' in bodies[1] and late == "504" and float(late_seconds.rstrip("s")) >= 3.0
    assert 'attnkit_requests_total{path="/v1/completions",status="200"} 1' in metrics
    assert 'attnkit_requests_total{path="/v1/completions",status="504"} 1' in metrics


def _logged(caplog, start: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith(start)]


@pytest.mark.parametrize(("prompt", "status", "words"), [
    ([1, -2, 3], 400, "the token id at [1] is -2"),
    ([1, 2.5, 3], 422, "[1] is 2.5, not a token id"),
    ([True], 422, "[0] is true, not a token id"),
    ([[1, 2], []], 400, "[1] is an empty list"),
    ([[1, 2], [3, -4]], 400, "the token id at [1][1] is -4"),
    ([1, "a"], 422, '[1] is "a", not a token id'),
])
def test_token_id_prompts_are_refused_naming_the_id(server, prompt, status, words):
    response = httpx.post(f"{server[0]}/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=TIMEOUT)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and words in error["message"] and "valid string" not in error["message"]


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 123}]},
     "messages.0.content: expected a string or a list of content parts, not a number"),
    ("/v1/completions", {"prompt": {"text": "ab"}}, "prompt: expected a string, a list of strings, a list of token ids "
     "or a list of token-id lists, not an object"),
    ("/v1/completions", {"prompt": "ab", "stop": 7}, "stop: expected a string or a list of strings, not a number"),
])
def test_a_value_of_no_members_type_is_told_every_member(server, path, body, words):
    """A union field given a value of none of its members' types names them all, not the first member's complaint
    ("Input should be a valid string")."""
    response = httpx.post(f"{server[0]}{path}", json=body, timeout=TIMEOUT)
    assert response.status_code == 422 and response.json()["error"]["message"] == words, response.text


def test_a_union_field_given_an_object_is_refused_for_what_the_object_lacks(server):
    """tool_choice is a string or an object: an object missing its function is told so, not "should be 'none',
    'auto' or 'required'" (the string member's complaint)."""
    body = {"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function"}}
    response = httpx.post(f"{server[0]}/v1/chat/completions", json=body, timeout=TIMEOUT)
    error = response.json()["error"]
    assert response.status_code == 422 and error["param"] == "tool_choice"
    assert error["message"] == "tool_choice.function: Field required"


def test_reading_bodies_and_answering_errors_needs_no_scheduler():
    """bodies.py and errors.py take their messages from errors.py, not from the batching scheduler (torch's)."""
    import subprocess
    import sys

    code = ("import sys, attnkit.serve.bodies, attnkit.serve.errors; "
            "print('attnkit.serve.batching' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
