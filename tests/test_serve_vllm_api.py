"""The API surface engineers bring from vLLM and llama.cpp's server, driven as users drive it: the official openai
client (vLLM's own fields through `extra_body`), httpx where the client has no method (/tokenize, /detokenize, CORS,
/metrics), and LangChain's ChatOpenAI where it is installed."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is in the dev extras")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

import attnkit  # noqa: E402

TIMEOUT = 60
ORIGIN = "http://app.example"
ALIASES = ("gpt-4o-mini", "local")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("vllm-api"), "decoder", sharpen=3.0)


@pytest.fixture(scope="module")
def server(run):
    with running_server(run, served_model_name=ALIASES, allowed_origins=(ORIGIN,), api_key="secret") as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="secret", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def pipeline(run):
    return attnkit.load(run, device="cpu")


def post(server: str, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(f"{server}{path}", json=body, timeout=TIMEOUT,
                      headers={"Authorization": "Bearer secret", **headers})


# Sampling ------------------------------------------------------------------------------------------------------------
def test_repetition_penalty_and_min_p_answer_as_the_library_and_penalties_change_the_reply(client, pipeline):
    answer = client.completions.create(model="local", prompt="the cat", max_tokens=12, temperature=0.8, seed=3,
                                       extra_body={"repetition_penalty": 1.5})
    assert answer.choices[0].text == pipeline.generate("the cat", max_new_tokens=12, temperature=0.8, seed=3,
                                                       repetition_penalty=1.5)[0]
    plain = client.completions.create(model="local", prompt="aaaa", max_tokens=12, temperature=0)
    penalised = client.completions.create(model="local", prompt="aaaa", max_tokens=12, temperature=0,
                                          presence_penalty=2.0, frequency_penalty=2.0)
    assert penalised.choices[0].text != plain.choices[0].text
    assert len(set(penalised.choices[0].text)) >= len(set(plain.choices[0].text))  # repeats made less likely
    kept = client.completions.create(model="local", prompt="the cat", max_tokens=12, temperature=1.0, seed=4,
                                     extra_body={"min_p": 1.0})  # only the likeliest token stays: greedy
    assert kept.choices[0].text == pipeline.generate("the cat", max_new_tokens=12, temperature=0)[0]


def test_stop_token_ids_min_tokens_and_ignore_eos(client, pipeline):
    first = pipeline.tokenizer.encode(pipeline.generate("the cat", max_new_tokens=1, temperature=0)[0])[0]
    stopped = client.completions.create(model="local", prompt="the cat", max_tokens=10, temperature=0,
                                        extra_body={"stop_token_ids": [first]})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 0
    held = client.completions.create(model="local", prompt="the cat", max_tokens=10, temperature=0,
                                     extra_body={"stop_token_ids": [first], "min_tokens": 3})
    assert held.usage.completion_tokens >= 3
    eos = pipeline.tokenizer.eos_id
    forced = {"logit_bias": {str(eos): 100}}  # the reply would end at once
    ends = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                          temperature=0, **forced)
    assert ends.choices[0].finish_reason == "stop" and ends.usage.completion_tokens == 0
    goes_on = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=5, temperature=0, **forced, extra_body={"ignore_eos": True})
    assert goes_on.choices[0].finish_reason == "length" and goes_on.usage.completion_tokens == 5


@pytest.mark.parametrize("off", [0, -1])
def test_top_k_of_0_or_minus_1_is_every_token_as_vllm_and_llama_cpp_take_it(client, pipeline, off):
    answer = client.completions.create(model="local", prompt="the cat", max_tokens=12, temperature=0.8, seed=3,
                                       extra_body={"top_k": off})
    assert answer.choices[0].text == pipeline.generate("the cat", max_new_tokens=12, temperature=0.8, seed=3)[0]
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="local", prompt="ab", max_tokens=4, extra_body={"top_k": -2})
    assert refused.value.body["param"] == "top_k" and "-1" in refused.value.body["message"]


@pytest.mark.parametrize("field, value", [("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("min_p", 1.5),
                                          ("repetition_penalty", 0.0), ("stop_token_ids", [10**6]), ("min_tokens", 9)])
def test_each_refused_sampling_value_is_a_400_naming_it(client, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="local", prompt="ab", max_tokens=4, extra_body={field: value})
    assert refused.value.body["param"] == field and field in refused.value.body["message"]


@pytest.mark.parametrize("stop", ["x" * 1001, ["ab", "y" * 5000]], ids=["one", "in-a-list"])
def test_a_stop_string_longer_than_the_server_takes_is_a_400_naming_stop(server, stop):
    """A stop string holds back that much of a stream's text (it might be the stop's start) and a longer one than
    any reply could hold is never met: one of more than 1,000 characters is refused, naming the field and the limit."""
    answer = post(server, "/v1/completions", {"prompt": "ab", "max_tokens": 2, "stop": stop})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "stop" and "1000" in error["message"], error


def test_a_chats_max_completion_tokens_beyond_the_context_is_refused_by_its_own_name(server):
    answer = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                   "max_completion_tokens": 10**9})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "max_completion_tokens", error
    assert error["message"].startswith("max_completion_tokens=1000000000 is more than")


# Streaming usage ------------------------------------------------------------------------------------------------------
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk_and_stream_options_need_a_stream(server, client):
    """vLLM's stream_options.continuous_usage_stats was refused as a field this server does not take: with
    include_usage, every chunk carries the usage so far of its one choice, as vLLM counts it (its prompt's tokens
    and its own; they were the request's prompts and choices counted together), and the last the whole request's;
    with include_usage alone, each chunk's usage is null (it was left out) but the last's; and stream_options beside
    no stream, which OpenAI and vLLM refuse, was taken and dropped: it is a 400 naming it."""
    for n in (1, 2):
        *chunks, last = client.completions.create(
            model="local", prompt=["the cat", "a"], max_tokens=5, n=n, temperature=1.0, seed=1, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True})
        assert not last.choices and (last.usage.prompt_tokens, last.usage.completion_tokens) == (7 + 1, 2 * 5 * n)
        counted: dict[int, list[int]] = {}
        for chunk in chunks:
            (choice,) = chunk.choices  # a chunk per choice, as vLLM sends them
            usage = chunk.usage
            assert usage.prompt_tokens == (7 if choice.index < n else 1)  # its own prompt's
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            counted.setdefault(choice.index, []).append(usage.completion_tokens)
        assert sorted(counted) == list(range(2 * n))
        assert all(counts == sorted(counts) and counts[-1] == 5 for counts in counted.values()), counted
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "n": 2, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=TIMEOUT,
                      headers={"Authorization": "Bearer secret"}, json=body) as raw:
        *chunks, last = [json.loads(line[6:]) for line in raw.iter_lines() if line.startswith("data: {")]
    roles = [chunk for chunk in chunks if chunk["choices"][0]["delta"].get("role")]
    assert [(len(c["choices"]), c["choices"][0]["index"], c["usage"]["completion_tokens"]) for c in roles] == [
        (1, 0, 0), (1, 1, 0)]  # the role, a chunk per choice, no token yet
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {last["usage"]["prompt_tokens"]}  # one prompt
    assert max(c["usage"]["completion_tokens"] for c in chunks) == 3 and last["usage"]["completion_tokens"] == 6
    plain = list(client.completions.create(model="local", prompt="the cat", max_tokens=3, stream=True,
                                           stream_options={"include_usage": True}))
    assert [chunk.usage is None for chunk in plain] == [True] * (len(plain) - 1) + [False]  # the last alone
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=TIMEOUT, headers={
            "Authorization": "Bearer secret"}, json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 3,
                                                     "stream": True, "stream_options": {"include_usage": True}}) as raw:
        chunks = [json.loads(line[6:]) for line in raw.iter_lines() if line.startswith("data: {")]
    assert all("usage" in chunk for chunk in chunks)  # null before the last, as OpenAI's stream writes it
    assert [chunk["usage"] is None for chunk in chunks] == [True] * (len(chunks) - 1) + [False]
    for create, settings in ((client.completions.create, {"prompt": "a"}),
                             (client.chat.completions.create, {"messages": [{"role": "user", "content": "a"}]})):
        with pytest.raises(openai.BadRequestError) as refused:
            create(model="local", max_tokens=2, stream_options={"include_usage": True}, **settings)
        assert refused.value.body["param"] == "stream_options" and "stream: true" in refused.value.body["message"]


def test_continuous_usage_counts_the_tokens_of_the_chunks_sent_so_far(client, monkeypatch):
    """Each chunk's usage read the scheduler's count of tokens as the chunk was written, so a chunk written while the
    scheduler ran ahead counted tokens whose text came in later chunks (the 8th piece said 9 tokens, the 9th 11): a
    chunk counts the tokens up to its own piece, here the tokens its and the earlier chunks' log-probabilities name
    (the event loop made slow, so that the scheduler runs ahead of it)."""
    from attnkit.serve.answer import Answer

    delta = Answer._delta
    monkeypatch.setattr(Answer, "_delta", lambda *args, **kwargs: time.sleep(0.02) or delta(*args, **kwargs))
    chunks = list(client.completions.create(
        model="local", prompt="the cat", max_tokens=12, temperature=1.0, seed=1, logprobs=1, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True}))
    sent, counted = 0, []
    for chunk in chunks[:-1]:
        sent += len(chunk.choices[0].logprobs.tokens) if chunk.choices[0].logprobs else 0
        counted.append((chunk.usage.completion_tokens, sent))
    assert all(usage == tokens for usage, tokens in counted), counted
    assert counted[-1] == (12, 12) and chunks[-1].usage.completion_tokens == 12


# Tokenize, models, CORS, request ids, metrics -------------------------------------------------------------------------
def test_tokenize_and_detokenize_as_vllm_shapes_them(server, client, pipeline):
    answer = post(server, "/tokenize", {"model": "gpt-4o-mini", "prompt": "the cat", "return_token_strs": True})
    assert answer.status_code == 200, answer.text
    shaped = answer.json()
    assert shaped["tokens"] == pipeline.tokenizer.encode("the cat") and shaped["count"] == len(shaped["tokens"])
    assert shaped["max_model_len"] == pipeline.config.max_seq_len
    assert "".join(shaped["token_strs"]) == "the cat"
    assert post(server, "/tokenize", {"prompt": ""}).json()["tokens"] == [pipeline.tokenizer.bos_id]
    assert post(server, "/tokenize", {"prompt": "", "add_special_tokens": False}).json()["tokens"] == []
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = post(server, "/tokenize", {"messages": messages}).json()
    reply = client.chat.completions.create(model="local", messages=messages, max_tokens=2, temperature=0)
    assert chat["count"] == reply.usage.prompt_tokens  # the tokens chat feeds the model
    assert chat["tokens"] == pipeline.prompt_ids("System: be brief\nUser: hi\nAssistant:", index=0)
    bare = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert bare["tokens"] == pipeline.prompt_ids("System: be brief\nUser: hi", index=0)
    back = post(server, "/detokenize", {"model": "local", "tokens": shaped["tokens"]})
    assert back.json() == {"prompt": "the cat"}
    refused = post(server, "/detokenize", {"tokens": [10**6]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"
    both = post(server, "/tokenize", {"prompt": "a", "messages": messages})
    assert both.status_code == 400 and "either prompt" in both.json()["error"]["message"]
    assert post(server, "/tokenize", {"prompt": "a", "tools": []}).status_code == 200
    assert post(server, "/tokenize", {"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}
                ).json()["error"]["param"] == "tools"
    assert post(server, "/tokenize", {"prompt": "a", "model": "other"}).status_code == 404


def test_served_model_names_are_aliases_and_models_give_the_context(client, pipeline, run):
    cards = client.models.list().data
    assert [card.id for card in cards] == list(ALIASES)
    assert all(card.max_model_len == pipeline.config.max_seq_len and card.root == run.name for card in cards)
    answer = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert answer.model == "gpt-4o-mini"  # answers carry the first name, as vLLM's
    assert client.models.retrieve("local").id == "local"
    with pytest.raises(openai.NotFoundError, match="also named 'local'"):
        client.completions.create(model=run.name, prompt="ab", max_tokens=2)


def test_cors_preflight_is_answered_before_the_key_and_request_ids_are_echoed_or_made(server, caplog):
    preflight = httpx.options(f"{server}/v1/completions", timeout=TIMEOUT, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(f"{server}/v1/completions", timeout=TIMEOUT, headers={
        "Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers
    unauthorised = httpx.post(f"{server}/v1/completions", json={"prompt": "a"}, timeout=TIMEOUT,
                              headers={"Origin": ORIGIN})
    assert unauthorised.status_code == 401 and unauthorised.headers["access-control-allow-origin"] == ORIGIN
    with caplog.at_level("INFO", logger="attnkit.serve"):
        echoed = post(server, "/v1/completions", {"prompt": "ab", "max_tokens": 2}, **{"X-Request-Id": "trace-42"})
        made = post(server, "/v1/completions", {"prompt": "ab", "max_tokens": 2})
        assert echoed.headers["x-request-id"] == "trace-42"
        assert len(made.headers["x-request-id"]) == 32 and made.headers["x-request-id"] != "trace-42"
        # a request's line is logged once its answer has gone out, so it may follow the client's read by a moment
        for request_id in ("trace-42", made.headers["x-request-id"]):
            assert _logged(caplog, f"request {request_id}"), f"no log line names request {request_id}"


def _logged(caplog, text: str, within: float = 10.0) -> bool:
    """Whether a captured log line holds `text`, waiting up to `within` seconds for the server's thread to write it."""
    deadline = time.monotonic() + within
    while not any(text in record.getMessage() for record in caplog.records):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def metrics_of(server: str) -> dict[str, float]:
    """/metrics as {sample name with its labels: value}."""
    text = httpx.get(f"{server}/metrics", timeout=TIMEOUT, headers={"Authorization": "Bearer secret"}).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_metrics_time_each_generation_request_as_prometheus_histograms(server, client):
    before = metrics_of(server)
    usages = [client.completions.create(model="local", prompt="the cat", max_tokens=6, temperature=0).usage,
              client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, temperature=0).usage]
    streamed = client.completions.create(model="local", prompt="a dog", max_tokens=5, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    usages.append([chunk for chunk in streamed][-1].usage)
    after = metrics_of(server)
    added = {name: after[name] - before.get(name, 0.0) for name in after}
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        buckets = [value for key, value in after.items() if key.startswith(f"attnkit_{name}_bucket")]
        assert buckets == sorted(buckets) and buckets[-1] == after[f"attnkit_{name}_count"]  # cumulative, +Inf last
        assert added[f'attnkit_{name}_bucket{{le="+Inf"}}'] == 3
    assert added["attnkit_time_to_first_token_seconds_sum"] <= added["attnkit_e2e_request_latency_seconds_sum"]
    assert added["attnkit_prompt_tokens_total"] == sum(usage.prompt_tokens for usage in usages)
    assert added["attnkit_generated_tokens_total"] >= sum(usage.completion_tokens for usage in usages)
    assert after["attnkit_num_requests_running"] == 0 and after["attnkit_num_requests_waiting"] == 0
    assert after["attnkit_kv_cache_usage_ratio"] == 0  # nothing runs now
    assert added["attnkit_prefix_cache_queries_total"] == sum(usage.prompt_tokens for usage in usages)
    # three requests one after another: a prefill each, and an iteration of one row per token chosen
    assert added["attnkit_prefills_total"] == 3
    assert added["attnkit_scheduler_rows_total"] == added["attnkit_scheduler_iterations_total"] \
        == added["attnkit_generated_tokens_total"]
    assert added["attnkit_scheduler_iteration_seconds_total"] > 0


@pytest.mark.parametrize("scrapes", [(2.0, 4.0, 12.0), (15.0, 30.0), (60.0,)])
def test_tokens_per_second_is_the_rate_since_the_last_scrape_at_10_s_or_more_before(monkeypatch, scrapes):
    """Scraped every 2 s, the rate over the last 10 s; every 15 s (Prometheus's usual interval) or once a minute, the
    rate since the scrape before (the first: since the server started), never 0 while tokens flow."""
    from types import SimpleNamespace

    from attnkit.serve import metrics

    now = [100.0]
    monkeypatch.setattr(metrics, "time", SimpleNamespace(monotonic=lambda: now[0]))  # metrics' clock alone
    counted = metrics.Metrics()  # the server starts at 100 s; it makes 20 tokens a second
    rates = []
    for at in scrapes:
        now[0] = 100.0 + at
        rates.append(counted.tokens_per_second(int(20 * at)))
    assert rates == [20.0] * len(scrapes)


def test_a_histogram_counts_each_value_in_the_first_bucket_that_holds_it():
    from attnkit.serve.metrics import Histogram

    histogram = Histogram("x_seconds", "x", buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    lines = histogram.lines()
    assert 'attnkit_x_seconds_bucket{le="0.1"} 2' in lines and 'attnkit_x_seconds_bucket{le="1"} 3' in lines
    assert 'attnkit_x_seconds_bucket{le="+Inf"} 4' in lines and "attnkit_x_seconds_sum 3.65" in lines
    assert "attnkit_x_seconds_count 4" in lines and "# TYPE attnkit_x_seconds histogram" in lines


def test_a_langchain_chatopenai_round_trip_answers_as_the_openai_client(server, client):
    langchain_openai = pytest.importorskip("langchain_openai", reason="LangChain's OpenAI chat model is not installed "
                                           "(pip install langchain-openai)")
    chat = langchain_openai.ChatOpenAI(base_url=f"{server}/v1", api_key="secret", model="gpt-4o-mini",
                                       temperature=0, max_tokens=6, timeout=TIMEOUT, max_retries=0)
    reply = chat.invoke([("system", "be brief"), ("human", "hi")])
    expected = client.chat.completions.create(model="gpt-4o-mini", max_tokens=6, temperature=0, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert reply.content == expected.choices[0].message.content
    assert reply.response_metadata["model_name"] == "gpt-4o-mini"
