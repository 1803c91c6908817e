"""`python -m benchmarks speculative` runs end to end on two tiny runs of one tokenizer: a row for the target alone
and for each K, the texts checked equal to the target's own, written to the results folder it is given."""

import json
import string

import pytest
import torch
from generate_models import tiny_model

from attnkit.checkpoint import save_model
from attnkit.tokenize import CharTokenizer
from benchmarks import bench_speculative, common


def test_the_speculative_benchmark_writes_a_row_per_k_beside_the_target_alone(tmp_path, monkeypatch):
    tokenizer = CharTokenizer(string.printable)
    for name, overrides in (("target", dict(n_layers=2, seed=1)), ("draft", dict(n_layers=1, seed=2))):
        model, config = tiny_model(vocab_size=tokenizer.vocab_size, position="rope", max_seq_len=64, **overrides)
        save_model(model.float(), config, tmp_path / name)
        tokenizer.save(tmp_path / name / "tokenizer")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    assert bench_speculative.main(["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                                   "--draft-tokens", "1", "3", "--new-tokens", "6", "--rounds", "2",
                                   "--threads", str(torch.get_num_threads())]) == 0  # the suite's, left as it is
    report = json.loads((tmp_path / "results" / "speculative-cpu.json").read_text())
    assert [row["draft_tokens"] for row in report["rows"]] == ["alone", 1, 3]
    assert report["rows"][0]["acceptance"] is None and report["rows"][0]["speedup"] == 1.0
    assert all(0 <= row["acceptance"] <= 1 and row["tokens_per_s"] > 0 for row in report["rows"][1:])
    assert report["sizes"] == {"target": [32, 2, 64], "draft": [32, 1, 64]} and report["rounds"] == 2
    assert "| draft, K = 3 |" in (tmp_path / "results" / "speculative-cpu.md").read_text()


def test_a_servers_cpu_time_is_read_from_proc_as_the_process_counts_its_own():
    """`bench_serve_speculative --clock cpu` divides by the server process's CPU time (/proc/PID/stat's utime and
    stime): read for this process, it moves with `time.process_time` over work done here."""
    import os
    import time

    from benchmarks.bench_serve_speculative import cpu_seconds

    pid = os.getpid()
    before, mine = cpu_seconds(pid), time.process_time()
    total = 0
    while time.process_time() - mine < 0.3:
        total += sum(range(1000))
    assert cpu_seconds(pid) - before == pytest.approx(time.process_time() - mine, abs=0.05)
