"""The serving benchmark's client (`benchmarks/bench_serve.load`, which `python -m benchmarks serve` and the GPU
benchmark run) against a live server: every request gives exactly the tokens asked for, and the scheduler's figures
it reads from /metrics are the load's own; against a server of one row its warm-up asks for no two choices."""

import asyncio

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

from benchmarks import bench_serve  # noqa: E402


@pytest.mark.parametrize("max_batch", [1, 4])
def test_the_load_counts_every_token_and_reads_the_schedulers_figures(tmp_path, max_batch):
    run = tiny_run(tmp_path, "decoder")
    with running_server(run, max_batch=max_batch) as (url, _app):
        result = asyncio.run(bench_serve.load(url, clients=3, requests=2, new_tokens=5, max_batch=max_batch))
    assert (result["requests"], result["tokens"]) == (6, 30)  # EOS ends none: every request is 5 tokens
    assert 1 <= result["mean_batch"] <= max_batch
    assert result["prefills"] >= (6 if max_batch == 1 else 1)
    assert result["ms_per_iteration"] > 0 and 0 < result["busy"] <= 1
