"""The training plan: how a training step runs, chosen from the model, the device, the dtype, what is installed and
the user's options, with the reason for each choice (`attnkit train --explain`). The trainer asks the plan; no
device checks are scattered through `train/`.

    plan_training(model, family=..., device=..., dtype=..., compile=...)  ->  TrainingPlan  (decides; changes nothing)
    plan.explain()                  the choices and why
    plan.prepare(model)             the model's loss path and attention kernel set, in place (before any wrapping)
    plan.compiled(module, model)    what to train through: `module` compiled whole, `model`'s blocks compiled, or
                                    `module` as it is
    plan.to_device(batch)           a batch on the device: pinned and copied without waiting, on a GPU
    plan.matmul_precision()         a context: TF32 for fp32 products on a GPU, while training

The choices (nanoGPT's train.py and torchtitan on a GPU; the CPU's own where they differ):

    loss            plain when compiled whole (inductor fuses the output product with its cross-entropy), or where
                    the logits fit in a quarter of free GPU memory (the faster path: on an H200 at GPT-2's shape,
                    eager, 48 ms a step against 78 ms fused); else fused (Liger Kernel, CUDA, where installed: no
                    logits kept), else chunked (`layers/chunked_loss.py`), its chunk sized from free memory; chunked
                    on a CPU, where memory is the scarce part
    vocabulary      the plain path's product padded to a multiple of 64 on a GPU (outputs and checkpoints unchanged)
    compilation     auto: the whole model on a GPU (fullgraph: the Transformer families trace without graph breaks),
                    eager on a CPU; model or blocks when asked; never a recurrent family (Dynamo does not trace
                    nn.RNN, nn.GRU or nn.LSTM); blocks under FSDP2 (each block is a shard unit); under DDP the
                    whole model without fullgraph (DDPOptimizer splits it at the gradient buckets)
    optimizer       AdamW, fused (`train/optim.py`)
    matmul          TF32 for fp32 products on a GPU
    float8          on request (--float8), where the GPU has float8 tensor cores (Hopper, Ada) and torchao is installed:
                    the blocks' linear layers multiply in float8 with dynamic scaling (torchao's float8 training)
    attention       per variant, said as each layer takes it (`Attention.kernel_path`): on a GPU, FlexAttention
                    for a position bias or mask SDPA would take only as a dense (T, S) bias, off its flash kernel
                    (ALiBi, sliding windows, packed documents), and for tanh soft-capping, which SDPA cannot compute
                    (the reference path does off a GPU), SDPA's own kernel for plain causal attention, the reference
                    path for what neither expresses (Shaw's value term and the additive and bilinear scores read the
                    weights); on a CPU, SDPA (with a dense bias for ALiBi, windows and packed documents) or plain
                    float32 products where the machine's profile measured them faster: FlexAttention has no backward
                    on the CPU in torch 2.13, so it is refused there (--attention-kernel flex), and serves forward
                    passes only; a padded task's batches (classify, tag, translate: `padded`) bring their attention
                    mask, which SDPA takes as a dense bias, and the plan asks the layers for such a pass
    data            pinned host memory and non-blocking copies on a GPU
    host reads      the loss and gradient norm read every `log_every` steps on a GPU (and before every evaluation and
                    checkpoint), where a read would wait for the device; every step on a CPU

Tests build plans for CUDA without one by passing `device="cuda"` and `free_memory=`: a plan changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from attnkit.blocks import attention_kernels, compile_blocks
from attnkit.errors import ConfigError, InputError
from attnkit.layers.attention import Attention
from attnkit.layers.kernels import MathKernel, use_flex_attention, use_math_kernel
from attnkit.layers.output_loss import LossPath, fused_kernel_missing, use_loss_path
from attnkit.layers.positions import ALiBi
from attnkit.machine import DEFAULT_PROFILE, Profile, default_profile_path, kept_by_attnkit, load_profile
from attnkit.plans import Choice, attention_choice, explain_choices
from attnkit.train.distributed import collective_backend

log = logging.getLogger(__name__)

TrainCompile = Literal["auto", "off", "model", "blocks"]
TRAIN_COMPILE: tuple[str, ...] = get_args(TrainCompile)
TrainAttention = Literal["auto", "sdpa", "flex"]
TRAIN_ATTENTION: tuple[str, ...] = get_args(TrainAttention)
GPU_VOCAB_MULTIPLE = 64  # nanoGPT's 50,304 for GPT-2's 50,257: matrix kernels favour widths in multiples of 64
CPU_LOSS_CHUNK = 256  # tokens per chunk of the chunked loss on a CPU (`chunked_loss.py`'s default)
RECURRENT_FAMILIES = ("recurrent-lm", "recurrent-seq2seq")


@dataclass(frozen=True)
class TrainingPlan:
    """What the trainer does (see the module docstring), and the reasons, as `explain` prints them."""

    device: torch.device
    dtype: str
    loss: LossPath
    compile: Literal["off", "model", "blocks"]
    fullgraph: bool
    math_kernel: MathKernel | None
    flex_attention: bool  # FlexAttention for the variants it expresses (`layers/kernels.py`)
    tf32: bool
    float8: bool
    pin_memory: bool
    sync_every: int  # optimizer steps between host reads of the loss and gradient norm
    choices: tuple[Choice, ...]

    def explain(self) -> str:
        return explain_choices(f"training plan for {self.dtype} on {self.device}", self.choices)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Set the loss path and the attention kernel on `model` (the module forward runs on), in place."""
        use_loss_path(model, self.loss)
        use_math_kernel(model, self.math_kernel)
        use_flex_attention(model, self.flex_attention)
        if self.float8:
            from torchao.float8 import convert_to_float8_training

            convert_to_float8_training(model, module_filter_fn=_float8_layer)
        return model

    def compiled(self, module: nn.Module, model: nn.Module) -> nn.Module:
        """What to train through: `module` (the model, or its DDP wrapper) compiled whole; or `model`'s blocks
        compiled in place and `module` returned; or `module` as it is."""
        if self.compile == "model":
            return torch.compile(module, fullgraph=self.fullgraph)
        if self.compile == "blocks":
            compile_blocks(model)
        return module

    def to_device(self, batch: Any) -> Any:
        """`batch` (tensors, or tuples, lists, dicts and dataclasses of them) on the plan's device; from pinned host
        memory without waiting on a GPU, so the copy overlaps the step before it."""
        if self.device.type == "cpu":
            return batch
        return _map_tensors(batch, lambda t: (t.pin_memory() if self.pin_memory and t.device.type == "cpu" else t).to(
            self.device, non_blocking=self.pin_memory))

    @contextmanager
    def matmul_precision(self):
        """TF32 for fp32 matrix products while training on a GPU (torch's setting restored after)."""
        before = torch.get_float32_matmul_precision()
        if self.tf32:
            torch.set_float32_matmul_precision("high")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)


def plan_training(
    model: nn.Module,
    *,
    family: str,
    device: torch.device | str,
    dtype: str = "fp32",
    compile: str = "auto",
    log_every: int = 10,
    batch_tokens: int = 0,
    sharded: bool = False,
    float8: bool = False,
    free_memory: int | None = None,
    capability: tuple[int, int] | None = None,
    attention: str = "auto",
    packed: bool = False,
    padded: bool = False,
    ranks: int = 1,
) -> TrainingPlan:
    """Decide how `model` of `family` trains on `device` in `dtype` (see the module docstring).

    batch_tokens: tokens of one micro-batch (B * T), which size the logits; sharded: FSDP2; float8: asked for (a
    ConfigError where it cannot run); free_memory: bytes free on a GPU, capability: its compute capability (default:
    what CUDA reports); attention: the attention kernel asked for (auto, sdpa, flex: a ConfigError where FlexAttention
    cannot train this model here); packed: rows pack several documents (a document mask); padded: batches carry an
    attention mask over padded rows (the task's `padded`: classify, tag, translate); ranks: the processes
    training together (torchrun's WORLD_SIZE), under DDP, or FSDP2 where `sharded`.
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    head = _output_head(model)
    compile_choice, fullgraph, why_compile = _compilation(compile, family, on_gpu, sharded, ranks)
    departs = compile in ("model", "blocks") and compile != compile_choice  # an explicit request not followed
    choices = [_ranks(ranks, sharded, device), Choice("precision", dtype, _precision_note(dtype, sharded))]
    loss, why_loss = _loss_path(head, on_gpu, compile_choice == "model", batch_tokens, dtype, free_memory, device)
    choices.append(Choice("loss", _describe_loss(loss, head), why_loss))
    if head is not None and loss.kind == "plain":
        vocab = head.weight.shape[0]
        padded = -vocab % loss.vocab_multiple
        choices.append(Choice("vocabulary", f"{vocab} padded to {vocab + padded} for the product" if padded else
                              f"{vocab}, not padded", "GPU matrix kernels favour widths in multiples of 64; outputs "
                              "and checkpoints keep the real vocabulary" if on_gpu else "off the GPU padding only "
                              "adds work"))
    choices.append(Choice("compilation", _describe_compile(compile_choice, fullgraph), why_compile,
                          asked=f"--compile {compile}" if departs else None))
    choices.append(Choice("q/k/v", "one product over the concatenated weights", "one kernel forward and two backward "
                          "per layer where there were three and six; the weights stay q_proj, k_proj, v_proj")
                   if _has_attention(model) else Choice("q/k/v", "none", "no attention projections in this model"))
    choices.append(Choice("optimizer", "AdamW, fused", "one kernel per step for all tensors of a device (moments and "
                          "weights in one pass over memory); deterministic, so resuming stays bit for bit"))
    tf32 = on_gpu
    choices.append(Choice("matmul", "TF32 for fp32 products" if tf32 else "fp32 products in fp32",
                          "tensor cores for what autocast leaves in fp32 (nanoGPT does the same)" if tf32 else
                          "TF32 is a GPU format"))
    why_float8 = _float8(float8, device, dtype, capability)
    choices.append(Choice("float8", "the blocks' linear layers" if float8 else "off", why_float8))
    math_kernel, (fused, why_fused) = _attention(model, device, dtype)
    kernel, why_kernel = _flex(model, device, attention, packed)
    flex = kernel == "flex"
    if kernel != "sdpa":  # the layers take FlexAttention or the reference path: no measured CPU kernel
        math_kernel = None
    if _has_attention(model):  # as the layers will take it, with the plan's FlexAttention choice and reason
        attention_paths = attention_kernels(model, cached=False, training=True, flex=flex, packed=packed,
                                            padded=padded)
        choice = attention_choice(attention_paths, fused, why_fused)
        choices.append(Choice("attention", choice.choice, choice.why + (f"; {why_kernel}" if why_kernel else "")))
    else:
        choices.append(Choice("attention", fused, why_fused))
    choices.append(Choice("packing", "rows of whole documents, a document mask" if packed else "off",
                          "as asked (lm's --pack, chat's --pack-conversations): no token attends across documents, "
                          "positions restart at each" if packed
                          else "rows as the task draws them (lm: windows that run across documents; --pack packs "
                          "whole documents with a document mask)"))
    choices.append(Choice("data", "pinned, copied without waiting" if on_gpu else "as drawn",
                          "the next batch's copy overlaps the step before it" if on_gpu else
                          "batches are drawn into the memory the model reads"))
    sync_every = log_every if on_gpu else 1
    choices.append(Choice("host reads", f"every {sync_every} steps and before each evaluation and checkpoint"
                          if on_gpu else "every step", "reading the loss waits for the device to finish the step; "
                          "a non-finite loss or gradient norm is found at the next read, before anything is saved"
                          if on_gpu else "a read costs no wait on a CPU, and a non-finite step is never applied"))
    return TrainingPlan(device=device, dtype=dtype, loss=loss, compile=compile_choice, fullgraph=fullgraph,
                        math_kernel=math_kernel, flex_attention=flex, tf32=tf32, float8=float8, pin_memory=on_gpu,
                        sync_every=sync_every,
                        choices=tuple(choices))


def _compilation(compile: str, family: str, on_gpu: bool, sharded: bool, ranks: int) -> tuple[str, bool, str]:
    """What is compiled ("off", "model", "blocks"), whether as one graph, and why."""
    if compile not in TRAIN_COMPILE:
        raise ValueError(f"compile={compile!r} is not known; use one of {', '.join(TRAIN_COMPILE)}")
    if compile != "off" and family in RECURRENT_FAMILIES:
        return "off", False, ("Dynamo does not trace nn.RNN, nn.GRU or nn.LSTM (each is already one fused kernel "
                              "call); a recurrent model trains eagerly")
    if compile == "off":
        return "off", False, "as asked (--compile off)"
    if compile == "auto" and not on_gpu:
        return "off", False, ("on a CPU compiling is chosen only on request (--compile model or blocks): each shape "
                              "costs a compilation, seconds to tens of seconds, that short runs do not earn back "
                              "(python -m benchmarks train_plan measures the gain here)")
    if sharded and compile in ("auto", "model"):
        return "blocks", False, "FSDP2 shards each block: each is compiled as its own graph (torchtitan's choice)"
    if compile == "blocks":
        return "blocks", False, "as asked (--compile blocks): each block one graph, the embeddings and loss eager"
    asked = ", as asked" if compile == "model" else " (auto, on a GPU)"
    if ranks > 1:  # Dynamo takes DDP's forward apart, which fullgraph refuses
        return "model", False, ("through DDP, the graph split at DDP's gradient buckets (TorchDynamo's DDPOptimizer): "
                                "each bucket's all-reduce overlaps the rest of the backward; inductor fuses the "
                                "element-wise work between products" + asked)
    return "model", True, ("one graph for the forward with its loss and one for the backward (the Transformer "
                           "families trace without graph breaks): inductor fuses the element-wise work between "
                           "products" + asked)


def _float8(asked: bool, device: torch.device, dtype: str, capability: tuple[int, int] | None) -> str:
    """Why float8 is off, or how it runs; a ConfigError naming what is missing where it was asked for and cannot."""
    if not asked:
        return "not asked for (--float8: Hopper or Ada GPUs, bf16, torchao)"
    if device.type != "cuda":
        raise ConfigError(f"--float8 multiplies on a GPU's float8 tensor cores; this run trains on {device}: drop "
                          "--float8, or train on a Hopper or Ada GPU (--device cuda)")
    capability = capability or torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise ConfigError(f"--float8 needs float8 tensor cores (compute capability 8.9: Ada, Hopper); this GPU has "
                          f"{capability[0]}.{capability[1]}: drop --float8")
    if dtype != "bf16":
        raise ConfigError(f"--float8 works beside bf16 autocast (what it leaves unconverted runs in bf16); this run "
                          f"trains in {dtype}: add --dtype bf16")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError("--float8 trains through torchao, which is not installed: pip install 'attnkit[gpu]'")
    return ("torchao's float8 training: inputs, weights and gradients cast to float8 with a scale per tensor for "
            "each product (the embeddings and the output layer stay bf16)")


def _float8_layer(module: nn.Module, name: str) -> bool:
    """The linear layers float8 training converts: the blocks' (not the output layer), with sizes that float8
    products tile (multiples of 16)."""
    return (isinstance(module, nn.Linear) and name.startswith(("stack.", "encoder.", "decoder."))
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def _describe_compile(choice: str, fullgraph: bool) -> str:
    return {"off": "eager", "model": "whole model" + (", fullgraph" if fullgraph else ""),
            "blocks": "each block"}[choice]


def _output_head(model: nn.Module) -> nn.Linear | None:
    """The output projection whose loss the plan chooses (a plain linear layer without bias), or None."""
    for module in model.modules():
        if hasattr(module, "loss_path"):
            head = getattr(module, "lm_head", None)
            return head if type(head) is nn.Linear and head.bias is None else None
    return None


def _loss_path(
    head: nn.Linear | None, on_gpu: bool, compiled: bool, batch_tokens: int, dtype: str, free_memory: int | None,
    device: torch.device,
) -> tuple[LossPath, str]:
    if head is None:
        return LossPath("plain"), "the model's own loss (no bias-free output projection over a vocabulary)"
    vocab = head.weight.shape[0]
    if not on_gpu:
        return LossPath("chunked", chunk_size=CPU_LOSS_CHUNK), (
            f"no (B*T, {vocab}) logits held or differentiated in memory at once; on a CPU memory is the scarce part")
    padded = LossPath("plain", vocab_multiple=GPU_VOCAB_MULTIPLE)
    if compiled:
        return padded, "inductor fuses the output product with its cross-entropy inside the compiled graph"
    free = free_memory if free_memory is not None else torch.cuda.mem_get_info(device)[0]
    # the logits in the compute dtype, their fp32 copy for the softmax and its gradient: about 10 bytes a logit
    logit_bytes = 10 if dtype != "fp32" else 12
    needed = batch_tokens * (vocab + GPU_VOCAB_MULTIPLE) * logit_bytes
    if needed <= free // 4:  # measured on an H200 at GPT-2's shape: 48 ms a step plain, 78 ms fused (Liger)
        return padded, (f"the logits ({needed / 2**30:.1f} GiB) fit in a quarter of free memory "
                        f"({free / 2**30:.1f} GiB): plain is the faster path when memory allows")
    short = (f"the logits ({needed / 2**30:.1f} GiB) would take over a quarter of free memory "
             f"({free / 2**30:.1f} GiB)")
    missing = fused_kernel_missing()
    if missing is None:
        return LossPath("fused"), f"{short}: Liger Kernel's fused linear cross-entropy keeps no logits"
    chunk = max(CPU_LOSS_CHUNK, min(batch_tokens, free // 16 // max(vocab * logit_bytes, 1)))
    return LossPath("chunked", chunk_size=int(chunk)), (
        f"{short}: chunks of {chunk} tokens, sized to a sixteenth of it; {missing}")


def _describe_loss(loss: LossPath, head: nn.Linear | None) -> str:
    if head is None:
        return "plain"
    if loss.kind == "chunked":
        return f"chunked, {loss.chunk_size} tokens a chunk"
    return {"plain": "plain (logits, then cross-entropy)", "fused": "fused (Liger Kernel)"}[loss.kind]


def _ranks(ranks: int, sharded: bool, device: torch.device) -> Choice:
    """How the processes share the work (`distributed.py`)."""
    over = f"over {ranks} rank{'s' if ranks > 1 else ''} ({collective_backend(device)})"
    if sharded:
        return Choice("ranks", f"FSDP2 {over}", "as asked (--shard): each rank holds 1/N of every weight, gradient and "
                      "AdamW moment; a block's weights are all-gathered for its forward and backward, its gradients "
                      "reduce-scattered")
    if ranks > 1:
        return Choice("ranks", f"DDP {over}", "every rank holds the whole model and backward all-reduces the "
                      "gradients (the default; --shard splits weights, gradients and AdamW state: FSDP2)")
    return Choice("ranks", "one process", "not started by torchrun (WORLD_SIZE unset or 1); torchrun --nproc-per-node "
                  "N -m attnkit train ... trains on N")


def _precision_note(dtype: str, sharded: bool) -> str:
    if dtype == "bf16-master" and sharded:
        return ("FSDP2's mixed precision: the all-gathered weights are cast to bf16 for forward and backward, "
                "gradients reduced in fp32 into the fp32 shards AdamW updates")
    return {"fp32": "weights, activations and gradients in fp32",
            "bf16": "autocast: products in bf16, weights and optimizer state in fp32",
            "bf16-master": "a bf16 copy runs forward and backward; fp32 master weights take the updates"}[dtype]


def _attention_layers(model: nn.Module) -> list[Attention]:
    """The model's attention layers (self- and cross-attention; a recurrent model's attention is none of them)."""
    return [m for m in model.modules() if isinstance(m, Attention)]


def _has_attention(model: nn.Module) -> bool:
    return bool(_attention_layers(model))


def _attention(model: nn.Module, device: torch.device, dtype: str) -> tuple[MathKernel | None, tuple[str, str]]:
    """The CPU's measured kernel choice (None: SDPA), and what to print about attention."""
    if not _has_attention(model):
        return None, ("none", "a recurrent or convolutional model: a recurrent model's attention (if any) is the "
                              "lecture's explicit path")
    compute = torch.float32 if dtype == "fp32" else torch.bfloat16
    if device.type == "cuda":
        return None, ("SDPA, " + sdpa_backend(model, compute, device), "fused, keeps no (T, S) weights")
    profile, note = _profile()
    kernel = MathKernel.from_profile(device.type, compute, profile)
    if kernel is None:
        return None, ("SDPA (its fused CPU kernel)", f"fused, keeps no (T, S) weights; {note}")
    return kernel, (f"float32 products up to {kernel.limits.pass_keys} keys, SDPA beyond",
                    f"faster than SDPA there for short reduced-precision attention; {note}")


def _profile() -> tuple[Profile, str]:
    """The CPU's measured profile and what to say of it. One kept in attnkit's cache that this attnkit cannot read
    (written by an older version, damaged, or a read the OS refuses) plans training with the documented defaults and
    says why, once a process (`_say_once`): the decoding plan measures it again on its next start, and training
    never stops for it. One elsewhere ($ATTNKIT_PROFILE) is the user's: an InputError naming the file and the fix
    (`machine.kept_by_attnkit`, the rule the decoding plan keeps too)."""
    path = default_profile_path()
    try:
        return load_profile(path)
    except (InputError, OSError) as err:
        if not kept_by_attnkit(path):
            raise
        _say_once(f"{err}; training plans with the documented defaults meanwhile")
        return DEFAULT_PROFILE, f"documented defaults: the kept profile is unreadable ({err})"


@functools.cache
def _say_once(warning: str) -> None:
    """Log `warning` the first time this process has it: a process that trains many models (an experiment's arms, a
    tutorial's cells) plans each, and one unreadable profile is one warning."""
    log.warning(warning)


def _flex(model: nn.Module, device: torch.device, asked: str, packed: bool) -> tuple[str, str | None]:
    """The attention layers' kernel ("flex", "sdpa": SDPA or the measured CPU kernel, "reference") and why; for
    "sdpa" a note added to that kernel's own reason, or None (no attention layers, or SDPA asked for)."""
    if asked not in TRAIN_ATTENTION:
        raise ValueError(f"attention={asked!r} is not known; use one of {', '.join(TRAIN_ATTENTION)}")
    layers = _attention_layers(model)
    if not layers or asked == "sdpa":
        return "sdpa", None
    variant, cannot = _attention_variant(layers, packed)
    version = torch.__version__.split("+")[0]
    # what SDPA cannot compute at all goes to the reference path where FlexAttention does not take it
    without_flex = "reference" if any(layer.softcap is not None for layer in layers) else "sdpa"
    if asked == "flex" and device.type != "cuda":
        raise ConfigError(f"--attention-kernel flex trains through FlexAttention, which has no backward on the CPU "
                          f"in torch {version}: train with --attention-kernel auto or sdpa here, or on a GPU "
                          "(--device cuda)")
    if cannot:
        if asked == "flex":
            raise ConfigError(f"--attention-kernel flex: FlexAttention cannot express {cannot}: use "
                              "--attention-kernel auto")
        return "reference", f"neither SDPA nor FlexAttention expresses {cannot}"
    if any(layer.dropout > 0 for layer in layers):
        if asked == "flex":
            raise ConfigError("--attention-kernel flex: FlexAttention has no attention dropout: set "
                              "attention_dropout=0 or use --attention-kernel auto")
        return without_flex, "FlexAttention has no attention dropout"
    if variant is None:  # plain causal attention: the layers say so (`Attention.kernel_path`)
        return "sdpa", None
    if device.type != "cuda":
        return without_flex, (f"{variant} would go to FlexAttention on a GPU; on the CPU it has no backward (torch "
                              f"{version})" + (", and SDPA cannot soft-cap scores" if without_flex == "reference" else
                                               ", so SDPA takes it as a dense (T, S) bias"))
    return "flex", (f"FlexAttention for {variant} ({'as asked' if asked == 'flex' else 'auto, on a GPU'}): the bias as "
                  "a score_mod and the mask as a block mask built once per shape, one fused kernel that skips the "
                  "masked blocks, where SDPA would take a dense (T, S) bias and leave its flash kernel; plain causal "
                  "passes stay on SDPA")


def _attention_variant(layers: list[Attention], packed: bool) -> tuple[str | None, str | None]:
    """What beyond plain causal attention the layers compute ("ALiBi, a sliding window, packed documents"; None:
    nothing), and what of it FlexAttention cannot express (None: all of it)."""
    parts, cannot = [], []
    for layer in layers:
        if not layer.dot_score:  # the facts `Attention.kernel_path` reads, fixed at the layer's build
            cannot.append(f"the {layer.score_kind} score (not a dot product)")
        if layer.position_biases:
            name = "ALiBi" if isinstance(layer.relative, ALiBi) else "Shaw's relative positions (the value term)"
            (parts if layer.position_flex else cannot).append(name)
        if layer.window is not None:
            parts.append("a sliding window")
        if layer.softcap is not None:
            parts.append("tanh soft-capping")
    if packed:
        parts.append("packed documents")
    return ", ".join(dict.fromkeys(parts)) or None, ", ".join(dict.fromkeys(cannot)) or None


def sdpa_backend(model: nn.Module, dtype: torch.dtype, device: torch.device) -> str:
    """Which CUDA kernel SDPA takes for the model's self-attention in training (flash, cuDNN, memory-efficient or
    math), asked of PyTorch with the model's head shape; "backend chosen per call" where PyTorch cannot say."""
    if not torch.cuda.is_available():
        return "backend chosen per call (no CUDA device here to ask)"
    attention = _attention_layers(model)[0]
    if attention.position_biases or attention.window is not None:
        return "with a float mask (flash attention takes none): memory-efficient or math"
    shape = (1, attention.n_heads, 64, attention.head_dim)
    q = torch.empty(shape, dtype=dtype, device=device)
    kv = torch.empty((1, attention.n_kv_heads, 64, attention.head_dim), dtype=dtype, device=device)
    checks = (("flash", torch.backends.cuda.can_use_flash_attention),
              ("cuDNN", torch.backends.cuda.can_use_cudnn_attention),
              ("memory-efficient", torch.backends.cuda.can_use_efficient_attention))
    try:
        params = torch.backends.cuda.SDPAParams(q, kv, kv, None, 0.0, True, attention.n_kv_heads != attention.n_heads)
        return next((f"{name} kernel" for name, usable in checks if usable(params, False)), "math kernel")
    except (TypeError, RuntimeError, AttributeError):
        return "backend chosen per call"


def _map_tensors(value: Any, fn) -> Any:
    """`value` with `fn` applied to every tensor in it (tuples, lists, dicts and dataclasses walked)."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _map_tensors(getattr(value, f.name), fn)
                                             for f in dataclasses.fields(value) if f.init})
    return value
