"""The training plan (`train/plan.py`): its choices per device, said with their reasons; the operations a step
dispatches against nanoGPT's; host reads of the loss deferred without changing what is trained or logged."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from attention_paths import VARIANTS, explained_kernels, spy_on_attention
from test_train import request, small_and_single_threaded, train_losses, weights  # noqa: F401 (a fixture)
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import ModelConfig, build_model, presets
from attnkit.data import LMData
from attnkit.errors import ConfigError, InputError
from attnkit.layers.output_loss import LossPath, use_loss_path
from attnkit.machine import PROFILE_VERSION
from attnkit.tasks.lm import LMTask
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainingDiverged, prepare
from attnkit.train.metrics import MetricsLog
from attnkit.train.plan import GPU_VOCAB_MULTIPLE, plan_training
from attnkit.train.state import checkpoints
from attnkit.train.trainer import TrainConfig, Trainer
from benchmarks.nanogpt import GPT, GPTConfig, train_step

GIB = 1 << 30


def _decoder(**overrides):
    return build_model(presets.get("gpt2-tiny", vocab_size=100, n_layers=1, **overrides))


def test_cpu_plan_chunks_the_loss_runs_eagerly_and_reads_every_step():
    plan = plan_training(_decoder(), family="decoder", device="cpu")
    assert (plan.loss.kind, plan.compile, plan.sync_every, plan.tf32, plan.pin_memory) == (
        "chunked", "off", 1, False, False)
    text = plan.explain()
    assert text.startswith("training plan for fp32 on cpu")
    for what in ("loss", "compilation", "q/k/v", "optimizer", "matmul", "attention", "data", "host reads"):
        assert f"  {what} " in text, what


def test_gpu_plan_compiles_the_whole_model_and_reads_the_host_at_log_intervals():
    """Planned for CUDA without one (a plan decides and changes nothing): nanoGPT's choices."""
    plan = plan_training(_decoder(), family="decoder", device="cuda", dtype="bf16", log_every=25, free_memory=80 * GIB)
    assert (plan.compile, plan.fullgraph) == ("model", True)
    assert plan.loss == LossPath("plain", vocab_multiple=GPU_VOCAB_MULTIPLE)
    assert (plan.sync_every, plan.tf32, plan.pin_memory) == (25, True, True)
    assert "100 padded to 128" in plan.explain()


def test_gpu_eager_loss_follows_free_memory(monkeypatch):
    model = _decoder()
    monkeypatch.setattr("attnkit.train.plan.fused_kernel_missing", lambda: "Liger Kernel is not installed")
    roomy = plan_training(model, family="decoder", device="cuda", compile="off", batch_tokens=16 * 1024,
                          free_memory=80 * GIB)
    assert roomy.loss.kind == "plain"
    tight = plan_training(model, family="decoder", device="cuda", compile="off", batch_tokens=16 * 1024,
                          free_memory=1 << 20)
    assert tight.loss.kind == "chunked" and tight.loss.chunk_size >= 256
    assert "quarter of free memory" in tight.explain()
    monkeypatch.setattr("attnkit.train.plan.fused_kernel_missing", lambda: None)  # Liger installed: its fused loss
    fused = plan_training(model, family="decoder", device="cuda", compile="off", batch_tokens=16 * 1024,
                          free_memory=1 << 20)
    assert fused.loss.kind == "fused"  # where memory is short; where it is not, plain (measured the faster)
    assert plan_training(model, family="decoder", device="cuda", compile="off", batch_tokens=16 * 1024,
                         free_memory=80 * GIB).loss.kind == "plain"


def test_recurrent_models_and_shards_are_compiled_as_they_can_be():
    lstm = build_model(presets.get("lstm-lm-tiny"))
    plan = plan_training(lstm, family="recurrent-lm", device="cuda", compile="model", free_memory=GIB)
    assert plan.compile == "off" and "nn.LSTM" in plan.explain()
    sharded = plan_training(_decoder(), family="decoder", device="cuda", sharded=True, free_memory=GIB)
    assert sharded.compile == "blocks" and "FSDP2" in sharded.explain()



@pytest.mark.parametrize(("ranks", "sharded", "device", "said"), [
    (1, False, "cpu", "ranks        one process: "),
    (2, False, "cpu", "ranks        DDP over 2 ranks (gloo): "),
    (8, True, "cuda", "ranks        FSDP2 over 8 ranks (nccl): "),
])
def test_plan_says_how_the_ranks_train(ranks, sharded, device, said):
    plan = plan_training(_decoder(), family="decoder", device=device, ranks=ranks, sharded=sharded, free_memory=GIB)
    assert said in plan.explain()


def test_ddp_compiles_the_whole_model_in_graphs_split_at_its_buckets():
    """Dynamo cannot trace DDP's forward as one graph (fullgraph fails, and the run fell back to eager): through DDP
    the model compiles with graph breaks allowed, where DDPOptimizer splits it at the gradient buckets."""
    plan = plan_training(_decoder(), family="decoder", device="cuda", ranks=2, free_memory=GIB)
    assert (plan.compile, plan.fullgraph) == ("model", False)
    assert "DDPOptimizer" in plan.explain()
    alone = plan_training(_decoder(), family="decoder", device="cuda", free_memory=GIB)
    assert (alone.compile, alone.fullgraph) == ("model", True)


@pytest.mark.parametrize(("packed", "said"), [(True, "packing      rows of whole documents"),
                                              (False, "packing      off")])
def test_plan_says_whether_rows_are_packed(packed, said):
    assert said in plan_training(_decoder(), family="decoder", device="cpu", packed=packed).explain()


def test_master_weights_under_fsdp2_are_its_mixed_precision():
    """FSDP2 keeps no second bf16 model (distributed.py): the precision line says what runs."""
    plan = plan_training(_decoder(), family="decoder", device="cuda", dtype="bf16-master", ranks=2, sharded=True,
                         free_memory=GIB)
    assert "FSDP2's mixed precision" in plan.explain() and "a bf16 copy" not in plan.explain()


def test_a_sharded_run_resumed_in_one_process_is_planned_as_one(tmp_path):
    """--shard is saved with the run; resumed without torchrun, nothing is sharded, so blocks are not compiled
    for FSDP2 and the plan says one process."""
    built = prepare(request(tmp_path / "run", max_steps=1, eval_every=1, batch_size=2))
    trainer = Trainer(model=built.model, config=built.config, task=built.task, tokenizer=built.tokenizer,
                      settings=dataclasses.replace(built.settings, shard=True, compile="model"),
                      run_dir=tmp_path / "resumed")
    assert trainer.parallel.size == 1 and trainer.plan.compile == "model"
    text = trainer.plan.explain()
    assert "ranks        one process" in text and "FSDP2" not in text, text

def test_compile_setting_takes_its_choices_and_old_runs_booleans():
    assert TrainConfig().compile == "auto"
    assert TrainConfig.from_dict({"compile": True}).compile == "blocks"  # how runs saved it before the plan
    assert TrainConfig.from_dict({"compile": False}).compile == "off"
    with pytest.raises(ConfigError, match="compile='fast' is not a known choice"):
        TrainConfig(compile="fast")


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _counted(step) -> collections.Counter:
    step()  # the optimizer's state is made at its first step
    with _CountOps() as counter:
        step()
    return counter.counts


def test_a_training_step_dispatches_at_most_1_1x_nanogpts_operations(tmp_path):
    """GPT-2's block at a small shape (4 layers, width 128, batch 2 x 64): one step of attnkit's trainer, eager, with
    the loss path and host reads a GPU's plan takes, against nanoGPT's train.py step (get_batch, forward, loss /
    grad_accum, backward, clipping, fused AdamW as it configures on a GPU, zero_grad), counted op by op."""
    vocab, length, batch, width, layers, heads = 96, 64, 2, 128, 4, 4
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=vocab, d_model=width, n_layers=layers, n_heads=heads,
                         d_ff=4 * width, max_seq_len=length, activation="gelu", bias=True)
    stream = np.random.default_rng(0).integers(0, vocab, 20_000).astype(np.uint16)
    task = LMTask(LMData.from_ids(stream), batch_size=batch, seq_len=length, seed=0)
    model = build_model(config)
    trainer = Trainer(model=model, config=config, task=task, run_dir=tmp_path, tokenizer=CharTokenizer(list("ab")),
                      settings=TrainConfig(batch_size=batch, instruments=False, compile="off"), progress=False)
    on_gpu = plan_training(model, family="decoder", device="cuda", compile="off", free_memory=80 * GIB)
    trainer.plan = dataclasses.replace(trainer.plan, sync_every=on_gpu.sync_every)
    use_loss_path(model, on_gpu.loss)
    ours = _counted(trainer.train_step)

    reference = GPT(GPTConfig(block_size=length, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=width))
    optimizer = reference.configure_optimizers(0.1, 1e-4, (0.9, 0.95), "cuda")  # fused, as on a GPU

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(stream) - length, (batch,))
        x = torch.stack([torch.from_numpy(stream[i : i + length].astype(np.int64)) for i in starts])
        y = torch.stack([torch.from_numpy(stream[i + 1 : i + 1 + length].astype(np.int64)) for i in starts])
        return x, y

    nanogpt_step = train_step(reference, optimizer, get_batch, forward=reference, ctx=contextlib.nullcontext(),
                              grad_clip=1.0)
    theirs = _counted(nanogpt_step)
    ratio = sum(ours.values()) / sum(theirs.values())
    assert ratio <= 1.1, (sum(ours.values()), sum(theirs.values()), (ours - theirs).most_common(12))
    products = ("mm", "addmm", "bmm")
    assert sum(ours[p] for p in products) <= sum(theirs[p] for p in products), (ours, theirs)


def test_deferred_host_reads_train_and_log_the_same(tmp_path):
    """Reading the loss every 3 steps (as a GPU's plan does at its log interval) logs every step with the same
    losses as reading each step, and trains the same weights."""
    prepare(request(tmp_path / "each")).fit()
    deferred = prepare(request(tmp_path / "deferred"))
    deferred.plan = dataclasses.replace(deferred.plan, sync_every=3)
    deferred.fit()
    assert train_losses(tmp_path / "deferred") == train_losses(tmp_path / "each")
    assert [s for s, _ in train_losses(tmp_path / "deferred")] == list(range(1, 9))
    a, b = weights(tmp_path / "each"), weights(tmp_path / "deferred")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_deferred_reads_still_save_nothing_past_a_non_finite_loss(tmp_path):
    trainer = prepare(request(tmp_path, max_steps=20, eval_every=3))
    trainer.plan = dataclasses.replace(trainer.plan, sync_every=4)
    real_loss = trainer.task.loss
    trainer.task.loss = lambda model, batch: real_loss(model, batch) * (float("nan") if trainer.step + 1 >= 5 else 1)
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step 5"):
        trainer.fit()
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000003"]
    assert max(r["step"] for r in MetricsLog(tmp_path / "metrics.jsonl").records("train")) == 4


def test_float8_is_refused_where_it_cannot_run_naming_the_fix():
    model = _decoder()
    with pytest.raises(ConfigError, match="float8 tensor cores.*--device cuda"):
        plan_training(model, family="decoder", device="cpu", dtype="bf16", float8=True)
    with pytest.raises(ConfigError, match="compute capability 8.9.*8.0"):
        plan_training(model, family="decoder", device="cuda", dtype="bf16", float8=True, capability=(8, 0),
                      free_memory=GIB)
    with pytest.raises(ConfigError, match="--dtype bf16"):
        plan_training(model, family="decoder", device="cuda", dtype="fp32", float8=True, capability=(9, 0),
                      free_memory=GIB)
    assert "off: not asked for (--float8" in plan_training(model, family="decoder", device="cpu").explain()


def test_float8_converts_the_blocks_linear_layers_and_not_the_output_layer():
    pytest.importorskip("torchao", reason="float8 training goes through torchao (pip install 'attnkit[gpu]')")
    model = _decoder(d_model=32, n_heads=2, d_ff=64)
    plan = plan_training(model, family="decoder", device="cuda", dtype="bf16", float8=True, capability=(9, 0),
                         free_memory=GIB)
    names = {name for name, _ in model.named_parameters()}
    plan.prepare(model)  # converting swaps modules only: it runs on the CPU
    converted = {name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted and all(name.startswith("stack.blocks.") for name in converted)
    assert {name for name, _ in model.named_parameters()} == names  # checkpoints keep their keys


def test_a_model_torch_cannot_compile_trains_eagerly_with_the_same_losses(tmp_path, caplog):
    """A compiled model whose compilation fails at the first step (here made to) trains on eagerly, said once."""

    class FailsToCompile(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("inductor failed on this graph")

    prepare(request(tmp_path / "eager", max_steps=3, eval_every=3)).fit()
    trainer = prepare(request(tmp_path / "compiled", max_steps=3, eval_every=3))
    trainer.train_model = FailsToCompile(trainer.eager_model)
    with caplog.at_level("WARNING"):
        trainer.fit()
    assert "training runs eagerly: torch.compile failed" in caplog.text
    assert train_losses(tmp_path / "compiled") == train_losses(tmp_path / "eager")


def _choices(text: str) -> list[str]:
    """The choices a printed plan names, in order: each indented line's label (`host reads`, `q/k/v`)."""
    return re.findall(r"^  (\S+(?: \S+)?) {2,}", text, flags=re.M)


def test_the_training_plan_guide_shows_the_choices_the_plan_prints():
    """docs/guides/training-plan.md shows a CPU plan whole ("the real output") and a CUDA one abridged: the CPU
    block names every choice the plan prints, in its order, and the CUDA block's choices come in the plan's order."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "training-plan.md").read_text()
    cpu, cuda = re.findall(r"```text\n(training plan for .*?)```", page, flags=re.S)[:2]
    printed = plan_training(_decoder(), family="decoder", device="cpu").explain()
    assert _choices(cpu) == _choices(printed)
    planned = plan_training(_decoder(), family="decoder", device="cuda", dtype="bf16", free_memory=80 * GIB).explain()
    shown = iter(_choices(planned))
    assert all(choice in shown for choice in _choices(cuda)), (_choices(cuda), _choices(planned))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_explained_attention_kernel_is_the_one_a_training_step_takes(variant, monkeypatch):
    """On the CPU (no FlexAttention backward) and with attention dropout, the plan says what the layers do with a
    training batch longer than any window: the reference path for Shaw, additive scores and soft-caps, SDPA with a
    dense bias for ALiBi and a window, SDPA bare for plain causal attention."""
    config = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64,
                         attention_dropout=0.1, **VARIANTS[variant])
    torch.manual_seed(0)
    model = build_model(config)
    plan = plan_training(model, family="decoder", device="cpu")
    plan.prepare(model)
    taken = spy_on_attention(monkeypatch)
    model.train()(torch.randint(0, 50, (2, 8)), labels=torch.randint(0, 50, (2, 8)))
    assert taken and explained_kernels(plan.explain()) == {kernel for kernel, _ in taken}


@pytest.mark.parametrize("task", ["classify", "translate", "lm"])
def test_the_explained_attention_kernel_is_the_one_a_padded_training_step_takes(task, tmp_path, monkeypatch):
    """A task's own batches: classify and translate pad their rows (an attention mask over the keys: SDPA with a
    dense bias for the encoder, the decoder and cross-attention alike), an lm stream has none (plain causal SDPA);
    the plan the trainer builds says the kernels one training step of the task's batches takes."""
    trainer = prepare(request(tmp_path, task, max_steps=1))
    taken = spy_on_attention(monkeypatch)
    trainer.task.loss(trainer.train_model.train(), trainer.task.next_batch())
    kernels = {kernel for kernel, _ in taken}
    assert kernels == ({"sdpa"} if task == "lm" else {"sdpa+bias"})
    assert explained_kernels(trainer.plan.explain()) == kernels


def test_a_kept_profile_this_attnkit_cannot_read_plans_training_with_the_defaults(tmp_path, monkeypatch, caplog):
    """A profile an older attnkit kept in the cache (its version bumped since) stopped every `attnkit train` on a
    CPU; training now plans with the documented defaults and says why, and a damaged $ATTNKIT_PROFILE, the user's
    own file, is still refused naming it."""
    from attnkit.machine import PROFILE_ENV, PROFILE_VERSION, default_profile_path

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = default_profile_path()
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"version": PROFILE_VERSION - 1, "attention": {}, "decode_linear": {}}))
    with caplog.at_level(logging.WARNING, logger="attnkit.train.plan"):
        plan = plan_training(_decoder(), family="decoder", device="cpu", dtype="bf16")
    assert "documented defaults" in plan.explain() and str(kept) in caplog.text
    mine = tmp_path / "mine.json"  # outside attnkit's cache: the user's
    mine.write_text(kept.read_text())
    monkeypatch.setenv(PROFILE_ENV, str(mine))
    with pytest.raises(InputError, match="version"):
        plan_training(_decoder(), family="decoder", device="cpu", dtype="bf16")


KEPT_PROFILE_DAMAGE = {  # every way a kept profile can fail to read: its bytes, or None for a read the OS refuses
    "an older version's": json.dumps({"version": 2, "attention": {}, "decode_linear": {}}).encode(),
    "cut short": b'{"version": %d, "attention": {"bf' % PROFILE_VERSION,
    "empty": b"",
    "not UTF-8": b"\xff\xfe{}",
    "not an object": b"[]",
    "a field out of range": json.dumps({"version": PROFILE_VERSION,
                                        "attention": {"bf16": {"decode_keys": -1, "pass_keys": 0}},
                                        "decode_linear": {}}).encode(),
    "refused by the OS": None,
}


def _damage(path: Path, damage: bytes | None, monkeypatch) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    if damage is None:  # root reads any mode bits: reading this file is refused, as EACCES or EIO would refuse it
        read_bytes, unreadable = Path.read_bytes, path.stat().st_ino

        def refused(self):
            if self == path and self.stat().st_ino == unreadable:  # a file measured again in its place reads
                raise PermissionError(13, "Permission denied", str(self))
            return read_bytes(self)

        monkeypatch.setattr(Path, "read_bytes", refused)
    else:
        path.write_bytes(damage)


@pytest.mark.parametrize("damage", KEPT_PROFILE_DAMAGE.values(), ids=KEPT_PROFILE_DAMAGE.keys())
def test_a_kept_profile_unreadable_in_any_way_plans_training_with_the_defaults_and_warns_once(
        damage, tmp_path, monkeypatch, caplog):
    """However the profile attnkit keeps fails to read, training plans with the documented defaults (a read the OS
    refused stopped it before), and a process that plans many models (an experiment's arms, a tutorial's cells) is
    told once (it was told at every plan)."""
    from attnkit.machine import PROFILE_ENV, default_profile_path

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = default_profile_path()
    _damage(kept, damage, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="attnkit.train.plan"):
        plans = [plan_training(_decoder(), family="decoder", device="cpu", dtype="bf16") for _ in range(3)]
    assert all("documented defaults: the kept profile is unreadable" in plan.explain() for plan in plans)
    warnings = [record for record in caplog.records if record.name == "attnkit.train.plan"]
    assert len(warnings) == 1 and str(kept) in warnings[0].getMessage(), [r.getMessage() for r in warnings]


def test_the_training_and_decoding_plans_take_one_rule_for_whose_profile_is_unreadable(tmp_path, monkeypatch):
    """A profile under attnkit's cache is attnkit's, even when $ATTNKIT_PROFILE names it: the decoding plan measures
    it again and training plans without it (training refused it before). One elsewhere is the user's: both refuse
    it naming the file."""
    from attnkit.generate import tune
    from attnkit.generate.plan import plan_inference
    from attnkit.machine import DEFAULT_PROFILE, PROFILE_ENV, CpuCapabilities

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    measured = dataclasses.replace(DEFAULT_PROFILE, cpu=CpuCapabilities.detect(), torch_version=torch.__version__)
    monkeypatch.setattr(tune, "tune", lambda **kw: (measured, []))  # measuring again, without the seconds it takes
    ours = tmp_path / "cache" / "attnkit" / "profiles" / "pinned.json"
    theirs = tmp_path / "mine" / "profile.json"
    for path in (ours, theirs):
        path.parent.mkdir(parents=True)
        path.write_text('{"version": 2}')
    monkeypatch.setenv(PROFILE_ENV, str(ours))
    assert "documented defaults" in plan_training(_decoder(), family="decoder", device="cpu", dtype="bf16").explain()
    plan_inference(_decoder(), "decoder")
    assert json.loads(ours.read_text())["version"] == json.loads(measured.to_json())["version"]  # measured again
    monkeypatch.setenv(PROFILE_ENV, str(theirs))
    for plan in (lambda: plan_training(_decoder(), family="decoder", device="cpu", dtype="bf16"),
                 lambda: plan_inference(_decoder(), "decoder")):
        with pytest.raises(InputError, match=re.escape(str(theirs))):
            plan()


def test_the_decoding_plan_measures_again_a_kept_profile_whose_read_the_os_refuses(tmp_path, monkeypatch):
    """As it measures a damaged one again (it stopped with the OS's error before)."""
    from attnkit.generate import tune
    from attnkit.generate.plan import plan_inference
    from attnkit.machine import DEFAULT_PROFILE, PROFILE_ENV, CpuCapabilities, default_profile_path

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    profile = dataclasses.replace(DEFAULT_PROFILE, cpu=CpuCapabilities.detect(), torch_version=torch.__version__)
    monkeypatch.setattr(tune, "tune", lambda **kw: measured.append(kw) or (profile, []))
    _damage(default_profile_path(), None, monkeypatch)
    plan_inference(_decoder(), "decoder")
    assert len(measured) == 1
