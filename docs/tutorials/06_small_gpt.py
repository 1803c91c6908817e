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
# # 6. A small GPT, block by block, trained on Tiny Shakespeare and sampled
#
# **Follows:** CMU 11-711 Advanced NLP, "Attention and Transformers": the "Core Transformer Concepts" (positional
# encodings, scaled dot-product self-attention, multi-headed attention, residual + layer normalization,
# feed-forward layer), the minGPT code slide, the `Block` / `TransformerLM` code slide (pre-normalization), and
# "Masking for Language Model Training"; COGS 150, "The Transformer block" (self-attention, feed-forward layers,
# residual connections, normalizing layers) and "GPT = Generative Pre-trained Transformer"; UvA ATCS, "Add & Norm";
# UT CS 371N's recap of n-gram language models ("estimate this by counting & normalizing"). Sampling
# (temperature, top-k, top-p) is not in the lectures; the papers are cited where it is built.
#
# **You will:** build a GPT from its parts in plain PyTorch, one part at a time, and check each part and then the
# whole model against attnkit's, weight for weight; train attnkit's model on Tiny Shakespeare with attnkit's
# trainer and set it beside n-gram models counted on the same text; then write temperature, top-k and top-p
# sampling and compare them with attnkit's.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import dataclasses
import json
import math
import os
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
torch.manual_seed(0)
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## The data: characters of Tiny Shakespeare
#
# One token per character, as in char-rnn and nanoGPT's Shakespeare setup. The text lives beside the repository
# (`../shared/data/tinyshakespeare/input.txt`); where it is absent, Python's own source code stands in.

# %%
from attnkit.data import read_text, stdlib_files
from attnkit.tokenize import CharTokenizer


def shared_data(name):
    """../shared/data/NAME, looked for beside every folder above the working directory; None when absent."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "shared" / "data" / name).exists():
            return folder / "shared" / "data" / name
    return None


temporary = tempfile.TemporaryDirectory(prefix="attnkit-tutorial-")  # removed, with all in it, when the kernel stops
workdir = Path(temporary.name)  # everything this notebook writes goes here
corpus = shared_data("tinyshakespeare/input.txt")
if corpus is None:
    print("Tiny Shakespeare is absent (../shared/data/tinyshakespeare): training on Python's own source instead")
    corpus = workdir / "python-source.txt"
    corpus.write_text("".join(read_text(p) for p in stdlib_files(max_bytes=1_000_000)))
text = corpus.read_text()
tokenizer = CharTokenizer.from_texts([text])
print(f"{len(text):,} characters, {tokenizer.vocab_size} tokens (the alphabet and a few special tokens)")
print(text[:200])

# %% [markdown]
# ## The parts, from scratch
#
# The sizes: width $C = 128$, 4 heads, 4 blocks, a context of 64 characters (nanoGPT's CPU setting).
# Each part is named as attnkit names it (`q_proj`, `attn_norm`, `up_proj`, ...), so that one model's weights
# load into the other by name.

# %%
C, H, N_LAYERS, CONTEXT, V = 128, 4, 4, 64, tokenizer.vocab_size


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(C, C) for _ in range(4))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, C // H).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // H)  # (B, H, T, T)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))  # heads side by side, then mixed


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.gelu(self.up_proj(x)))  # the same MLP at every position


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.self_attn = nn.LayerNorm(C), CausalSelfAttention()
        self.mlp_norm, self.mlp = nn.LayerNorm(C), FeedForward()

    def forward(self, x):
        x = x + self.self_attn(self.attn_norm(x))  # pre-norm residual: x + sublayer(norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.token, self.positions = nn.Embedding(V, C), nn.Embedding(CONTEXT, C)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.final_norm = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.token.weight  # tied input and output embeddings (Press & Wolf 2017)

    def forward(self, ids):
        x = self.token(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))  # (B, T, V): next-character logits at every position


scratch = GPT()
print(f"{sum(p.numel() for p in scratch.parameters()):,} parameters")

# %% [markdown]
# ### The residual connection and layer normalization, as the lectures write them
#
# COGS 150's residual connection adds a layer's input to its output before passing it on, "dog" +
# Self-Attention("dog"); CMU 11-711 writes it $\mathrm{Residual}(x, f) = f(x) + x$. Layer normalization (Ba et al.
# 2016) "keeps the values of a hidden layer within a range", COGS 150's "similar to a z-score": for each token, over
# its $C$ features, $\mathrm{LN}(x) = \gamma \odot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$, with $\mu$ and
# $\sigma^2$ that token's own mean and variance (not the batch's), a small $\epsilon$ that keeps the division finite
# ($10^{-5}$ in PyTorch and attnkit), and a learned gain $\gamma$ and shift $\beta$.
# The feed-forward network is GPT-2's two layers, $C \to 4C$, GELU, $4C \to C$, the same at every position. The
# block above puts them together as GPT-2 does: each sublayer reads the normalised stream and adds its output to
# the stream itself, $x + f(\mathrm{LN}(x))$ (pre-norm; the original order comes below). Two checks: the z-score
# formula is attnkit's `LayerNorm`, and a block whose sublayers add nothing hands its input on unchanged, along the
# residual path.

# %%
import copy

from attnkit.layers.norms import LayerNorm

drawn = torch.Generator().manual_seed(1)  # its own: the cells after this one draw as they did without it
x = torch.randn(2, 10, C, generator=drawn) * 3 + 1  # (B, T, C): hidden states far from mean 0, std 1
mean, var = x.mean(-1, keepdim=True), x.var(-1, correction=0, keepdim=True)  # (B, T, 1): each token's own
z = (x - mean) / torch.sqrt(var + 1e-5)  # (B, T, C): each token's z-score
norm = LayerNorm(C)
with torch.no_grad():
    norm.weight.normal_(generator=drawn)  # a learned gain and shift, here drawn at random
    norm.bias.normal_(generator=drawn)
    torch.testing.assert_close(norm(x), z * norm.weight + norm.bias)
    torch.testing.assert_close(scratch.blocks[0].attn_norm(x), z)  # as built: gain 1, shift 0

silent = copy.deepcopy(scratch.blocks[0])
with torch.no_grad():
    for projection in (silent.self_attn.o_proj, silent.mlp.down_proj):
        projection.weight.zero_()  # the sublayers' outputs are 0 ...
        projection.bias.zero_()
    torch.testing.assert_close(silent(x), x, rtol=0, atol=0)  # ... and x comes through, exactly
print("LayerNorm is each token's z-score, then a gain and a shift; with its sublayers silent, a block is the identity")

# %% [markdown]
# ## attnkit's GPT, and the same numbers part by part
#
# attnkit describes the same model with a config; `build_model` makes it. Load attnkit's weights into the
# from-scratch model (the names differ only by attnkit's `stack.` and `embeddings.` prefixes, and loading is
# strict: every tensor must find its place), then compare the attention, a block, and the whole model.

# %%
from attnkit import ModelConfig, build_model
from attnkit.layers.masks import AttentionMask

config = ModelConfig(family="decoder", vocab_size=V, d_model=C, n_heads=H, n_layers=N_LAYERS, d_ff=4 * C,
                     max_seq_len=CONTEXT, position="learned", norm="layer", norm_position="pre", activation="gelu",
                     bias=True, tie_embeddings=True, dropout=0.0)
model = build_model(config)
weights = {name.replace("stack.", "").replace("embeddings.", ""): tensor for name, tensor in model.state_dict().items()}
scratch.load_state_dict(weights, strict=True)

ids = torch.tensor([tokenizer.encode("First Citizen:\nBefore we proceed any further, hear me speak.")])
with torch.no_grad():
    x = torch.randn(2, 10, C)
    ours, theirs = scratch.blocks[0], model.stack.blocks[0]
    torch.testing.assert_close(ours.self_attn(x), theirs.self_attn(x, mask=AttentionMask(10, causal=True))[0])
    torch.testing.assert_close(ours.mlp(x), theirs.mlp(x))
    torch.testing.assert_close(ours(x), theirs(x)[0])
    torch.testing.assert_close(scratch(ids), model(ids).logits)
print("attention, feed-forward, block and whole model: the same numbers as attnkit's")

# %% [markdown]
# ## Post-norm: the original block (UvA's Add and Norm)
#
# The block above is **pre-norm** (GPT-2, Llama; CMU's "Pre-Layer Norm" slide, Xiong et al. 2020): each sublayer
# reads a normalised copy and its output is added to the untouched residual stream, $x + \mathrm{SubLayer}(
# \mathrm{LN}(x))$. The original Transformer, and UvA's "Add & Norm" slide, put the norm *after* the addition:
#
# $$X_l = \mathrm{LayerNorm}(X_{l-1} + \mathrm{SubLayer}(X_{l-1}))$$
#
# so the residual stream itself is normalised after every sublayer. attnkit builds it with
# `norm_position="post"`; the same parts, in the other order:

# %%
class PostNormBlock(Block):
    def forward(self, x):
        x = self.attn_norm(x + self.self_attn(x))  # post-norm residual: norm(x + sublayer(x))
        return self.mlp_norm(x + self.mlp(x))


post_config = dataclasses.replace(config, norm_position="post")
post_block = build_model(post_config).stack.blocks[0]
ours = PostNormBlock()
ours.load_state_dict(post_block.state_dict(), strict=True)
with torch.no_grad():
    x = torch.randn(2, 10, C) * 3 + 1  # a stream far from normalised, so a misplaced norm would show
    out = post_block(x)[0]
    torch.testing.assert_close(ours(x), out)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 10), rtol=0, atol=1e-4)  # what leaves is normalised
    torch.testing.assert_close(out.std(-1, correction=0), torch.ones(2, 10), rtol=1e-3, atol=1e-3)
print("post-norm block: attnkit = LayerNorm(X + SubLayer(X)), twice; every row leaving it has mean 0, std 1")

# %% [markdown]
# ## Train it with attnkit's trainer
#
# `attnkit train` is a command; `attnkit.train.job.prepare` is the same thing as a function. It reads the text,
# holds out the last 10% for validation, trains with AdamW and a cosine schedule, evaluates, and writes a run
# directory (config, weights, tokenizer, `metrics.jsonl`) that `attnkit.load` reads back.
#
# The command below trains the model built above: every field where attnkit's default differs from it is given
# (attnkit's decoder defaults to Llama's RMSNorm, SwiGLU and no biases, tutorial 7's model). The notebook reads the
# command with attnkit's own parser, checks that it builds a model of the same config and parameter count as the
# from-scratch one, and trains that (at the tiny budget with fewer steps and smaller batches).

# %%
import shlex

from attnkit import count_parameters
from attnkit.cli import parse, train_request
from attnkit.train.job import check_request, prepare

run_dir = workdir / "shakespeare"
command = ["train", "--data", str(corpus), "--tokenizer", "char", "--out", str(run_dir), "--device", "cpu",
           "--set", "d_model=128", "n_layers=4", "n_heads=4", "d_ff=512", "max_seq_len=64", "position=learned",
           "norm=layer", "activation=gelu", "bias=true", "dropout=0.0",
           "--batch-size", "12", "--lr", "1e-3", "--warmup", "100", "--max-steps", "2000", "--max-time", "600",
           "--eval-every", "250", "--eval-batches", "20"]
print("attnkit", shlex.join(command).replace(str(run_dir), "runs/shakespeare"))  # (the notebook writes to a temp dir)
invocation = parse(command)  # what `attnkit train ...` would run, without running it
request = train_request(invocation.settings, *invocation.sections)
command_config, _, training = check_request(request)
command_config = dataclasses.replace(command_config, vocab_size=V)  # the vocabulary is the tokenizer's
assert command_config == config, f"the command builds another model: {command_config}"
assert count_parameters(command_config) == sum(p.numel() for p in scratch.parameters())
print(f"the command's model: {count_parameters(command_config):,} parameters, the from-scratch GPT's config; "
      f"batches of {training.batch_size}")
if BUDGET == "tiny":  # seconds, not minutes: the first 100 kB, five steps of batches of 4
    request = dataclasses.replace(
        request, data={**request.data, "eval_batches": 2, "max_bytes": 100_000},
        settings={**request.settings, "max_steps": 5, "eval_every": 5, "batch_size": 4, "warmup": 2})
request = dataclasses.replace(request, progress=False)
result = prepare(request).fit()
print(f"stopped after {result.step} steps ({result.reason}), {result.elapsed:.0f} s: "
      f"validation loss {result.evaluation['val_loss']:.3f} nats per character")

# %%
records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
train_curve = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train"]
val_curve = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(*zip(*train_curve, strict=True), alpha=0.5, label="training batch")
ax.plot(*zip(*val_curve, strict=True), marker="o", label="validation (held-out 10%)")
ax.axhline(math.log(tokenizer.vocab_size), color="grey", linestyle=":", label="uniform guess, log V")
ax.set(xlabel="step", ylabel="loss (nats per character)", title="a 4-layer GPT on Tiny Shakespeare")
ax.legend()
plt.show()

# %% [markdown]
# ## Before neural networks: n-gram models, by counting
#
# UT CS 371N's recap and COGS 150's taxonomy of language models start from statistical ones. An $n$-gram model
# predicts a character from the $n - 1$ before it, and its probabilities are "estimated by counting & normalizing"
# over the training text. Add-$\alpha$ smoothing leaves some probability for what training never showed:
# $P(w \mid c) = (\#(c\,w) + \alpha) / (\#c + \alpha V)$. The text is split as the trainer split it: the last
# 10% is held out (at the tiny budget, of the same first 100 kB).

# %%
from attnkit.data.lm import split_point
from attnkit.models.ngram import NGramLM

counted = torch.tensor(tokenizer.encode(text[:100_000] if BUDGET == "tiny" else text))  # (N,)
held_out = split_point(len(counted), 0.1)  # the trainer's split: the first 90% trains
train_ids, val_ids = counted[:held_out], counted[held_out:]


def ngram_loss(n, alpha):
    """Validation loss (nats per character) of the n-gram model counted on train_ids, add-alpha smoothed."""
    return NGramLM(n=n, vocab_size=V, alpha=alpha).fit(train_ids).cross_entropy(val_ids)


def kneser_ney_loss(n):
    """The same, interpolated Kneser-Ney (discount 0.75): each order mixed with the one below it."""
    return NGramLM(n=n, vocab_size=V, smoothing="kneser-ney").fit(train_ids).cross_entropy(val_ids)


losses = {n: (ngram_loss(n, 1.0), ngram_loss(n, 0.1), kneser_ney_loss(n)) for n in (1, 2, 3, 4, 5)}
for n, (add_one, tenth, kneser_ney) in losses.items():
    print(f"{n}-gram: validation loss {add_one:.3f} (add-one), {tenth:.3f} (alpha 0.1), {kneser_ney:.3f} (Kneser-Ney)")
print(f"the GPT above, after {result.step} steps: {result.evaluation['val_loss']:.3f}")
if BUDGET == "full":  # the text below: the best add-alpha table (4-gram, alpha 0.1) is ahead of the GPT where it
    # stopped, and Kneser-Ney's 5-gram ahead of every add-alpha table
    assert losses[4][1] < result.evaluation["val_loss"], (losses[4], result.evaluation)
    assert losses[5][2] < min(min(row[:2]) for row in losses.values()), losses

# %% [markdown]
# With add-one and $\alpha = 0.1$ each character of context helps, up to a point, and then the next one hurts. That
# is add-$\alpha$'s fault more than the text's: most held-out characters follow a context that training counted often
# (at the full budget only 4% follow a 4-character context it never saw), but where a context is rare or unseen,
# add-$\alpha$ has nothing to fall back on and spreads its probability evenly over all $V = 72$ tokens (the 65
# characters and 7 special tokens, which never occur). A smaller $\alpha$ already moves the turning point
# ($\alpha = 0.03$: the 5-gram 1.761, the 4-gram 1.783); a model that interpolates each order with the shorter
# contexts below it does better again. The last column is interpolated Kneser-Ney (Kneser & Ney 1995; Chen &
# Goodman 1998; Jurafsky & Martin ch. 3; `NGramLM(smoothing="kneser-ney")`): it subtracts a discount $d = 0.75$
# from every count, gives what it took to the order below, and counts a lower order's character by the number of
# contexts it followed rather than how often it occurred. It keeps improving with context where add-$\alpha$ turns
# back: at the full budget 1.722 for the 4-gram and 1.566 for the 5-gram.
# The best add-$\alpha$ table printed here (the 4-gram, $\alpha = 0.1$, 1.791 at the full budget) is ahead of this
# GPT where it stopped: nanoGPT reports about 1.88 for this shape after 2,000 steps, attnkit's `shakespeare-char`
# recipe (the same shape without biases) 1.907 on every validation token, and on a two-core EPYC busy with other
# work the ten-minute limit stopped this notebook at 1,553 steps (1.959) in one run and 1,491 (2.002) in another
# (two runs no results file keeps; the line above gives your run's): at this size and training time, counting is a
# strong baseline. What no table can do is grow its context: a 4-gram table over 65 characters has $65^4$ (18
# million) cells, a 64-gram would have more than there are atoms, while the GPT reads 64 characters with 0.8 million
# parameters and is still learning when it stops.
# With tutorial 7's Llama-style block and the same budget, attnkit's `shakespeare-char-plus` recipe reaches 1.665
# ([recipes](../../recipes/)), ahead of every add-$\alpha$ table but still behind the Kneser-Ney 5-gram.

# %% [markdown]
# ## Sampling: temperature, top-k, top-p
#
# A language model gives a distribution over the next token; generating means choosing from it, one token at a
# time. Three ways to reshape the distribution before sampling:
#
# - **temperature** $\tau$: divide the logits by $\tau$. Below 1 sharpens (0 is greedy: always the most likely
#   token), above 1 flattens.
# - **top-k** (Fan et al. 2018): keep the $k$ most likely tokens.
# - **top-p**, "nucleus" (Holtzman et al. 2020): keep the smallest set of most likely tokens whose probability
#   reaches $p$.

# %%
def reshape_logits(logits, temperature=1.0, top_k=None, top_p=None):
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # the tokens before this one already reach p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


from attnkit import load
from attnkit.generate.sampling import SamplingConfig, process_logits

pipeline = load(run_dir, device="cpu")  # the trained model, its config and its tokenizer
prompt = "ROMEO:\n"
with torch.no_grad():
    logits = pipeline.model(torch.tensor([pipeline.tokenizer.encode(prompt)])).logits[:, -1]  # (1, V)
for setting in (dict(temperature=0.7), dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_p=0.9),
                dict(temperature=1.3, top_k=20, top_p=0.95)):
    torch.testing.assert_close(process_logits(logits, SamplingConfig(**setting)), reshape_logits(logits, **setting))
print("temperature, top-k and top-p: the same logits as attnkit's sampler")

# %%
settings = {"temperature 0.5": dict(temperature=0.5), "temperature 1": dict(temperature=1.0),
            "temperature 1.5": dict(temperature=1.5), "top-k 5": dict(top_k=5), "top-p 0.9": dict(top_p=0.9)}
top = logits[0].softmax(-1).topk(12).indices  # the 12 characters the model finds most likely
labels = [pipeline.tokenizer.decode([i]).replace(" ", "\u2423").replace("\n", "\\n") for i in top.tolist()]
fig, ax = plt.subplots(figsize=(11, 4))
for n, (name, setting) in enumerate(settings.items()):
    probs = reshape_logits(logits, **setting)[0].softmax(-1)[top]
    ax.bar(torch.arange(12) + (n - 2) * 0.16, probs, width=0.16, label=name)
ax.set_xticks(range(12), labels)
ax.set(xlabel="next character", ylabel="probability", title=f"what follows {prompt!r}, reshaped five ways")
ax.legend()
plt.show()

# %% [markdown]
# Now generate with attnkit's pipeline (prefill the prompt, then one token at a time through the KV cache):

# %%
new_tokens = {"tiny": 40, "full": 300}[BUDGET]
for name, setting in (("greedy (temperature 0)", dict(temperature=0.0)), ("temperature 0.8", dict(temperature=0.8)),
                      ("top-k 10", dict(top_k=10)), ("top-p 0.9", dict(top_p=0.9))):
    sample = pipeline.generate(prompt, max_new_tokens=new_tokens, seed=0, **setting)[0]
    print(f"--- {name}\n{prompt}{sample}\n")

# %% [markdown]
# Greedy decoding tends to fall into a loop; sampling with no filter now and then picks a character from the
# unlikely tail and derails; top-k and top-p cut that tail off, and a lower temperature makes the text safer and
# duller. The full budget trains for 2,000 steps (nanoGPT's CPU setting), cut short after ten minutes on a slow or
# busy machine: the printed step count and validation loss say where it stopped. For scale, nanoGPT's CPU setting
# (this model's shape) reaches a validation loss of about 1.88 after 2,000 steps; around 2 the samples spell short
# words, name speakers and keep the play's layout. At the tiny budget the model has trained for five steps and
# writes noise.
#
# **In attnkit:** `attnkit.models.DecoderLM` (built by `build_model` from a `DecoderConfig`), `attnkit.blocks`,
# `attnkit.train` (the trainer), `attnkit.generate.sampling` and `attnkit.load(...).generate(...)`; from the
# command line, `attnkit train` and `attnkit generate RUN --prompt "ROMEO:" --temperature 0.8 --top-k 10`.

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. Write `block_parameters(C)`: the parameter count of one block of this GPT (four C x C projections with biases,
#    an FFN of width 4C with biases, two LayerNorms with gain and bias) as a formula in C.
# 2. Write `nucleus_size(probs, p)`: how many tokens top-p keeps from a 1-d probability vector.
# 3. *Predict, then run:* sample the character after `"ROMEO:\n"` 200 times at temperature 0.01. You get
#    `"the most likely character every time"` (at least 95% of the draws) or `"a spread of characters"`?
# 4. *Predict, then run:* every row leaving the post-norm block has mean 0 and standard deviation 1. Is that also
#    true of the **pre**-norm block's output? `"yes"` or `"no"`.

# %%
from attnkit.exercises import exercise


@exercise(1, hint="four C x C projections with biases, C -> 4C -> C with biases, two norms of 2C each")
def check_1(block_parameters):
    widths = (16, 64, 128)
    counts = [sum(p.numel() for p in build_model(dataclasses.replace(config, d_model=c, d_ff=4 * c, n_heads=4))
                  .stack.blocks[0].parameters()) for c in widths]
    print(f"attnkit's blocks hold {counts} parameters for C = {widths}")
    return [block_parameters(c) for c in widths] == counts


@exercise(2, hint="sort the probabilities, and keep each token whose predecessors do not yet reach p")
def check_2(nucleus_size):
    cases = [(logits[0].softmax(-1), 0.9), (torch.tensor([0.5, 0.3, 0.2]), 0.75), (torch.tensor([0.6, 0.4]), 0.5)]
    expected = [int(torch.isfinite(reshape_logits(probs.log()[None], top_p=p)).sum()) for probs, p in cases]
    return [nucleus_size(probs, p) for probs, p in cases] == expected


@exercise(3, hint="dividing the logits by 0.01 multiplies every gap between them by 100",
          choices=("the most likely character every time", "a spread of characters"))
def check_3(prediction):
    probs = process_logits(logits, SamplingConfig(temperature=0.01)).softmax(-1)  # (1, V)
    draws = torch.multinomial(probs.expand(200, -1), 1, generator=torch.Generator().manual_seed(0)).flatten()
    likeliest = int(logits.argmax())
    share = (draws == likeliest).float().mean().item()
    print(f"measured: {share:.1%} of 200 draws are the most likely character, "
          f"{pipeline.tokenizer.decode([likeliest])!r}")
    # a near-tie of the two likeliest (logits within about 0.03) still gives a spread at 0.01: a model stopped early
    measured = "the most likely character every time" if share >= 0.95 else "a spread of characters"
    return prediction == measured


@exercise(4, hint="pre-norm normalises the copy each sublayer reads, and adds the result to the stream as it is",
          choices=("yes", "no"))
def check_4(prediction):
    pre_block = build_model(config).stack.blocks[0]
    with torch.no_grad():
        out = pre_block(torch.randn(2, 10, C) * 3 + 1)[0]
    mean, std = out.mean(-1).abs().max().item(), out.std(-1, correction=0)
    print(f"measured: rows leaving the pre-norm block: |mean| up to {mean:.2f}, std {std.min():.2f} to {std.max():.2f}")
    normalised = mean < 1e-3 and torch.allclose(std, torch.ones_like(std), atol=1e-3)
    return prediction == ("yes" if normalised else "no")


block_parameters = None  # your function here
nucleus_size = None  # your function here
prediction_3 = None  # "the most likely character every time" or "a spread of characters"
prediction_4 = None  # "yes" or "no"
for check, answer in ((check_1, block_parameters), (check_2, nucleus_size), (check_3, prediction_3),
                      (check_4, prediction_4)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 3. The most likely character every time (unless two are within a hair of each other): temperature 0.01
#    multiplies every gap between logits by 100, so the softmax is one-hot; temperature 0 *is* greedy decoding.
#    The hair: two logits 0.03 apart become 3 apart, and the second is drawn $1/(1 + e^3) \approx 5\%$ of the
#    time. A model stopped early can leave such a near-tie after `"ROMEO:\n"`; then 200 draws may fall short of
#    95%, and the cell below says so instead of holding the check to "every time".
# 4. No: a pre-norm block adds its sublayers' outputs to the stream without normalising the sum, so the stream
#    keeps its scale (here mean about 1, std about 3) and grows layer by layer. That is why pre-norm models end
#    with a final norm before the output layer.

# %% tags=["solution"] jupyter={"source_hidden": true}
def nucleus_solution(probs, p):
    ordered = probs.sort(descending=True).values
    return int((ordered.cumsum(0) - ordered < p).sum())  # those not already past p before them


assert check_1(lambda c: 4 * (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c) + 2 * 2 * c)
assert check_2(nucleus_solution)
assert check_4("no") and not check_4("yes")
assert not check_1(lambda c: 12 * c * c)  # a wrong answer: the biases and norms left out
likeliest = process_logits(logits, SamplingConfig(temperature=0.01)).softmax(-1).max().item()  # a draw's chance
if likeliest > 0.99:  # no near-tie: 200 draws miss it about twice, far from the 10 (5%) that make a spread
    assert check_3("the most likely character every time") and not check_3("a spread of characters")
else:
    print(f"a near-tie: at temperature 0.01 the likeliest character has {likeliest:.1%} of each draw, so whether "
          "200 draws reach 95% is chance: exercise 3 is not held to 'every time' for this model")
assert not check_2(lambda probs, p: probs.cumsum() < p)  # an error in the answer (cumsum needs dim): wrong
