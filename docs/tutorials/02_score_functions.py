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
# # 2. Score functions, and why the dot product is scaled
#
# **Follows:** CMU 11-711 Advanced NLP, "Attention and Transformers" (Sean Welleck): the slides "Attention Score
# Functions (1)" and "(2)" (nonlinear/additive, bilinear, dot product, scaled dot product) and "Scaled dot product
# attention"; USC CSCI 499, Lecture 11 "Transformers: Building Blocks" (Swabha Swayamdipta): "Attention Variants"
# (basic dot-product attention, multiplicative or bilinear attention).
#
# **You will:** write the four scores in one line each, check them against attnkit's score modules, see the dot
# product's scale grow with the dimension until the softmax saturates and its gradient vanishes, and train one
# attention layer with each score.

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
# ## Four scores, from scratch
#
# For a query $q$ and a key $k$ (here whole batches: $q$ of shape (B, H, T, D), $k$ of shape (B, H, S, D)):
#
# | score | formula | from |
# |---|---|---|
# | dot | $q^\top k$ | Luong et al. 2015 |
# | scaled dot | $q^\top k / \sqrt{D}$ | Vaswani et al. 2017 |
# | bilinear ("general", "multiplicative") | $q^\top W k$ | Luong et al. 2015 |
# | additive ("nonlinear") | $w_2^\top \tanh(W_1 [q; k])$ | Bahdanau et al. 2015 |
#
# CMU's slide writes the scaled score $q^\top k / \sqrt{|k|}$: there $|k|$ is the key's size, its number of
# dimensions $D$ (Vaswani et al.'s $d_k$), not its length $\lVert k \rVert$: $q^\top k / \sqrt{\lVert k \rVert}$
# would be another score, $\lVert q \rVert \sqrt{\lVert k \rVert} \cos\theta$, still growing with the key's length
# (the cosine similarity divides by both lengths). The code on CMU's slide divides by `math.sqrt(k.size(-1))`, the
# number of dimensions. Every query and key of a layer has the same $D$, so the scale is one constant, $1/\sqrt{D}$.

# %%
def dot(q, k):
    return q @ k.transpose(-2, -1)  # (B, H, T, D) @ (B, H, D, S) -> (B, H, T, S)


def scaled_dot(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])


def bilinear(q, k, W):
    return q @ W @ k.transpose(-2, -1)  # q^T W k for every pair: (B, H, T, D) @ (D, D) @ (B, H, D, S)


def additive(q, k, W1, b1, w2):
    pairs = torch.cat(torch.broadcast_tensors(q[..., :, None, :], k[..., None, :, :]), dim=-1)  # (B, H, T, S, 2D)
    return torch.tanh(pairs @ W1.T + b1) @ w2  # (B, H, T, S, A) @ (A,) -> (B, H, T, S)


D, A = 8, 16
q, k = torch.randn(2, 3, 5, D), torch.randn(2, 3, 7, D)  # B=2, H=3, T=5 queries, S=7 keys

# %% [markdown]
# ## attnkit's score modules compute the same
#
# attnkit keeps each score behind one signature, `score(q, k) -> (B, H, T, S)` (`attnkit.layers.attention`), so any
# of them drops into any attention layer. The bilinear score holds $W$ as a linear layer applied to the keys; the
# additive score splits $W_1 [q; k] = W_q q + W_k k$, which lets it project the keys once for many queries.

# %%
from attnkit.layers.attention import AdditiveScore, BilinearScore, make_score

torch.testing.assert_close(make_score("dot", D)(q, k), dot(q, k))
torch.testing.assert_close(make_score("scaled_dot", D)(q, k), scaled_dot(q, k))

bilinear_score = BilinearScore(D)
W = bilinear_score.weight.weight.detach()  # (D, D): W k is the layer applied to k
torch.testing.assert_close(bilinear_score(q, k), bilinear(q, k, W))

additive_score = AdditiveScore(D, A)
W1 = torch.cat([additive_score.query_proj.weight, additive_score.key_proj.weight], dim=1).detach()  # (A, 2D)
b1, w2 = additive_score.key_proj.bias.detach(), additive_score.out.weight[0].detach()
torch.testing.assert_close(additive_score(q, k), additive(q, k, W1, b1, w2), rtol=1e-5, atol=1e-5)
print("dot, scaled dot, bilinear and additive: attnkit's scores equal the from-scratch ones")

# %% [markdown]
# ## Why scale: the dot product grows with the dimension
#
# "Problem: scale of dot product increases as dimensions get larger. Fix: scale by size of the vector." If the
# entries of $q$ and $k$ are independent with mean 0 and variance 1, then $q^\top k = \sum_{i=1}^{D} q_i k_i$ is a
# sum of $D$ terms of variance 1: its standard deviation is $\sqrt{D}$. Dividing by $\sqrt{D}$ brings it back to 1.
#
# Large scores **saturate** the softmax: one weight goes to 1, the others to 0. The softmax's Jacobian is
# $\mathrm{diag}(\alpha) - \alpha\alpha^\top$, which is 0 when $\alpha$ is one-hot, so almost no gradient reaches
# the queries and keys.

# %%
def softmax_stats(scores):
    """Mean largest weight and mean norm of the gradient reaching the scores from a random upstream gradient."""
    scores = scores.clone().requires_grad_(True)
    weights = torch.softmax(scores, dim=-1)
    (weights * torch.randn_like(weights)).sum().backward()
    return weights.max(-1).values.mean().item(), scores.grad.norm(dim=-1).mean().item()


dims = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
rows = {"dot": [], "scaled dot": []}
for d in dims:
    q, k = torch.randn(2000, 1, d), torch.randn(2000, 16, d)  # 2000 queries, 16 keys each
    for name, score in (("dot", dot), ("scaled dot", scaled_dot)):
        s = score(q, k)
        rows[name].append((s.std().item(), *softmax_stats(s)))
scaled_std = [r[0] for r in rows["scaled dot"]]
assert all(abs(s - 1) < 0.1 for s in scaled_std), scaled_std  # the fix works at every width

fig, axes = plt.subplots(1, 3, figsize=(15, 4))
axes[0].plot(dims, [math.sqrt(d) for d in dims], linewidth=6, alpha=0.3, color="grey", label="sqrt(D)")
for name, values in rows.items():
    for ax, column in zip(axes, range(3), strict=True):
        ax.plot(dims, [v[column] for v in values], marker="o", label=name)
titles = ("std of the scores", "mean largest softmax weight (16 keys)", "gradient norm reaching the scores")
for ax, title in zip(axes, titles, strict=True):
    ax.set(xscale="log", xlabel="dimension D of q and k", title=title)
    ax.legend()
axes[0].set_yscale("log")
plt.show()

# %% [markdown]
# Unscaled, the largest weight climbs towards 1 and the gradient falls towards 0 as $D$ grows; scaled, both stay
# where they are at $D = 2$.
#
# ## Going further: train one attention layer with each score
#
# A retrieval task sized so the dimension matters ($D = 256$, one head): the context is 8 random vectors, the
# query is a noisy copy of one of them, and the layer must return that vector. attnkit's `Attention` module (its
# projections $W^Q, W^K, W^V, W^O$ at PyTorch's default initialisation) learns it by cross-attention from the query
# to the context; only the score differs between the four runs.

# %%
from attnkit.layers.attention import Attention

C, S, BATCH = 256, 8, 64
steps = {"tiny": 15, "full": 400}[BUDGET]


def retrieval_batch(generator):
    context = torch.randn(BATCH, S, C, generator=generator)  # (B, S, C)
    pick = torch.randint(S, (BATCH,), generator=generator)
    target = context[torch.arange(BATCH), pick]  # (B, C)
    query = target + 0.5 * torch.randn(BATCH, C, generator=generator)
    return query[:, None], context, target  # (B, 1, C), (B, S, C), (B, C)


curves, entropies, first_below = {}, {}, {}
for kind in ("dot", "scaled_dot", "bilinear", "additive"):
    torch.manual_seed(0)
    layer = Attention(C, 1, score=kind, additive_dim=64)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-3)
    held_out = retrieval_batch(torch.Generator().manual_seed(2))
    with torch.no_grad():  # the scores' spread before training: the score applied to the projected q and k
        start_std = layer.score(layer.q_proj(held_out[0])[:, None], layer.k_proj(held_out[1])[:, None]).std().item()
    generator = torch.Generator().manual_seed(1)  # the same batches for every score
    curves[kind] = []
    for _ in range(steps):
        query, context, target = retrieval_batch(generator)
        out, weights = layer(query, context=context, need_weights=True)  # (B, 1, C), (B, 1, 1, S)
        loss = ((out[:, 0] - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        curves[kind].append(loss.item())
    with torch.no_grad():
        _, weights = layer(held_out[0], context=held_out[1], need_weights=True)
        entropies[kind] = -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean().item()
    below = first_below[kind] = next((step for step, loss in enumerate(curves[kind]) if loss < 0.1), None)
    print(f"{kind:10s} scores' std at the start {start_std:5.2f}   steps to MSE < 0.1: {below}   "
          f"final loss {sum(curves[kind][-10:]) / 10:.4f}   weight entropy {entropies[kind]:.2f} nats")
print(f"(entropy of uniform weights over {S} keys: {math.log(S):.2f} nats; of one-hot weights: 0)")
if BUDGET == "full":  # the text below: the scaled score is first to an MSE of 0.1, the additive score last
    assert None not in first_below.values() and min(first_below, key=first_below.get) == "scaled_dot" \
        and max(first_below, key=first_below.get) == "additive", first_below

fig, ax = plt.subplots(figsize=(7, 4))
for kind, curve in curves.items():
    ax.plot(curve, label=kind)
ax.set(xlabel="step", ylabel="MSE", yscale="log", title=f"retrieving one of {S} vectors, D = {C}, one head")
ax.legend()
plt.show()

# %% [markdown]
# Read the printed lines and the curves together. The unscaled dot product starts with scores spread several
# times wider than the scaled one's, so its softmax starts nearly one-hot on a key chosen by chance, with a small
# gradient; the scaled score starts near uniform and sharpens as it learns. In the full run the scaled score is
# the first to an MSE of 0.1; the unscaled one gets there later, but on a task this easy it ends *lower* (a final
# loss of about 0.0028 against 0.0036) and is still falling where the scaled one has levelled off: the scale
# speeds the start, it does not set where training ends. Bilinear and additive scores carry their own learned
# scale. The bilinear score's loss jumps about near the end; nearly one-hot weights do not explain that alone, as
# the plain dot's are as one-hot (an entropy of 0.00 nats) and its loss hardly jumps. The additive score is the
# slowest to learn here and costs more: it builds a hidden vector for every query-key pair.
# At the tiny budget (a few steps) none of this is visible yet. How much the scale matters for a whole language
# model is a measured claim of its own: `attnkit experiment scaled-dot` and
# `attnkit experiment score-functions`.
#
# **In attnkit:** `attnkit.layers.attention` (`DotScore`, `BilinearScore`, `AdditiveScore`, `make_score`); a model
# picks its score with the config field `score` (`attnkit train --set score=additive`).

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. The dot product of two vectors of $D$ independent N(0, 1) entries has variance $D$. Write `scale(D)`, the
#    number to multiply it by so that its variance is 1 (the scaled dot product's factor).
# 2. The bilinear score $q^\top W k$ with one $W$ equals the plain dot score. Write `identity_like(D)` returning
#    that $W$, shape (D, D).
# 3. Write `entropy(weights)`: the entropy $-\sum_j \alpha_j \log \alpha_j$ of each row of attention weights
#    (..., S) -> (...), in nats. A masked key has weight exactly 0, and contributes 0.
# 4. *Predict, then run:* at $D = 256$, remove the $1/\sqrt{D}$ from the scaled dot product. Does the entropy of the
#    attention weights (how spread out they are) become `"lower"`, `"higher"` or stay `"about the same"`?

# %%
from attnkit.exercises import exercise


@exercise(1, hint="the variance of c x is c^2 times that of x")
def check_1(scale):
    generator = torch.Generator().manual_seed(0)
    variances = []
    for D in (16, 256):
        q, k = torch.randn(20_000, D, generator=generator), torch.randn(20_000, D, generator=generator)
        variances.append(((q * k).sum(-1) * scale(D)).var().item())
    print(f"the variances come out {[round(v, 2) for v in variances]}")
    return all(abs(v - 1) < 0.05 for v in variances)


@exercise(2, hint="q^T W k = q^T k for every q and k")
def check_2(identity_like):
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 5, 8)
    return torch.allclose(bilinear(q, k, identity_like(8)), dot(q, k), atol=1e-5)


@exercise(3, hint="-(w * log w).sum(-1), with 0 log 0 taken as 0 (torch.special.xlogy, or mask the zeros)")
def check_3(entropy):
    weights = torch.softmax(torch.randn(3, 4, 6), dim=-1)
    weights[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])  # a row with masked keys
    expected = torch.distributions.Categorical(probs=weights).entropy()  # (3, 4)
    return torch.allclose(entropy(weights), expected, atol=1e-5)


def entropy_reference(weights):
    return torch.distributions.Categorical(probs=weights).entropy()


@exercise(4, hint="the unscaled scores spread 16 times wider at D = 256: what does that do to the softmax?",
          choices=("lower", "higher", "about the same"))
def check_4(prediction):
    q, k = torch.randn(2000, 1, 256), torch.randn(2000, 16, 256)
    scaled, unscaled = (entropy_reference(torch.softmax(s, -1)).mean() for s in (scaled_dot(q, k), dot(q, k)))
    print(f"measured: mean entropy {scaled:.2f} nats with the scale, {unscaled:.2f} without "
          f"(uniform over 16 keys: {math.log(16):.2f})")
    measured = "about the same" if abs(unscaled - scaled) < 0.1 else "lower" if unscaled < scaled else "higher"
    return prediction == measured


scale = None  # your function here
identity_like = None  # your function here
entropy = None  # your function here
prediction_4 = None  # "lower", "higher" or "about the same"
for check, answer in ((check_1, scale), (check_2, identity_like), (check_3, entropy), (check_4, prediction_4)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 4. Lower, by far: without the scale the scores have a standard deviation of 16 instead of 1, the largest one
#    wins almost all the weight, and the entropy falls from near $\log 16$ toward 0, the saturation drawn above.
#    Each query then looks at one key, and (the Jacobian above) almost no gradient reaches the others.

# %% tags=["solution"] jupyter={"source_hidden": true}
def entropy_solution(weights):
    return -torch.special.xlogy(weights, weights).sum(-1)  # xlogy(0, 0) = 0


assert check_1(lambda D: D**-0.5) and check_2(torch.eye)
assert check_3(entropy_solution) and check_4("lower")
assert not check_1(lambda D: 1 / D)  # a wrong answer: the variance would be 1/D
assert not check_2(lambda D: torch.ones(D, D))  # every coordinate of q times every one of k: not the dot product
assert not check_3(lambda weights: -(weights * weights.log()).sum(-1))  # 0 log 0 = nan: the masked row is wrong
assert not check_4("about the same")
