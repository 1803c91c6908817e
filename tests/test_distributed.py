"""Training on two CPU processes (gloo) with DDP and FSDP2, through the command line users run: the loss curve of
2 ranks x B equals 1 process x 2B (with gradient accumulation too), a run saved by 2 ranks resumes bit for bit (and
in one process), a SIGTERM saves once on every rank, and a dead rank ends the job with its name and the last
checkpoint intact. In this process, on a group of one rank: gradients are reduced in each step's last micro-batch
only."""

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import FSDPModule

from attnkit import cli
from attnkit.data import PairBatch
from attnkit.errors import ConfigError
from attnkit.train import TrainRequest, prepare
from attnkit.train.distributed import RankLost, Replicated, Sharded, SingleProcess, World, no_forward_buffer_sync
from attnkit.train.state import load_checkpoint

TINY = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=64",
        "--set", "max_seq_len=24", "--no-progress", "--schedule", "constant",
        "--warmup", "2", "--lr", "3e-3", "--seed", "7"]
TASKS = {"lm": ["--task", "lm", "--data", "synthetic:copy", "--sample-tokens", "0"],
         "translate": ["--task", "translate", "--data", "synthetic:copy", "--set", "dropout=0.0",
                       "--set", "bleu_samples=4"]}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(out: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "attnkit", "train", "--out", str(out), *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=timeout)


def train_records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process with batch 8, per task and number of micro-batches (lm only with 2): the reference curves."""
    runs = {}
    for task, accum in [*((task, 1) for task in TASKS), ("lm", 2)]:
        out = tmp_path_factory.mktemp(f"single-{task}-{accum}")
        assert cli.main(["train", "--out", str(out), *TASKS[task], *TINY, "--batch-size", "8", "--grad-accum",
                         str(accum), "--max-steps", "5", "--eval-every", "5"]) == 0
        runs[task, accum] = train_records(out)
    return runs


SLOW = pytest.mark.slow  # the whole file takes about two minutes without these (two processes start per run)


@pytest.mark.parametrize(("task", "shard", "accum"), [
    ("lm", False, 1), pytest.param("lm", True, 1, marks=SLOW), pytest.param("lm", False, 2, marks=SLOW),
    ("lm", True, 2),
    pytest.param("translate", False, 1, marks=SLOW), ("translate", True, 1)],
    ids=["lm-ddp", "lm-fsdp2", "lm-ddp-accum2", "lm-fsdp2-accum2", "translate-ddp", "translate-fsdp2"])
def test_two_ranks_of_b_follow_one_process_of_2b(tmp_path, single, task, shard, accum):
    """accum 2: every rank's first micro-batch skips the reduction, the second reduces the sum of both (lm-fsdp2
    and lm-ddp-accum2 are slow: lm-fsdp2-accum2 takes both paths)."""
    out = tmp_path / "run"
    done = torchrun(out, *TASKS[task], *TINY, "--batch-size", "4", "--grad-accum", str(accum), "--max-steps", "5",
                    "--eval-every", "5", "--explain", *(["--shard"] if shard else []))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{'FSDP2' if shard else 'DDP'} over 2 ranks (gloo): global batch {8 * accum} sequences" in done.stderr
    # the training plan, printed once (rank 0), says how the ranks train
    assert done.stderr.count(f"ranks        {'FSDP2' if shard else 'DDP'} over 2 ranks (gloo): ") == 1
    assert done.stdout.count("trained 5 steps") == 1  # rank 0 prints, rank 1 does not
    # resuming in one process would halve the global batch: the hint resumes on as many ranks
    assert f"resume with: torchrun --nproc-per-node 2 -m attnkit train --out {out} --resume --max-steps N" in (
        done.stdout), done.stdout
    ranks, one = train_records(out), single[task, accum]
    assert [r["step"] for r in ranks] == [1, 2, 3, 4, 5]  # rank 0 alone writes metrics
    assert [r["tokens"] for r in ranks] == [r["tokens"] for r in one]  # tokens of the global batch
    for key in ("loss", "grad_norm"):
        torch.testing.assert_close([r[key] for r in ranks], [r[key] for r in one], rtol=1e-5, atol=1e-6)
    # the gathered checkpoint loads in one process (FSDP2's shards gathered, tied weights once)
    checkpoint = load_checkpoint(out / "checkpoints" / "step_000005")
    assert checkpoint.step == 5 and checkpoint.train_state["ranks"] == 2


@SLOW
def test_compile_model_under_ddp_trains_compiled(tmp_path):
    """--compile model through DDP: compiled as the plan says, not fallen back to eager after a failed fullgraph."""
    done = torchrun(tmp_path / "run", *TASKS["lm"], *TINY, "--batch-size", "4", "--max-steps", "2",
                    "--eval-every", "2", "--compile", "model", "--explain")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compilation  whole model" in done.stderr and "DDPOptimizer" in done.stderr, done.stderr[-3000:]
    assert "training runs eagerly" not in done.stderr, done.stderr[-3000:]


@SLOW
def test_batch_tokens_are_per_rank_as_the_batch_size_is(tmp_path):
    """--set batch_tokens=T is each rank's share, as --batch-size is (fairseq's --max-tokens is per GPU too): 2 ranks
    of T follow one process of 2T, and the log says the global batch in tokens."""
    args = [*TASKS["translate"], *TINY, "--max-steps", "4", "--eval-every", "4"]
    one = tmp_path / "one"
    assert cli.main(["train", "--out", str(one), *args, "--batch-size", "8", "--set", "batch_tokens=120"]) == 0
    done = torchrun(tmp_path / "two", *args, "--batch-size", "4", "--set", "batch_tokens=60")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global batch of up to 120 tokens per step (60 per rank's micro-batch x 1 micro-batches x 2 ranks)" in (
        done.stderr), done.stderr[-3000:]
    ranks, single = train_records(tmp_path / "two"), train_records(one)
    assert [r["tokens"] for r in ranks] == [r["tokens"] for r in single]
    torch.testing.assert_close([r["loss"] for r in ranks], [r["loss"] for r in single], rtol=1e-5, atol=1e-6)


def test_two_ranks_train_on_the_wordpiece_rank_0_trained(tmp_path):
    """A WordPiece trained twice on one text differed (tokenizers#1794: ids given in hash order), so each rank
    training its own stopped the job: rank 0 trains the tokenizer and the others take it."""
    from attnkit.tokenize import load_tokenizer

    draw = random.Random(0)
    syllables = ["ka", "to", "ri", "mu", "sen", "dal", "o", "e", "ith", "qua", "ven", "lor"]
    words = ["".join(draw.choices(syllables, k=draw.randint(1, 4))) for _ in range(400)]
    text = "\n".join(" ".join(draw.choices(words, k=12)) for _ in range(800))
    (tmp_path / "text.txt").write_text(text)
    out = tmp_path / "run"
    done = torchrun(out, "--task", "mlm", "--data", str(tmp_path / "text.txt"), "--tokenizer", "wordpiece",
                    "--vocab-size", "200", *TINY, "--batch-size", "4", "--max-steps", "2", "--eval-every", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_tokenizer(out / "tokenizer").kind == "wordpiece"


def test_a_tokenizer_that_trains_past_the_timeout_stops_every_rank_saying_so(tmp_path):
    """The other ranks wait --dist-timeout seconds for the tokenizer rank 0 trains: one that trained longer (a large
    corpus) ended them in a traceback from the broadcast. Now a rank says what it waited for and how not to wait."""
    draw = random.Random(0)
    words = ["".join(draw.choices("abcdefghijklmnopqrstuvwxyz", k=draw.randint(3, 9))) for _ in range(20000)]
    # 50 MB: some 5 s of BPE training on two cores, well past the 2 s wait (17 MB took 1.6-2.2 s: at times inside it)
    (tmp_path / "text.txt").write_text((" ".join(words) + "\n") * 360)
    done = torchrun(tmp_path / "run", "--task", "lm", "--data", str(tmp_path / "text.txt"), "--tokenizer", "bpe",
                    *TINY, "--batch-size", "4", "--max-steps", "1", "--dist-timeout", "2", timeout=120)
    assert done.returncode != 0 and "[rank1]: Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.search(r"attnkit: error: rank 1: the other ranks waited for the tokenizer that rank 0 builds, and the "
                     r"wait failed \(.*\): building it took longer than --dist-timeout 2 s, or a rank died\. Train it "
                     r"once before the launch with attnkit tokenizer train --out DIR, then give attnkit train "
                     r"--tokenizer DIR",
                     done.stderr), done.stderr[-3000:]


@pytest.mark.parametrize("shard", [pytest.param(False, marks=SLOW), True], ids=["ddp", "fsdp2"])
def test_saved_by_two_ranks_resumes_bit_for_bit_and_in_one_process(tmp_path, shard):
    # dropout on: the ranks' own RNG streams must be saved and restored too
    args = [*TASKS["lm"], *TINY, "--batch-size", "4", "--eval-every", "2", "--set", "dropout=0.1",
            "--set", f"shard={str(shard).lower()}"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert torchrun(whole, *args, "--max-steps", "4").returncode == 0
    # steps 3 and 4 again, from the checkpoint of step 2, in another run directory
    resumed = torchrun(parts, *args, "--max-steps", "4", "--resume", str(whole / "checkpoints" / "step_000002"),
                       "--log-every", "5")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # what every rank would say alike, rank 0 says once
    assert resumed.stderr.count("resuming with a changed setting: log_every: 10 -> 5") == 1, resumed.stderr[-3000:]
    assert resumed.stderr.count(f"continuing {whole / 'checkpoints' / 'step_000002'} in {parts}") == 1
    assert [r["loss"] for r in train_records(parts)] == [r["loss"] for r in train_records(whole)][2:]
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(whole / name), load_file(parts / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # one process continues the run (its global batch halves: a warning says so)
    assert cli.main(["train", "--out", str(parts), "--resume", "--max-steps", "5", "--no-progress",
                     "--sample-tokens", "0"]) == 0
    assert json.loads((parts / "train_state.json").read_text())["step"] == 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_saves_once_and_every_rank_exits_cleanly(tmp_path):
    """Both ranks started as a scheduler would (RANK, WORLD_SIZE, MASTER_ADDR/PORT), both sent SIGTERM."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "attnkit", "train", "--out", str(out), *TASKS["lm"], *TINY,
               "--batch-size", "4", "--max-steps", "100000", "--eval-every", "3"]
    port = str(free_port())
    ranks = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={
            **ENV, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port})
        for r in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints").is_dir() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in ranks), ranks[0].communicate()
            time.sleep(0.2)
        for p in ranks:
            p.send_signal(signal.SIGTERM)
        results = [p.communicate(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    for p, (_, err) in zip(ranks, results, strict=True):
        assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert "Traceback" not in err
    step = json.loads((out / "train_state.json").read_text())["step"]
    assert f"stopped by SIGTERM after step {step};" in results[0][1]
    assert f"Resume with: the same launch of 2 ranks, with attnkit train --out {out} --resume" in results[0][1]
    assert "stopped by" not in results[1][1]  # rank 1 saves with rank 0 and says nothing
    assert max(r["step"] for r in train_records(out)) == step
    assert load_checkpoint(out / "checkpoints" / f"step_{step:06d}").step == step


def signal_rank_1(out: Path, signum: int, *options: str) -> tuple[int, str, float]:
    """torchrun training lm on 2 ranks into `out`, `signum` sent to rank 1 once rank 0 has logged a step past 3 (it
    has saved step 3 and left the barrier after it, so a checkpoint is there to name): the job's exit status, its
    stderr, and the seconds it took to end after the signal."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "attnkit", "train", "--out", str(out), *TASKS["lm"], *TINY, "--batch-size", "4",
               "--max-steps", "100000", "--eval-every", "3", *options]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while not trained_past(out, 3) and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
        assert job.poll() is None, job.communicate()
        os.kill(rank_pid(job.pid, 1), signum)
        signalled = time.monotonic()
        _, err = job.communicate(timeout=120)
        return job.returncode, err, time.monotonic() - signalled
    finally:
        job.kill()


def test_a_dead_rank_ends_the_job_naming_it_and_the_checkpoint_survives(tmp_path):
    out = tmp_path / "run"
    status, err, waited = signal_rank_1(out, signal.SIGKILL, "--set", "dist_timeout=30")
    assert status != 0 and waited < 90
    # torchrun's summary names the dead rank; rank 0's own message names the failed collective and the checkpoint
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9", err), err[-3000:]
    said = re.search(r"attnkit: error: rank 0: a collective with the other ranks failed \(.+\); another rank died "
                     r"or did not answer within 30 s .*?The last checkpoint \(step (\d+)\) in (\S+) is intact; "
                     r"resume with: torchrun --nproc-per-node 2 -m attnkit train --out (\S+) --resume", err)
    assert said, err[-3000:]
    assert Path(said[2]) == out == Path(said[3]) and int(said[1]) % 3 == 0 and int(said[1]) > 0
    checkpoint = load_checkpoint(out / "checkpoints" / f"step_{int(said[1]):06d}")  # the one named loads
    assert checkpoint.step == int(said[1])



def test_sigterm_to_one_rank_under_torchrun_stops_every_rank_cleanly_with_a_checkpoint(tmp_path):
    """A signal to one rank (a kill of its process) stops every rank after the same step, saved; torchrun reports
    the job as ended, not failed, and rank 0 says it was stopped and how to resume."""
    out = tmp_path / "run"
    status, err, _ = signal_rank_1(out, signal.SIGTERM)
    assert status == 0, err[-3000:]
    assert "Traceback" not in err and "FAILED" not in err, err[-3000:]
    step = json.loads((out / "train_state.json").read_text())["step"]
    assert f"stopped by SIGTERM after step {step};" in err
    assert f"Resume with: torchrun --nproc-per-node 2 -m attnkit train --out {out} --resume" in err
    assert load_checkpoint(out / "checkpoints" / f"step_{step:06d}").step == step

def trained_past(out: Path, step: int) -> bool:
    """Whether rank 0 has logged a training step after `step`."""
    try:
        return any(r["step"] > step for r in train_records(out))
    except (OSError, json.JSONDecodeError):  # no metrics yet, or a line still being written
        return False


def rank_pid(launcher: int, rank: int) -> int:
    """The process torchrun started for `rank` (its RANK variable)."""
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
            if parent == launcher and f"RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no rank {rank} among torchrun's children")


@pytest.fixture
def one_rank_group():
    """A process group of this process alone (gloo), for DDP and FSDP2 without torchrun."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("shard", [False, True], ids=["ddp", "fsdp2"])
def test_gradients_are_reduced_in_each_steps_last_micro_batch_only(tmp_path, monkeypatch, one_rank_group, shard):
    """Two steps of 3 micro-batches through the trainer: DDP's all-reduces (seen by a comm hook, per bucket) and
    FSDP2's reduce-scatters (seen by the all-reduce hook of each sharded module) all happen in micro-batches 3 and 6."""
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (200, 16))
    parallel = (Sharded if shard else Replicated)(World(0, 0, 1), "cpu")
    monkeypatch.setattr("attnkit.train.job._start", lambda world, settings, data, device: parallel)
    trainer = prepare(TrainRequest(
        out=str(tmp_path), task="lm", overrides=["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64", "max_seq_len=24"],
        data={"data": ("synthetic:copy",), "eval_batches": 1},
        settings=dict(max_steps=2, batch_size=2, grad_accum=3, eval_every=2), device="cpu", progress=False,
    ))
    micro_batches, reduced_in = 0, []  # reduced_in: the micro-batch (1, 2, ...) of each reduction
    real_loss = trainer.task.loss

    def counted_loss(model, batch):
        nonlocal micro_batches
        micro_batches += 1
        return real_loss(model, batch)

    def seen(reduced):
        reduced_in.append(micro_batches)
        return reduced

    trainer.task.loss = counted_loss
    sharded = [m for m in trainer.model.modules() if isinstance(m, FSDPModule)]  # FSDP2: each block, the whole model
    for module in sharded:
        module.set_all_reduce_hook(seen)
    if not shard:
        trainer.train_model.register_comm_hook(None, lambda state, bucket: seen(allreduce_hook(state, bucket)))
    trainer.fit()
    per_step = len(sharded) if shard else reduced_in.count(3)  # DDP: one all-reduce per gradient bucket
    assert per_step > 0 and reduced_in == [3] * per_step + [6] * per_step  # never before a step's last micro-batch


def test_fsdp2_master_weights_train_as_one_process_does(tmp_path, monkeypatch, one_rank_group):
    """--shard --dtype bf16-master (FSDP2's mixed precision) on a group of one rank against one process's bf16 copy
    with fp32 master weights: FSDP2 cast the blocks' inputs through the attention mask (a dataclass with a cache
    field it cannot rebuild), and every such run failed at its first forward pass."""
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (200, 16))
    runs = {}
    for name, parallel in (("one", SingleProcess()), ("fsdp2", Sharded(World(0, 0, 1), "cpu"))):
        monkeypatch.setattr("attnkit.train.job._start", lambda world, settings, data, device, p=parallel: p)
        out = tmp_path / name
        prepare(TrainRequest(
            out=str(out), task="lm", overrides=["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64", "max_seq_len=24"],
            data={"data": ("synthetic:copy",), "eval_batches": 1},
            settings=dict(max_steps=3, batch_size=4, eval_every=3, dtype="bf16-master", seed=3), device="cpu",
            progress=False,
        )).fit()
        runs[name] = [r["loss"] for r in train_records(out)]
    assert len(runs["fsdp2"]) == 3
    torch.testing.assert_close(runs["fsdp2"], runs["one"], rtol=2e-2, atol=0)  # bf16 products, cast apart


def test_a_rank_lost_after_rank_0_saved_names_the_checkpoint_written(tmp_path, monkeypatch):
    """The other rank dies while rank 0 writes (it waits at the barrier after the save): the checkpoint rank 0 has
    written is whole, and is the one resuming takes, so the message names it rather than the one before."""

    class LostAtBarrier(SingleProcess):
        timeout = 30.0
        lost = Replicated.lost

        def barrier(self):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]: Connection reset by peer")

    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (200, 16))
    monkeypatch.setattr("attnkit.train.job._start", lambda world, settings, data, device: LostAtBarrier())
    trainer = prepare(TrainRequest(
        out=str(tmp_path), task="lm", overrides=["d_model=32", "n_layers=1", "n_heads=2", "d_ff=64", "max_seq_len=24"],
        data={"data": ("synthetic:copy",), "eval_batches": 1},
        settings=dict(max_steps=4, batch_size=2, eval_every=2), device="cpu", progress=False,
    ))
    with pytest.raises(RankLost, match=rf"The last checkpoint \(step 2\) in {re.escape(str(tmp_path))} is intact"):
        trainer.fit()
    assert load_checkpoint(tmp_path / "checkpoints" / "step_000002").step == 2


def test_each_rank_takes_its_rows_of_the_global_batch():
    batch = (torch.arange(8)[:, None], torch.arange(8)[:, None] + 100)  # (B, 1) inputs and targets
    for rank in range(2):
        rows, count = Replicated(World(rank, rank, 2), "cpu").share(batch)
        assert count == 1 and rows[0].flatten().tolist() == list(range(rank * 4, rank * 4 + 4))
    # the end of an epoch: fewer rows than ranks; the rank left without takes a stand-in counted 0 times
    pairs = PairBatch(*(torch.ones(1, 3, dtype=torch.long) for _ in range(5)))
    (stand_in, first), (_, second) = (Replicated(World(r, r, 2), "cpu").share(pairs) for r in range(2))
    assert (first, second) == (0, 1) and stand_in.src_ids.shape == (1, 3)


def test_ddp_refuses_master_weights():
    with pytest.raises(ConfigError, match="--shard"):
        Replicated(World(0, 0, 2), "cpu").precision("bf16-master", torch.nn.Linear(2, 2))


@pytest.mark.parametrize("flag", [["--shard"], ["--set", "shard=true"], ["--dist-timeout", "30"]])
def test_distributed_options_in_one_process_are_refused(tmp_path, capsys, monkeypatch, flag):
    """Without torchrun the run is one process: --shard would train unsharded and --dist-timeout bound nothing."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["train", "--out", str(tmp_path / "run"), *TASKS["lm"], *TINY, "--max-steps", "1", *flag]) == 2
    err = capsys.readouterr().err
    option = "--shard" if "shard" in " ".join(flag) else "--dist-timeout"
    assert re.search(rf"attnkit: error: {option} .*one process.*torchrun --nproc-per-node", err), err
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()
    # a saved run keeps its sharding on resume in one process (documented): only options given are refused
    assert cli.main(["train", "--out", str(tmp_path / "one"), *TASKS["lm"], *TINY, "--max-steps", "1",
                     "--no-shard"]) == 0


def test_launch_variables_without_a_rendezvous_address_are_refused(tmp_path, capsys, monkeypatch):
    """RANK and WORLD_SIZE set (a scheduler's) but not MASTER_ADDR and MASTER_PORT: named, never a traceback."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert cli.main(["train", "--out", str(tmp_path / "run"), *TASKS["lm"], *TINY, "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"attnkit: error: .*MASTER_ADDR.*torchrun", err) and "Traceback" not in err, err
    assert not dist.is_initialized()


def test_a_rank_that_never_joins_ends_the_wait_within_the_timeout(tmp_path):
    """Rank 0 of 2 started alone: the rendezvous waits --dist-timeout seconds, then one line says who is missing."""
    command = [sys.executable, "-m", "attnkit", "train", "--out", str(tmp_path / "run"), *TASKS["lm"], *TINY,
               "--max-steps", "1", "--dist-timeout", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={
        **ENV, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port())})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.search(r"attnkit: error: rank 0: the ranks did not all join at 127\.0\.0\.1:\d+ within 2 s .*"
                     r"WORLD_SIZE=2", done.stderr), done.stderr[-3000:]


def test_ddp_is_told_not_to_sync_buffers_each_forward_in_the_words_its_torch_knows():
    """torch 2.13 renamed DDP's broadcast_buffers to forward_sync_buffers; torch 2.11 (a GPU image's) refuses the new
    word with a TypeError, so every DDP run failed at construction there."""

    def before_2_13(self, module, device_ids=None, broadcast_buffers=True, init_sync=True):
        """DDP's signature up to torch 2.12."""

    def since_2_13(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=None):
        """DDP's signature from torch 2.13."""

    assert no_forward_buffer_sync(before_2_13) == {"broadcast_buffers": False}
    assert no_forward_buffer_sync(since_2_13) == {"forward_sync_buffers": False}



RANK_0_FAILS = '''
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

from attnkit.train.distributed import Replicated, World


def rank(r, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=r, world_size=2,
                            timeout=timedelta(seconds=60))
    parallel = Replicated(World(r, r, 2), "cpu", timeout=60)

    def make():
        raise PermissionError("[Errno 13] Permission denied: 'OUT/cache'")

    try:
        parallel.made_on_rank_0(make, what="the token cache", beforehand="Make it first")
    except Exception as err:
        print(f"rank {r}: {type(err).__name__}: {err}", flush=True)


if __name__ == "__main__":
    mp.start_processes(rank, args=(sys.argv[1],), nprocs=2, start_method="fork")  # attnkit imported once
'''


def test_a_fault_of_rank_0s_own_while_it_makes_a_shared_thing_is_told_to_the_other_ranks(tmp_path):
    """Rank 0 failing with an error of no attnkit kind (a cache it may not write, a bug) while it makes what the ranks
    share: the other ranks stop at once, told what failed, and rank 0 raises its own error; they were left waiting
    in the broadcast until its process ended (or --dist-timeout passed), then blamed the timeout."""
    (tmp_path / "ranks.py").write_text(RANK_0_FAILS)
    done = subprocess.run([sys.executable, str(tmp_path / "ranks.py"), str(tmp_path / "store")], capture_output=True,
                          text=True, env=ENV, timeout=120)
    assert "rank 0: PermissionError: [Errno 13] Permission denied: 'OUT/cache'" in done.stdout, done.stderr[-2000:]
    assert ("rank 1: ConfigError: rank 0 failed to make the token cache (PermissionError: [Errno 13] Permission "
            "denied: 'OUT/cache'); rank 0's traceback names the cause") in done.stdout, done.stderr[-2000:]
