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
# # 11. The Transformer encoder-decoder, from scratch (Vaswani et al. 2017)
#
# **Follows:** UvA ATCS, "Attention & Transformers": "Encoders & Decoders: text comes in, text goes out", the
# "Add & Norm" equation $X_l = \mathrm{LayerNorm}(X_{l-1} + \mathrm{SubLayer}(X_{l-1}))$, "Embedding: Token
# Embedding, Positional Encoding" and "Output: Linear, Softmax"; CMU 11-711, "Attention and Transformers": "Cross
# Attention (Bahdanau et al. 2015): each element in a sequence attends to elements of another sequence", "Self
# Attention (Cheng et al. 2016, Vaswani et al. 2017)", "Masking for Language Model Training"; USC CSCI 499, Lecture
# 11, "Encoder-Decoder Networks". Label smoothing, the learning-rate warmup and beam search are in the paper
# (sections 5.3, 5.4 and 6.1), not the slides; d2l's chapter 11.7 and the Annotated Transformer build the same model.
#
# **You will:** write the model of "Attention Is All You Need" in plain PyTorch (sinusoidal positions, multi-head
# self- and cross-attention, the decoder's causal mask, the post-norm "Add & Norm" layout, the tied output layer),
# check every piece against attnkit's `vaswani` preset with the same weights, write label smoothing, teacher forcing,
# greedy decoding and beam search and check them too, train the model to reverse strings, draw what its
# cross-attention looks at, translate a few Multi30k captions, and compare post-norm with pre-norm.
#
# **Time:** about ten minutes on a laptop's CPU at the full budget (7 to 17 on a busy two-core machine, where the
# Multi30k section stops itself after three minutes of training); `ATTNKIT_TUTORIAL_BUDGET=tiny` runs every cell
# and every assertion in seconds.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import math
import os
import time
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
# ## The model attnkit builds
#
# attnkit's `vaswani-tiny` preset is the paper's base model at a size a laptop trains in minutes: post-norm
# LayerNorm, ReLU feed-forward layers, sinusoidal positions, token embeddings multiplied by $\sqrt{C}$, one
# embedding table shared by the source, the target and the output layer, and label smoothing 0.1. The sizes here:
# width $C = 64$, 4 heads, 2 encoder and 2 decoder layers, a feed-forward width of 256. The vocabulary is the
# synthetic tasks' characters with BOS, EOS and PAD.
#
# The weights start as the paper's do (`paper_init`: Xavier-uniform matrices, embeddings of standard deviation
# $1/\sqrt{C}$, so of unit size once multiplied by $\sqrt{C}$). attnkit's default is GPT-2's, $N(0, 0.02)$ for
# everything: multiplied by $\sqrt{64} = 8$, its token embeddings would start at under a quarter of the position
# table's size (0.16 against 0.71 an entry), and the model would first have to grow them before it could tell
# one token from another.

# %%
from attnkit import build_model, presets
from attnkit.data import synthetic_tokenizer
from attnkit.experiments.norm_placement import paper_init

tokenizer = synthetic_tokenizer()
BOS, EOS, PAD = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
V = tokenizer.vocab_size
config = presets.get("vaswani-tiny", vocab_size=V, max_seq_len=64)
C, H, N_LAYERS, D_FF = config.d_model, config.n_heads, config.n_layers, config.d_ff
model = build_model(config)
paper_init(model)
print(config)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

# %% [markdown]
# ## The parts, from scratch
#
# **Positions.** Attention ignores order (tutorial 3), so each position adds a fixed vector to its token's
# embedding: $PE_{(pos, 2i)} = \sin(pos / 10000^{2i/C})$, $PE_{(pos, 2i+1)} = \cos(pos / 10000^{2i/C})$. The token
# embedding is multiplied by $\sqrt{C}$ first (section 3.4), so that token and position are of a size.
#
# **Attention.** One function for all three uses: $\mathrm{softmax}(QK^\top / \sqrt{D} + M)\,V$, with the mask $M$
# an additive bias of 0 (may look) or $-\infty$ (may not). *Self*-attention takes queries, keys and values from the
# same sequence; *cross*-attention (CMU's slide: "each element in a sequence attends to elements of another
# sequence") takes its queries from the decoder and its keys and values from the encoder's output, the *memory*.
# The decoder's self-attention is *causal*: position $t$ may not look at the target tokens after it.

# %%
def sinusoidal(length):
    """(T, C): the paper's position table, sin on even dimensions and cos on odd ones."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (T, 1)
    freq = 10000 ** (-torch.arange(0, C, 2, dtype=torch.float32) / C)  # (C/2,)
    table = torch.zeros(length, C)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return table


def padding_bias(src_mask):
    """src_mask (B, S), True at real tokens -> (B, 1, 1, S): -inf at padding, for every head and query."""
    return torch.zeros(src_mask.shape).masked_fill(~src_mask, float("-inf"))[:, None, None, :]


def causal_bias(length):
    """(1, 1, T, T): -inf above the diagonal, so that query t sees keys 0..t only."""
    return torch.full((length, length), float("-inf")).triu(1)[None, None]


class MultiHeadAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(C, C) for _ in range(4))

    def forward(self, x, memory, bias):
        """Queries from x (B, T, C), keys and values from memory (B, S, C): memory is x for self-attention."""
        B, T, S, D = x.shape[0], x.shape[1], memory.shape[1], C // H
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, T, C) -> (B, H, T, D)
        k = self.k_proj(memory).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        v = self.v_proj(memory).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D) + bias, dim=-1)  # (B, H, T, S)
        out = (weights @ v).transpose(1, 2).reshape(B, T, C)  # heads side by side: (B, T, C)
        return self.o_proj(out), weights


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(C, D_FF), nn.Linear(D_FF, C)

    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)))  # FFN(x) = max(0, x W1 + b1) W2 + b2


# %% [markdown]
# **Add & Norm.** Each sublayer's output is added to its input and the sum normalised (UvA's slide, the paper's
# $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$): *post*-norm. The encoder layer has two sublayers, the decoder
# layer three: causal self-attention, cross-attention to the memory, the feed-forward layer. The parts carry
# attnkit's names (`self_attn`, `attn_norm`, `cross_attn`, `cross_attn_norm`, `mlp`, `mlp_norm`), so that one
# model's weights load into the other.

# %%
def add_and_norm(x, sublayer_output, norm):
    return norm(x + sublayer_output)  # post-norm: the residual stream itself is normalised


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.attn_norm = MultiHeadAttention(), nn.LayerNorm(C)
        self.mlp, self.mlp_norm = FeedForward(), nn.LayerNorm(C)

    def forward(self, x, src_bias):
        x = add_and_norm(x, self.self_attn(x, x, src_bias)[0], self.attn_norm)  # every source token sees all
        return add_and_norm(x, self.mlp(x), self.mlp_norm)


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.attn_norm = MultiHeadAttention(), nn.LayerNorm(C)
        self.cross_attn, self.cross_attn_norm = MultiHeadAttention(), nn.LayerNorm(C)
        self.mlp, self.mlp_norm = FeedForward(), nn.LayerNorm(C)

    def forward(self, y, memory, tgt_bias, src_bias):
        y = add_and_norm(y, self.self_attn(y, y, tgt_bias)[0], self.attn_norm)  # causal: the target so far
        attended, cross = self.cross_attn(y, memory, src_bias)  # queries: the target; keys, values: the source
        y = add_and_norm(y, attended, self.cross_attn_norm)
        return add_and_norm(y, self.mlp(y), self.mlp_norm), cross


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, C)  # one table: source tokens, target tokens and the output layer (3.4)
        self.encoder = nn.ModuleList(EncoderLayer() for _ in range(N_LAYERS))
        self.decoder = nn.ModuleList(DecoderLayer() for _ in range(N_LAYERS))

    def embed_tokens(self, ids):
        return self.embed(ids) * math.sqrt(C) + sinusoidal(ids.shape[1])  # (B, T, C)

    def encode(self, src, src_mask):
        x = self.embed_tokens(src)
        for layer in self.encoder:
            x = layer(x, padding_bias(src_mask))
        return x  # the memory (B, S, C)

    def decode(self, tgt, memory, src_mask):
        y, crosses = self.embed_tokens(tgt), []
        for layer in self.decoder:
            y, cross = layer(y, memory, causal_bias(tgt.shape[1]), padding_bias(src_mask))
            crosses.append(cross)
        return y @ self.embed.weight.T, crosses  # (B, T, V): the output layer is the embedding, transposed

    def forward(self, src, src_mask, tgt):
        return self.decode(tgt, self.encode(src, src_mask), src_mask)[0]


def from_attnkit(state):
    """attnkit's names -> these: `encoder.blocks.0.` -> `encoder.0.`, the shared table once."""
    tied = ("decoder.embeddings.token.weight", "lm_head.weight")  # the same tensor as the encoder's table
    return {name.replace("encoder.embeddings.token", "embed").replace(".blocks.", "."): tensor
            for name, tensor in state.items() if name not in tied}


scratch = Transformer()
scratch.load_state_dict(from_attnkit(model.state_dict()), strict=True)  # every tensor finds its place

# %% [markdown]
# ## Every piece against attnkit's, with the same weights
#
# A batch of two sources, the second padded, and two targets. Piece by piece: the position table, the embeddings,
# cross-attention with the source's padding, the causal self-attention, one encoder layer, one decoder layer, and
# the whole model's logits.

# %%
from attnkit.layers.masks import AttentionMask

src = torch.tensor([tokenizer.encode("abcdefg"), tokenizer.encode("hij") + [PAD] * 4])  # (B, S) = (2, 7)
src_mask = src != PAD
tgt = torch.tensor([[BOS, *tokenizer.encode("gfedcb")], [BOS, *tokenizer.encode("jih")] + [PAD] * 3])  # (2, 7)
S, T = src.shape[1], tgt.shape[1]
with torch.no_grad():
    torch.testing.assert_close(sinusoidal(S), model.encoder.embeddings.positions.embed(torch.arange(S)))
    torch.testing.assert_close(scratch.embed_tokens(src), model.encoder.embeddings(src, torch.arange(S)[None]))
    memory = model.encode(src, src_mask=src_mask)  # (B, S, C)
    torch.testing.assert_close(scratch.encode(src, src_mask), memory)
    y = scratch.embed_tokens(tgt)
    block = model.decoder.blocks[0]
    ours, weights = scratch.decoder[0].cross_attn(y, memory, padding_bias(src_mask))
    theirs, their_weights = block.cross_attn(y, context=memory, mask=AttentionMask(T, attention_mask=src_mask),
                                             need_weights=True)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(weights, their_weights)
    assert (weights[1, :, :, 3:] == 0).all(), "the padded source positions got attention"
    ours = scratch.decoder[0].self_attn(y, y, causal_bias(T))[0]
    torch.testing.assert_close(ours, block.self_attn(y, mask=AttentionMask(T, causal=True))[0])
    x = scratch.embed_tokens(src)
    torch.testing.assert_close(scratch.encoder[0](x, padding_bias(src_mask)),
                               model.encoder.blocks[0](x, mask=AttentionMask(S, attention_mask=src_mask))[0])
    torch.testing.assert_close(scratch.decoder[0](y, memory, causal_bias(T), padding_bias(src_mask))[0],
                               block(y, context=memory, cross_mask=AttentionMask(T, attention_mask=src_mask))[0])
    logits = scratch(src, src_mask, tgt)
    torch.testing.assert_close(logits, model(src, tgt, src_mask=src_mask).logits)
print("positions, embeddings, cross-attention (and its weights), causal self-attention, encoder layer, decoder "
      "layer and the whole model: the same numbers as attnkit's vaswani preset")

# %% [markdown]
# The causal mask is a promise: what the decoder computes at position $t$ does not depend on the target tokens
# after $t$. Change the last target token and only the last position's logits move.

# %%
changed = tgt.clone()
changed[0, -1] = tokenizer.encode("z")[0]
with torch.no_grad():
    before, after = scratch(src, src_mask, tgt), scratch(src, src_mask, changed)
torch.testing.assert_close(before[0, :-1], after[0, :-1])  # positions 0 .. T-2: untouched
assert not torch.allclose(before[0, -1], after[0, -1])
print("changing target token", T - 1, "changes the logits at position", T - 1, "only")

# %% [markdown]
# ## Teacher forcing and label smoothing
#
# **Teacher forcing:** in training, the decoder reads the *true* target shifted right (`<bos> y1 y2 ...`) and
# predicts it unshifted (`y1 y2 ... <eos>`), every position at once: the causal mask makes this one forward pass
# equal to writing the target a token at a time, as generation does. attnkit's decoder writes one token at a time
# through its KV cache; the logits agree.
#
# **Label smoothing** (section 5.4; Szegedy et al. 2016): the loss compares the prediction with a target that puts
# $1 - \varepsilon$ on the right token and spreads $\varepsilon$ evenly over the whole vocabulary (PyTorch's
# `label_smoothing`, which attnkit uses; the paper and the Annotated Transformer spread it over the wrong tokens
# only, a difference of $\varepsilon / V$). The model is pushed away from certainty: "this hurts perplexity ... but
# improves accuracy and BLEU".

# %%
from attnkit.generate.seq2seq import decode_step, encode_sources

labels = torch.tensor([tokenizer.encode("gfedcba"), [*tokenizer.encode("jih"), EOS] + [-100] * 3])  # tgt, shifted
with torch.no_grad():  # one token at a time through attnkit's cache, against one teacher-forced pass
    source = encode_sources(model, [tokenizer.encode("abcdefg")], pad_id=PAD)
    cache = model.allocate_cache(1, T)
    stepwise = torch.stack([decode_step(model, tgt[0, t : t + 1], source, cache) for t in range(T)], dim=1)
    torch.testing.assert_close(stepwise, model(src[:1], tgt[:1]).logits)


def smoothed_loss(logits, labels, eps):
    """Mean over real target tokens of the cross-entropy against the smoothed target. -100: padding, no loss."""
    logp = logits.log_softmax(-1)  # (B, T, V)
    real = labels != -100
    target = torch.full_like(logp, eps / V)  # eps spread over every token ...
    target.scatter_add_(-1, labels.clamp(min=0)[..., None], torch.full_like(logp[..., :1], 1 - eps))  # ... 1-eps
    return -(target * logp).sum(-1)[real].mean()


with torch.no_grad():
    loss = model(src, tgt, src_mask=src_mask, labels=labels).loss  # attnkit: label_smoothing=0.1 from the preset
    torch.testing.assert_close(smoothed_loss(logits, labels, config.label_smoothing), loss)
print(f"teacher forcing = decoding step by step; label-smoothed loss {loss:.4f}, the same as attnkit's")

# %% [markdown]
# ## Greedy decoding and beam search
#
# Generation encodes the source once and writes the target a token at a time. **Greedy** decoding takes the most
# likely token at each step. **Beam search** (the paper: beam size 4, length penalty 0.6) keeps the $K$ most likely
# partial targets; at each step every one proposes every token, the best $2K$ candidates are kept, those ending in
# EOS among the first $K$ are finished (scored by their summed log-probability divided by $\text{length}^{\alpha}$;
# $\alpha = 1$ here, attnkit's default), and the best $K$ others live on. Here the search stops once $K$ targets
# are finished, as attnkit's `early_stopping=True` does.

# %%
from attnkit.generate.beam import beam_search
from attnkit.generate.seq2seq import greedy_translate


@torch.no_grad()
def greedy(net, source, max_length):
    src = torch.tensor([source])
    src_mask = torch.ones_like(src, dtype=torch.bool)
    memory, out = net.encode(src, src_mask), [BOS]
    for _ in range(max_length):
        token = int(net.decode(torch.tensor([out]), memory, src_mask)[0][0, -1].argmax())
        if token == EOS:
            break
        out.append(token)
    return out[1:]


@torch.no_grad()
def beam(net, source, k, max_length, alpha=1.0):
    src = torch.tensor([source])
    src_mask = torch.ones_like(src, dtype=torch.bool)
    memory = net.encode(src, src_mask)
    live, finished = [(0.0, [BOS])], []
    for _ in range(max_length):
        candidates = []
        for score, seq in live:
            logp = net.decode(torch.tensor([seq]), memory, src_mask)[0][0, -1].log_softmax(-1)  # (V,)
            candidates += [(score + lp, seq + [token]) for token, lp in enumerate(logp.tolist())]
        candidates = sorted(candidates, key=lambda c: c[0], reverse=True)[: 2 * k]
        finished += [(score / (len(seq) - 1) ** alpha, seq[1:-1]) for score, seq in candidates[:k] if seq[-1] == EOS]
        finished = sorted(finished, key=lambda c: c[0], reverse=True)[:k]
        live = [c for c in candidates if c[1][-1] != EOS][:k]
        if len(finished) == k:  # early stopping: K finished targets
            break
    else:  # out of steps: the live targets count as finished
        finished += [(score / (len(seq) - 1) ** alpha, seq[1:]) for score, seq in live]
    return max(finished, key=lambda c: c[0])[1]


def check_decoders(net, reference, sources, max_length):
    """The from-scratch greedy and beam search give attnkit's outputs on `sources`."""
    reference.eval()
    kwargs = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=max_length)
    with torch.no_grad():
        assert [greedy(net, s, max_length) for s in sources] == greedy_translate(reference, sources, **kwargs)
        assert [beam(net, s, 4, max_length) for s in sources] == beam_search(reference, sources, beam_size=4,
                                                                             **kwargs)


check_decoders(scratch, model, [tokenizer.encode(s) for s in ("abc", "hgfedcba", "jjiaa")], max_length=10)
print("greedy decoding and beam search (K = 4): the same targets as attnkit's, untrained")

# %% [markdown]
# ## Train it to reverse strings
#
# The reversal task (tutorial 5's): the target is the source backwards, 3 to 14 letters of a-j. Its answer needs
# the whole source in the right order, and which source token each output needs moves as the output grows: a job
# for cross-attention. The training loop is the paper's: Adam with $\beta_2 = 0.98$, the learning rate warmed up
# linearly and then decayed as $1/\sqrt{\text{step}}$ (section 5.3), label smoothing 0.1, teacher forcing.

# %%
from attnkit.data import make_task, pad

MIN_LEN, MAX_LEN = 3, 14
train_pairs = make_task("reverse", 60_000, seed=0, min_len=MIN_LEN, max_len=MAX_LEN).pairs()


def batch(pairs, tok=tokenizer):
    """(source, target) strings -> src (B, S), src_mask, the decoder's input <bos> y (B, T), its labels y <eos>."""
    sources, targets = [tok.encode(s) for s, _ in pairs], [tok.encode(t) for _, t in pairs]
    src, src_mask = pad(sources, tok.pad_id)
    tgt_in, _ = pad([[tok.bos_id, *t] for t in targets], tok.pad_id)
    labels, _ = pad([[*t, tok.eos_id] for t in targets], -100)  # -100: no loss at padding
    return src, src_mask, tgt_in, labels


def vaswani_schedule(warmup):
    """The paper's learning rate, relative to the peak: linear warmup, then 1/sqrt(step)."""
    return lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


def train(net, pairs, *, steps, lr, schedule=None, batch_size=64, tok=tokenizer, max_seconds=None, name=""):
    """Teacher-forced training; schedule: the learning rate relative to `lr` at each step (None: constant). Returns
    the losses, one a step, and prints its progress ten times."""
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule) if schedule else None
    losses, start = [], time.perf_counter()
    net.train()
    for step in range(steps):
        src, src_mask, tgt_in, labels = batch(pairs[batch_size * step % len(pairs) :][:batch_size], tok)
        loss = net(src, tgt_in, src_mask=src_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule:
            schedule.step()
        losses.append(loss.item())
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            print(f"{name} step {step + 1:5d}/{steps}  loss {sum(losses[-50:]) / len(losses[-50:]):.3f}  "
                  f"{time.perf_counter() - start:4.0f} s", flush=True)
        if max_seconds and time.perf_counter() - start > max_seconds:
            print(f"{name} stopped at {max_seconds} s, after {step + 1} steps")
            break
    net.eval()
    return losses


steps = {"tiny": 10, "full": 1000}[BUDGET]
losses = train(model, train_pairs, steps=steps, lr=1e-3, schedule=vaswani_schedule(200), name="reverse")

# %% [markdown]
# Score it with attnkit's greedy decoder on fresh strings of every length, and check again that the from-scratch
# decoders, given the trained weights, write the same targets.

# %%
lengths = list(range(MIN_LEN, MAX_LEN + 1))
n_test = {"tiny": 4, "full": 100}[BUDGET]
exact = []
for length in lengths:
    test = make_task("reverse", n_test, seed=1000 + length, min_len=length, max_len=length)
    outputs = greedy_translate(model, [tokenizer.encode(s) for s, _ in test.pairs()], bos_id=BOS, eos_id=EOS,
                               pad_id=PAD, max_length=length + 1)
    exact.append(test.score([tokenizer.decode(o) for o in outputs]))
print("exactly reversed, by length:", " ".join(f"{n}:{a:.0%}" for n, a in zip(lengths, exact, strict=True)))
scratch.load_state_dict(from_attnkit(model.state_dict()), strict=True)
check_decoders(scratch, model, [tokenizer.encode(s) for s in ("abcdefghij", "hgfa", "jjiaabc")], max_length=16)
print("after training too: from-scratch greedy and beam search = attnkit's")

# %% [markdown]
# ## What the cross-attention looks at
#
# The decoder's queries against the encoder's memory, for one string: each row is one decoding step (the token it
# reads), each column a source token. Reversal needs the source's last letter first, so a model that has learned
# it draws an anti-diagonal: after 1,000 steps every head of the last decoder layer does, `<bos>` looking at `j`,
# `j` at `i`, and so on down to `a`, some heads sharp and some spread over two neighbours. At the tiny budget the
# weights are untrained and the picture shows no pattern.

# %%
example = "abcdefghij"
src, src_mask, tgt_in, _ = batch([(example, example[::-1])])
with torch.no_grad():
    crosses = model(src, tgt_in, src_mask=src_mask, need_weights=True).attentions  # per layer {"self", "cross"}
last = crosses[-1]["cross"][0]  # (H, T, S) of the last decoder layer
fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
ax.plot(torch.tensor(losses).unfold(0, min(50, len(losses)), 1).mean(1))
ax.set(xlabel="step", ylabel="loss (50-step mean)", title="training on reversal", yscale="log")
plt.show()

fig, axes = plt.subplots(2, H // 2, figsize=(8, 8), layout="constrained")  # the heads two by two
for head, ax in enumerate(axes.flat):
    image = ax.imshow(last[head], cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(example)), list(example))
    ax.set_yticks(range(len(example) + 1), ["<bos>", *example[::-1]])
    ax.set(xlabel="source token (key)", ylabel="decoder input at each step",
           title=f"last layer's cross-attention, head {head}")
fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
plt.show()

# %% [markdown]
# ## A slice of Multi30k: German captions to English
#
# The same model, the same loop, on real sentences: Multi30k's image captions, German to English (the lectures'
# translation setting), from `../shared/data/multi30k` where it is present: a byte-level BPE of 1,000 tokens
# trained on the captions, the same `vaswani-tiny` model, at most 1,500 steps or three minutes (the steps it
# managed are printed: a busy 2-core machine gets through about 300, a less busy one about 900). That is far too
# little to translate; it shows what a translation model learns first, and how far it gets depends on those steps.
# After 300 it writes the captions' shape and their subject: "Ein Junge mit Kopfhörern ..." comes out as "A boy is
# a ...", "Eine Gruppe von Männern ..." as "A group of people are ...", and then it loops on frequent pieces, at a
# BLEU of about 5. After some 900 the sentences start right more often ("A group of men are ...", "A boy with a
# woman ...") before they drift, at a BLEU of about 12. Both are far from the 36.5 of a Transformer trained for
# hours (the data's README). The tiny budget takes 200 pairs and five steps.

# %%
from attnkit.tasks.bleu import bleu_scores
from attnkit.tokenize import train_bpe


def shared_data(name):
    """../shared/data/NAME, looked for beside every folder above the working directory; None when absent."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "shared" / "data" / name).exists():
            return folder / "shared" / "data" / name
    return None


multi30k = shared_data("multi30k")
if multi30k is None:
    print("Multi30k is absent (../shared/data/multi30k): this section is skipped")
else:
    n_pairs, mt_steps, n_eval = {"tiny": (200, 5, 5), "full": (29_000, 1500, 200)}[BUDGET]

    def read(split, n):
        de, en = ((multi30k / f"{split}.{lang}").read_text().splitlines()[:n] for lang in ("de", "en"))
        return list(zip(de, en, strict=True))

    mt_train, mt_val = read("train", n_pairs), read("val", n_eval)
    bpe = train_bpe([text for pair in mt_train for text in pair], vocab_size=1000, special_tokens=["pad", "bos",
                    "eos", "unk"])
    assert (bpe.pad_id, bpe.bos_id, bpe.eos_id) == (0, 1, 2)
    torch.manual_seed(0)
    translator = build_model(presets.get("vaswani-tiny", vocab_size=bpe.vocab_size, max_seq_len=128))
    paper_init(translator)
    train(translator, mt_train, steps=mt_steps, lr=1e-3, schedule=vaswani_schedule(200), batch_size=32, tok=bpe,
          max_seconds=180, name="multi30k")
    outputs = greedy_translate(translator, [bpe.encode(de) for de, _ in mt_val], bos_id=bpe.bos_id,
                               eos_id=bpe.eos_id, pad_id=bpe.pad_id, max_length=60)
    hypotheses = [bpe.decode(o) for o in outputs]
    for (de, en), hypothesis in list(zip(mt_val, hypotheses, strict=True))[:3]:
        print(f"de:    {de}\nen:    {en}\nmodel: {hypothesis}\n")
    bleu = bleu_scores(hypotheses, [en for _, en in mt_val])["bleu"]
    print(f"BLEU (sacreBLEU) on the first {len(mt_val)} validation captions: {bleu:.1f}")

# %% [markdown]
# ## Post-norm against pre-norm: where the norm sits
#
# The paper's block normalises *after* each residual sum; GPT-2 and Llama normalise inside the branch,
# $x + \mathrm{SubLayer}(\mathrm{LN}(x))$, and add one LayerNorm at the end of each stack (tutorial 6 builds both).
# Xiong et al. (2020) show why the paper needed its warmup: under the paper's initialisation a post-norm stack's
# gradients at initialisation grow toward the output layers, so a full learning rate from the first step can
# derail it; pre-norm keeps an identity path from the output to every layer and trains without warmup.
#
# Below: the gradient norm of each layer's feed-forward weights at initialisation, for 6 + 6 layers in both
# layouts (the paper's initialisation), then both layouts trained on reversal at a learning rate of $2 \times
# 10^{-3}$ from the first step, and with a warmup over the first 50 steps. attnkit's
# [norm-placement experiment](../../experiments/#norm-placement) measures the same on language models over
# several seeds and depths.

# %%
DEPTH = 6


def gradient_norms(placement):
    """Each block's FFN weight-gradient norm (W1 and W2) at initialisation: encoder blocks, then decoder blocks."""
    torch.manual_seed(0)
    net = build_model(presets.get("vaswani-tiny", vocab_size=V, n_layers=DEPTH, norm_position=placement))
    paper_init(net)
    src, src_mask, tgt_in, labels = batch(train_pairs[:64])
    net(src, tgt_in, src_mask=src_mask, labels=labels).loss.backward()
    blocks = [*net.encoder.blocks, *net.decoder.blocks]
    return [math.hypot(b.mlp.up_proj.weight.grad.norm(), b.mlp.down_proj.weight.grad.norm()) for b in blocks]


grads = {placement: gradient_norms(placement) for placement in ("post", "pre")}
for placement, norms in grads.items():
    print(f"{placement:4s}-norm gradient norm by block (encoder 1-{DEPTH}, decoder 1-{DEPTH}):",
          " ".join(f"{g:.2f}" for g in norms))

# %%
compare_steps = {"tiny": 4, "full": 150}[BUDGET]
curves = {}
for placement in ("post", "pre"):
    for warmup in (0, 50):
        torch.manual_seed(0)
        net = build_model(presets.get("vaswani-tiny", vocab_size=V, n_layers=DEPTH, norm_position=placement))
        paper_init(net)
        name = f"{placement}-norm, {f'warmup {warmup}' if warmup else 'no warmup'}"
        schedule = (lambda step, warmup=warmup: min((step + 1) / warmup, 1.0)) if warmup else None  # then constant
        curves[name] = train(net, train_pairs, steps=compare_steps, lr=2e-3, schedule=schedule, batch_size=32,
                             name=name)
print("mean training loss over the last 25 steps:",
      ", ".join(f"{name} {sum(curve[-25:]) / len(curve[-25:]):.2f}" for name, curve in curves.items()))

# %%
fig, axes = plt.subplots(2, 1, figsize=(8, 8), layout="constrained")  # one panel per row: each readable
for colour, (placement, norms) in zip(("C0", "C1"), grads.items(), strict=True):
    for stack in (slice(0, DEPTH), slice(DEPTH, 2 * DEPTH)):  # two lines: no line runs from encoder to decoder
        axes[0].plot(range(stack.start + 1, stack.stop + 1), norms[stack], marker="o", color=colour,
                     label=f"{placement}-norm" if stack.start == 0 else None)
axes[0].axvline(DEPTH + 0.5, color="grey", linestyle=":")
axes[0].set(xlabel=f"block (1-{DEPTH}: encoder, {DEPTH + 1}-{2 * DEPTH}: decoder)",
            ylabel="FFN weight-gradient norm at init", yscale="log", title="gradients at initialisation")
for name, curve in curves.items():
    axes[1].plot(torch.tensor(curve).unfold(0, min(20, len(curve)), 1).mean(1), label=name,
                 linestyle="-" if "no warmup" in name else "--")
axes[1].set(xlabel="step", ylabel="training loss (mean of 20 steps)", yscale="log",
            title=f"{DEPTH} + {DEPTH} layers on reversal, Adam at 2e-3")
for ax in axes:
    ax.legend()
plt.show()

# %% [markdown]
# What to look for. At initialisation, post-norm's gradients grow block by block toward the output of each stack
# (in the decoder from about 0.4 at its first block to about 1.7 at its last), where pre-norm's shrink slowly: in
# post-norm every block's output passes through all the norms above it, and what reaches the early blocks is
# divided again and again. In training, pre-norm falls steadily from the first step, with or without warmup;
# post-norm at the same learning rate stalls on a plateau (a loss near that of guessing among the ten letters),
# and warmup, at this depth and rate, lifts it off only a little. One seed and 150 steps make this an
# illustration, not a measurement: the [norm-placement experiment](../../experiments/#norm-placement) repeats
# it over seeds and depths with its noise, and finds the gradient pattern and post-norm's gap beyond the noise,
# but warmup's own help for post-norm against the claim at its budget.
#
# **In attnkit:** `attnkit.models.seq2seq.EncoderDecoder` (`encode`, `decode`), `attnkit.blocks.DecoderBlock`
# (self-attention, cross-attention, FFN, `norm_position`), `attnkit.layers.positions.SinusoidalPositions`,
# `attnkit.generate.seq2seq.greedy_translate`, `attnkit.generate.beam.beam_search`; from the command line,
# `attnkit train --preset vaswani-tiny --task translate --data pairs.tsv` and
# `attnkit translate RUN "..." --beam-size 4`.

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. Exercises 3 and 5 ask you to predict before you run. The
# solutions are folded away below.
#
# 1. Write `smoothed_target(labels, eps)`: the target distribution (B, T, V) that label smoothing compares the
#    prediction with, for labels (B, T) without padding.
# 2. Write `vaswani_parameters(C, d_ff, n_layers, V)`: the parameter count of this model (the same number of
#    encoder and decoder layers, every linear layer with a bias, one embedding table shared three ways) as a formula.
# 3. *Predict, then run:* change the *first* target token the decoder reads after `<bos>` (position 1). Which
#    positions' logits change: `"all"`, `"from 1 on"` or `"only 1"`?
# 4. Write `smallest_smoothed_loss(eps, V)`: the lowest label-smoothed loss any model can reach on one token. (It
#    is not 0: what distribution reaches it?)
# 5. *Predict, then run:* with $K = 1$, is beam search the same as greedy decoding on every source? `"yes"` or
#    `"no"`.

# %%
from attnkit.exercises import exercise

probe_labels = torch.randint(0, V, (2, 5))
probe_logits = torch.randn(2, 5, V)


@exercise(1, hint="1 - eps + eps/V on the right token, eps/V on every other one; each row sums to 1")
def check_1(smoothed_target):
    target = smoothed_target(probe_labels, 0.1)
    loss = -(target * probe_logits.log_softmax(-1)).sum(-1).mean()
    expected = torch.nn.functional.cross_entropy(probe_logits.view(-1, V), probe_labels.view(-1), label_smoothing=0.1)
    return target.shape == (2, 5, V) and torch.allclose(loss, expected)


@exercise(2, hint="per layer: 4 C x C projections with biases per attention (the decoder has two attentions), "
                  "an FFN C -> d_ff -> C with biases, a LayerNorm (gain and bias) per sublayer; plus V x C once")
def check_2(vaswani_parameters):
    sizes = [(32, 64, 1, 20), (64, 256, 2, V), (48, 100, 3, 50)]
    counts = [sum(p.numel() for p in build_model(presets.get("vaswani-tiny", d_model=c, d_ff=f, n_layers=n,
                                                                vocab_size=v)).parameters()) for c, f, n, v in sizes]
    return [vaswani_parameters(*size) for size in sizes] == counts


@exercise(3, hint="the causal mask lets position t read the target tokens 0..t: which positions see token 1?",
          choices=("all", "from 1 on", "only 1"))
def check_3(prediction):
    src, _, tgt_in, _ = batch([("abcdef", "fedcba")])
    changed = tgt_in.clone()
    changed[0, 1] = tokenizer.encode("z")[0]
    with torch.no_grad():
        moved = ~torch.isclose(model(src, tgt_in).logits, model(src, changed).logits).all(-1)[0]  # (T,)
    measured = "all" if moved.all() else "only 1" if moved.sum() == 1 else "from 1 on"
    print(f"measured: the logits change at positions {moved.nonzero().flatten().tolist()}")
    return prediction == measured


@exercise(4, hint="the best prediction is the smoothed target itself; the loss is then its entropy")
def check_4(smallest_smoothed_loss):
    cases = [(0.1, 10), (0.1, V), (0.3, 100)]
    found = []
    for eps, v in cases:
        target = torch.full((v,), eps / v)
        target[0] += 1 - eps
        found.append(float(-(target * target.log()).sum()))  # cross-entropy of the target with itself
    return all(math.isclose(smallest_smoothed_loss(eps, v), f, rel_tol=1e-5) for (eps, v), f in zip(cases, found,
                                                                                                     strict=True))


@exercise(5, hint="with one beam, the best of the first 2 candidates that is not EOS lives on; EOS among the "
                  "first 1 finishes it", choices=("yes", "no"))
def check_5(prediction):
    sources = [tokenizer.encode(s) for s in ("abcdefg", "hij", "jihgfedcba", "aaabbb")]
    same = [beam(scratch, s, 1, 16) for s in sources] == [greedy(scratch, s, 16) for s in sources]
    print(f"measured: beam search with K = 1 {'equals' if same else 'differs from'} greedy on these sources")
    return prediction == ("yes" if same else "no")


smoothed_target = None  # your function here
vaswani_parameters = None  # your function here
prediction_3 = None  # "all", "from 1 on" or "only 1"
smallest_smoothed_loss = None  # your function here
prediction_5 = None  # "yes" or "no"
for check, answer in ((check_1, smoothed_target), (check_2, vaswani_parameters), (check_3, prediction_3),
                      (check_4, smallest_smoothed_loss), (check_5, prediction_5)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 3. `"from 1 on"`: position $t$ reads the target tokens $0..t$, so token 1 reaches positions 1, 2, ... and never
#    position 0.
# 4. The best prediction is the smoothed target $q$ itself, where the loss is its entropy
#    $-\sum_v q_v \log q_v$: about 0.50 nats for $\varepsilon = 0.1$ and $V = 10$. A model cannot reach 0, so it is
#    never pushed to certainty: the point of smoothing.
# 5. `"yes"`: with one beam, the single best token is taken at every step and EOS ends the search: greedy
#    decoding.

# %% tags=["solution"] jupyter={"source_hidden": true}
def smoothed_target_solution(labels, eps):
    target = torch.full((*labels.shape, V), eps / V)
    return target.scatter_add(-1, labels[..., None], torch.full((*labels.shape, 1), 1 - eps))


def vaswani_parameters_solution(c, d_ff, n_layers, v):
    attention, ffn, norm = 4 * (c * c + c), c * d_ff + d_ff + d_ff * c + c, 2 * c
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return n_layers * (encoder_layer + decoder_layer) + v * c


def smallest_smoothed_loss_solution(eps, v):
    right, other = 1 - eps + eps / v, eps / v
    return -(right * math.log(right) + (v - 1) * other * math.log(other))


assert check_1(smoothed_target_solution)
assert check_2(vaswani_parameters_solution)
assert check_3("from 1 on")
assert check_4(smallest_smoothed_loss_solution)
assert check_5("yes")
assert not check_1(lambda labels, eps: torch.nn.functional.one_hot(labels, V).float())  # no smoothing at all
assert not check_2(lambda c, d_ff, n_layers, v: n_layers * 12 * c * c)  # biases, norms, embeddings left out
assert not check_3("all")
assert not check_4(lambda eps, v: 0.0)  # a certain model pays for its certainty
assert not check_5("no")
assert not check_1(lambda labels, eps: labels.shape[2])  # an error in the answer is a wrong answer, not a crash
