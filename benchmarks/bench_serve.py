"""Serving load: `attnkit serve` under 1, 8 and 32 concurrent clients, continuous batching against one request at
a time.

    python -m benchmarks.bench_serve [--requests 4] [--new-tokens 32] [--threads 1] [--rounds 1] [--quick]
    python -m benchmarks.bench_serve --forms [fp32 bf16 int8 int4 "compile aot"] [--requests 4] [--new-tokens 32]
                                     [--form-clients 1 8] [--name serve-forms-cpu]

The benchmark model is the `small` shape of bench_generate (6 layers, width 384, 6 heads; nanoGPT's
Shakespeare-char shape) with random weights and a character vocabulary, saved as a run and served (`attnkit
serve`, a process of its own) on 127.0.0.1 on a free port twice, side by side: with --max-batch 32 (batched) and
--max-batch 1 (one request at a time: each waits for the one before). The measurement is repeated `--rounds`
times, each round with two fresh servers, started and measured in the other order than the round before: of two
servers of the same mode, the one started first came out about 5% slower (the median over 12 runs, both ways
round, on the 2-core machine of the figures; runs made while this benchmark was written, not kept in a results
file), so a fixed order would favour one mode. Each of C clients (a small
asyncio client over httpx) sends `--requests` completions one after the other (a 24-character prompt, exactly
`--new-tokens` tokens sampled with a seed: `ignore_eos`, as vLLM's serving benchmark fixes its output lengths; where
EOS ended requests at random lengths (1,367 of 2,048 tokens), the clients whose requests ran short were done early
and the rest ran in a smaller batch: 8 clients kept a mean batch of 5.6 rows, against 7.7-7.8 with fixed lengths,
two rounds each on the 2-core machine of the figures); the rows report total tokens per second (every client's
tokens over the wall time), the p50/p99 latency of a whole request, and from the server's /metrics over the same
time its scheduler's mean batch, the mean time of an iteration (admission, choosing the tokens, a decoding step)
and its prefills; each ratio is the median of the rounds' own ratios. The target: at 8 clients,
batched >= 3x one at a time. Results go to benchmarks/results/serve-cpu.json (with the CPU and the machine's load
average before and after, since a loaded machine slows both modes) and a markdown table beside it.

With --forms, the batched server is measured at 1 and 8 clients (--form-clients) once per form the run is served in
(`FORMS`: as stored, --dtype bf16, --int8, --int4, --compile aot; the options `attnkit generate` takes, through the
same inference plan), one server at a time, each warmed up first with a request of one row and one of two (a captured
step captures its one-row and its several-row forms then, not while measured); with --rounds, the forms run in the
other order each round, so that a load that changes over the run does not favour the forms measured first. Results
go to benchmarks/results/serve-forms-cpu.json and .md (--name names another).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import load_averages, write_report

CLIENTS = (1, 8, 32)
FORMS = {"fp32": [], "bf16": ["--dtype", "bf16"], "int8": ["--int8"], "int4": ["--int4"],
         "compile aot": ["--compile", "aot"]}  # a form's name -> its options of `attnkit serve`
FORM_CLIENTS = (1, 8)
PROMPT = "to be or not to be, that "  # 24 characters


def make_run(root: Path, *, max_seq_len: int = 256) -> Path:
    from attnkit import ModelConfig, build_model
    from attnkit.checkpoint import save_model
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\n-")
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, n_layers=6, d_model=384, n_heads=6,
                         d_ff=1536, max_seq_len=max_seq_len, dropout=0.0)
    save_model(build_model(config).eval(), config, root / "small")
    tokenizer.save(root / "small" / "tokenizer")
    return root / "small"


class Server:
    """`attnkit serve RUN` in its own process on 127.0.0.1 on a free port (the clients' event loop stays out of
    its way), stopped at the end."""

    def __init__(self, run: Path, max_batch: int, threads: int, device: str = "cpu", options: list[str] = ()) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.command = [sys.executable, "-m", "attnkit", "serve", str(run), "--port", str(self.port),
                        "--device", device, "--max-batch", str(max_batch), "--max-queue", "256", *options]
        self.environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}

    def __enter__(self) -> str:
        import httpx

        self.process = subprocess.Popen(self.command, env=self.environment, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.2)
        self.process.kill()
        raise RuntimeError("attnkit serve did not start within 600 s")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


async def one_request(http, url: str, seed: int, new_tokens: int, n: int = 1) -> tuple[float, int]:
    """(seconds, tokens) of one completion (of `n` choices) of exactly `new_tokens` tokens (EOS does not end it)."""
    body = {"prompt": PROMPT, "max_tokens": new_tokens, "seed": seed, "n": n, "ignore_eos": True}
    start = time.perf_counter()
    response = await http.post(f"{url}/v1/completions", json=body)
    response.raise_for_status()
    return time.perf_counter() - start, response.json()["usage"]["completion_tokens"]


async def scheduler_counts(http, url: str) -> dict[str, float]:
    """The server's counters of its scheduler's work (GET /metrics, `serve/metrics.py`)."""
    text = (await http.get(f"{url}/metrics")).text
    return {name: float(value) for name, value in (line.split() for line in text.splitlines() if line.startswith(
        ("attnkit_scheduler_", "attnkit_prefills_total")))}


async def settled_counts(http, url: str) -> dict[str, float]:
    """`scheduler_counts` once two reads 10 ms apart agree: a reply's last token reaches its client before the
    scheduler adds that iteration's time, so a read just after a reply can miss it (at most half a second)."""
    counts = await scheduler_counts(http, url)
    for _ in range(50):
        await asyncio.sleep(0.01)
        again = await scheduler_counts(http, url)
        if again == counts:
            break
        counts = again
    return counts


async def load(url: str, clients: int, requests: int, new_tokens: int, *, max_batch: int = 32) -> dict:
    """`clients` clients sending `requests` completions each, one after the other, to a server of `max_batch`
    rows: tokens/s, latencies, and what the server's scheduler did meanwhile (its /metrics): the mean batch (rows a
    token was chosen for per iteration), an iteration's mean time, and the share of the time it was iterating."""
    import httpx

    async def client(index: int, http) -> list[tuple[float, int]]:
        return [await one_request(http, url, index * 1000 + r, new_tokens) for r in range(requests)]

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await one_request(http, url, 0, 4)  # warm-up: a step of one row,
        if max_batch > 2:
            await one_request(http, url, 0, 4, n=2)  # and of several (one request takes at most max_batch - 1 rows)
        before = await settled_counts(http, url)  # the warm-up's iterations all counted: the scheduler is idle
        start = time.perf_counter()
        results = await asyncio.gather(*(client(i, http) for i in range(clients)))
        wall = time.perf_counter() - start
        after = await settled_counts(http, url)
        counted = time.perf_counter() - start  # every iteration the counters hold began and ended within this
    done = {name: after[name] - before[name] for name in after}
    iterations, seconds = done["attnkit_scheduler_iterations_total"], done["attnkit_scheduler_iteration_seconds_total"]
    latencies = sorted(s for per_client in results for s, _ in per_client)
    tokens = sum(t for per_client in results for _, t in per_client)
    return {"clients": clients, "requests": len(latencies), "tokens": tokens, "seconds": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1), "p50_s": round(statistics.median(latencies), 3),
            "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
            "mean_batch": round(done["attnkit_scheduler_rows_total"] / iterations, 2),
            "ms_per_iteration": round(1000 * seconds / iterations, 3), "busy": round(seconds / counted, 3),
            "prefills": int(done["attnkit_prefills_total"])}


def measure_forms(forms: list[str], args, cpu: str) -> int:
    """The batched server in each of `forms`, at `args.form_clients` clients (FORM_CLIENTS unless given):
    `args.name` (serve-forms-cpu unless given) .json and .md."""
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        run = make_run(Path(root))
        for index in range(args.rounds):
            for form in forms if index % 2 == 0 else forms[::-1]:
                started = time.perf_counter()
                with Server(run, 32, args.threads, options=FORMS[form]) as url:
                    start_s = round(time.perf_counter() - started, 1)
                    for clients in args.form_clients:
                        row = {"form": form, "round": index, "start_s": start_s,
                               **asyncio.run(load(url, clients, args.requests, args.new_tokens))}
                        print(row, flush=True)
                        rows.append(row)
    load_after = os.getloadavg()
    rows.sort(key=lambda r: (forms.index(r["form"]), r["clients"], r["round"]))
    lines = ["| form | round | clients | requests | tokens/s | p50 latency (s) | p99 latency (s) | server start (s) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['form']} | {r['round']} | {r['clients']} | {r['requests']} | {r['tokens_per_s']} | {r['p50_s']} | "
              f"{r['p99_s']} | {r['start_s']} |" for r in rows]
    lines += ["", f"CPU: {cpu}; server threads: {args.threads}; {args.requests} requests per client, up to "
              f"{args.new_tokens} new tokens each; {load_averages(load_before, load_after)}"]
    table = "\n".join(lines)
    print(table)
    write_report(args.name, {"args": vars(args), "cpu": cpu, "rows": rows, "load_average_before": load_before,
                                     "load_average_after": load_after}, table)
    return 0


def main(argv: list[str] | None = None) -> int:
    from attnkit.machine import CpuCapabilities

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_serve", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="requests per client, one after the other")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each request generates")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (OMP_NUM_THREADS)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of fresh servers, started and measured in alternating order")
    parser.add_argument("--quick", action="store_true", help="2 requests per client, 16 tokens (a smoke run)")
    parser.add_argument("--forms", nargs="*", choices=list(FORMS), default=None,
                        help="measure the batched server in these forms (none named: all) at --form-clients clients "
                             "instead")
    parser.add_argument("--form-clients", nargs="+", type=int, default=list(FORM_CLIENTS),
                        help="with --forms: the client counts to measure each form at")
    parser.add_argument("--name", default="serve-forms-cpu", help="with --forms: the results file's name")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.new_tokens = 2, 16
    cpu = CpuCapabilities.detect().summary()
    if args.forms is not None:
        return measure_forms(args.forms or list(FORMS), args, cpu)
    load_before = os.getloadavg()
    print(f"{cpu}; load average {load_before}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        run = make_run(Path(root))
        for index in range(args.rounds):
            modes = [("batched", 32), ("one at a time", 1)]
            modes = modes if index % 2 == 0 else modes[::-1]  # started, and measured, in this order
            with Server(run, modes[0][1], args.threads) as first, Server(run, modes[1][1], args.threads) as second:
                for clients in CLIENTS:
                    for (mode, max_batch), url in zip(modes, (first, second), strict=True):
                        row = {"mode": mode, "round": index,
                               **asyncio.run(load(url, clients, args.requests, args.new_tokens, max_batch=max_batch))}
                        print(row, flush=True)
                        rows.append(row)
    by = {(r["mode"], r["round"], r["clients"]): r["tokens_per_s"] for r in rows}
    ratios = {c: round(statistics.median(by[("batched", i, c)] / by[("one at a time", i, c)]
                                         for i in range(args.rounds)), 2) for c in CLIENTS}
    rows.sort(key=lambda r: (r["clients"], r["round"]))
    lines = ["| mode | round | clients | requests | tokens/s | p50 latency (s) | p99 latency (s) | mean batch | "
             "ms per iteration | prefills |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['round']} | {r['clients']} | {r['requests']} | {r['tokens_per_s']} | {r['p50_s']} | "
              f"{r['p99_s']} | {r['mean_batch']} | {r['ms_per_iteration']} | {r['prefills']} |" for r in rows]
    lines.append("")
    lines.append("batched / one at a time, tokens/s (median of the rounds): "
                 + ", ".join(f"{c} clients {ratios[c]}x" for c in CLIENTS))
    load_after = os.getloadavg()
    lines.append(f"CPU: {cpu}; server threads: {args.threads}; {load_averages(load_before, load_after)}")
    table = "\n".join(lines)
    print(table)
    write_report("serve-cpu", {"args": vars(args), "cpu": cpu, "rows": rows, "ratios": ratios,
                              "load_average_before": load_before, "load_average_after": load_after}, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
