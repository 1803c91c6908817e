"""The speed suite's peers beyond plain `transformers`: the tools people pick for speed, each optional.

- nanoGPT's model (`nanogpt.GPT`, its `model.py` written out) and its `train.py` step: autocast,
  `logits, loss = model(X, Y)` with the loss inside the model (and so inside `torch.compile(model)` for the compiled
  rows), backward, AdamW with its weight-decay groups (fused only on CUDA, as `configure_optimizers` chooses).
  Clipping is left out, as it is from every other training row of the suite.
- `transformers` with its static cache and `torch.compile` of the model's forward, the fastest decoding path its
  documentation gives ("static kv-cache and torch.compile").
- llama.cpp through `llama-cpp-python` (`pip install 'attnkit[bench]'`): the same weights written to GGUF at f32,
  bf16, q8_0 or q4_0, decoded through its C API with one sequence per row of the batch, greedy, on the same threads.
- onnxruntime (the `export` extra): the same model written by `attnkit convert --to-onnx`'s exporter (fp32, the
  KV cache as inputs and outputs), decoded greedily by the loop such graphs are run with (each step's presents fed
  back as the next past), on the same threads.

`unavailable(impl)` names what is missing for a peer, so the suite skips it with that reason.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

LLAMA_CPP_TYPES = {"llama.cpp": {"fp32": "F32", "bf16": "BF16"}, "llama.cpp-q8_0": {"fp32": "Q8_0", "bf16": "Q8_0"},
                   "llama.cpp-q4_0": {"fp32": "Q4_0", "bf16": "Q4_0"}}


def unavailable(impl: str) -> str | None:
    """Why the peer `impl` cannot run here, or None when it can."""
    if impl.startswith("transformers") and importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'attnkit[dev]')"
    if impl == "onnxruntime":
        missing = [name for name in ("onnxruntime", "onnxscript") if importlib.util.find_spec(name) is None]
        if missing:
            return f"{' and '.join(missing)} not installed (pip install 'attnkit[export]')"
    if impl.startswith("llama.cpp"):
        missing = [name for name in ("llama_cpp", "gguf") if importlib.util.find_spec(name) is None]
        if missing:
            return f"{' and '.join(missing)} not installed (pip install 'attnkit[bench]': llama-cpp-python, gguf)"
    return None


def llama_cpp_system_info() -> str | None:
    """The instruction sets llama.cpp was built for and found ("AVX2 = 1 | AVX512 = 1 | ..."), None without it."""
    if unavailable("llama.cpp") is not None:
        return None
    import llama_cpp

    report = llama_cpp.llama_print_system_info().decode().replace("CPU :", "")
    return " | ".join(part.strip() for part in report.split("|")
                      if part.strip().endswith("= 1"))


# --- nanoGPT ---------------------------------------------------------------------------------------------------------
def nanogpt_train_step(case, dtype: str, *, compiled: bool, device: str):
    """nanoGPT's model of the case's shape (`nanogpt.GPT`, with biases) and its train.py iteration
    (`nanogpt.train_step`) on one fixed batch: (model, step). As train.py runs it, `logits, loss = model(X, Y)`: the
    cross-entropy is computed inside the model, so inside `torch.compile(model)` for the compiled rows."""
    from benchmarks.nanogpt import GPT, GPTConfig, train_step

    model = GPT(GPTConfig(block_size=case.seq_len, vocab_size=case.vocab_size, n_layer=case.n_layers,
                          n_head=case.n_heads, n_embd=case.d_model, bias=True)).to(device)
    generator = torch.Generator().manual_seed(0)
    ids, targets = (torch.randint(2, case.vocab_size, (case.batch_size, case.seq_len), generator=generator).to(device)
                    for _ in range(2))
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), torch.device(device).type)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    step = train_step(model, optimizer, lambda: (ids, targets), forward=torch.compile(model) if compiled else model,
                      ctx=autocast)
    return model, step


# --- transformers with a static cache, compiled ----------------------------------------------------------------------
def transformers_static_generate(model, prompt: torch.Tensor, new_tokens: int):
    """`generate` over a static cache, compiled as transformers documents it. On CUDA, `generate` compiles the decoding
    step itself (its `CompileConfig`: CUDA graphs, "reduce-overhead") and runs the prefill uncompiled, which is also
    where its static cache allocates its tensors: compiling `model.forward` by hand there puts that first allocation
    inside a CUDA graph, whose next replay overwrites it. transformers compiles on its own only on accelerators, so
    on a CPU the forward is compiled here (fullgraph, no CUDA graphs)."""
    auto = prompt.device.type == "cuda"
    if not auto:
        model.forward = torch.compile(model.forward, fullgraph=True)

    def run(tokens: int = new_tokens) -> None:
        with torch.no_grad():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens,
                           min_new_tokens=tokens, do_sample=False, pad_token_id=0, cache_implementation="static",
                           disable_compile=not auto)

    return run


# --- llama.cpp -------------------------------------------------------------------------------------------------------
def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (byte-level BPE), byte 10 ("Ċ") first: llama.cpp looks for it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shift = iter(range(256, 512))
    symbols = {b: chr(b) if b in printable else chr(next(shift)) for b in range(256)}
    return [symbols[10]] + [symbols[b] for b in range(256) if b != 10]


def byte_vocabulary(size: int) -> list[str]:
    """`size` distinct byte-level token strings: the bytes, then pairs of them, and so on. The weights are random,
    so the tokens only need to exist: prompts are given as ids and no text is tokenized."""
    symbols, tokens = _byte_symbols(), []
    for length in itertools.count(1):
        tokens += ("".join(p) for p in itertools.islice(itertools.product(symbols, repeat=length), size - len(tokens)))
        if len(tokens) == size:
            return tokens
    raise AssertionError("unreachable")


def write_gguf(model: nn.Module, path: Path, type_name: str) -> None:
    """Write an attnkit GPT-2-style DecoderLM (learned positions, LayerNorm, biases, tied output) as llama.cpp's
    `gpt2` architecture, with 2-D weights in `type_name` (F32, BF16, Q8_0, Q4_0) and norms and biases in F32, as
    llama.cpp's `convert_hf_to_gguf.py --outtype` writes them (the output layer as its own tensor)."""
    import gguf

    stack = model.stack
    block = stack.blocks[0]
    attention = block.self_attn
    d_model, vocab = stack.embeddings.token.weight.shape[1], stack.embeddings.token.weight.shape[0]
    qtype = gguf.GGMLQuantizationType[type_name]
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_context_length(stack.embeddings.max_positions)
    writer.add_embedding_length(d_model)
    writer.add_feed_forward_length(block.mlp.up_proj.weight.shape[0])
    writer.add_block_count(len(stack.blocks))
    writer.add_head_count(attention.n_heads)
    writer.add_layer_norm_eps(block.attn_norm.eps)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{type_name}" if type_name != "F32" else "ALL_F32"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(byte_vocabulary(vocab))
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
    writer.add_token_merges([" ".join(_byte_symbols()[1:3])])  # llama.cpp needs a merge list; none is used

    def add(name: str, tensor: torch.Tensor) -> None:
        array = tensor.detach().float().cpu().numpy()
        if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array.astype(np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)

    add("token_embd.weight", stack.embeddings.token.weight)
    add("position_embd.weight", stack.embeddings.positions.weight)
    for i, block in enumerate(stack.blocks):
        a, mlp = block.self_attn, block.mlp
        parts = {"attn_norm": block.attn_norm, "attn_output": a.o_proj, "ffn_norm": block.mlp_norm,
                 "ffn_up": mlp.up_proj, "ffn_down": mlp.down_proj}
        add(f"blk.{i}.attn_qkv.weight", torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))  # (3C, C)
        add(f"blk.{i}.attn_qkv.bias", torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        for name, module in parts.items():
            add(f"blk.{i}.{name}.weight", module.weight)
            add(f"blk.{i}.{name}.bias", module.bias)
    add("output_norm.weight", stack.final_norm.weight)
    add("output_norm.bias", stack.final_norm.bias)
    add("output.weight", model.lm_head.weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class LlamaCpp:
    """A GGUF model in llama.cpp: greedy decoding of a batch, one llama.cpp sequence per row, through its C API."""

    def __init__(self, path: Path, *, batch_size: int, prompt_len: int, new_tokens: int, threads: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_log_set(_QUIET, ctypes.c_void_p())
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        params = lc.llama_context_default_params()
        params.n_ctx = batch_size * (prompt_len + new_tokens)
        params.n_batch = params.n_ubatch = batch_size * prompt_len
        params.n_seq_max, params.n_threads, params.n_threads_batch = batch_size, threads, threads
        self.context = lc.llama_init_from_model(self.model, params)
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(batch_size * prompt_len, 0, batch_size)

    def _decode(self, rows: list[list[int]], start: int, *, every_position: bool = False) -> np.ndarray:
        """Feed each row's tokens at positions start, start + 1, ...; the last logits of each row (B, V), or with
        `every_position` the logits at every token fed (N, V)."""
        lc, batch = self.lc, self.batch
        n = 0
        for seq, tokens in enumerate(rows):
            for offset, token in enumerate(tokens):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, start + offset, 1
                batch.seq_id[n][0], batch.logits[n] = seq, every_position or offset == len(tokens) - 1
                n += 1
        batch.n_tokens = n
        if lc.llama_decode(self.context, batch) != 0:
            raise RuntimeError("llama_decode failed")
        wanted = range(n) if every_position else np.cumsum([len(tokens) for tokens in rows]) - 1
        return np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(self.context, int(i)), (self.vocab,))
                         for i in wanted])

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy continuation of equal-length prompts by `new_tokens` tokens each."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.context), True)
        logits = self._decode(prompts, 0)
        out: list[list[int]] = [[] for _ in prompts]
        for step in range(new_tokens):
            tokens = logits.argmax(axis=-1).tolist()
            for row, token in zip(out, tokens, strict=True):
                row.append(token)
            if step < new_tokens - 1:
                logits = self._decode([[t] for t in tokens], len(prompts[0]) + step)
        return out

    def prompt_logits(self, prompt: list[int]) -> np.ndarray:
        """The logits after one prompt (V,), for checking the conversion against the model it came from."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.context), True)
        return self._decode([prompt], 0)[0]

    def sequence_logits(self, tokens: list[int]) -> np.ndarray:
        """The logits at every position of one sequence (T, V), from an empty cache: for measuring quality."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.context), True)
        return self._decode([tokens], 0, every_position=True)


_QUIET = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda level, text, data: None)


def llama_cpp_generate(model: nn.Module, impl: str, dtype: str, prompt: torch.Tensor, new_tokens: int,
                       threads: int):
    """The attnkit `model`'s weights in llama.cpp at the precision `impl` and `dtype` name: (run, check), where
    `run(tokens)` decodes the prompt batch greedily and `check` is the largest logit difference from attnkit's
    fp32 model after the first prompt row (the conversion's own test)."""
    folder = Path(tempfile.mkdtemp(prefix="attnkit-gguf-"))
    path = folder / "model.gguf"
    write_gguf(model, path, LLAMA_CPP_TYPES[impl][dtype])
    runner = LlamaCpp(path, batch_size=prompt.shape[0], prompt_len=prompt.shape[1], new_tokens=new_tokens,
                      threads=threads)
    path.unlink()  # llama.cpp has read it (or mapped it: the mapping keeps the data until the process ends)
    folder.rmdir()
    prompts = prompt.tolist()
    with torch.no_grad():
        expected = model(prompt[:1]).logits[0, -1].float().numpy()
    check = float(np.abs(runner.prompt_logits(prompts[0]) - expected).max())

    def run(tokens: int = new_tokens) -> None:
        runner.generate(prompts, tokens)

    return run, check


# --- onnxruntime -----------------------------------------------------------------------------------------------------
def onnxruntime_generate(model: nn.Module, config, prompt: torch.Tensor, new_tokens: int, threads: int):
    """The attnkit `model` (fp32) exported to ONNX and run by onnxruntime: (run, check), where `run(tokens)` decodes
    the prompt batch greedily and returns the new tokens (B, tokens), and `check` is the largest difference from
    attnkit's logits after the prompt."""
    import onnxruntime

    from attnkit.interop.onnx import export_onnx

    folder = Path(tempfile.mkdtemp(prefix="attnkit-onnx-"))
    path = folder / "model.onnx"
    export = export_onnx(model, config, path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    path.unlink()  # read into the session
    folder.rmdir()
    pasts = [name for name in export.inputs if name.startswith("past_key_values.")]
    ids = prompt.numpy()
    batch, heads, head_dim = ids.shape[0], config.resolved.n_kv_heads, config.resolved.head_dim
    empty = np.zeros((batch, heads, 0, head_dim), dtype=np.float32)

    def decode(tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Greedy decoding of `tokens` tokens: (the logits after the prompt (B, V), the new tokens (B, tokens))."""
        mask = np.ones(ids.shape, dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, **dict.fromkeys(pasts, empty)}
        chosen, first = [], None
        for _ in range(tokens):
            logits, *presents = session.run(None, feed)
            first = logits[:, -1] if first is None else first
            chosen.append(logits[:, -1].argmax(axis=-1)[:, None])  # (B, 1)
            if len(chosen) == tokens:
                break
            mask = np.concatenate((mask, np.ones((batch, 1), dtype=np.int64)), axis=1)
            feed = {"input_ids": chosen[-1], "attention_mask": mask, **dict(zip(pasts, presents, strict=True))}
        return first, np.concatenate(chosen, axis=1)

    with torch.no_grad():
        expected = model(prompt).logits[:, -1].float().numpy()
    check = float(np.abs(decode(1)[0] - expected).max())

    def run(tokens: int = new_tokens) -> np.ndarray:
        return decode(tokens)[1]

    return run, check
