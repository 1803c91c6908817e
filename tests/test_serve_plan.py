"""`attnkit serve` loads its run as `attnkit generate` does, through the same inference plan: int8 and int4 weights,
another weight type, and a decoding step captured ahead of time each start, answer the official client with the
tokens the library gives under the same options, and are said by --explain."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is in the dev extras")

from serve_helpers import running_server, tiny_run  # noqa: E402

import attnkit  # noqa: E402
from attnkit.machine import CpuCapabilities  # noqa: E402

TIMEOUT = 120  # seconds any one request may take in these tests
OPTIONS = {  # serve's options -> (attnkit.load's keywords, what the plan says)
    "int8": (dict(int8=True), dict(quantize="int8"), "int8"),
    "int4": (dict(int4=True), dict(quantize="int4"), "int4"),
    "bf16": (dict(dtype="bf16"), dict(dtype="bf16"), "inference plan for bf16"),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("serve-plan-runs"), "decoder", sharpen=3.0)


def served_and_alone(run, serve_options: dict, load_options: dict, caplog) -> tuple[list[str], list[str], str]:
    """Greedy completions of two prompts sent together from the server started with `serve_options`, the same from
    `attnkit.load(run, **load_options)`, and the plan the server logged."""
    prompts = ["the cat", "a dog sat on"]
    with caplog.at_level(logging.INFO, logger="attnkit.serve"), running_server(
            run, explain=True, device="cpu", **serve_options) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        answer = client.completions.create(model="decoder", prompt=prompts, max_tokens=10, temperature=0)
    alone = attnkit.load(run, device="cpu", **load_options).generate(prompts, max_new_tokens=10, temperature=0)
    plans = [record.message for record in caplog.records if "inference plan for" in record.message]
    assert len(plans) == 1
    return [choice.text for choice in answer.choices], alone, plans[0]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_quantized_and_typed_serving_answers_as_the_library_loads_it(run, name, caplog):
    if name == "int4" and not CpuCapabilities.detect().int4_kernel:
        pytest.skip(f"PyTorch's CPU int4 kernel needs AVX2 or AVX-512; this CPU reports "
                    f"{CpuCapabilities.detect().isa} (the plan serves int8 weights instead)")
    serve_options, load_options, said = OPTIONS[name]
    served, alone, plan = served_and_alone(run, serve_options, load_options, caplog)
    assert served == alone and any(served)
    assert said in plan


@pytest.mark.slow  # a C++ compiler builds the captured step, torch.compile a graph per batch size: tens of seconds
@pytest.mark.parametrize("mode, said", [("aot", "captured ahead of time"), ("default", "decoding step, default")])
def test_serving_with_a_captured_or_compiled_step_answers_as_the_library(run, mode, said, caplog, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("ATTNKIT_COMPILED", str(tmp_path / "compiled"))
    served, alone, plan = served_and_alone(run, dict(compile=mode), dict(compile=mode), caplog)
    assert served == alone and any(served)
    assert said in plan
    if mode == "aot":
        forms = {path.stem.split("-", 2)[2] for path in (tmp_path / "compiled").glob("step-*.pt2")}
        assert forms == {"one-row", "rows"}  # both forms: one request's row alone, and two requests' rows together


@pytest.mark.parametrize("max_batch, forms", [(4, ["one-row", "rows"]), (1, ["one-row"])])
def test_aot_serving_builds_every_step_it_will_use_before_it_answers(run, max_batch, forms, caplog, tmp_path,
                                                                     monkeypatch):
    """The several-row step is built before the server answers, not at its first batched step (while every request
    in flight would wait); a server that never batches builds the one-row step alone. Capture is stood in for here
    (the slow test above captures for real)."""
    from attnkit.generate import captured_step

    monkeypatch.setenv("ATTNKIT_COMPILED", str(tmp_path / "compiled"))
    built = []
    monkeypatch.setattr(captured_step, "capture_step", lambda model, path, form: built.append(form))
    monkeypatch.setattr(captured_step, "load_step", lambda path, model: lambda inputs: pytest.fail("no step runs"))
    with caplog.at_level(logging.INFO, logger="attnkit"), running_server(
            run, compile="aot", device="cpu", max_batch=max_batch) as (_url, _app):
        assert built == forms  # before the first request
    progress = [record.getMessage() for record in caplog.records if "decoding step" in record.getMessage()]
    assert any(f"{len(forms)} of {len(forms)}" in message for message in progress), progress
