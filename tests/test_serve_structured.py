"""Structured output in the server: the batching scheduler masks each constrained request's rows beside free ones in
one step (each gets what it gets alone), and the HTTP API's response_format and tools give text that parses and
validates, streamed and not, with tool calls in OpenAI's shape."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("llguidance", reason="structured output needs the structured extra: pip install "
                    "'attnkit[structured]'")
jsonschema = pytest.importorskip("jsonschema")

from generate_models import tiny_model  # noqa: E402
from test_generate_constrained import BOUND_TOKENS, BOUNDED, JSON_CHARS, SMALL  # noqa: E402
from test_serve_batching import Recorded, drain  # noqa: E402

from attnkit.generate import GREEDY, SamplingConfig, generate_tokens, make_generator  # noqa: E402
from attnkit.generate.constrained import Grammar, GrammarMask  # noqa: E402
from attnkit.serve.batching import Scheduler  # noqa: E402
from attnkit.tokenize import CharTokenizer  # noqa: E402

TOKENIZER = CharTokenizer(JSON_CHARS)
CONTEXT = 96


def test_constrained_and_free_requests_share_steps_and_each_gets_its_own():
    model = tiny_model(vocab_size=TOKENIZER.vocab_size, max_seq_len=CONTEXT, **SMALL)[0]
    eos = frozenset({TOKENIZER.eos_id})
    requests = [  # (prompt, sampling, n, schema or None)
        ("a", GREEDY, 1, None),
        ("person:", SamplingConfig(temperature=1.0), 2, BOUNDED),
        ("b", SamplingConfig(temperature=0.8), 1, None),
        ("x", GREEDY, 1, {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 3}),
    ]
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=TOKENIZER.pad_id, max_rows=8)
    recorded = []
    for seed, (prompt, sampling, n, schema) in enumerate(requests):
        job = Recorded(TOKENIZER.encode(prompt), BOUND_TOKENS, sampling=sampling, seed=seed, n=n, stop_ids=eos)
        job.job.grammar = GrammarMask.of(Grammar.json_schema(schema), TOKENIZER, n) if schema else None
        scheduler.submit(job.job)
        recorded.append(job)
    drain(scheduler)
    assert scheduler.steps < sum(len(t) for job in recorded for t in job.tokens)  # the requests shared steps
    for job, (_, sampling, n, schema) in zip(recorded, requests, strict=True):
        grammar = GrammarMask.of(Grammar.json_schema(schema), TOKENIZER, n) if schema else None
        alone = generate_tokens(model, [job.job.prompt] * n, max_new_tokens=BOUND_TOKENS, context_len=CONTEXT,
                                sampling=sampling, generator=make_generator(job.job.seed, "cpu"), stop_ids=eos,
                                grammar=grammar)
        assert job.tokens == alone
        if schema is not None:
            assert job.reasons == ["stop"] * n
            for tokens in job.tokens:
                jsonschema.validate(json.loads(TOKENIZER.decode(tokens)), schema)


def test_a_request_whose_grammar_gets_stuck_fails_alone():
    no_z = CharTokenizer('{}"abc')
    model = tiny_model(vocab_size=no_z.vocab_size, max_seq_len=CONTEXT, **SMALL)[0]
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=no_z.pad_id, max_rows=4)
    stuck = Recorded(no_z.encode("a"), 8, seed=1)
    stuck.job.grammar = GrammarMask.of(Grammar.json_schema({"enum": ["zz"]}), no_z, 1)
    free = Recorded(no_z.encode("b"), 8, seed=2)
    for job in (stuck, free):
        scheduler.submit(job.job)
    with torch.inference_mode():
        drain(scheduler)
    assert stuck.reasons == ["error"] and "cannot go on" in str(stuck.job.failure)
    assert free.reasons == ["length"] and len(free.tokens[0]) == 8
