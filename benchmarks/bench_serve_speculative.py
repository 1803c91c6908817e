"""Serving with a draft: `attnkit serve TARGET` against `attnkit serve TARGET --draft DRAFT --draft-tokens K` at 1
and 4 concurrent clients, greedy.

    python -m benchmarks serve_speculative --target runs/shakespeare-192x4 --draft runs/shakespeare-64x1 \
        [--draft-tokens 4] [--clients 1 4] [--requests 2] [--new-tokens 48] [--rounds 2] [--threads 1] \
        [--library] [--clock wall | cpu] [--report serve-speculative-cpu]

Both runs are trained on one text with one tokenizer (`attnkit train --tokenizer TARGET/tokenizer`). Each round
starts the two servers (`bench_serve.Server`: a process of its own on 127.0.0.1 on a free port, `--threads` torch
threads), one after the other, in the other order than the round before; each is warmed up, then each client sends
`--requests` greedy completions one after the other (a line of Shakespeare as the prompt, exactly `--new-tokens`
tokens: `ignore_eos`). A row gives the tokens per second over the wall time; the speed-up is the median over rounds
of each round's ratio to the server without the draft at the same clients; the acceptance is the draft server's
`attnkit_spec_decode_*` counters over the same time. Every text is checked equal to the one the server without the
draft wrote (greedy: the target's own). Results go to benchmarks/results/serve-speculative-cpu.json and .md, with
the CPU and the machine's load average before and after. With --library, the same process then measures the
library's own speculative path with the same runs and K (`bench_speculative.measure`: batch 1, `--rounds` rounds, in
turn, --threads torch threads), so that the server's ratio stands beside the library's of the same load; --report
names the results' files (benchmarks/results/REPORT.json and .md). `--clock cpu` divides the tokens by the server
process's CPU time over the requests (and the library's rounds by this process's) instead of the wall time: on a
machine other jobs load past its cores, where a `nice`d server waits for long stretches, that is what the tokens
cost, where the wall clock is mostly the wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import bench_speculative
from benchmarks.bench_serve import Server
from benchmarks.common import load_averages, write_report

PROMPTS = ("ROMEO:\nWhat light is", "First Citizen:\nWe are", "KING HENRY:\nNow, my lords,", "MENENIUS:\nWhy, how",
           "JULIET:\nO Romeo, Romeo", "DUKE VINCENTIO:\nHe who", "LADY MACBETH:\nOut, damned", "HAMLET:\nTo be")


async def counters(http, url: str) -> dict[str, float]:
    text = (await http.get(f"{url}/metrics")).text
    return {name: float(value) for name, value in (line.split() for line in text.splitlines()
                                                   if line.startswith("attnkit_spec_decode_num"))}


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, every thread) process `pid` has taken so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


async def measure(url: str, clients: int, requests: int, new_tokens: int, clock: Callable[[], float]
                  ) -> tuple[dict, dict[tuple, str]]:
    """`clients` clients sending `requests` greedy completions each: tokens/s (over `clock`'s seconds), the
    spec-decode counters' deltas and every text by (client, request)."""
    import httpx

    async def one(http, client: int, request: int) -> tuple[tuple, str, int]:
        prompt = PROMPTS[(client * requests + request) % len(PROMPTS)]
        body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        answer = (await http.post(f"{url}/v1/completions", json=body)).raise_for_status().json()
        return (client, request), answer["choices"][0]["text"], answer["usage"]["completion_tokens"]

    async def client(http, index: int) -> list:
        return [await one(http, index, request) for request in range(requests)]

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        await one(http, 0, 0)  # warm-up
        before = await counters(http, url)
        start = clock()
        results = [row for rows in await asyncio.gather(*(client(http, i) for i in range(clients))) for row in rows]
        wall = clock() - start
        await asyncio.sleep(0.2)  # the scheduler counts a round after its tokens are sent
        after = await counters(http, url)
    tokens = sum(count for _, _, count in results)
    done = {name.removeprefix("attnkit_spec_decode_num_"): after[name] - before.get(name, 0.0) for name in after}
    return ({"clients": clients, "tokens": tokens, "seconds": round(wall, 3), "tokens_per_s": round(tokens / wall, 1),
             **done}, {key: text for key, text, _ in results})


def main(argv: list[str] | None = None) -> int:
    from attnkit.machine import CpuCapabilities

    parser = argparse.ArgumentParser(prog="python -m benchmarks serve_speculative", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--draft", required=True, type=Path)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="each server's torch threads (OMP_NUM_THREADS)")
    parser.add_argument("--library", action="store_true", help="also the library's speculative path, same runs and K")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time the requests by the wall clock or by the server's CPU time")
    parser.add_argument("--report", default="serve-speculative-cpu", help="the results' name in benchmarks/results")
    args = parser.parse_args(argv)
    modes = {"target alone": [], f"draft, K = {args.draft_tokens}": ["--draft", str(args.draft), "--draft-tokens",
                                                                    str(args.draft_tokens)]}
    rows, texts = [], {}
    load_before = os.getloadavg()
    for index in range(args.rounds):
        for mode in list(modes) if index % 2 == 0 else list(modes)[::-1]:
            server = Server(args.target, 32, args.threads, options=modes[mode])
            with server as url:
                pid = server.process.pid
                clock = time.perf_counter if args.clock == "wall" else lambda: cpu_seconds(pid)  # noqa: B023
                for clients in args.clients:
                    row, written = asyncio.run(measure(url, clients, args.requests, args.new_tokens, clock))
                    rows.append({"mode": mode, "round": index, **row})
                    print(rows[-1], flush=True)
                    texts.setdefault((clients, index), {})[mode] = written
    library = []
    if args.library:
        import torch

        torch.set_num_threads(args.threads)
        library, _ = bench_speculative.measure(args.target, args.draft, [args.draft_tokens],
                                               new_tokens=args.new_tokens, rounds=args.rounds,
                                               clock=time.perf_counter if args.clock == "wall" else time.process_time)
    load_after = os.getloadavg()
    for (clients, index), by_mode in texts.items():
        first, *others = by_mode.values()
        if any(other != first for other in others):
            raise SystemExit(f"{clients} clients, round {index}: a text with the draft differs from the target's own")
    alone = {(r["clients"], r["round"]): r["tokens_per_s"] for r in rows if r["mode"] == "target alone"}
    per = "tokens/s" if args.clock == "wall" else "tokens per CPU second"
    lines = [f"| server | clients | {per} (round by round) | vs target alone (median of rounds) | drafts accepted |",
             "|---|---|---|---|---|"]
    for mode in modes:
        for clients in args.clients:
            mine = [r for r in rows if r["mode"] == mode and r["clients"] == clients]
            ratio = statistics.median(r["tokens_per_s"] / alone[clients, r["round"]] for r in mine)
            drafted = sum(r.get("draft_tokens_total", 0) for r in mine)
            accepted = sum(r.get("accepted_tokens_total", 0) for r in mine)
            rate = f"{accepted / drafted:.1%} ({int(accepted)} of {int(drafted)})" if drafted else ""
            lines.append(f"| {mode} | {clients} | {', '.join(str(r['tokens_per_s']) for r in mine)} | {ratio:.2f}x | "
                         f"{rate} |")
    for row in library:
        name = "target alone" if row["draft_tokens"] == "alone" else f"draft, K = {row['draft_tokens']}"
        rate = "" if row["acceptance"] is None else f"{row['acceptance']:.1%}"
        lines.append(f"| library (`speculative_generate`), {name} | 1 (batch 1, {len(bench_speculative.PROMPTS)} "
                     f"prompts in turn) | {row['tokens_per_s']:.1f} (median round) | {row['speedup']:.2f}x | {rate} |")
    cpu = CpuCapabilities.detect().summary()
    sizes = {name: json.loads((run / "config.json").read_text()) for name, run in (("target", args.target),
                                                                                   ("draft", args.draft))}
    described = "; ".join(f"{name} width {c['d_model']}, {c['n_layers']} layers, d_ff {c['d_ff']}"
                          for name, c in sizes.items())
    lines += ["", f"{described}. Greedy, {args.requests} requests per client of {args.new_tokens} new tokens each "
              f"(ignore_eos), {args.rounds} rounds in alternating order, every text equal to the target's own; "
              f"server threads: {args.threads}; timed by the {args.clock} clock. CPU: {cpu}; "
              f"{load_averages(load_before, load_after)}"]
    table = "\n".join(lines)
    print(table)
    write_report(args.report, {"args": {k: str(v) for k, v in vars(args).items()}, "cpu": cpu,
                                           "sizes": {name: {key: c[key] for key in ("d_model", "n_layers", "d_ff")}
                                                     for name, c in sizes.items()},
                                           "rows": rows, "library": library, "load_average_before": load_before,
                                           "load_average_after": load_after}, table)
    return 0
