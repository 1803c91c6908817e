"""Speed and memory, attnkit side by side with Hugging Face `transformers`, on the same machine in the same run.

    python -m benchmarks speed [--only CASE ...] [--dtypes fp32 bf16] [--repeats 5] [--rounds 3] [--threads 1]
                               [--device cpu | cuda] [--compiled] [--peers] [--machine NAME] [--update]
                               [--isa avx2]

Each implementation runs in a process of its own (so peak resident memory is that case's alone), with warm-up steps.
Generation rows are held side by side and take turns, one timed repetition each, the order reversing every turn,
--repeats x --rounds turns in all; each reports its median repetition, and a ratio is the median of the turns' own
ratios, so a machine shared with other work slows both sides of a ratio alike. Training and forward rows, whose
steps hold gigabytes, run one process at a time, alternating round after round (--rounds), each reporting the median
of its --repeats and its median round, and a ratio is the median of the rounds' own ratios. The machine's
matrix-multiply peaks are measured first, for the dtypes asked for; a row's utilisation divides by the peak of the
arithmetic its products run in (bf16 on a CPU without bf16 kernels converts to fp32 inside, so that row takes the
larger of the two peaks; int8 products have no measured peak and no utilisation). Memory read bandwidth is measured
in each generation row's own subprocess, right after its timing, so "bandwidth used" compares with what the machine
gave that row. The CPU's capabilities (`attnkit.machine.CpuCapabilities`: PyTorch's report, from which oneDNN's
bf16 kernels follow) are recorded with the results, and with `--peers` the instruction sets llama.cpp reports.
Results go to `benchmarks/results/speed-<machine>.json` and a markdown table beside it.

`--peers` adds the tools people pick for speed (`benchmarks/peers.py`): nanoGPT's model and training loop for the
decoder training cases, `transformers` with its static cache and torch.compile, and llama.cpp (f32, bf16, q8_0,
q4_0) for generation; a peer that is not installed is skipped with the reason. Generation rows also give the time to
the first token (a one-token generation, warm) and the first call's time (cold: compilation included).

`--isa avx2` measures a CPU with AVX-512 as an AVX2-only one: the whole run (peaks, capabilities, every measured
process) is started again with PyTorch's and oneDNN's AVX2 kernels (`ATEN_CPU_CAPABILITY=avx2`,
`ONEDNN_MAX_CPU_ISA=AVX2`; `attnkit.machine.CpuCapabilities` then reports AVX2), the results file is named `-avx2` and
says the figures are emulated and on which CPU. llama.cpp is the build that `llama_cpp` imports: one built without
AVX-512 (`CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF"`) for such a run; the file records the
instruction sets it reports.

`--device cuda` runs everything on the GPU: the peaks are the GPU's (matrix multiply, reading its memory), each
timed repetition ends with a synchronisation, and peak GPU memory (allocated by PyTorch) is reported beside the
process's resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.experiments.base import device_name
from attnkit.generate.quantize import dynamic_quantization_available
from attnkit.machine import CpuCapabilities
from benchmarks import peers
from benchmarks.common import RESULTS, synced, timed_runs


@dataclass(frozen=True)
class Case:
    """One workload: a model shape, what is timed, and how many tokens one repetition processes."""

    name: str
    kind: str  # "train" (forward, backward, AdamW), "forward", "generate", "prefill" (the prompt and one token)
    family: str  # "decoder", "encoder", "encoder-decoder"
    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    seq_len: int
    batch_size: int
    new_tokens: int = 0  # generate: tokens produced after a prompt of seq_len

    @property
    def decodes(self) -> bool:
        """Whether the case runs generation (decoding, or a prefill: the prompt read and one token chosen)."""
        return self.kind in ("generate", "prefill")


CASES = [
    Case("train-nanogpt-cpu", "train", "decoder", 4, 128, 4, 65, 64, 12),
    Case("train-nanogpt-shakespeare", "train", "decoder", 6, 384, 6, 65, 256, 4),
    Case("train-make-run", "train", "decoder", 4, 128, 4, 2048, 128, 16),  # `make run`'s sizes, GPT-2's block
    Case("train-gpt2-124m", "train", "decoder", 12, 768, 12, 50257, 512, 2),
    Case("forward-bert-base", "forward", "encoder", 12, 768, 12, 30522, 128, 8),
    Case("train-seq2seq-6+6-512", "train", "encoder-decoder", 6, 512, 8, 8000, 64, 8),
    Case("generate-small-b1", "generate", "decoder", 6, 384, 6, 65, 16, 1, new_tokens=128),
    Case("generate-small-b8", "generate", "decoder", 6, 384, 6, 65, 16, 8, new_tokens=128),
    Case("generate-gpt2-124m-b1", "generate", "decoder", 12, 768, 12, 50257, 16, 1, new_tokens=128),
    Case("generate-gpt2-124m-b8", "generate", "decoder", 12, 768, 12, 50257, 16, 8, new_tokens=128),
    # prefill: tokens/s over the prompt's tokens, as `generate` runs it for one new token
    Case("prefill-small-128", "prefill", "decoder", 6, 384, 6, 65, 128, 1, new_tokens=1),
    Case("prefill-small-1024", "prefill", "decoder", 6, 384, 6, 65, 1024, 1, new_tokens=1),
    Case("prefill-gpt2-124m-128", "prefill", "decoder", 12, 768, 12, 50257, 128, 1, new_tokens=1),
    Case("prefill-gpt2-124m-1024", "prefill", "decoder", 12, 768, 12, 50257, 1024, 1, new_tokens=1),
]
IMPLEMENTATIONS = ["attnkit", "transformers"]
INT8 = ["attnkit-int8", "attnkit-int8-compiled"]  # int8 weights (eager, compiled decoding step)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
INT8_DYNAMIC = "attnkit-int8-dynamic"  # int8 weights and activations (eager, CPU), fp32 elsewhere
INT4 = ["attnkit-int4"]  # 4-bit weights on a CPU with AVX2 or AVX-512 (+ compiled)
MASTER = "attnkit-master"  # bf16 training through a bf16 copy of the model with fp32 master weights
AUTOTUNED = {"attnkit-autotuned", "attnkit-int8-autotuned"}  # the decoding step compiled with "max-autotune"
CAPTURED = {"attnkit-aot", "attnkit-int8-aot", "attnkit-int4-aot"}  # the decoding step captured with AOTInductor
LABELS = {"attnkit": "{dtype}", "attnkit-compiled": "{dtype}, compiled", "attnkit-autotuned": "{dtype}, max-autotune",
          "attnkit-int8": "int8 weights, {dtype}", "attnkit-int8-compiled": "int8, bf16, compiled",
          "attnkit-int8-autotuned": "int8, bf16, max-autotune", MASTER: "bf16, fp32 master weights",
          "attnkit-int4": "int4 weights, {dtype}", "attnkit-int4-compiled": "int4, bf16, compiled",
          INT8_DYNAMIC: "int8 weights and activations, fp32", "attnkit-aot": "{dtype}, captured (aot)",
          "attnkit-int8-aot": "int8, {dtype}, captured (aot)", "attnkit-int4-aot": "int4, {dtype}, captured (aot)"}
# --peers: each peer beside the attnkit rows it is compared with (same case, dtype and run)
PEERS = {"nanogpt": ["attnkit"], "nanogpt-compiled": ["attnkit-compiled"],
         "transformers-static": ["attnkit-compiled", "attnkit-autotuned", "attnkit"],
         "llama.cpp": ["attnkit", "attnkit-compiled", "attnkit-autotuned", "attnkit-aot"],
         "llama.cpp-q8_0": [INT8_DYNAMIC, "attnkit-int8", "attnkit-int8-compiled", "attnkit-int8-autotuned",
                            "attnkit-int8-aot"],
         "llama.cpp-q4_0": ["attnkit-int4", "attnkit-int4-compiled", "attnkit-int4-aot"],
         "onnxruntime": ["attnkit", "attnkit-compiled", "attnkit-aot"]}
PEER_LABELS = {"nanogpt": "nanoGPT", "nanogpt-compiled": "nanoGPT, torch.compile",
               "transformers-static": "transformers, static cache, torch.compile", "llama.cpp": "llama.cpp {gguf}",
               "llama.cpp-q8_0": "llama.cpp q8_0", "llama.cpp-q4_0": "llama.cpp q4_0",
               "onnxruntime": "onnxruntime (attnkit's ONNX export)"}


def peer_impls(case: Case, dtype: str, compiled: bool) -> list[str]:
    """The peers that run a case in a dtype (compiled peers only with --compiled, beside attnkit's compiled rows)."""
    if case.kind == "train" and case.family == "decoder":
        return ["nanogpt"] + (["nanogpt-compiled"] if compiled else [])
    if case.decodes:
        return (["transformers-static"] if compiled else []) + [
            impl for impl, types in peers.LLAMA_CPP_TYPES.items() if dtype in types] + (
            ["onnxruntime"] if dtype == "fp32" and case.family == "decoder" else [])  # its CPU kernels are fp32
    return []


def compile_setting(impl: str) -> bool | str:
    """The `compile` argument of `attnkit.load` that an implementation's name stands for."""
    if impl in AUTOTUNED or impl in CAPTURED:
        return "max-autotune" if impl in AUTOTUNED else "aot"
    return impl.endswith("compiled") or impl == "transformers-static"


# --- the machine's own limits ------------------------------------------------------------------------------------
def matmul_peak(dtype: torch.dtype, device: str = "cpu", repeats: int = 5, enough_s: float = 0.5) -> float:
    """Best FLOP/s of a square matrix multiply in `dtype`: sizes double from 256 up to 2048 on the CPU (8192 on a GPU,
    to fill it), stopping early once one multiply takes `enough_s` (a CPU without bf16 kernels multiplies bf16 so
    slowly that 2048 would take minutes, and the rate has settled long before)."""
    size, largest = 256, 2048 if device == "cpu" else 8192
    while True:
        a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
        best = min(timed_runs(synced(lambda a=a, b=b: a @ b, device), repeats if size == largest else 2))
        if size == largest or best >= enough_s:
            return 2 * size**3 / best
        size *= 2


def read_bandwidth(device: str = "cpu", n_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best bytes/s of reading a large buffer once (a sum over 1 GiB of float32)."""
    x = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    return n_bytes / min(timed_runs(synced(x.sum, device), repeats))


# --- model construction, one per implementation --------------------------------------------------------------
def attnkit_config(case: Case):
    """attnkit's config for a case's shape: GPT-2's block for a decoder, BERT's for an encoder, Vaswani's otherwise."""
    from attnkit import ModelConfig

    common = dict(
        vocab_size=case.vocab_size, d_model=case.d_model, n_layers=case.n_layers, n_heads=case.n_heads,
        d_ff=4 * case.d_model, dropout=0.0, bias=True, tie_embeddings=True,
    )
    if case.family == "decoder":  # GPT-2's block
        return ModelConfig(family="decoder", position="learned", activation="gelu_tanh", norm_position="pre",
                           max_seq_len=max(case.seq_len + case.new_tokens, 64), **common)
    if case.family == "encoder":  # BERT's block
        return ModelConfig(family="encoder", position="learned", activation="gelu", norm_position="post",
                           norm_eps=1e-12, max_seq_len=512, encoder_head="none", **common)
    return ModelConfig(family="encoder-decoder", position="sinusoidal", activation="relu", norm_position="post",
                       scale_embeddings=True, max_seq_len=512, **common)  # Vaswani's


def _transformers_model(case: Case):
    import transformers as tf

    if case.family == "decoder":
        config = tf.GPT2Config(n_layer=case.n_layers, n_embd=case.d_model, n_head=case.n_heads,
                               vocab_size=case.vocab_size, n_positions=max(case.seq_len + case.new_tokens, 64),
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return tf.GPT2LMHeadModel(config)
    if case.family == "encoder":
        config = tf.BertConfig(num_hidden_layers=case.n_layers, hidden_size=case.d_model,
                               num_attention_heads=case.n_heads, intermediate_size=4 * case.d_model,
                               vocab_size=case.vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return tf.BertModel(config, add_pooling_layer=False)
    config = tf.MarianConfig(vocab_size=case.vocab_size, d_model=case.d_model, encoder_layers=case.n_layers,
                             decoder_layers=case.n_layers, encoder_attention_heads=case.n_heads,
                             decoder_attention_heads=case.n_heads, encoder_ffn_dim=4 * case.d_model,
                             decoder_ffn_dim=4 * case.d_model, dropout=0.0, attention_dropout=0.0,
                             activation_dropout=0.0, activation_function="relu", max_position_embeddings=512,
                             pad_token_id=0, decoder_start_token_id=0, eos_token_id=1, scale_embedding=True)
    return tf.MarianMTModel(config)


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it starts afresh at exec, not at fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step_function(case: Case, impl: str, dtype: str, device: str = "cpu"):
    """A closure running one repetition of the case, and the model it uses: the harness's one route to a row, which
    `bench_before_after` calls in each checkout."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, case.vocab_size, (case.batch_size, case.seq_len), generator=generator).to(device)
    targets = torch.randint(2, case.vocab_size, (case.batch_size, case.seq_len), generator=generator).to(device)
    if impl.startswith("nanogpt"):
        return peers.nanogpt_train_step(case, dtype, compiled=impl.endswith("compiled"), device=device)
    if impl.startswith(("attnkit", "llama.cpp", "onnxruntime")):
        from attnkit import build_model

        model = build_model(attnkit_config(case)).to(device)
    else:
        model = _transformers_model(case).to(device)

    if case.decodes:
        model.eval()
        if impl.startswith("llama.cpp"):  # the same (fp32) weights, written at the peer's precision
            return model, peers.llama_cpp_generate(model, impl, dtype, ids, case.new_tokens, torch.get_num_threads())
        if impl == "onnxruntime":  # the same weights, exported as `attnkit convert --to-onnx` writes them
            return model, peers.onnxruntime_generate(model, attnkit_config(case), ids, case.new_tokens,
                                                     torch.get_num_threads())
        if dtype == "bf16" and impl != INT8_DYNAMIC:
            model.to(torch.bfloat16)
        if impl.startswith("attnkit"):  # as `attnkit.load` prepares it; a compiled model compiles during warm-up
            from attnkit.generate.plan import prepare_for_inference

            quantize = next((form for form in ("int8-dynamic", "int8", "int4") if impl.startswith(f"attnkit-{form}")),
                            None)
            prepare_for_inference(model, case.family, quantize=quantize, compile=compile_setting(impl))
        return model, _generate_function(model, impl, ids, case.new_tokens)
    from attnkit.train.precision import make_precision

    # as `attnkit train --dtype` runs either model: fp32, bf16 autocast, or a bf16 copy with fp32 master weights
    precision = make_precision("bf16-master" if impl == MASTER else dtype, model)
    compute = precision.compute_model
    if impl == "attnkit-compiled":  # as `attnkit train --compile` does; compiled during warm-up
        from attnkit.blocks import compile_blocks

        compile_blocks(compute)
    if case.kind == "forward":
        compute.eval()

        def forward() -> None:
            with torch.no_grad(), precision.context():
                compute(ids)

        return model, forward

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def train_step() -> None:
        with precision.context():
            if impl.startswith("attnkit") and case.family == "decoder":
                loss = compute(ids, labels=targets, return_logits=False).loss
            elif impl.startswith("attnkit"):
                loss = compute(ids, ids, labels=targets, return_logits=False).loss
            elif case.family == "decoder":
                loss = compute(input_ids=ids, labels=targets).loss
            else:
                loss = compute(input_ids=ids, decoder_input_ids=ids, labels=targets).loss
        loss.backward()
        precision.gradients_to_model()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        precision.weights_to_compute()

    return model, train_step


def _generate_function(model, impl: str, prompt, new_tokens: int):
    """run(tokens=new_tokens): greedy generation of `tokens` after the prompt batch."""
    if impl == "transformers-static":
        return peers.transformers_static_generate(model, prompt, new_tokens)
    if impl == "transformers":
        def run(tokens: int = new_tokens) -> None:
            with torch.no_grad():
                model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens,
                               min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        return run
    from attnkit.generate import generate_tokens
    from attnkit.generate.pipeline import decoding_for

    prompts = prompt.tolist()
    context_len = model.stack.embeddings.max_positions
    if impl in CAPTURED:  # captured into a folder of its own (a cold start), then loaded again (a second start)
        from attnkit.generate.captured_step import CapturedDecoding

        folder, rows = tempfile.mkdtemp(prefix="attnkit-aot-"), len(prompts)
        cold = CapturedDecoding(model, package_dir=folder)
        cold.prepare(rows)
        decoding = CapturedDecoding(model, package_dir=folder)
        decoding.prepare(rows)
        shutil.rmtree(folder)  # loaded: the library stays mapped until the process ends
    else:
        decoding = decoding_for(model, compile_setting(impl))  # as `attnkit.load(compile=...)`

    def run(tokens: int = new_tokens) -> None:
        generate_tokens(model, prompts, max_new_tokens=tokens, context_len=context_len, decoding=decoding)
    if impl in CAPTURED:
        run.start_s = {"capture_s": sum(cold.capture_s.values()), "package_load_s": sum(decoding.load_s.values())}
    return run


def _flops_per_token(case: Case) -> float:
    """Model FLOPs per token (Kaplan et al. 2020): 2 per weight per token forward, plus attention's 4 L T C,
    x3 for training. The same count serves both implementations (the workload, not the code, is counted)."""
    c, layers, t = case.d_model, case.n_layers, case.seq_len + case.new_tokens // 2
    if case.family == "decoder":
        weights, attention = 12 * layers * c * c + case.vocab_size * c, 4 * layers * t * c
    elif case.family == "encoder":
        weights, attention = 12 * layers * c * c, 4 * layers * t * c
    else:  # encoder (12 C^2 a layer), decoder with cross-attention (16 C^2 a layer), output projection
        weights, attention = 28 * layers * c * c + case.vocab_size * c, 3 * 4 * layers * t * c
    forward = 2 * weights + attention
    return 3 * forward if case.kind == "train" else forward


def run_one(case_name: str, impl: str, dtype: str, repeats: int, warmup: int, device: str = "cpu",
            turns: bool = False) -> dict:
    """Time one case in this process; the parent runs this in a fresh subprocess. With `turns`, after the warm-up
    this prints "ready" and times one repetition for each line read from stdin (printing its seconds) until "done",
    so that the parent can have several implementations take turns repetition by repetition."""
    torch.manual_seed(0)
    case = next(c for c in CASES if c.name == case_name)
    model, step = step_function(case, impl, dtype, device)
    check = None
    if impl.startswith("llama.cpp") or impl == "onnxruntime":
        step, check = step
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:  # from here: the model as it runs, not the fp32 copy a bf16 one was converted from
        torch.cuda.reset_peak_memory_stats(device)
    if compile_setting(impl):  # compilation and its first recompilations for new lengths are not the speed
        warmup = max(warmup, 3)
    (first_call,) = timed_runs(synced(step, device), 1, warmup=0)  # cold: what a user's first call costs
    if turns:
        timed_runs(synced(step, device), 0, warmup=warmup - 1)
        print("ready", flush=True)
        times = []
        for line in sys.stdin:
            if line.strip() == "done":
                break
            times += timed_runs(synced(step, device), 1, warmup=0)
            print(times[-1], flush=True)
    else:
        times = timed_runs(synced(step, device), repeats, warmup=warmup - 1)
    median = statistics.median(times)
    tokens = case.batch_size * (case.new_tokens if case.kind == "generate" else case.seq_len)
    result = {
        "case": case.name, "impl": impl, "dtype": dtype, "median_s": median, "times_s": times,
        "tokens_per_s": tokens / median, "peak_rss_mb": peak_rss_mb(),
        "flops_per_token": _flops_per_token(case), "first_call_s": first_call,
    }
    if check is not None:
        result["max_logit_difference"] = check
    if on_gpu:
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    if case.kind == "generate":
        result["read_bytes_per_s"] = read_bandwidth(device, n_bytes=1 << 28, repeats=3)  # beside this row's timing
        result["ms_per_token"] = 1000 * median / case.new_tokens
        llama = impl.startswith("llama.cpp")
        result["weight_bytes"] = gguf_bytes(model, impl, dtype) if llama else bytes_read_per_token(model)
        result["first_token_s"] = statistics.median(timed_runs(synced(lambda: step(1), device), repeats, warmup=0))
        result.update(getattr(step, "start_s", {}))  # a captured step: its capture, and its load at a second start
    return result


def bytes_read_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter and buffer, once, except tables that only an
    embedding looks rows up in (a tied output layer reads its table whole, so that one counts), and the packed
    copies that a one-row step leaves unread (`GemvPackedLinear`), plus the int8 weights and fp32 scales FBGEMM keeps
    packed outside any buffer (`Int8DynamicLinear`)."""
    from attnkit.generate.decode_layout import GemvPackedLinear
    from attnkit.generate.quantize import Int8DynamicLinear
    from attnkit.layers.positions import LearnedPositions

    unread = {id(m.packed.weight_packed) for m in model.modules() if isinstance(m, GemvPackedLinear)}
    read: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if not isinstance(module, (torch.nn.Embedding, LearnedPositions)):
            read.update((id(t), t) for t in (*module.parameters(recurse=False), *module.buffers(recurse=False))
                        if id(t) not in unread)
    packed = sum(m.out_features * (m.in_features + 4) for m in model.modules() if isinstance(m, Int8DynamicLinear))
    return sum(t.numel() * t.element_size() for t in read.values()) + packed


def gguf_bytes(model: torch.nn.Module, impl: str, dtype: str) -> int:
    """Bytes a llama.cpp decoding step reads: the same tensors, 2-D weights at the GGUF type's bytes per weight."""
    per_weight = {"F32": 4, "BF16": 2, "Q8_0": 34 / 32, "Q4_0": 18 / 32}[peers.LLAMA_CPP_TYPES[impl][dtype]]
    fp32 = bytes_read_per_token(model)
    matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return int(fp32 - 4 * matrices + per_weight * matrices)


def _child_command(case: str, impl: str, dtype: str, repeats: int, warmup: int, threads: int, device: str,
                   turns: bool) -> dict:
    return {"args": [sys.executable, "-m", "benchmarks.speed", "--turns" if turns else "--child", case, impl, dtype,
                     str(repeats), str(warmup), device],
            "env": {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false"},
            "cwd": Path(__file__).resolve().parents[1], "text": True}


def _subprocess(case: str, impl: str, dtype: str, repeats: int, warmup: int, threads: int, device: str) -> dict:
    done = subprocess.run(**_child_command(case, impl, dtype, repeats, warmup, threads, device, False),
                          capture_output=True)
    if done.returncode != 0:
        return {"case": case, "impl": impl, "dtype": dtype, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _in_turns(case: str, impls: list[str], dtype: str, turns: int, warmup: int, threads: int, device: str
              ) -> dict[str, dict]:
    """Every implementation in a process of its own, all held at once, timed one repetition each in turn (the order
    reversing every turn), `turns` times: each row's result, with every turn's tokens/s."""
    errors = {impl: tempfile.TemporaryFile(mode="w+") for impl in impls}  # a pipe left unread could fill and block
    started = {impl: subprocess.Popen(**_child_command(case, impl, dtype, turns, warmup, threads, device, True),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors[impl])
               for impl in impls}
    workers, results = {}, {}
    for impl, process in started.items():
        if process.stdout.readline().strip() == "ready":
            workers[impl] = process
        else:
            process.wait()
            errors[impl].seek(0)
            results[impl] = {"case": case, "impl": impl, "dtype": dtype,
                             "error": errors[impl].read().strip().splitlines()[-1:]}
    for n in range(turns):
        for process in (list(workers.values()) if n % 2 == 0 else list(reversed(workers.values()))):
            process.stdin.write("run\n")
            process.stdin.flush()
            process.stdout.readline()
    for impl, process in workers.items():
        out, _ = process.communicate("done\n")
        result = json.loads(out.strip().splitlines()[-1])
        tokens = result["tokens_per_s"] * result["median_s"]
        results[impl] = {**result, "rounds_tokens_per_s": [tokens / t for t in result["times_s"]]}
    for file in errors.values():
        file.close()
    return {impl: results[impl] for impl in impls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--dtypes", nargs="*", default=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate attnkit and the reference this many times per case; report the median round")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--machine", help="names the results file (default: the host name, + '-cuda' on a GPU)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N) to run every case on a GPU")
    parser.add_argument("--compiled", action="store_true",
                        help="also time attnkit through torch.compile: each block (training, forward), the "
                        "decoding step for fixed shapes, in the default mode and max-autotune (generation)")
    parser.add_argument("--peers", action="store_true",
                        help="also time nanoGPT (training), transformers with a static cache and torch.compile (with "
                        "--compiled) and llama.cpp (generation); each is skipped with the reason when not installed")
    parser.add_argument("--impls", nargs="*", help="keep only these implementations (attnkit, attnkit-compiled, "
                        "transformers, attnkit-int8-dynamic, attnkit-int4, llama.cpp, llama.cpp-q8_0, ...; default: "
                        "every one the other options add)")
    parser.add_argument("--update", action="store_true",
                        help="merge into the machine's results file, replacing only the cases and dtypes run now")
    parser.add_argument("--isa", choices=["native", "avx2"], default="native",
                        help="avx2: run everything with PyTorch's and oneDNN's AVX2 kernels, as on an AVX2-only CPU "
                        "(the results say the figures are emulated)")
    parser.add_argument("--emulating", help=argparse.SUPPRESS)  # the CPU's own vector level, in the restarted run
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--turns", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child or args.turns:
        case, impl, dtype, repeats, warmup, device = args.child or args.turns
        print(json.dumps(run_one(case, impl, dtype, int(repeats), int(warmup), device, turns=bool(args.turns))))
        return 0

    device = args.device
    on_gpu = torch.device(device).type == "cuda"
    if args.isa != "native" and args.emulating is None:
        if on_gpu:
            parser.error("--isa chooses the CPU's kernels; it does not apply with --device cuda")
        return emulated(args.isa, argv if argv is not None else sys.argv[1:])
    machine = (args.machine or (platform.node() or "cpu") + ("-cuda" if on_gpu else "")) + \
        (f"-{args.isa}" if args.isa != "native" else "")
    path = RESULTS / f"speed-{machine}.json"
    earlier = json.loads(path.read_text()) if args.update and path.is_file() else None
    if earlier is not None and earlier.get("device", device_name("cpu")) != device_name(device):
        parser.error(f"{path} holds results measured on {earlier.get('device', 'the CPU')}, not on "
                     f"{device_name(device)}; give this run its own --machine name")
    cpu = None if on_gpu else CpuCapabilities.detect()
    peaks = {f"{d}_flops": matmul_peak(DTYPES[d], device) for d in ("fp32", "bf16") if d in args.dtypes or d == "fp32"}
    if on_gpu:
        torch.cuda.empty_cache()  # the subprocesses measure their own memory; leave them the GPU's
    print(f"machine: {cpu.summary() if cpu else device_name(device)}; peaks: {_peaks_text(peaks)}", flush=True)
    rows = []
    for case in [c for c in CASES if not args.only or c.name in args.only]:
        for dtype in args.dtypes:
            # weight-only int8 and int4: bf16 activations, and on the CPU fp32 ones too (the native kernels')
            weight_only = case.decodes and (dtype == "bf16" or not on_gpu)
            impls = IMPLEMENTATIONS + (INT8 if weight_only else [])
            dynamic = not on_gpu and dynamic_quantization_available() is None  # FBGEMM: x86 CPUs
            impls += [INT8_DYNAMIC] if case.decodes and dtype == "bf16" and dynamic else []
            if weight_only and cpu is not None and cpu.int4_kernel:
                impls += INT4 + (["attnkit-int4-compiled"] if args.compiled else [])
            impls += [MASTER] if case.kind == "train" and dtype == "bf16" else []
            impls += ["attnkit-compiled"] if args.compiled else []
            if args.compiled and case.decodes:
                impls += sorted(AUTOTUNED) if dtype == "bf16" else ["attnkit-autotuned"]
                impls += [impl for impl in sorted(CAPTURED) if weight_only or impl == "attnkit-aot"]
            skipped = {}
            for impl in peer_impls(case, dtype, args.compiled) if args.peers else []:
                reason = peers.unavailable(impl)
                if reason is None:
                    impls.append(impl)
                else:
                    skipped[impl] = {"case": case.name, "impl": impl, "dtype": dtype, "skipped": reason}
                    print(f"{case.name} {dtype}: {impl} skipped: {reason}", flush=True)
            impls = [impl for impl in impls if not args.impls or impl in args.impls]
            if case.decodes:  # small models: held side by side, taking turns repetition by repetition
                pair = _in_turns(case.name, impls, dtype, args.rounds * args.repeats, args.warmup, args.threads,
                                 device)
            else:  # training steps hold gigabytes each: one process at a time, round after round
                runs: dict[str, list[dict]] = {impl: [] for impl in impls}
                for _ in range(args.rounds):
                    for impl in impls:
                        runs[impl].append(
                            _subprocess(case.name, impl, dtype, args.repeats, args.warmup, args.threads, device)
                        )
                pair = {impl: _median_round(results) for impl, results in runs.items()}
            for result in pair.values():
                _add_utilisation(result, case, peaks, cpu)
                rows.append(result)
            rows.extend(skipped.values())
            _print_pair(case, dtype, pair)
    command = "python -m benchmarks speed " + " ".join(argv or sys.argv[1:])
    report = {"machine": machine, "device": device_name(device), "threads": args.threads,
              "torch": torch.__version__, "peaks": peaks, "command": command, "results": rows,
              "load_average": os.getloadavg(), "cpu": cpu.to_dict() if cpu else None,
              "emulated": (f"{args.isa.upper()} kernels ({isa_settings(args.isa)}) on a CPU whose own level is "
                           f"{args.emulating}") if args.emulating else None,
              "llama_cpp": peers.llama_cpp_system_info() if args.peers else None}
    if earlier is not None:  # keep the earlier rows of other cases and dtypes
        redone = {(r["case"], r["dtype"]) for r in rows}
        rows[:0] = [r for r in earlier["results"] if (r["case"], r["dtype"]) not in redone]
        report["command"] = f"{earlier['command']}`, then `{command}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown_table(report))
    print(f"wrote {path} and .md")
    return 0


ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def isa_settings(isa: str) -> str:
    return " ".join(f"{name}={value}" for name, value in ISA_ENV[isa].items())


def emulated(isa: str, argv: list[str]) -> int:
    """The run again, in a process whose PyTorch and oneDNN use `isa`'s kernels (and whose measured processes do, by
    inheriting its environment); its exit status."""
    own = torch.backends.cpu.get_cpu_capability()
    env = {**os.environ, **ISA_ENV[isa]}
    print(f"running with {isa.upper()} kernels on this {own} CPU: {isa_settings(isa)}", flush=True)
    return subprocess.run([sys.executable, "-m", "benchmarks.speed", *argv, "--emulating", own], env=env,
                          cwd=Path(__file__).resolve().parents[1]).returncode


def _median_round(results: list[dict]) -> dict:
    """The round with the median tokens/s (the lower middle one for an even count), listing every round's."""
    good = [r for r in results if "error" not in r]
    if not good:
        return results[0]
    ranked = sorted(good, key=lambda r: r["tokens_per_s"])
    return {**ranked[(len(ranked) - 1) // 2], "rounds_tokens_per_s": [r["tokens_per_s"] for r in good]}


def row_peak(result: dict, peaks: dict, cpu: CpuCapabilities | None) -> float | None:
    """The FLOP/s peak of the arithmetic a row's products run in: fp32; bf16 (the larger of the bf16 and fp32 peaks on
    a CPU without oneDNN's bf16 kernels, which convert to fp32 inside); None for int8 products, whose peak is not
    measured."""
    if result["impl"] in (INT8_DYNAMIC, "llama.cpp-q8_0", "llama.cpp-q4_0"):
        return None
    if result["impl"].startswith("attnkit-int4"):  # PyTorch's CPU int4 kernel multiplies in fp32
        return peaks["fp32_flops"]
    if result["dtype"] != "bf16":
        return peaks["fp32_flops"]
    if "bf16_flops" not in peaks:
        return None
    converts = cpu is not None and not cpu.onednn_bf16
    return max(peaks["bf16_flops"], peaks["fp32_flops"]) if converts else peaks["bf16_flops"]


def _add_utilisation(result: dict, case: Case, peaks: dict, cpu: CpuCapabilities | None) -> None:
    if "error" in result or "skipped" in result:
        return
    peak = row_peak(result, peaks, cpu)
    if peak is not None:
        result["mfu"] = result["tokens_per_s"] * result["flops_per_token"] / peak
    if case.kind == "generate" and case.batch_size == 1 and "read_bytes_per_s" in result:
        result["bandwidth_fraction"] = result["weight_bytes"] * result["tokens_per_s"] / result["read_bytes_per_s"]


def round_ratio(ours: dict, ref: dict) -> float:
    """attnkit's tokens/s over the reference's: the median of the rounds' own ratios where both ran the same rounds,
    else the ratio of their median rounds."""
    mine, theirs = ours.get("rounds_tokens_per_s"), ref.get("rounds_tokens_per_s")
    if mine and theirs and len(mine) == len(theirs):
        return statistics.median(a / b for a, b in zip(mine, theirs, strict=True))
    return ours["tokens_per_s"] / ref["tokens_per_s"]


def _peaks_text(peaks: dict) -> str:
    flops = ", ".join(f"{k.removesuffix('_flops')} {v / 1e12:.2f} TFLOP/s" for k, v in peaks.items()
                      if k.endswith("_flops"))
    read = f", read {peaks['read_bytes_per_s'] / 1e9:.1f} GB/s" if "read_bytes_per_s" in peaks else ""
    return flops + read


def _mfu(result: dict) -> str:
    return f"{result['mfu']:.1%}" if "mfu" in result else "-"


def _print_pair(case: Case, dtype: str, pair: dict) -> None:
    for impl in (name for name in pair if name != "transformers"):
        reference = next((p for p in PEERS.get(impl, []) if p in pair), "transformers")
        if reference not in pair:  # --impls left out what this row is compared with
            continue
        ours, ref = pair[impl], pair[reference]
        if impl in PEERS:  # a peer, against the first of its attnkit rows run now
            ours, ref = ref, ours
        if "error" in ours or "error" in ref:
            print(f"{case.name} {dtype}: error {ours.get('error') or ref.get('error')}", flush=True)
            continue
        print(f"{case.name:28s} {dtype}: {ours['impl']} {ours['tokens_per_s']:9.1f} tok/s  {ref['impl']} "
              f"{ref['tokens_per_s']:9.1f} tok/s  ratio {round_ratio(ours, ref):.2f}x  "
              f"peak RSS {ours['peak_rss_mb']:.0f} vs {ref['peak_rss_mb']:.0f} MB", flush=True)


def markdown_table(report: dict) -> str:
    gpu = any("peak_gpu_mb" in r for r in report["results"])
    cpu = CpuCapabilities.from_dict(report["cpu"]) if report.get("cpu") else None
    load = report.get("load_average")
    lines = [
        f"Machine `{report['machine']}` ({cpu.summary() if cpu else report['device']}), {report['threads']} threads, "
        f"torch {report['torch']}; measured peaks: {_peaks_text(report['peaks'])}. Command: `{report['command']}`"
        + (f"; load average at the end {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} (1, 5, 15 min)" if load else ""),
        "",
        *([f"Emulated: {report['emulated']}. PyTorch and oneDNN ran their AVX2 kernels; the memory system, caches "
           "and clock are the host's.", ""] if report.get("emulated") else []),
        "| case | dtype | attnkit tok/s | transformers tok/s | ratio | attnkit MFU | ref MFU "
        "| attnkit / ref peak RSS MB | attnkit ms/token | bandwidth used |"
        + (" attnkit / ref peak GPU MB |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else ""),
    ]
    by_key = {(r["case"], r["dtype"], r["impl"]): r for r in report["results"]}
    for case in CASES:
        for dtype, impl in ((d, i) for d in ("fp32", "bf16") for i in LABELS):
            ours, ref = by_key.get((case.name, dtype, impl)), by_key.get((case.name, dtype, "transformers"))
            if not ours or not ref or "error" in ours or "error" in ref:
                continue
            ms = f"{ours['ms_per_token']:.1f}" if "ms_per_token" in ours else ""
            bandwidth = f"{ours['bandwidth_fraction']:.0%}" if "bandwidth_fraction" in ours else ""
            label = LABELS[impl].format(dtype=dtype)
            gpu_memory = f" {_mb(ours, 'peak_gpu_mb')} / {_mb(ref, 'peak_gpu_mb')} |" if gpu else ""
            lines.append(
                f"| {case.name} | {label} | {ours['tokens_per_s']:.1f} | {ref['tokens_per_s']:.1f} | "
                f"{round_ratio(ours, ref):.2f}x | {_mfu(ours)} | {_mfu(ref)} | "
                f"{ours['peak_rss_mb']:.0f} / {ref['peak_rss_mb']:.0f} | {ms} | {bandwidth} |{gpu_memory}"
            )
    return "\n".join(lines + peers_table(report)) + "\n"


def peers_table(report: dict) -> list[str]:
    """Each peer's rows beside the attnkit rows of the same case, dtype and run (`PEERS`), and the skipped peers."""
    results = report["results"]
    by_key = {(r["case"], r["dtype"], r["impl"]): r for r in results}
    lines = ["", "Peers (`--peers`): attnkit / peer tokens/s in the same run; first token: a one-token generation, "
             "warm; first call: the first whole repetition, cold (compilation included)."
             + (f" llama.cpp reports: {report['llama_cpp']}." if report.get("llama_cpp") else "")
             + (f" Load average at the end of the run: {report['load_average'][0]:.1f}." if "load_average" in report
                else ""), "",
             "| case | dtype | peer | peer tok/s | attnkit | attnkit tok/s | ratio | attnkit / peer peak RSS MB "
             "| first token ms, attnkit / peer | first call s, attnkit / peer | bandwidth used, attnkit / peer |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for peer in (r for r in results if r["impl"] in PEERS and "tokens_per_s" in r):
        label = PEER_LABELS[peer["impl"]].format(gguf=peers.LLAMA_CPP_TYPES.get(peer["impl"], {}).get(peer["dtype"]))
        for impl in PEERS[peer["impl"]]:
            ours = by_key.get((peer["case"], peer["dtype"], impl))
            if not ours or "tokens_per_s" not in ours:
                continue
            first = (f"{1000 * ours['first_token_s']:.0f} / {1000 * peer['first_token_s']:.0f}"
                     if "first_token_s" in peer and "first_token_s" in ours else "")
            bandwidth = (f"{ours['bandwidth_fraction']:.0%} / {peer['bandwidth_fraction']:.0%}"
                         if "bandwidth_fraction" in peer and "bandwidth_fraction" in ours else "")
            first_call = f"{ours.get('first_call_s', 0):.1f}"
            if "capture_s" in ours:  # a captured step's start: capturing it (cold), loading it kept (a second start)
                first_call += f" (+ capture {ours['capture_s']:.0f}; second start {ours['package_load_s']:.2f})"
            lines.append(
                f"| {peer['case']} | {peer['dtype']} | {label} | {peer['tokens_per_s']:.1f} | "
                f"{LABELS[impl].format(dtype=peer['dtype'])} | {ours['tokens_per_s']:.1f} | "
                f"{round_ratio(ours, peer):.2f}x | {ours['peak_rss_mb']:.0f} / "
                f"{peer['peak_rss_mb']:.0f} | {first} | {first_call} / {peer['first_call_s']:.1f} | {bandwidth} |"
            )
    lines += [f"- {r['case']} {r['dtype']}: {r['impl']} skipped: {r['skipped']}" for r in results if "skipped" in r]
    return lines if len(lines) > 5 else []


def _mb(result: dict, key: str) -> str:
    return f"{result[key]:.0f}" if key in result else "-"


if __name__ == "__main__":
    sys.exit(main())
