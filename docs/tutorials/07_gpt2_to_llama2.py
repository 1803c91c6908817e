# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 7. From GPT-2 to Llama 2: RMSNorm, SwiGLU, RoPE, grouped-query attention and the KV cache
#
# **Follows:** CMU 11-711 Advanced NLP, "Attention and Transformers", part 3 "Improved transformer architecture":
# "Pre- Layer Norm", "RMSNorm (Zhang and Sennrich 2019)", "Rotary Positional Encodings", "Grouped-query
# attention" (with Llama's `repeat_kv` code), the table "Original Transformer vs. LLama", and "How Important is
# It?" (Transformer++). The KV cache is the decoding side of the lecture's "Transformer Training" slide: training
# computes every position at once, generation one position at a time.
#
# **You will:** rebuild the lecture's comparison table from attnkit's presets, write RMSNorm, SwiGLU, grouped-query
# attention and a KV cache from scratch and check each against attnkit, load a Hugging Face Llama checkpoint (a
# small random one, built here: nothing is downloaded) and check its logits, then measure what the cache saves.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import os
import tempfile
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
os.environ["HF_HUB_OFFLINE"] = "1"  # transformers must never reach for the network here
torch.manual_seed(0)
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## The lecture's table, from attnkit's presets
#
# attnkit keeps the published shapes as data (`attnkit.presets`, `attnkit presets` on the command line); the
# parameter counts are computed on PyTorch's meta device, without allocating anything.

# %%
from attnkit import count_parameters, presets

print("| preset | layers | width | heads / kv heads | norm | FFN | positions | parameters |")
print("|---|---|---|---|---|---|---|---|")
for name in ("vaswani-base", "gpt2-124m", "llama-7b", "llama2-7b", "llama2-70b"):
    config = presets.get(name)
    row = presets.summary(config)
    print(f"| {name} | {row['layers']} | {row['width']} | {row['heads/kv']} | {row['norm']} | {row['ffn/cell']} | "
          f"{row['positions']} | {count_parameters(config) / 1e9:.2f} B |")

# %% [markdown]
# The lecture's table reads: norm position post (Vaswani) -> pre (Llama, Llama 2); LayerNorm -> RMSNorm; ReLU ->
# SwiGLU; sinusoidal -> RoPE; multi-head -> grouped-query (Llama 2's 70B model, 8 key/value heads for 64 query
# heads). The rows above say the same.
#
# ## RMSNorm
#
# $\mathrm{RMSNorm}(x) = \dfrac{x}{\mathrm{RMS}(x)} \cdot g$, $\mathrm{RMS}(x) = \sqrt{\tfrac1n \sum_i x_i^2}$:
# LayerNorm without the mean and the bias ("simplifies LayerNorm by removing the mean and bias terms").

# %%
def rms_norm(x, gain, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


from attnkit.layers.norms import LayerNorm, RMSNorm

norm = RMSNorm(64)
torch.nn.init.normal_(norm.weight)
x = torch.randn(2, 5, 64) * 3 + 1
torch.testing.assert_close(norm(x), rms_norm(x, norm.weight))

centred = x - x.mean(-1, keepdim=True)  # on inputs with mean 0, the two norms agree
torch.testing.assert_close(RMSNorm(64, eps=1e-5)(centred), LayerNorm(64, bias=False)(centred), rtol=1e-4, atol=1e-4)
print("RMSNorm: attnkit = the formula; on zero-mean inputs it is LayerNorm")

# %% [markdown]
# ## SwiGLU (Shazeer 2020)
#
# The feed-forward layer with a gate: $\mathrm{down}(\mathrm{SiLU}(\mathrm{gate}(x)) \odot \mathrm{up}(x))$. Three
# matrices instead of two, so Llama shrinks the hidden width to about $\tfrac83 C$ to keep the parameter count of
# a $4C$ GELU layer.

# %%
from attnkit.layers.feedforward import FeedForward, SwiGLU

C = 96
swiglu = SwiGLU(C, 256)
x = torch.randn(2, 5, C)
scratch = swiglu.down_proj(F.silu(swiglu.gate_proj(x)) * swiglu.up_proj(x))
torch.testing.assert_close(swiglu(x), scratch)
gelu_ffn = FeedForward(C, 4 * C, bias=False)
print("SwiGLU: attnkit = the formula.",
      f"parameters at C = {C}: GELU with d_ff = 4C {sum(p.numel() for p in gelu_ffn.parameters()):,}, "
      f"SwiGLU with d_ff = 8C/3 = 256 {sum(p.numel() for p in swiglu.parameters()):,}")

# %% [markdown]
# ## Grouped-query attention (Ainslie et al. 2023)
#
# $H$ query heads share $H_{kv}$ key/value heads, each serving $H / H_{kv}$ query heads: fewer keys and values to
# keep during generation. Llama's code repeats each key/value head for its group (`repeat_kv`) and then runs
# ordinary attention:

# %%
def grouped_query_attention(x, attention, n_heads, n_kv_heads):
    B, T, _ = x.shape
    D = attention.head_dim
    q = attention.q_proj(x).view(B, T, n_heads, D).transpose(1, 2)  # (B, H, T, D)
    k = attention.k_proj(x).view(B, T, n_kv_heads, D).transpose(1, 2)  # (B, Hkv, T, D)
    v = attention.v_proj(x).view(B, T, n_kv_heads, D).transpose(1, 2)
    k, v = (t.repeat_interleave(n_heads // n_kv_heads, dim=1) for t in (k, v))  # repeat_kv: (B, H, T, D)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = torch.softmax((q @ k.transpose(-2, -1) / D**0.5).masked_fill(causal, float("-inf")), dim=-1)
    return attention.o_proj((weights @ v).transpose(1, 2).reshape(B, T, n_heads * D)), weights  # (B, H, T, T)


from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask

# attnkit's Attention has two paths: a fused kernel (PyTorch's scaled_dot_product_attention) when no weights are
# asked for, and a readable reference path that returns them (what `attnkit viz` and the explorer draw). Both must
# group the heads as repeat_kv does.
x = torch.randn(2, 7, C)
for n_kv_heads in (8, 2, 1):  # multi-head, grouped-query, multi-query
    gqa = Attention(C, 8, n_kv_heads=n_kv_heads, bias=False)
    scratch, scratch_weights = grouped_query_attention(x, gqa, 8, n_kv_heads)
    fused = gqa(x, mask=AttentionMask(7, causal=True))[0]  # the fast kernel path
    reference, weights = gqa(x, mask=AttentionMask(7, causal=True), need_weights=True)  # the path viz reads
    torch.testing.assert_close(fused, scratch)
    torch.testing.assert_close(reference, scratch)
    torch.testing.assert_close(weights, scratch_weights)  # (B, H, T, T): query head h reads kv head h // group
    print(f"{n_kv_heads} key/value head{'s' if n_kv_heads > 1 else ''} for 8 query heads: attnkit = the from-scratch "
          f"layer on both paths; k_proj is {tuple(gqa.k_proj.weight.shape)}")

# %% [markdown]
# ## The KV cache
#
# A decoder generates one token at a time, and each new token attends to all the earlier ones. Their keys and
# values do not change (the mask keeps every position blind to what comes later), so they are computed once and
# kept: each step projects only the new token and appends its key and value. From scratch, for one attention
# layer:

# %%
layer = Attention(C, 8, n_kv_heads=2, bias=False)
x = torch.randn(1, 10, C)
full = layer(x, mask=AttentionMask(10, causal=True))[0]  # every position at once, as in training

cached_keys, cached_values, steps = [], [], []
D = layer.head_dim
for t in range(10):  # one token at a time
    new = x[:, t : t + 1]
    cached_keys.append(layer.k_proj(new).view(1, 1, 2, D).transpose(1, 2))  # (1, Hkv, 1, D): computed once
    cached_values.append(layer.v_proj(new).view(1, 1, 2, D).transpose(1, 2))
    q = layer.q_proj(new).view(1, 1, 8, D).transpose(1, 2)  # (1, H, 1, D): the new token's query only
    k, v = (torch.cat(c, dim=2).repeat_interleave(4, dim=1) for c in (cached_keys, cached_values))  # (1, H, t+1, D)
    weights = torch.softmax(q @ k.transpose(-2, -1) / D**0.5, dim=-1)  # no mask: the cache holds only the past
    steps.append(layer.o_proj((weights @ v).transpose(1, 2).reshape(1, 1, 8 * D)))
torch.testing.assert_close(torch.cat(steps, dim=1), full)
print("one token at a time with a cache = the whole sequence at once")

# %% [markdown]
# attnkit's decoders take a preallocated cache (`allocate_cache`) and append to it; here a small Llama 2 shaped
# model (RMSNorm, SwiGLU, RoPE, 4 query heads sharing 2 key/value heads) decodes token by token and matches its
# own full forward pass:

# %%
from attnkit import build_model

llama = build_model(presets.get("llama2-tiny")).eval()
ids = torch.randint(llama.stack.embeddings.vocab_size, (2, 24))
with torch.no_grad():
    full_logits = llama(ids).logits  # (B, T, V)
    cache = llama.allocate_cache(batch_size=2, max_len=24)
    prefill = llama(ids[:, :8], cache=cache).logits  # the prompt in one pass
    decoded = [llama(ids[:, t : t + 1], cache=cache).logits for t in range(8, 24)]  # then one token per call
torch.testing.assert_close(torch.cat([prefill, *decoded], dim=1), full_logits, rtol=1e-4, atol=1e-4)
print("attnkit's KV cache: prefill + 16 single-token steps = one full forward pass")

# %% [markdown]
# ## A Hugging Face checkpoint, and its logits
#
# attnkit reads Hugging Face model directories (GPT-2, Llama, BERT, Marian) into its own modules. To check it
# without downloading anything, build a small Llama with random weights in `transformers`, save it the way the
# Hub stores models (`config.json` + `model.safetensors`), read it with attnkit, and compare the logits with
# what `transformers` computes. (The same check runs on a real checkpoint: point `attnkit convert` at it.)

# %%
import contextlib
import logging

import transformers

from attnkit.interop.hf import convert_from_hf
from attnkit.interop.hf import load as load_hf


@contextlib.contextmanager
def no_tokenizer_notices():
    """Inside the block, hide attnkit's notices that a model directory has no tokenizer: the checkpoint built here
    has random weights and reads ids, not text, so it has none on purpose."""
    loggers = [logging.getLogger(name) for name in ("attnkit.interop.hf", "attnkit.generate.pipeline")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


transformers.utils.logging.disable_progress_bar()
temporary = tempfile.TemporaryDirectory(prefix="attnkit-tutorial-")  # removed when the kernel stops
workdir = Path(temporary.name)
hf_config = transformers.LlamaConfig(
    vocab_size=101, hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False)
torch.manual_seed(0)
reference = transformers.LlamaForCausalLM(hf_config)
with torch.no_grad():  # random weights of a visible size (norm gains near 1), so a misplaced tensor would show
    for name, parameter in reference.named_parameters():
        parameter.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1 if name.endswith("norm.weight") else 0.2)
reference.save_pretrained(workdir / "tiny-llama")
reference.eval()

with no_tokenizer_notices():
    loaded = load_hf(workdir / "tiny-llama")
print(f"read a {loaded.architecture} ({loaded.model_type}) as attnkit config:", loaded.config.to_dict())
ids = torch.randint(101, (2, 16))
with torch.no_grad():
    expected = reference(ids).logits
    got = loaded.model(ids).logits
torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
print(f"logits: attnkit = transformers (largest difference {(got - expected).abs().max():.2e})")

# %% [markdown]
# `convert_from_hf` (the command `attnkit convert`) writes the same model as an attnkit run directory, which
# `attnkit.load` serves like any model attnkit trained:

# %%
from attnkit import load

with no_tokenizer_notices():
    convert_from_hf(workdir / "tiny-llama", workdir / "tiny-llama-run")
    pipeline = load(workdir / "tiny-llama-run", device="cpu")
with torch.no_grad():
    torch.testing.assert_close(pipeline.model(ids).logits, expected, rtol=1e-4, atol=1e-4)
print(sorted(p.name for p in (workdir / "tiny-llama-run").iterdir()))

# %% [markdown]
# ## Going further: what the cache and the groups save
#
# **Time.** Without a cache, step $t$ runs the whole prefix through the model again ($t$ tokens); with it, one
# token. Both below decode the same 4-layer Llama-shaped model, token by token, in the same run; the figure is a
# ratio, so it holds on another machine better than the seconds do.

# %%
from attnkit import ModelConfig

model = build_model(ModelConfig(**{**presets.PRESETS["llama2-tiny"], "d_model": 128, "n_layers": 4, "d_ff": 344,
                                   "max_seq_len": 512})).eval()
length = {"tiny": 32, "full": 384}[BUDGET]
ids = torch.randint(512, (1, length))
per_token = {"without cache": [], "with cache": []}
with torch.no_grad():
    for t in range(1, length):  # recompute the prefix each step
        start = time.perf_counter()
        model(ids[:, : t + 1])
        per_token["without cache"].append(time.perf_counter() - start)
    cache = model.allocate_cache(batch_size=1, max_len=length)
    model(ids[:, :1], cache=cache)
    for t in range(1, length):  # one token each step
        start = time.perf_counter()
        model(ids[:, t : t + 1], cache=cache)
        per_token["with cache"].append(time.perf_counter() - start)
total = {name: sum(times) for name, times in per_token.items()}
print(f"{length} tokens: {total['without cache']:.2f} s without the cache, {total['with cache']:.2f} s with it "
      f"({total['without cache'] / total['with cache']:.1f}x)")

# %% [markdown]
# **Memory.** The cache holds, per token, a key and a value for every layer and key/value head:
# $2 \cdot L \cdot H_{kv} \cdot D$ numbers. For the Llama 2 70B shape in 16-bit numbers:

# %%
shape = presets.get("llama2-70b")
kv_bytes = {f"{kv} kv head{'s' if kv > 1 else ''}" + (" (Llama 2 70B)" if kv == 8 else ""):
            2 * shape.n_layers * kv * shape.resolved.head_dim * 2 for kv in (64, 8, 1)}
for name, size in kv_bytes.items():
    print(f"{name:24s} {size / 2**20:6.2f} MiB per token, {size * 4096 / 2**30:6.1f} GiB for 4,096 tokens")

fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4), layout="constrained")
for name, times in per_token.items():
    left.plot(range(2, length + 1), torch.tensor(times).cumsum(0), label=name)
left.set(xlabel="tokens generated", ylabel="seconds, all steps so far", title="decoding token by token")
left.legend()
right.bar(list(kv_bytes), [4096 * b / 2**30 for b in kv_bytes.values()], color=["C0", "C1", "C2"])
right.set(ylabel="GiB", title="KV cache at 4,096 tokens, Llama 2 70B shape, 16-bit")
plt.show()

# %% [markdown]
# Without the cache each step costs more as the text grows, so the total bends upwards; with it each step costs
# about the same (attention still reads all the cached keys, a small part of the work at these lengths), and the
# total is a straight line. Grouped-query attention cuts the
# cache by the group size: 8 key/value heads for 64 query heads keep one eighth of what multi-head attention
# would. Whether the other changes make a better model per unit of compute is the lecture's last slide
# ("Stronger architecture is ~10x more efficient"); attnkit measures it at small scale with
# `attnkit experiment transformer-plus-plus`.
#
# **In attnkit:** `attnkit.layers.norms`, `attnkit.layers.feedforward`, `attnkit.layers.positions.RotaryEmbedding`,
# `attnkit.layers.attention.Attention(n_kv_heads=...)`, `attnkit.layers.kv_cache`, `attnkit.interop.hf`
# (`attnkit convert`), the presets (`attnkit presets`).

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. Write `kv_head_of(h, n_heads, n_kv_heads)`: which key/value head query head `h` reads under grouped-query
#    attention.
# 2. Write `kv_cache_bytes(n_layers, n_kv_heads, head_dim, tokens, bytes_per_number)`.
# 3. Write `gqa_parameters(C, n_heads, n_kv_heads)`: the parameter count of grouped-query attention without biases
#    (heads of width $C / H$).
# 4. *Predict, then run:* add the same number (5) to every entry of a vector. LayerNorm's output does not change.
#    RMSNorm's output: `"unchanged"` or `"changed"`?

# %%
from attnkit.exercises import exercise


@exercise(1, hint="consecutive query heads share one key/value head")
def check_1(kv_head_of):
    for n_kv in (8, 2, 1):
        heads = torch.arange(n_kv).repeat_interleave(8 // n_kv)  # repeat_kv's layout: query head -> its kv head
        if [kv_head_of(h, 8, n_kv) for h in range(8)] != heads.tolist():
            return False
    return True


@exercise(2, hint="a key and a value per layer, kv head and token")
def check_2(kv_cache_bytes):
    return all(kv_cache_bytes(shape.n_layers, kv, shape.resolved.head_dim, 4096, 2) == 4096 * size
               for kv, size in zip((64, 8, 1), kv_bytes.values(), strict=True))


@exercise(3, hint="q_proj and o_proj are C x C; k_proj and v_proj map C to n_kv_heads heads of width C / n_heads")
def check_3(gqa_parameters):
    cases = [(64, 8, 8), (64, 8, 2), (96, 8, 1), (128, 4, 2)]
    return all(gqa_parameters(c, h, kv) == sum(p.numel() for p in Attention(c, h, n_kv_heads=kv, bias=False)
                                                                     .parameters()) for c, h, kv in cases)


@exercise(4, hint="RMSNorm divides by the root mean square, which a shift changes; it subtracts no mean",
          choices=("unchanged", "changed"))
def check_4(prediction):
    probe = torch.randn(3, 64)
    moved = not torch.allclose(norm(probe), norm(probe + 5), atol=1e-4)
    layer_norm = LayerNorm(64)
    assert torch.allclose(layer_norm(probe), layer_norm(probe + 5), atol=1e-4)  # LayerNorm centres first
    print(f"measured: RMSNorm's output {'changed' if moved else 'did not change'}")
    return prediction == ("changed" if moved else "unchanged")


kv_head_of = None  # your function here
kv_cache_bytes = None  # your function here
gqa_parameters = None  # your function here
prediction_4 = None  # "unchanged" or "changed"
for check, answer in ((check_1, kv_head_of), (check_2, kv_cache_bytes), (check_3, gqa_parameters),
                      (check_4, prediction_4)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 4. Changed: RMSNorm divides by $\sqrt{\mathrm{mean}(x^2)}$ and subtracts nothing, so a shift changes both the
#    vector's direction and its RMS. LayerNorm subtracts the mean first, which a shift cancels. Zhang and Sennrich's
#    bet, which Llama took, is that the re-centring is not what makes normalisation work.

# %% tags=["solution"] jupyter={"source_hidden": true}
def gqa_parameters_solution(c, n_heads, n_kv_heads):
    head_dim = c // n_heads
    return 2 * c * c + 2 * c * n_kv_heads * head_dim  # q_proj, o_proj; k_proj, v_proj


assert check_1(lambda h, n_heads, n_kv_heads: h // (n_heads // n_kv_heads))
assert check_2(lambda layers, kv, dim, tokens, size: 2 * layers * kv * dim * tokens * size)
assert check_3(gqa_parameters_solution) and check_4("changed")
assert not check_1(lambda h, n_heads, n_kv_heads: h % n_kv_heads)  # a wrong answer: round robin, not groups
assert not check_2(lambda layers, kv, dim, tokens, size: layers * kv * dim * tokens * size)  # keys, no values
assert not check_3(lambda c, n_heads, n_kv_heads: 4 * c * c)  # multi-head attention's count: no sharing
assert not check_4("unchanged")
