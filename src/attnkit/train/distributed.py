"""Data-parallel training over several processes with PyTorch's own engine: `torchrun` starts one process per
GPU (or CPU share), each a rank r of N, and DistributedDataParallel or FSDP2 keeps them in step.

    torchrun --nproc-per-node N -m attnkit train ...            DDP: every rank holds the whole model; backward
                                                                all-reduces (averages) the gradients
    torchrun --nproc-per-node N -m attnkit train --shard ...    FSDP2 (`fully_shard`, ZeRO-3): each rank holds 1/N
                                                                of every weight, gradient and AdamW moment; a block's
                                                                weights are all-gathered for its forward and backward,
                                                                its gradients reduce-scattered

Backend: nccl on CUDA (rank r uses GPU `LOCAL_RANK`), gloo on the CPU. `SingleProcess` is the same interface for
one process, so the trainer has one code path.

Batches. A step's global batch is the batch one process would draw with `batch_size x N` sequences, from the same
seed (the task is built with that batch size); rank r keeps its rows [r*B, (r+1)*B). Every rank draws the same
global batch and trains on its own rows, so the ranks' rows are distinct and fixed by the seed and the rank, the
data position is the same on every rank (resuming needs no per-rank data state), and N ranks x B follow the loss
curve of 1 process x N*B, up to the order of float sums. Drawing is cheap next to a step (token ids, not
activations). Each rank's loss is weighted by its targets over all ranks' targets, times N (DDP and FSDP average
over ranks), so the gradient is that of the mean loss over the global batch, as in one process. With
`grad_accum`, micro-batches before the last skip the gradient all-reduce (`no_sync`,
`set_requires_gradient_sync(False)`); gradients accumulate locally and the last backward reduces their sum.

Checkpoints. Rank 0 writes today's single-process files (`model.safetensors`, `optimizer.safetensors`): under FSDP2
the shards are gathered with `get_model_state_dict` / `get_optimizer_state_dict` (full_state_dict, cpu_offload)
into a CPU copy of the model kept on rank 0; under DDP rank 0's replica is the model. Every rank's RNG state
(dropout) is saved beside rank 0's. So a run resumes under N ranks bit for bit, under another count of ranks (the
global batch changes; a warning says so) and in a single process (`attnkit generate`, `--resume`).

Stopping and failures. Ranks agree every step on a signal (on any rank) and on the time budget, so all stop
after the same step and save once, together. A collective waits `dist_timeout` seconds at most; a rank that dies
makes torchrun stop the others and name it, and the last checkpoint stays as it was (writes are atomic). Ranks
that never all join (one not started, a wrong MASTER_ADDR:MASTER_PORT) stop after `dist_timeout` seconds, saying so.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from attnkit.blocks import TransformerBlock
from attnkit.checkpoint import load_weights, unique_state_dict
from attnkit.errors import AttnkitError, ConfigError
from attnkit.tasks.common import take_rows
from attnkit.train.optim import make_optimizer
from attnkit.train.precision import Autocast, FullPrecision, make_precision
from attnkit.train.state import capture_rng, load_optimizer_tensors, restore_rng, seed_all

log = logging.getLogger(__name__)
T = TypeVar("T")

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only


def no_forward_buffer_sync(ddp_init: Any = DistributedDataParallel.__init__) -> dict[str, bool]:
    """DDP's keyword that stops it broadcasting buffers before every forward: `forward_sync_buffers=False` where
    torch has it (2.13 renamed the setting), else `broadcast_buffers=False` (which also leaves the buffers out of
    the sync at construction: attnkit's buffers are tables every rank computes alike)."""
    if "forward_sync_buffers" in inspect.signature(ddp_init).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class RankLost(AttnkitError):
    """A collective failed: another rank died, or did not answer within `dist_timeout`."""


@dataclass(frozen=True)
class World:
    """This process's place among the ranks, as torchrun (or a scheduler) sets it in RANK, LOCAL_RANK, WORLD_SIZE."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @classmethod
    def from_env(cls) -> World:
        """The launcher's variables (torchrun's interface, not a switch of ours); one process when absent. A value
        that is no whole number, WORLD_SIZE below 1, or a rank outside 0..WORLD_SIZE-1 is one ConfigError naming the
        variables as they are set."""
        env = os.environ
        given = {name: env.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if env.get(name) is not None}
        shown = ", ".join(f"{name}={value!r}" for name, value in given.items())
        fix = ("these variables are set by torchrun for each process it starts: launch with torchrun, or unset them "
               "to train in one process")
        try:
            values = {name: int(value) for name, value in given.items()}
        except ValueError:
            raise ConfigError(f"the distributed launch variables are not whole numbers ({shown}); {fix}") from None
        world = cls(values.get("RANK", 0), values.get("LOCAL_RANK", 0), values.get("WORLD_SIZE", 1))
        if world.size < 1 or not 0 <= world.rank < world.size or world.local_rank < 0:
            raise ConfigError(f"the distributed launch variables do not describe a process among the ranks ({shown}: "
                              f"WORLD_SIZE must be at least 1 and 0 <= RANK < WORLD_SIZE); {fix}")
        return world

    def device(self, device: torch.device) -> torch.device:
        """Rank r's device: its own GPU (cuda:LOCAL_RANK) when `device` is CUDA without an index."""
        if device.type == "cuda" and device.index is None and self.size > 1:
            return torch.device("cuda", self.local_rank)
        return device


class SingleProcess:
    """One process: the interface `Replicated` and `Sharded` implement, doing nothing distributed."""

    kind = "single process"
    shards = False  # FSDP2: each rank holds a share of the weights (`Sharded`)

    def __init__(self, world: World = World(), device: torch.device | str = "cpu") -> None:
        self.rank, self.size, self.device = world.rank, world.size, torch.device(device)

    @property
    def writes(self) -> bool:
        """Whether this rank logs, prints and writes files (rank 0)."""
        return self.rank == 0

    def precision(self, dtype: str, model: nn.Module) -> FullPrecision:
        return make_precision(dtype, model)

    def wrap(self, model: nn.Module, *, dtype: str, seed: int) -> nn.Module:
        """The module to train through (`model`'s parameters stay the ones the optimizer updates)."""
        return model

    def share(self, batch: Any) -> tuple[Any, int]:
        """This rank's rows of a global batch, and 1 if they count (0: a stand-in row, see `Replicated.share`)."""
        return batch, 1

    def sync(self, model: nn.Module, *, last: bool) -> AbstractContextManager:
        """Entered around each micro-batch's forward and backward; gradients are reduced on the `last` only."""
        return nullcontext()

    def sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks."""
        return list(values)

    def max(self, *values: float) -> list[float]:
        """Each value's maximum over the ranks."""
        return list(values)

    def barrier(self) -> None:
        """Wait until every rank is here."""

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> Tensor:
        """Clip the gradients of all ranks together; returns the norm before clipping (a 0-dim tensor on the device:
        the trainer reads it when its plan says)."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def full_copy(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer] | None:
        """A whole model and optimizer to save on rank 0 (None on the other ranks)."""
        return (model, optimizer) if self.writes else None

    def load_optimizer(self, optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], *, source: str) -> None:
        """Put a saved optimizer state (`state.optimizer_tensors`, whole tensors) into `optimizer`."""
        load_optimizer_tensors(optimizer, tensors, source=source)

    def rng_states(self) -> list[dict[str, Any]]:
        """Every rank's RNG states (`state.capture_rng`), rank 0's first."""
        return [capture_rng()]

    def restore_rng(self, state: dict[str, Any], *, seed: int) -> None:
        """Restore this rank's RNG from a train_state (`rng`: rank 0's, `rank_rng`: the others'); a rank the saved
        run did not have starts its own stream from `seed + rank`."""
        saved = [state["rng"], *state.get("rank_rng", [])]
        if self.rank < len(saved):
            restore_rng(saved[self.rank])
        else:
            seed_all(seed + self.rank)

    def check_same(self, value: str, what: str) -> None:
        """Raise ConfigError unless every rank has the same `value` (a fingerprint of `what`)."""

    def made_on_rank_0(self, make: Callable[[], T], *, what: str, beforehand: str) -> T:
        """`make()` run on rank 0 alone, and its result (or the error it raised) on every rank: for what the ranks
        must share and that is built once rather than on every rank (the tokenizer trained on the whole corpus, an LM
        corpus's token cache). The other ranks wait `dist_timeout` seconds at most: past it, every rank stops with a
        ConfigError naming `what` and how to build it `beforehand`. A fault of rank 0's own that is no AttnkitError (a
        full disk, a bug) is raised as it is there, and as a ConfigError naming it on the other ranks."""
        return make()

    def lost(self, err: RuntimeError, *, saved_step: int, run_dir: Any) -> RankLost | None:
        """The error to raise for `err` if it is a failed collective (None: `err` is something else)."""
        return None

    def resume_command(self, run_dir: Any) -> str:
        """The command that continues the run in `run_dir` on as many ranks (the same global batch)."""
        return f"attnkit train --out {run_dir} --resume"

    def stopped_status(self, signum: int) -> int:
        """The exit status of a run a signal stopped after a step, its checkpoint saved: 128 + signum, as a shell
        reports a signalled command and a scheduler reads it (a SIGTERM before preemption), except for a rank torchrun
        started (it sets TORCHELASTIC_RUN_ID), which exits 0: torchrun reads any other status as the rank's failure,
        stops the other ranks mid-save with SIGTERM, reports the job failed and restarts it where --max-restarts
        allows. Every rank stops after the same step when any of them is signalled (`Trainer.fit`)."""
        return 0 if os.environ.get("TORCHELASTIC_RUN_ID") else 128 + signum

    def describe(self, batch_size: int, grad_accum: int, lr: float, *, batch_tokens: int | None = None) -> str:
        """The global batch and learning rate, said once at the start (`batch_tokens`: batches of about that many
        tokens per rank instead of `batch_size` sequences)."""
        return ""


class Replicated(SingleProcess):
    """DistributedDataParallel: every rank holds the whole model and all-reduces gradients in backward."""

    kind = "DDP"

    def __init__(self, world: World, device: torch.device | str, *, timeout: float = 600.0) -> None:
        super().__init__(world, device)
        self.backend, self.timeout = collective_backend(self.device), timeout

    def precision(self, dtype: str, model: nn.Module) -> FullPrecision:
        if dtype == "bf16-master":
            raise ConfigError(
                "--dtype bf16-master keeps fp32 master weights beside a bf16 copy, whose gradients DDP would reduce in "
                "bf16 and only for the last micro-batch; with several ranks use --shard (FSDP2 computes in bf16 from "
                "fp32 master shards and reduces gradients in fp32) or --dtype bf16 (autocast)"
            )
        return make_precision(dtype, model)

    def wrap(self, model: nn.Module, *, dtype: str, seed: int) -> nn.Module:
        # DDP broadcasts rank 0's weights and buffers at construction; buffers (position tables) are constants, so
        # not before every forward
        ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids, **no_forward_buffer_sync())
        if self.rank > 0:
            seed_all(seed + self.rank)  # each rank its own dropout masks; rank 0 keeps a single process's stream
        return wrapped

    def share(self, batch: Any) -> tuple[Any, int]:
        """Rows [r*n/N, (r+1)*n/N) of a batch of n rows: [r*B, (r+1)*B) of a full global batch of N*B rows.

        A global batch smaller than N (the end of an epoch) leaves some ranks without rows: such a rank takes the
        batch's last row and counts it 0 times, since every rank must run backward for the all-reduce.
        """
        n = _rows(batch)
        start, stop = self.rank * n // self.size, (self.rank + 1) * n // self.size
        if start == stop:
            return take_rows(batch, slice(n - 1, n)), 0
        return take_rows(batch, slice(start, stop)), 1

    def sync(self, model: nn.Module, *, last: bool) -> AbstractContextManager:
        return nullcontext() if last else model.no_sync()

    def sum(self, *values: float) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, *values: float) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: Sequence[float], op: dist.ReduceOp) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def barrier(self) -> None:
        dist.barrier()

    def rng_states(self) -> list[dict[str, Any]]:
        states: list[Any] = [None] * self.size
        dist.all_gather_object(states, capture_rng())
        return states

    def check_same(self, value: str, what: str) -> None:
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, value)
        if len(set(values)) > 1:
            raise ConfigError(
                f"the ranks built different {what}s (fingerprints {values}); give every rank the same files, or a "
                f"saved {what} (e.g. --tokenizer DIR)"
            )

    def made_on_rank_0(self, make: Callable[[], T], *, what: str, beforehand: str) -> T:
        made: list[Any] = [None]
        failure = None  # rank 0's own fault (a full disk, a bug), which it raises as it is once the others know
        if self.rank == 0:
            try:
                made[0] = (make(), None)
            except AttnkitError as err:  # every rank stops with rank 0's error, none waits for a result
                made[0] = (None, err)
            except Exception as err:
                failure = err
                made[0] = (None, ConfigError(f"rank 0 failed to make {what} ({type(err).__name__}: {err}); rank "
                                             "0's traceback names the cause"))
        try:
            dist.broadcast_object_list(made, src=0, device=self.device)
        except RuntimeError as err:  # nccl's DistError or gloo's: a rank waited past dist_timeout, or one died
            if failure is not None:
                raise failure from None
            raise ConfigError(
                f"rank {self.rank}: the other ranks waited for {what} that rank 0 builds, and the wait failed "
                f"({str(err).splitlines()[0]}): building it took longer than --dist-timeout {self.timeout:g} s, or "
                f"a rank died. {beforehand}, or give a longer --dist-timeout") from None
        if failure is not None:
            raise failure
        value, err = made[0]
        if err is not None:
            raise err
        return value

    def lost(self, err: RuntimeError, *, saved_step: int, run_dir: Any) -> RankLost | None:
        # nccl raises DistError; gloo, when a peer's connection closes, a RuntimeError from its transport
        if not (isinstance(err, dist.DistError) or "gloo" in str(err)):
            return None
        kept = f"The last checkpoint (step {saved_step}) in {run_dir} is intact" if saved_step >= 0 else (
            "No checkpoint had been written yet")
        return RankLost(
            f"rank {self.rank}: a collective with the other ranks failed ({str(err).splitlines()[0]}); another rank "
            f"died or did not answer within {self.timeout:g} s (torchrun's summary names the rank that failed). "
            f"{kept}; resume with: {self.resume_command(run_dir)}"
        )

    def resume_command(self, run_dir: Any) -> str:
        command = super().resume_command(run_dir)
        if os.environ.get("LOCAL_WORLD_SIZE") == str(self.size):  # torchrun's, every rank on this machine
            return f"torchrun --nproc-per-node {self.size} -m {command}"
        return f"the same launch of {self.size} ranks, with {command}"

    def describe(self, batch_size: int, grad_accum: int, lr: float, *, batch_tokens: int | None = None) -> str:
        parts = f"x {grad_accum} micro-batches x {self.size} ranks"
        batch = (f"global batch {batch_size * grad_accum * self.size} sequences per step ({batch_size} per "
                 f"micro-batch {parts})") if batch_tokens is None else (
            f"global batch of up to {batch_tokens * grad_accum * self.size} tokens per step ({batch_tokens} per "
            f"rank's micro-batch {parts})")
        return (f"{self.kind} over {self.size} ranks ({self.backend}): {batch}; learning rate {lr:g} as given (not "
                "scaled with the number of ranks)")


class Sharded(Replicated):
    """FSDP2: `fully_shard` on every transformer block, then on the whole model (embeddings, final norm, head)."""

    kind = "FSDP2"
    shards = True

    def __init__(self, world: World, device: torch.device | str, *, timeout: float = 600.0) -> None:
        super().__init__(world, device, timeout=timeout)
        self._copy: nn.Module | None = None  # rank 0: what the shards are gathered into to be saved (see `wrap`)

    def precision(self, dtype: str, model: nn.Module) -> FullPrecision:
        # bf16-master is FSDP's own mixed precision (see `wrap`): no second copy of the model
        return Autocast(model) if dtype == "bf16" else FullPrecision(model)

    def wrap(self, model: nn.Module, *, dtype: str, seed: int) -> nn.Module:
        """Shard `model` in place. bf16-master: all-gathered weights are cast to bf16 for forward and backward,
        gradients reduced in fp32 into the fp32 shards AdamW updates (master weights, Micikevicius et al. 2018)."""
        self._copy = _cpu_copy(model) if self.writes else None
        master = dtype == "bf16-master"
        # the blocks' inputs are cast by a hook of ours: FSDP's own cast rebuilds every dataclass it meets, and the
        # attention mask (with the forms it has built) is not one to rebuild
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                      cast_forward_inputs=False) if master else MixedPrecisionPolicy()
        for module in model.modules():
            if isinstance(module, TransformerBlock):
                fully_shard(module, mp_policy=policy)
                if master:
                    module.register_forward_pre_hook(_cast_to_bf16, with_kwargs=True)
        fully_shard(model, mp_policy=policy)
        for method in ("encode", "decode"):  # translation evaluation decodes through these, not forward
            if callable(getattr(model, method, None)):
                register_fsdp_forward_method(model, method)
        if self.rank > 0:
            seed_all(seed + self.rank)
        return model

    def sync(self, model: nn.Module, *, last: bool) -> AbstractContextManager:
        model.set_requires_gradient_sync(last)
        return nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> Tensor:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm  # the shards' norms combined

    def full_copy(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer] | None:
        weights = get_model_state_dict(model, options=_FULL)  # every rank takes part; rank 0 receives
        moments = get_optimizer_state_dict(model, optimizer, options=_FULL)
        if self._copy is None:
            return None
        kept = unique_state_dict(self._copy)  # tied weights once, under their first name
        load_weights(self._copy, {name: weights[name] for name in kept}, source="the gathered shards")
        tensors = {f"{name}/{key}": value for name, state in moments["state"].items() for key, value in state.items()}
        saved_optimizer = make_optimizer(self._copy, lr=1.0, weight_decay=0.0)  # only its state is saved
        load_optimizer_tensors(saved_optimizer, tensors, source="the gathered optimizer shards")
        return self._copy, saved_optimizer

    def load_optimizer(self, optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], *, source: str) -> None:
        """Whole tensors (read by every rank) cut into this rank's shards, locally (`src_data_rank=None`)."""
        load_optimizer_tensors(optimizer, tensors, source=source)
        for param, state in optimizer.state.items():
            if isinstance(param, DTensor):
                for key, value in state.items():
                    if key != "step":
                        state[key] = distribute_tensor(
                            value.to(self.device), param.device_mesh, param.placements, src_data_rank=None
                        )


def start(world: World, *, shard: bool, timeout: float, device: torch.device) -> SingleProcess:
    """Join the other ranks (torchrun's MASTER_ADDR / MASTER_PORT rendezvous) when there are several, else one process.

    nccl on CUDA, gloo on the CPU; every collective fails after `timeout` seconds.
    """
    if world.size == 1:
        return SingleProcess(world, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        address = _rendezvous_address(world)
        try:
            dist.init_process_group(
                collective_backend(device), timeout=timedelta(seconds=timeout),
                device_id=device if device.type == "cuda" else None,
            )
        except dist.DistError as err:  # the store's wait for the others (rank 0) or for rank 0 (the others) ran out
            raise RankLost(
                f"rank {world.rank}: the ranks did not all join at {address} within {timeout:g} s "
                f"({str(err).splitlines()[0]}); start all WORLD_SIZE={world.size} ranks together (one torchrun "
                "command per machine, the same --rdzv-endpoint or MASTER_ADDR:MASTER_PORT on each), or give them "
                "longer with --dist-timeout"
            ) from None
    return (Sharded if shard else Replicated)(world, device, timeout=timeout)


def quiet_other_ranks(world: World) -> None:
    """Ranks other than 0 log errors only, from the start: what every rank would say alike (a changed setting on
    resume, a fallback), rank 0 says once. A rank's own failure still ends it with its message (`RankLost`)."""
    if world.rank > 0:
        logging.getLogger("attnkit").setLevel(logging.ERROR)


def refuse_rank_options(world: World, given: Mapping[str, Any]) -> None:
    """A ConfigError for an option of several ranks set (`given`: the training settings the user gave) in one
    process, where --shard would train unsharded and --dist-timeout bound no wait, both in silence. A saved run's
    own settings are not given: a run trained with --shard resumes in one process."""
    if world.size > 1:
        return
    for name, flag in (("shard", "--shard"), ("dist_timeout", "--dist-timeout")):
        if given.get(name, False) is not False:
            size = os.environ.get("WORLD_SIZE")
            raise ConfigError(
                f"{flag} applies to several processes, and this is one process (WORLD_SIZE "
                f"{'unset' if size is None else size}): launch with torchrun --nproc-per-node N (N >= 2) -m attnkit "
                f"train ..., or drop {flag}"
            )


def _rendezvous_address(world: World) -> str:
    """MASTER_ADDR:MASTER_PORT, where rank 0 waits for the others (torchrun sets both); a ConfigError naming what is
    missing or malformed."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    missing = [name for name, value in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if not value]
    if missing or not port.isdigit() or not 0 < int(port) < 65536:
        problem = f"{' and '.join(missing)} unset" if missing else f"MASTER_PORT={port!r} is no port number"
        raise ConfigError(
            f"WORLD_SIZE={world.size} and RANK={world.rank} ask for several processes, but {problem}: torchrun sets "
            "MASTER_ADDR and MASTER_PORT for every rank it starts; launch with torchrun, or export both (rank 0's "
            "address and a free port) beside RANK and WORLD_SIZE, or unset RANK and WORLD_SIZE to train in one process"
        )
    return f"{addr}:{port}"


def collective_backend(device: torch.device) -> str:
    """The process group's backend for `device`: nccl on CUDA, gloo on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


# Batches as rows -----------------------------------------------------------------------------------------------
def _rows(batch: Any) -> int:
    first = batch[0] if isinstance(batch, tuple) else getattr(batch, dataclasses.fields(batch)[0].name)
    return int(first.shape[0])


def _cast_to_bf16(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block's floating-point inputs (the residual stream (B, T, C), an encoder's output, rotary tables) in bf16,
    its weights' dtype under FSDP2's mixed precision; other objects (the mask: ids and flags) pass as they are."""

    def cast(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value.to(torch.bfloat16) if value.is_floating_point() else value
        if type(value) in (tuple, list):
            return type(value)(cast(item) for item in value)
        if type(value) is dict:
            return {key: cast(item) for key, item in value.items()}
        return value

    return cast(args), cast(kwargs)


def _cpu_copy(model: nn.Module) -> nn.Module:
    """A CPU copy of `model`'s structure (tied weights stay tied) with uninitialised weights: no copy of the weights
    on the accelerator (the memo trick of `precision.MasterWeights`)."""
    memo = {id(p): nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad) for p in model.parameters()}
    return copy.deepcopy(model, memo).cpu()
