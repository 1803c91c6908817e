"""Prefix caching: time to first token for a long shared system prompt plus a short question, `attnkit serve` with
its prefix cache (the default) against `--no-prefix-cache`, at 1 and 8 concurrent clients.

    python -m benchmarks prefix_cache [--requests 6] [--threads 1] [--rounds 2]

The model is bench_serve's `small` shape (6 layers, width 384, 6 heads, random weights, a character vocabulary)
with a context of 1,536 positions. Every request is a streamed completion of a 1,000-token system prompt (the same
for all) followed by a 20-token question of its own, up to 4 new tokens; its time to first token is the time from
sending it to the first streamed chunk. Each server first answers one request with the system prompt (with the
cache, that one computes it and keeps its blocks; without, it warms up the same way). Each of C clients then sends
`--requests` requests one after the other. The two servers run one at a time, in the other order each round; the
ratio is the median of the rounds' ratios of median times to first token. Target: >= 5x at 1 client on the CPU.
Results go to benchmarks/results/prefix-cache-cpu.json and .md, with the CPU and the machine's load average
before and after (other work on the machine slows both servers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_serve import Server, make_run
from benchmarks.common import load_averages, write_report

CLIENTS = (1, 8)
CONTEXT = 1536
SENTENCE = "Answer briefly and truthfully; say so when you do not know. "
SYSTEM = (SENTENCE * (1000 // len(SENTENCE) + 1))[:1000]  # 1,000 characters: 1,000 tokens of the char vocabulary
MODES = {"prefix cache": [], "no prefix cache": ["--no-prefix-cache"]}


def question(index: int) -> str:
    """A question of 20 characters (20 tokens), different for each request."""
    return f"What is item {index:05d}?"[:20].ljust(20)


async def first_token_seconds(http, url: str, index: int) -> float:
    """Seconds from sending one streamed completion to its first chunk (the stream is then read to its end)."""
    body = {"prompt": SYSTEM + question(index), "max_tokens": 4, "seed": index, "stream": True}
    start = time.perf_counter()
    first = None
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                first = time.perf_counter() - start
    return first


async def load(url: str, clients: int, requests: int) -> dict:
    import httpx

    async def client(number: int, http) -> list[float]:
        return [await first_token_seconds(http, url, 1000 * (number + 1) + r) for r in range(requests)]

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        await first_token_seconds(http, url, 0)  # the system prompt, once, before the measured requests
        results = await asyncio.gather(*(client(i, http) for i in range(clients)))
    times = sorted(t for per_client in results for t in per_client)
    return {"clients": clients, "requests": len(times), "ttft_p50_s": round(statistics.median(times), 4),
            "ttft_p90_s": round(times[min(len(times) - 1, int(0.9 * len(times)))], 4)}


def main(argv: list[str] | None = None) -> int:
    from attnkit.machine import CpuCapabilities

    parser = argparse.ArgumentParser(prog="python -m benchmarks prefix_cache", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6, help="requests per client, one after the other")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (OMP_NUM_THREADS)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the two servers in alternating order")
    args = parser.parse_args(argv)
    cpu = CpuCapabilities.detect().summary()
    load_before = os.getloadavg()
    print(f"{cpu}; load average {load_before}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        run = make_run(Path(root), max_seq_len=CONTEXT)
        for index in range(args.rounds):
            for mode in list(MODES) if index % 2 == 0 else list(MODES)[::-1]:
                with Server(run, 32, args.threads, options=MODES[mode]) as url:
                    for clients in CLIENTS:
                        row = {"mode": mode, "round": index, **asyncio.run(load(url, clients, args.requests))}
                        print(row, flush=True)
                        rows.append(row)
    load_after = os.getloadavg()
    by = {(r["mode"], r["round"], r["clients"]): r["ttft_p50_s"] for r in rows}
    ratios = {c: round(statistics.median(by[("no prefix cache", i, c)] / by[("prefix cache", i, c)]
                                         for i in range(args.rounds)), 1) for c in CLIENTS}
    rows.sort(key=lambda r: (r["clients"], r["mode"], r["round"]))
    lines = ["| mode | round | clients | requests | time to first token p50 (s) | p90 (s) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['round']} | {r['clients']} | {r['requests']} | {r['ttft_p50_s']} | "
              f"{r['ttft_p90_s']} |" for r in rows]
    lines += ["", "time to first token, no prefix cache / prefix cache (median of the rounds' p50 ratios): "
              + ", ".join(f"{c} client{'s' if c > 1 else ''} {ratios[c]}x" for c in CLIENTS),
              f"Prompt: {len(SYSTEM)}-token shared system prompt + 20-token question, 4 new tokens, streamed. "
              f"CPU: {cpu}; server threads: {args.threads}; {load_averages(load_before, load_after)}"]
    table = "\n".join(lines)
    print(table)
    write_report("prefix-cache-cpu", {"args": vars(args), "cpu": cpu, "rows": rows, "ratios": ratios,
                              "load_average_before": load_before, "load_average_after": load_after}, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
