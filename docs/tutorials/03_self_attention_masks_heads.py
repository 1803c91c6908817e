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
# # 3. Self-attention, masks and multi-head attention: the A/B running example
#
# **Follows:** UT CS 371N, Lecture 10 "LM 2: Self-attention, Transformers": the running example of sequences of
# As and Bs (predict B if any B occurs), attention as "random access" into the context, the query $[0, 10]$,
# keys and queries decoupled from the embeddings by $W^K$ and $W^Q$, and self-attention as $S = QK^\top$. Masks
# follow COGS 150 ("we prevent attention from looking ahead", the matrix of $-\infty$) and CMU 11-711 ("Masking
# for Language Model Training"); multi-head attention follows CMU 11-711's code slide (minGPT) and USC CSCI 499;
# permutation equivariance follows UvA ATCS.
#
# **You will:** compute the lecture's numbers by hand, check that attnkit's `Attention` gives the same weights
# with and without masks and with several heads, then train a one-layer encoder on the A/B task and look at where
# it attends.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import math
import os
import warnings

import matplotlib.pyplot as plt
import torch

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
torch.manual_seed(0)
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## One query looking for a B
#
# Embeddings $A = [1, 0]$, $B = [0, 1]$; the keys are the embeddings; the query $q = [0, 1]$ "because we want to
# find Bs". (1) score each key: $s_i = k_i^\top q$; (2) softmax; (3) output $= \sum_i \alpha_i e_i$.

# %%
embedding = {"A": torch.tensor([1.0, 0.0]), "B": torch.tensor([0.0, 1.0])}
E = torch.stack([embedding[c] for c in "AABA"])  # (T, 2): one row per token


def attend_once(query, keys, values):
    scores = keys @ query  # (T,)
    weights = torch.softmax(scores, dim=0)  # (T,)
    return weights @ values, weights, scores


out, alpha, scores = attend_once(torch.tensor([0.0, 1.0]), E, E)
print("scores", scores.tolist())
print("weights", [round(a, 3) for a in alpha.tolist()], "(the lecture rounds e to 3: 1/6, 1/6, 1/2, 1/6)")
print("output", [round(o, 3) for o in out.tolist()], "vs the plain average (a DAN):", E.mean(0).tolist())
out, alpha, _ = attend_once(torch.tensor([0.0, 10.0]), E, E)
print("with q = [0, 10]: weights", [round(a, 4) for a in alpha.tolist()], "output", [round(o, 4) for o in out.tolist()])

# %% [markdown]
# Attention is "biased towards B": the average sees $\frac34$ A, attention about half B, and with the query
# scaled to $[0, 10]$ it returns (almost exactly) the B. The exact weights are $e/(3 + e) = 0.475$ and
# $1/(3 + e) = 0.175$.
#
# ## Self-attention: every token is a query
#
# With $Q = EW^Q$, $K = EW^K$, the scores of all pairs are one matrix product, $S = QK^\top$ (sequence length
# $\times$ sequence length). The lecture's second version makes the keys ten times the embeddings, $Q = E$ and
# $K = 10E$, so $S = 10EE^\top$: each A is most similar to the As, the B to itself.

# %%
W_Q, W_K, W_V = torch.eye(2), 10 * torch.eye(2), torch.eye(2)
Q, K, V = E @ W_Q, E @ W_K, E @ W_V  # (T, 2) each
S = Q @ K.T  # (T, T)
weights = torch.softmax(S, dim=-1)
print("S =\n", S)
print("weights =\n", weights.round(decimals=4))

# %% [markdown]
# ## attnkit's `Attention` computes the same
#
# `Attention(d_model, n_heads, score="dot")` holds $W^Q, W^K, W^V$ as `q_proj`, `k_proj`, `v_proj` (and an output
# projection `o_proj`). PyTorch's linear layers compute $xW^\top$, so the lecture's $W$ goes in transposed (these
# are symmetric). `need_weights=True` returns the weights, (B, H, T, S).

# %%
from attnkit.layers.attention import Attention

layer = Attention(2, 1, score="dot", bias=False)
with torch.no_grad():
    for projection, W in ((layer.q_proj, W_Q), (layer.k_proj, W_K), (layer.v_proj, W_V), (layer.o_proj, torch.eye(2))):
        projection.weight.copy_(W.T)
out, attnkit_weights = layer(E[None], need_weights=True)  # (1, T, 2), (1, 1, T, T)
torch.testing.assert_close(attnkit_weights[0, 0], weights)
torch.testing.assert_close(out[0], weights @ V)
print("attnkit's weights and outputs equal the lecture's")

# %% [markdown]
# ## Without positions, attention ignores word order
#
# UvA ATCS: "The elements of V' are *equivariant* to a change in the order of the rows ... Attention does not care
# about word order." Shuffle the tokens and the outputs are shuffled the same way, nothing else changes.

# %%
x = torch.randn(1, 6, 2)
order = torch.randperm(6)
torch.testing.assert_close(layer(x[:, order])[0], layer(x)[0][:, order])
print("permuting the input permutes the output: self-attention alone is a bag of tokens")

# %% [markdown]
# ## Masks: no looking ahead, no attending to padding
#
# A language model predicting token $t+1$ must not see it. The causal mask sets the scores above the diagonal to
# $-\infty$ before the softmax, so those weights are exactly 0. A padding mask does the same for the columns of
# padded keys. In attnkit both are parts of one `AttentionMask`, which a model builds once per forward pass and
# hands to every layer; attention turns it (and every position bias) into one additive float bias in one place.

# %%
T = 5
layer = Attention(4, 1, score="dot", bias=False)  # random projections this time, so the weights spread out
x = torch.randn(2, T, 4)
scores = (layer.q_proj(x) @ layer.k_proj(x).transpose(-2, -1))  # (B, T, T), the dot score
future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True above the diagonal
causal_weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
attention_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])  # row 2: the last two are padding
both_weights = torch.softmax(scores.masked_fill(future | ~attention_mask[:, None, :], float("-inf")), dim=-1)

from attnkit.layers.masks import AttentionMask

causal = AttentionMask(T, causal=True)  # T queries at positions 0 .. T-1, causal
torch.testing.assert_close(causal.allowed(T), ~future)
torch.testing.assert_close(causal.bias(T), torch.zeros(T, T).masked_fill(future, float("-inf")))
_, w = layer(x, mask=causal, need_weights=True)
torch.testing.assert_close(w[:, 0], causal_weights)
_, w = layer(x, mask=AttentionMask(T, causal=True, attention_mask=attention_mask), need_weights=True)
torch.testing.assert_close(w[:, 0, :3], both_weights[:, :3])  # the real queries' rows
print("causal and padding masks: attnkit's weights equal the from-scratch ones")

fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
for ax, matrix, title in ((axes[0], causal_weights[0], "causal mask"),
                          (axes[1], both_weights[1, :3], "causal + padding (2 keys padded)")):
    image = ax.imshow(matrix.detach(), cmap="viridis", vmin=0, vmax=1)
    ax.set(xlabel="key position", ylabel="query position", title=title)
fig.colorbar(image, ax=axes)
plt.show()

# %% [markdown]
# ## Multi-head attention
#
# Several heads, each with its own slice of the projections, attend independently; their outputs are put side by
# side and mixed by the output projection. CMU 11-711 shows minGPT's forward pass; here it is, with the
# projections taken from an attnkit layer so both compute with the same weights.

# %%
def multi_head_attention(x, attention, n_heads, causal):
    B, T, C = x.shape
    D = C // n_heads
    q = attention.q_proj(x).view(B, T, n_heads, D).transpose(1, 2)  # (B, T, C) -> (B, H, T, D)
    k = attention.k_proj(x).view(B, T, n_heads, D).transpose(1, 2)
    v = attention.v_proj(x).view(B, T, n_heads, D).transpose(1, 2)
    att = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    if causal:
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, H * D): heads side by side
    return attention.o_proj(y), att


C, H = 16, 4
mha = Attention(C, H)  # scaled dot product, 4 heads of width 4
x = torch.randn(3, 7, C)
scratch, scratch_weights = multi_head_attention(x, mha, H, causal=True)
out, w = mha(x, mask=AttentionMask(7, causal=True), need_weights=True)
torch.testing.assert_close(out, scratch)
torch.testing.assert_close(w, scratch_weights)
torch.testing.assert_close(mha(x, mask=AttentionMask(7, causal=True))[0], scratch)  # the fused kernel path too

reference = torch.nn.MultiheadAttention(C, H, batch_first=True)  # PyTorch's own layer, with the same weights
with torch.no_grad():
    reference.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
    reference.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
    reference.out_proj.weight.copy_(mha.o_proj.weight)
    reference.out_proj.bias.copy_(mha.o_proj.bias)
expected, _ = reference(x, x, x, attn_mask=torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1))
torch.testing.assert_close(out, expected)
print("multi-head attention: attnkit = minGPT's forward pass = torch.nn.MultiheadAttention")

# %% [markdown]
# ## Going further: train an encoder on the A/B task and look at its heads
#
# A one-layer attnkit encoder (two heads scored with the lecture's plain dot product, no positions: the task does
# not need order) reads `[CLS] A A B A` and classifies from the `[CLS]` token's output, BERT's way. It trains on
# lengths 1 to 8, half the sequences holding one or more Bs, and is tested on lengths up to 64 with exactly one
# B. Beside it, the lecture's comparison: a DAN (the plain average of the embeddings, then a linear layer),
# trained the same way.

# %%
from attnkit import ModelConfig, build_model

CLS, A_ID, B_ID, PAD = 0, 1, 2, 3


def ab_batch(n, lengths, generator, *, single_b):
    """n sequences `[CLS] x_1 .. x_L` with L in lengths, right-padded; label 1 when some x is B."""
    lo, hi = lengths
    length = torch.randint(lo, hi + 1, (n,), generator=generator)
    ids = torch.full((n, hi + 1), PAD)
    ids[:, 0] = CLS
    real = torch.arange(hi + 1)[None] <= length[:, None]  # (n, hi + 1), CLS included
    ids[real & (torch.arange(hi + 1)[None] > 0)] = A_ID
    labels = (torch.rand(n, generator=generator) < 0.5).long()
    for row in labels.nonzero().flatten().tolist():
        count = 1 if single_b else int(torch.randint(1, int(length[row]) + 1, (), generator=generator))
        ids[row, 1 + torch.randperm(int(length[row]), generator=generator)[:count]] = B_ID
    return ids, real, labels


config = ModelConfig(family="encoder", vocab_size=4, d_model=16, n_heads=2, n_layers=1, d_ff=32, position="none",
                     score="dot", max_seq_len=128, encoder_head="classify", n_classes=2, pooling="cls")
torch.manual_seed(0)
encoder = build_model(config)


class DAN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.classify = torch.nn.Embedding(4, 16), torch.nn.Linear(16, 2)

    def forward(self, ids, mask):
        tokens = self.embed(ids) * mask[..., None]
        return self.classify(tokens[:, 1:].sum(1) / mask[:, 1:].sum(1, keepdim=True))  # average, CLS left out


dan = DAN()
steps = {"tiny": 40, "full": 300}[BUDGET]
for model, logits_of in ((encoder, lambda ids, mask: encoder(ids, attention_mask=mask).logits),
                         (dan, lambda ids, mask: dan(ids, mask))):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids, mask, labels = ab_batch(64, (1, 8), generator, single_b=False)
        loss = torch.nn.functional.cross_entropy(logits_of(ids, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

lengths = (4, 8, 16, 32, 64)
accuracy = {"attention (attnkit encoder)": [], "plain average (DAN)": []}
with torch.no_grad():
    for length in lengths:
        ids, mask, labels = ab_batch(1000, (length, length), torch.Generator().manual_seed(length), single_b=True)
        for name, logits in (("attention (attnkit encoder)", encoder(ids, attention_mask=mask).logits),
                             ("plain average (DAN)", dan(ids, mask))):
            accuracy[name].append((logits.argmax(-1) == labels).float().mean().item())
for name, values in accuracy.items():
    print(f"{name:28s}", "  ".join(f"L={n}: {a:.1%}" for n, a in zip(lengths, values, strict=True)))
chance_from = {name: next((n for n, a in zip(lengths, values, strict=True) if a < 0.6), None)
               for name, values in accuracy.items()}  # the first length at which it is no better than a coin
print("at chance (below 60%) from length:", chance_from)
if BUDGET == "full":  # the text below says what the full run shows; a change that moves it must change the text
    assert chance_from == {"attention (attnkit encoder)": None, "plain average (DAN)": 8}, chance_from

# %% [markdown]
# Now look at the trained heads: the weights of the `[CLS]` query over the tokens, per head.

# %%
examples = ["AABA", "BAAA", "AAAA", "AAAAAAAAAAABAAAA"]
ids = torch.full((len(examples), 17), PAD)
ids[:, 0] = CLS
for row, text in enumerate(examples):
    ids[row, 1 : 1 + len(text)] = torch.tensor([A_ID if c == "A" else B_ID for c in text])
mask = ids != PAD
with torch.no_grad():
    output = encoder(ids, attention_mask=mask, need_weights=True)
cls_weights = output.attentions[0]["self"][:, :, 0]  # layer 0, (B, H, T, S) -> the CLS query's row (B, H, S)

gap = (cls_weights[0, :, 3] / cls_weights[0, :, 1]).log()  # "AABA": the B's weight over an A's, per head
for head, delta in enumerate(gap.tolist()):
    print(f"head {head}: score of B minus score of A = {delta:.1f}; a lone B among 63 As would get weight "
          f"{1 / (1 + 63 * math.exp(-delta)):.3f}")

fig, axes = plt.subplots(1, 3, figsize=(16, 3), layout="constrained")
for head, ax in enumerate(axes[:2]):
    ax.imshow(cls_weights[:, head], cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set(title=f"head {head}: the [CLS] query's weights", xlabel="position (0 = [CLS])")
    ax.set_yticks(range(len(examples)), examples)
    for row, text in enumerate(examples):
        for col, char in enumerate(text):
            ax.text(col + 1, row, char, ha="center", va="center", color="white", fontsize=7)
for name, values in accuracy.items():
    axes[2].plot(lengths, values, marker="o", label=name)
axes[2].set(xscale="log", xlabel="sequence length (one B in the positives)", ylabel="test accuracy",
            title="trained on lengths 1-8", ylim=(0.4, 1.02))
axes[2].set_xticks(lengths, [str(n) for n in lengths])
axes[2].minorticks_off()
axes[2].legend(fontsize=8)
plt.show()

# %% [markdown]
# A trained head puts its weight on the B wherever it sits, as the lecture's query $[0, 10]$ did, so the `[CLS]`
# output says "B" at any length. The average sees the *fraction* of Bs, $1/L$ for one B in $L$ tokens: a
# threshold learned on short sequences misses a lone B in a long one. At the full budget the DAN is at chance
# already at $L = 8$, the longest length it trained on: its positives there held on average four or five Bs, and
# one B in eight is a fraction it never had to call positive.
#
# Attention is not free of length either: a lone B among $L - 1$ As gets the weight $1 / (1 + (L-1)e^{-\Delta})$,
# where $\Delta$ is the B's score minus an A's. It generalises to long sequences only if training made $\Delta$
# large (printed above). Try `score="scaled_dot"` with AdamW's default weight decay: the gap stays near 1, and the
# encoder falls to chance from 32 tokens on (at the full budget; the DAN still from 8).
#
# **In attnkit:** `attnkit.layers.attention.Attention`, `attnkit.layers.masks`; `attnkit viz` draws a trained
# model's attention maps; `attnkit experiment ab-task` runs the comparison as a measured claim.

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. With the query $[0, c]$ and the keys of "AABA", write `weight_of_b(c)`: the B's attention weight, as a formula
#    in $c$ (at $c = 1$ it is $e/(3 + e)$).
# 2. One B among $L - 1$ As, with the B's score $\Delta$ above an A's: write `lone_b_weight(L, delta)`, the B's
#    weight.
# 3. *Predict, then run:* shuffle the 7 tokens going into the 4-head self-attention `mha` above (no positions, no
#    mask). Its outputs: `"are shuffled the same way"`, `"stay as they were"` or `"change in some other way"`?
# 4. Write `window_allowed(T, window)`: the (T, T) boolean mask of causal attention with a sliding window
#    (Mistral's, Longformer's): query $t$ may see the `window` most recent keys, itself included.

# %%
from attnkit.exercises import exercise


@exercise(1, hint="the B scores c, each A scores 0")
def check_1(weight_of_b):
    expected = [attend_once(torch.tensor([0.0, c]), E, E)[1][2].item() for c in (0.5, 1.0, 3.0)]
    return all(abs(weight_of_b(c) - e) < 1e-5 for c, e in zip((0.5, 1.0, 3.0), expected, strict=True))


@exercise(2, hint="softmax over one score delta and L - 1 scores 0")
def check_2(lone_b_weight):
    cases = [(8, 1.0), (64, 4.6), (200, 2.0)]
    expected = [torch.softmax(torch.tensor([delta] + [0.0] * (L - 1)), 0)[0].item() for L, delta in cases]
    return all(abs(lone_b_weight(L, d) - e) < 1e-5 for (L, d), e in zip(cases, expected, strict=True))


@exercise(3, hint="each output is a weighted average whose weights depend only on the query's and the keys' contents",
          choices=("are shuffled the same way", "stay as they were", "change in some other way"))
def check_3(prediction):
    tokens, order = torch.randn(1, 7, C), torch.randperm(7)
    with torch.no_grad():
        out, shuffled = mha(tokens)[0], mha(tokens[:, order])[0]
    measured = ("are shuffled the same way" if torch.allclose(shuffled, out[:, order], atol=1e-6)
                else "stay as they were" if torch.allclose(shuffled, out, atol=1e-6) else "change in some other way")
    print(f"measured: the outputs {measured}")
    return prediction == measured


@exercise(4, hint="key s is allowed for query t when s <= t and t - s < window")
def check_4(window_allowed):
    cases = [(6, 1), (8, 3), (5, 5), (7, 10)]
    return all(torch.equal(torch.as_tensor(window_allowed(T, w)).bool(),
                           AttentionMask(T, causal=True).allowed(T, window=w)) for T, w in cases)


weight_of_b = None  # your function here
lone_b_weight = None  # your function here
prediction_3 = None  # "are shuffled the same way", "stay as they were" or "change in some other way"
window_allowed = None  # your function here
for check, answer in ((check_1, weight_of_b), (check_2, lone_b_weight), (check_3, prediction_3),
                      (check_4, window_allowed)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 3. They are shuffled the same way: self-attention without positions is *permutation equivariant* (UvA's slide).
#    Each token's output is its own query's weighted average over the set of keys and values, and a set has no
#    order. This is why every model needs a position scheme (tutorial 4).

# %% tags=["solution"] jupyter={"source_hidden": true}
def window_solution(T, window):
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, 1), (1, T)
    return (s <= t) & (t - s < window)


assert check_1(lambda c: math.exp(c) / (3 + math.exp(c)))
assert check_2(lambda L, delta: 1 / (1 + (L - 1) * math.exp(-delta)))
assert check_3("are shuffled the same way") and check_4(window_solution)
assert not check_1(lambda c: c / (3 + c))  # a wrong answer: the scores shared out without the softmax's exp
assert not check_2(lambda L, delta: 1 / (1 + L * math.exp(-delta)))  # a wrong answer: counts the B among the As
assert not check_3("stay as they were")
assert not check_4(lambda T, window: torch.ones(T, T).tril().bool())  # causal, but no window
