"""The OpenAI API as the official `openai` client calls it, with its default arguments, against `attnkit serve` on
127.0.0.1: base64 embeddings, logprobs and top_logprobs (whole and streamed, held to the model's own log-softmax
computed here), echo, prompts of token ids, content parts, models.retrieve, usage as OpenAI counts it, logit_bias."""

from __future__ import annotations

import base64
import struct

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is in the dev extras")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402
from serve_helpers import running_server, tiny_run  # noqa: E402

import attnkit  # noqa: E402

TIMEOUT = 60  # seconds any one request may take in these tests
STOPS = ["\nUser:", "\nSystem:"]  # the default chat template's


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-openai-runs")
    return {"lm": tiny_run(root, "decoder", sharpen=3.0), "encoder": tiny_run(root, "encoder", n_classes=2)}


@pytest.fixture(scope="module")
def client(runs):
    with running_server(runs["lm"]) as (url, _app):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def pipeline(runs):
    return attnkit.load(runs["lm"], device="cpu")


def direct_logprobs(pipeline, prompt_ids: list[int], new_ids: list[int]) -> torch.Tensor:
    """(len(new_ids), V): the log-softmax of the model's logits before each new token, by one forward pass."""
    ids = torch.tensor([prompt_ids + new_ids])
    with torch.inference_mode():
        logits = pipeline.model(ids).logits[0].float()  # (T, V)
    return logits.log_softmax(dim=-1)[len(prompt_ids) - 1 : -1]


def ids_of(pipeline, pieces: list[str]) -> list[int]:
    """Each reported token's id (the char tokenizer: one character, one id)."""
    return [pipeline.tokenizer.encode(piece)[0] for piece in pieces]


def test_embeddings_with_the_clients_default_base64_equal_the_floats(runs):
    with running_server(runs["encoder"]) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        texts = ["a cat", "zzz"]
        default = client.embeddings.create(model="encoder", input=texts)  # sends encoding_format="base64"
        floats = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "encoding_format": "float"},
                            timeout=TIMEOUT).json()
        raw = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "encoding_format": "base64"},
                         timeout=TIMEOUT).json()
    expected = [row["embedding"] for row in floats["data"]]
    assert [row.embedding for row in default.data] == expected  # float32 both ways: equal to the bit
    packed = base64.b64decode(raw["data"][1]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == expected[1] and len(expected[1]) == 32
    assert expected[0] != expected[1]


def test_completion_logprobs_are_the_models_log_softmax_whole_and_streamed(client, pipeline):
    prompt = "the cat"
    answer = client.completions.create(model="decoder", prompt=prompt, max_tokens=8, temperature=0.9, seed=4,
                                       logprobs=3)
    choice = answer.choices[0]
    tokens = ids_of(pipeline, choice.logprobs.tokens)
    assert pipeline.tokenizer.decode(tokens) == choice.text and len(tokens) == answer.usage.completion_tokens
    expected = direct_logprobs(pipeline, pipeline.tokenizer.encode(prompt), tokens)
    picked = expected.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(choice.logprobs.token_logprobs), picked, atol=1e-4, rtol=1e-4)
    for position, top in enumerate(choice.logprobs.top_logprobs):
        values, ids = expected[position].topk(3)
        assert list(top) == [pipeline.tokenizer.decode([i], skip_special=False) for i in ids.tolist()]
        assert list(top.values()) == pytest.approx(values.tolist(), abs=1e-4)
    assert choice.logprobs.text_offset == list(range(len(tokens)))
    stream = client.completions.create(model="decoder", prompt=prompt, max_tokens=8, temperature=0.9, seed=4,
                                       logprobs=3, stream=True)
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in stream:
        for part in chunk.choices:
            for key in streamed:
                streamed[key] += getattr(part.logprobs, key) if part.logprobs else []
    assert streamed["tokens"] == choice.logprobs.tokens
    assert streamed["token_logprobs"] == pytest.approx(choice.logprobs.token_logprobs, abs=1e-6)
    assert streamed["text_offset"] == choice.logprobs.text_offset


def test_chat_logprobs_and_top_logprobs_whole_and_streamed(client, pipeline):
    messages = [{"role": "user", "content": "hi"}]
    answer = client.chat.completions.create(model="decoder", messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content
    tokens = ids_of(pipeline, [entry.token for entry in content])
    prompt_ids = pipeline.tokenizer.encode("User: hi\nAssistant:")
    expected = direct_logprobs(pipeline, prompt_ids, tokens)
    assert pipeline.tokenizer.decode(tokens) == answer.choices[0].message.content
    assert tokens == expected.argmax(dim=-1).tolist()  # greedy: each token the likeliest
    for position, entry in enumerate(content):
        assert entry.logprob == pytest.approx(expected[position].max().item(), abs=1e-4)
        assert [alt.logprob for alt in entry.top_logprobs] == pytest.approx(expected[position].topk(2).values.tolist(),
                                                                            abs=1e-4)
        assert entry.top_logprobs[0].token == entry.token and entry.bytes == list(entry.token.encode())
    stream = client.chat.completions.create(model="decoder", messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True)
    streamed = [entry for chunk in stream for part in chunk.choices if part.logprobs
                for entry in part.logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in content]
    plain = client.chat.completions.create(model="decoder", messages=messages, max_tokens=2)
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="decoder", messages=messages, top_logprobs=2)
    assert refused.value.body["param"] == "top_logprobs"


def test_echo_puts_the_prompt_and_its_scores_first(client, pipeline):
    prompt = "a dog sat"
    answer = client.completions.create(model="decoder", prompt=prompt, max_tokens=5, temperature=0, echo=True,
                                       logprobs=1)
    alone = client.completions.create(model="decoder", prompt=prompt, max_tokens=5, temperature=0)
    choice = answer.choices[0]
    assert choice.text == prompt + alone.choices[0].text
    scores = choice.logprobs
    prompt_ids = pipeline.tokenizer.encode(prompt)
    assert scores.token_logprobs[0] is None and scores.top_logprobs[0] is None
    assert "".join(scores.tokens) == choice.text and scores.text_offset == list(range(len(choice.text)))
    whole = direct_logprobs(pipeline, prompt_ids[:1], ids_of(pipeline, scores.tokens[1:]))
    picked = whole.gather(-1, torch.tensor(ids_of(pipeline, scores.tokens[1:]))[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(scores.token_logprobs[1:]), picked, atol=1e-4, rtol=1e-4)
    echoed = "".join(c.text for chunk in client.completions.create(model="decoder", prompt=prompt, max_tokens=5,
                                                                    temperature=0, echo=True, stream=True)
                     for c in chunk.choices)
    assert echoed == choice.text


def test_a_request_the_context_cannot_hold_carries_openais_context_length_exceeded_code(client):
    """OpenAI answers a request beyond the context with the code "context_length_exceeded", which clients (LiteLLM,
    LangChain) read to shorten the conversation and try again; the server gave no code."""
    user = [{"role": "user", "content": "a" * 200}]
    requests = [(client.completions.create, {"prompt": "a" * 200}, "prompt"),
                (client.completions.create, {"prompt": "a" * 100_000}, "prompt"),  # refused from its head
                (client.chat.completions.create, {"messages": user}, "messages"),
                (client.completions.create, {"prompt": "a" * 60, "max_tokens": 90}, "max_tokens")]
    for create, fields, param in requests:
        with pytest.raises(openai.BadRequestError) as refused:
            create(model="decoder", **{"max_tokens": 4, **fields})
        assert refused.value.body["code"] == "context_length_exceeded" and refused.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as other:  # a refusal of another kind carries no such code
        client.completions.create(model="decoder", prompt="a", max_tokens=4, temperature=5)
    assert other.value.body["code"] is None


def test_a_streamed_request_of_several_prompts_sends_each_prompts_pieces_as_they_come(client):
    """A streamed request of several prompts sent the second prompt's pieces only once the first had ended, though
    both were generated together; its chunks now come as the tokens do, interleaved as vLLM streams them, each
    prompt's in order, and each prompt's text equals the whole answer's."""
    settings = {"model": "decoder", "prompt": ["the cat", "a dog"], "max_tokens": 12, "temperature": 0,
                "extra_body": {"ignore_eos": True}}
    order, texts = [], {0: "", 1: ""}
    for chunk in client.completions.create(stream=True, **settings):
        for choice in chunk.choices:
            order.append((choice.index, choice.finish_reason))
            texts[choice.index] += choice.text
    first_of_second = order.index(next(entry for entry in order if entry[0] == 1))
    assert first_of_second < order.index((0, "length"))  # the second prompt's first piece before the first's end
    whole = client.completions.create(**settings)
    assert [choice.text for choice in whole.choices] == [texts[0], texts[1]]
    assert [choice.finish_reason for choice in whole.choices] == ["length", "length"]


def test_prompts_of_token_ids_content_parts_usage_and_models_retrieve(client, pipeline):
    ids = pipeline.tokenizer.encode("the cat")
    by_text = client.completions.create(model="decoder", prompt="the cat", max_tokens=6, seed=2, n=3)
    by_ids = client.completions.create(model="decoder", prompt=ids, max_tokens=6, seed=2, n=3, logprobs=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert by_ids.usage.prompt_tokens == len(ids)  # the prompt once, though three choices continue it
    assert by_ids.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in by_ids.choices)  # every choice's
    lists = client.completions.create(model="decoder", prompt=[ids, ids[:3]], max_tokens=4, temperature=0)
    assert [c.text for c in lists.choices] == pipeline.generate(["the cat", "the"], max_new_tokens=4, temperature=0)
    assert lists.usage.prompt_tokens == len(ids) + 3
    parts = [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]
    by_parts = client.chat.completions.create(model="decoder", max_tokens=6, temperature=0,
                                              messages=[{"role": "user", "content": parts}])
    expected = pipeline.generate("User: be\nbrief\nAssistant:", max_new_tokens=6, temperature=0, stop=STOPS)[0]
    assert by_parts.choices[0].message.content == expected
    with pytest.raises(openai.BadRequestError) as image:
        client.chat.completions.create(model="decoder", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert image.value.body["param"] == "messages"
    assert client.models.retrieve("decoder").id == "decoder"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_logit_bias_bans_and_forces_tokens(client, pipeline):
    greedy = client.completions.create(model="decoder", prompt="the cat", max_tokens=8, temperature=0).choices[0].text
    banned = {str(i): -100 for i in set(pipeline.tokenizer.encode(greedy))}
    without = client.completions.create(model="decoder", prompt="the cat", max_tokens=8, temperature=0,
                                        logit_bias=banned).choices[0].text
    assert without and not set(without) & set(greedy)
    forced_id = pipeline.tokenizer.encode("q")[0]
    forced = client.completions.create(model="decoder", prompt="the cat", max_tokens=6, temperature=0.8, seed=1,
                                       logit_bias={str(forced_id): 100}).choices[0].text
    assert forced == "q" * 6
    library = pipeline.generate("the cat", max_new_tokens=8, temperature=0.8, seed=3, logit_bias={forced_id: 5})[0]
    served = client.completions.create(model="decoder", prompt="the cat", max_tokens=8, temperature=0.8, seed=3,
                                       logit_bias={str(forced_id): 5}).choices[0].text
    assert served == library


def test_embeddings_of_token_ids_equal_those_of_their_text(runs):
    encoder = attnkit.load(runs["encoder"], device="cpu")
    texts = ["a cat", "the dog sat"]
    ids = [encoder.tokenizer.encode(text) for text in texts]
    with running_server(runs["encoder"]) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        by_text = client.embeddings.create(model="encoder", input=texts, encoding_format="float")
        by_ids = client.embeddings.create(model="encoder", input=ids, encoding_format="float")
        one = client.embeddings.create(model="encoder", input=ids[0], encoding_format="float")
        for bad, words in (([1, -2], "the token id at [1] is -2"), ([[1], []], "[1] is an empty list"),
                           ([10_000], "beyond the vocabulary")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.embeddings.create(model="encoder", input=bad, encoding_format="float")
            assert refused.value.body["param"] == "input" and words in refused.value.body["message"]
    for text, token in zip(by_text.data, by_ids.data, strict=True):
        assert token.embedding == pytest.approx(text.embedding, abs=1e-6)
    assert one.data[0].embedding == pytest.approx(by_text.data[0].embedding, abs=1e-6)
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens


def test_a_stop_string_across_two_tokens_ends_the_text_before_it_whole_and_streamed(tmp_path):
    """A byte-level BPE writes tokens of several characters; a stop string made of the end of one and the start of
    the next ends the text just before it, whole and streamed (no chunk shows any of it), and the usage counts the
    tokens generated up to the one that completed it, as each request's own free reply says."""
    run = tiny_run(tmp_path, "decoder", tokenizer="bpe", sharpen=3.0)
    checked = 0
    with running_server(run) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        for seed in range(12):
            settings = {"model": "decoder", "prompt": "the cat", "max_tokens": 30, "temperature": 0.8, "seed": seed}
            free = client.completions.create(**settings, logprobs=0).choices[0]
            tokens, text = free.logprobs.tokens, free.text
            if "".join(tokens) != text:  # a character split over tokens: offsets are not the tokens' lengths
                continue
            ends = [len("".join(tokens[: k + 1])) for k in range(len(tokens))]  # where each token's text ends
            for k in range(len(tokens) - 1):
                stop = text[ends[k] - 1 : ends[k] + 1]  # token k's last character and token k + 1's first
                if tokens[k] and tokens[k + 1] and text.find(stop) == ends[k] - 1:
                    break
            else:
                continue
            whole = client.completions.create(**settings, stop=[stop])
            chunks = [chunk.choices[0] for chunk in client.completions.create(
                **settings, stop=[stop], stream=True, stream_options={"include_usage": True}) if chunk.choices]
            streamed = "".join(choice.text for choice in chunks)
            assert whole.choices[0].text == streamed == text[: ends[k] - 1]
            assert whole.choices[0].finish_reason == chunks[-1].finish_reason == "stop"
            assert whole.usage.completion_tokens == k + 2  # up to token k + 1, which completed the stop string
            checked += 1
    assert checked >= 3, "too few replies had a stop string to try across two tokens"
