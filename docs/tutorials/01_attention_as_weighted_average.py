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
# # 1. Attention as a weighted average: from kernel regression to dot-product attention
#
# **Follows:** UvA, Advanced Topics in Computational Semantics (ATCS), "Attention & Transformers" (Ivo Verhoeven):
# the slides that write attention as $\mathrm{Attention}(Q, K, V) = \mathrm{softmax}(f(Q, K))\,V$, call $f$ "some
# kernel function (read: similarity function)", show that the result is a convex combination of the rows of $V$
# (the "I am Sam" example), and give Nadaraya-Watson kernel regression as a non-Transformer example of it. The same
# idea is COGS 150's "weighted average over all hidden states" (its "The cat sat on" example, computed here) and
# USC CSCI 499's "fuzzy lookup in a key-value store".
#
# **You will:** write kernel regression in five lines, see that it *is* dot-product attention, check that
# attnkit's `Attention` module computes exactly the same numbers, set it beside a linear map that mixes tokens (it
# is not one), then train the one parameter it has.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import os
import warnings

import matplotlib.pyplot as plt
import torch

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## The data: noisy samples of a curve
#
# The slide's setting: a set of training pairs $\mathcal{D} = [(x_1, y_1), \dots, (x_n, y_n)]$, and a new $x$ at
# which to predict $y$.

# %%
def true_function(x):
    return 2 * torch.sin(x) + x**0.8


torch.manual_seed(0)
n_train = 50
x_train = torch.sort(torch.rand(n_train) * 5).values  # (K,) the keys
y_train = true_function(x_train) + 0.5 * torch.randn(n_train)  # (K,) the values
x_test = torch.arange(0, 5, 0.1)  # (Q,) the queries

# %% [markdown]
# ## Nadaraya-Watson kernel regression, from scratch
#
# "We compute the negative Euclidean distance of our new sample with all training samples ($f$). We normalize the
# outputs to lie between (0, 1). We compute our predicted value as the mean of the seen values, weighted by the
# computed similarities." With a Gaussian kernel of bandwidth $w$:
#
# $$\hat y(x) = \sum_i \alpha_i(x)\, y_i, \qquad
#   \alpha(x) = \mathrm{softmax}_i\!\left(-\tfrac{1}{2}\,(w\,(x - x_i))^2\right)$$
#
# The score is not quite the slide's negative Euclidean distance $-|x - x_i|$ but minus half its **square**, the
# Gaussian kernel's exponent ($e^{-d^2/2}$, the form d2l.ai's section 11.2 uses). Both shrink as $x_i$ moves away
# from $x$, so both give a weighted average that favours near neighbours. The square is chosen because it expands
# into a dot product (next section); the plain distance does not, and a check there shows its weights are
# another kernel's (Laplace's, $e^{-d}$). The $\tfrac12$ only rescales the bandwidth.

# %%
def nadaraya_watson(queries, keys, values, bandwidth=1.0):
    scores = -((queries[:, None] - keys[None, :]) * bandwidth) ** 2 / 2  # (Q, K) similarity of each pair
    weights = torch.softmax(scores, dim=-1)  # (Q, K) each row sums to 1
    return weights @ values, weights  # (Q,) weighted average of the values


prediction, weights = nadaraya_watson(x_test, x_train, y_train)
query = torch.tensor([4.21])  # the slide's new sample
one_prediction, one_weights = nadaraya_watson(query, x_train, y_train)
print(f"prediction at x = 4.21: {one_prediction.item():.3f} (true curve: {true_function(query).item():.3f})")
print("the five largest weights go to x_i =", [round(v, 2) for v in x_train[one_weights[0].topk(5).indices].tolist()])

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
left.plot(x_test, true_function(x_test), color="black", label="true curve")
left.axhline(y_train.mean(), color="grey", linestyle=":", label="plain average (every weight 1/n)")
left.plot(x_test, prediction, label="Nadaraya-Watson, w = 1")
left.scatter(x_train, y_train, s=12, alpha=0.5, label="training pairs (keys, values)")
left.set(xlabel="x", ylabel="y", title="kernel regression: a weighted average of the values")
left.legend(fontsize=8)
right.bar(x_train, one_weights[0], width=0.06)
right.axvline(4.21, color="red", linestyle="--", label="query x = 4.21")
right.set(xlabel="training x_i (keys)", ylabel="weight alpha_i", title="the weights of one query sum to 1")
right.legend()
plt.show()

# %% [markdown]
# ## It is dot-product attention
#
# Expand the square: $-\tfrac12 (x - x_i)^2 = x\,x_i - \tfrac12 x_i^2 - \tfrac12 x^2$. The last term is the same
# for every key, and a softmax does not change when the same number is added to every score in a row. So the
# kernel's weights are a softmax of a **dot product** $x \cdot x_i$ plus a per-key term $-\tfrac12 x_i^2$. Both
# fit in one dot product of 2-vectors: query $q = [x, 1]$, key $k_i = [x_i, -\tfrac12 x_i^2]$.

# %%
Q = torch.stack([x_test, torch.ones_like(x_test)], dim=-1)  # (Q, 2)
K = torch.stack([x_train, -x_train**2 / 2], dim=-1)  # (K, 2)
dot_weights = torch.softmax(Q @ K.T, dim=-1)  # (Q, K)
torch.testing.assert_close(dot_weights, weights)
print("softmax(Q K^T) equals the Gaussian kernel's weights")

distance = (x_test[:, None] - x_train[None, :]).abs()  # (Q, K) the slide's Euclidean distance, in one dimension
torch.testing.assert_close(weights, torch.softmax(-(distance**2) / 2, dim=-1))  # the score: minus half its square
laplace = torch.softmax(-distance, dim=-1)  # the negative distance itself: a weighted average too, but another one
assert not torch.allclose(laplace, dot_weights, atol=1e-3)
print(f"softmax(-distance) is another kernel: its weights differ by up to {(laplace - weights).abs().max():.2f}")

# %% [markdown]
# ## COGS 150's example: what is relevant to "on"?
#
# COGS 150 shows the same three steps on a sentence. To predict what follows "The cat sat on", the model scores how
# relevant each word's hidden state $h_j$, "on"'s own among them, is to the last one's (numbers "made up for
# illustration purposes": .2, .1, .1, 1), turns the scores into weights with a softmax,
# $\alpha_j = e^{s_j} / \sum_k e^{s_k}$, and builds the context vector $c = \sum_j \alpha_j h_j$, a weighted average
# of the hidden states. The slide's weights are .2, .18, .18, .44; below, the same with made-up 3-dimensional hidden
# states, through attnkit's softmax (`attention_weights`).

# %%
from attnkit.layers.attention import attention_weights

words = ["The", "cat", "sat", "on"]
relevance = torch.tensor([0.2, 0.1, 0.1, 1.0])  # the slide's scores of each word for "on"
alpha = torch.exp(relevance) / torch.exp(relevance).sum()  # the softmax, as the slide writes it
torch.testing.assert_close(alpha, torch.tensor([0.20, 0.18, 0.18, 0.44]), rtol=0, atol=0.005)  # the slide's weights
torch.testing.assert_close(attention_weights(relevance[None, None, None], None)[0, 0, 0], alpha)
hidden = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])  # (T, 3) h_1 .. h_4
context = alpha @ hidden  # (3,) c = sum_j alpha_j h_j
print("weights", dict(zip(words, [round(a, 3) for a in alpha.tolist()], strict=True)))
print("context vector", [round(c, 3) for c in context.tolist()], "= the weighted average of the hidden states")

# %% [markdown]
# The weights are positive and sum to 1, so the context vector is an average, pulled towards "on"'s own state, the
# one scored most relevant. In a trained model the scores are not made up: they are dot products of learned vectors,
# which is what the rest of this tutorial (and tutorial 3, for self-attention) builds.

# %% [markdown]
# ## Dot-product attention for whole matrices, and why the output is a convex combination
#
# $\mathrm{Attention}(Q, K, V) = \mathrm{softmax}(QK^\top)\,V$. Every row of $A = \mathrm{softmax}(QK^\top)$ lies in
# (0, 1) and sums to 1, so every output row is a convex combination of the rows of $V$: it lies inside their convex
# hull. The slide's example multiplies a given $A$ with the vectors of "I", "am", "Sam":

# %%
def dot_product_attention(queries, keys, values):
    weights = torch.softmax(queries @ keys.transpose(-2, -1), dim=-1)  # (Tq, Tk)
    return weights @ values, weights  # (Tq, Dv)


A = torch.tensor([[0.6, 0.1, 0.3], [0.3, 0.5, 0.2], [0.2, 0.1, 0.7]])
V = torch.tensor([[2.0, 1.0], [-0.5, 2.0], [-1.0, -0.5]])  # rows: I, am, Sam
mixed = A @ V
print("A V =\n", mixed)

fig, ax = plt.subplots(figsize=(5, 4))
hull = torch.cat([V, V[:1]])
ax.plot(hull[:, 0], hull[:, 1], color="grey", linestyle="--", label="convex hull of V's rows")
for word, row in zip(["I", "am", "Sam"], V, strict=True):
    ax.scatter(*row, color="black")
    ax.annotate(word, row, textcoords="offset points", xytext=(5, 5))
ax.scatter(mixed[:, 0], mixed[:, 1], color="red", label="rows of A V")
ax.margins(0.15)
ax.set(title="attention outputs stay inside the values' hull", xlabel="dimension 1", ylabel="dimension 2")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## attnkit computes the same numbers
#
# attnkit's score functions share one signature, `score(q, k) -> (B, H, Tq, Tk)`; `attention_weights` is the
# softmax over keys (plus an optional additive bias, where masks go). `DotScore(1.0)` is the plain dot product.

# %%
from attnkit import count_parameters
from attnkit.layers.attention import Attention, DotScore, attention_weights
from attnkit.layers.masks import AttentionMask

scratch_out, scratch_weights = dot_product_attention(Q, K, y_train[:, None])
scores = DotScore(1.0)(Q[None, None], K[None, None])  # (B=1, H=1, Q, K)
torch.testing.assert_close(attention_weights(scores, None)[0, 0], scratch_weights)

# %% [markdown]
# The whole `Attention` module adds learned projections $W^Q, W^K, W^V$ and an output projection $W^O$. Set all
# four to the identity and feed it the regression as tokens: each training pair is a context token
# $[x_i, -\tfrac12 x_i^2, y_i]$ and each test point a query token $[x, 1, 0]$ (the 0 keeps $y_i$ out of the score).
# Cross-attention from the queries to the context then returns $\sum_i \alpha_i\,[x_i, -\tfrac12 x_i^2, y_i]$, whose
# last channel is the kernel regression. A bandwidth $w$ multiplies every score by $w^2$: put it in the query.

# %%
def regression_tokens(x_query, x_keys, y_values, bandwidth):
    w2 = torch.as_tensor(bandwidth) ** 2
    queries = torch.stack([w2 * x_query, w2.expand_as(x_query), torch.zeros_like(x_query)], dim=-1)  # (Q, 3)
    context = torch.stack([x_keys, -x_keys**2 / 2, y_values], dim=-1)  # (K, 3)
    return queries, context


attention = Attention(3, 1, score="dot", bias=False)  # d_model 3, one head
with torch.no_grad():
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
        projection.weight.copy_(torch.eye(3))
attention.requires_grad_(False)

queries, context = regression_tokens(x_test, x_train, y_train, 1.0)
out, attnkit_weights = attention(queries[None], context=context[None], need_weights=True)  # (1, Q, 3), (1, 1, Q, K)
torch.testing.assert_close(attnkit_weights[0, 0], weights)
torch.testing.assert_close(out[0, :, 2], prediction)
fast_out, _ = attention(queries[None], context=context[None])  # without weights: the fused kernel path
torch.testing.assert_close(fast_out, out)
print("attnkit's Attention is Nadaraya-Watson regression: same weights, same predictions (both kernel paths)")

# %% [markdown]
# ## Not just a linear map
#
# UvA's slide asks: "So is Attention just a linear map?" Once the weights $A$ are fixed, $AV$ is linear in the
# values, and a linear layer can mix tokens too: flatten the $T$ tokens of width $C$ into one vector and multiply
# it by a $(TC \times TC)$ matrix. "Not quite", the slide answers: linear maps are
#
# 1. *inflexible in terms of sequence length*: the matrix is built for one $T$;
# 2. *parameter inefficient*: the general map has $(TC)^2$ numbers (618 billion at GPT-2 small's $T = 1{,}024$,
#    $C = 768$), against attention's four $C \times C$ projections (2.4 million), whatever $T$;
# 3. *invariant to the input content*: the same mixing for every input, where attention computes $A$ from it.
#
# A cheaper linear map keeps one $T \times T$ matrix $A$, learned and fixed, and computes $AV$: each output token a
# fixed mix of the input tokens, as MLP-Mixer's token mixing does. Its $T^2$ numbers (1.05 million at $T = 1{,}024$)
# are fewer than attention's 2.4 million, but it is still built for one $T$ and blind to the content: points 1 and
# 3 stand, and point 2 holds against the general map.
#
# Each, measured on the general linear token mixer beside attnkit's `Attention` (self-attention, no biases):

# %%
torch.manual_seed(0)
T, C = 5, 8
mixer = torch.nn.Linear(T * C, T * C, bias=False)  # (B, T*C) -> (B, T*C): every token from every token
self_attention = Attention(C, 2, bias=False)  # d_model 8, two heads: W^Q, W^K, W^V, W^O, each (C, C)
self_attention.requires_grad_(False)

# 1. Length: the mixer takes sequences of exactly T tokens; attention takes any length with the same weights.
longer = torch.randn(1, T + 1, C)  # (B, T+1, C)
try:
    mixer(longer.flatten(1))
except RuntimeError as error:
    print(f"the linear mixer on {T + 1} tokens: {error}")
print("attention's outputs for 6, 50 and 500 tokens:",
      [tuple(self_attention(torch.randn(1, n, C))[0].shape) for n in (6, 50, 500)])

# 2. Parameters: (T C)^2 for the general mixer, T^2 for a fixed T x T one (A fixed, then AV), 4 C^2 for attention,
# at this size and at GPT-2 small's (C 768, T 1,024).
fixed_mix = torch.nn.Linear(T, T, bias=False)  # A: (T, T), applied as A V, the same for every input
assert count_parameters(mixer) == (T * C) ** 2 and count_parameters(fixed_mix) == T**2
assert count_parameters(self_attention) == 4 * C**2
print(f"parameters at T = {T}, C = {C}: general linear mixer {count_parameters(mixer):,}, fixed T x T mixer "
      f"{count_parameters(fixed_mix):,}, attention {count_parameters(self_attention):,}")
print(f"parameters at T = 1,024, C = 768: general linear mixer {(1024 * 768) ** 2:,}, fixed T x T mixer "
      f"{1024**2:,}, attention {4 * 768**2:,}")

# 3. Content: the mixer's output of a sum is the sum of its outputs; attention's is not, because its weights
# are computed from the input.
def mix(x):
    return mixer(x.flatten(1)).view(x.shape)  # (B, T, C) -> (B, T*C) -> (B, T, C)


def attend(x):
    return self_attention(x)[0]  # (B, T, C)


x1, x2 = torch.randn(2, 1, T, C)  # two inputs (B, T, C)
torch.testing.assert_close(mix(x1 + x2), mix(x1) + mix(x2))
assert not torch.allclose(attend(x1 + x2), attend(x1) + attend(x2), atol=1e-3)
(_, w1), (_, w2) = self_attention(x1, need_weights=True), self_attention(x2, need_weights=True)  # (B, H, T, T)
print(f"the linear mixer: the same matrix for every input; attention's weights for the two inputs differ by up "
      f"to {(w1 - w2).abs().max():.2f}")

# %% [markdown]
# So attention is a linear map of the values *whose matrix the input chooses*: $A$ has one row and one column per
# token, at any length, and comes from $4C^2$ parameters that never see $T$. The price, and the reason
# Transformers need position schemes (tutorial 4), is that nothing in $A$ knows where a token sits; the linear
# mixer has a weight for every pair of places.

# %% [markdown]
# ## Going further: learn the bandwidth
#
# With $w = 1$ the method has no parameters. Make $w$ learnable and it becomes the simplest trainable attention
# (d2l.ai, section 11.2). Fit it by leave-one-out: each training point is a query to all the *other* points. In
# attnkit that is a padding mask: an `AttentionMask` whose `attention_mask` (B, S) hides each row's own key.

# %%
steps = {"tiny": 20, "full": 300}[BUDGET]
log_w = torch.zeros((), requires_grad=True)  # w = exp(log_w) stays positive
optimizer = torch.optim.Adam([log_w], lr=0.05)
others = ~torch.eye(n_train, dtype=torch.bool)  # (K, K): row i may not see key i
losses = []
for _ in range(steps):
    queries, context = regression_tokens(x_train, x_train, y_train, log_w.exp())
    queries = queries[:, None]  # (B=K, T=1, 3): one query per row
    context = context.expand(n_train, n_train, 3)  # (B=K, S=K, 3): every row sees the same training set ...
    out, _ = attention(queries, context=context, mask=AttentionMask(1, attention_mask=others))  # ... but its own
    loss = ((out[:, 0, 2] - y_train) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
bandwidth = log_w.exp().item()
print(f"learned bandwidth w = {bandwidth:.2f} after {steps} steps "
      f"(leave-one-out MSE {losses[0]:.3f} -> {losses[-1]:.3f})")

# %%
with torch.no_grad():
    queries, context = regression_tokens(x_test, x_train, y_train, bandwidth)
    learned, learned_weights = attention(queries[None], context=context[None], need_weights=True)
learned, learned_weights = learned[0, :, 2], learned_weights[0, 0]
y_true = true_function(x_test)
for name, guess in (("plain average", y_train.mean().expand_as(x_test)), ("attention, w = 1", prediction),
                    (f"attention, learned w = {bandwidth:.2f}", learned)):
    print(f"{name:32s} test MSE {((guess - y_true) ** 2).mean():.3f}")
print(f"mean largest weight per query: {weights.max(-1).values.mean():.2f} (w = 1), "
      f"{learned_weights.max(-1).values.mean():.2f} (learned)")

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
axes[0].plot(losses)
axes[0].set(xlabel="step", ylabel="leave-one-out MSE", title="training the bandwidth")
for ax, w, title in ((axes[1], weights, "w = 1"), (axes[2], learned_weights, f"learned w = {bandwidth:.2f}")):
    image = ax.imshow(w, aspect="auto", cmap="viridis")
    ax.set(xlabel="training point (key), sorted by x", ylabel="test point (query), by x",
           title=f"attention weights, {title}")
    fig.colorbar(image, ax=ax)
plt.show()

# %% [markdown]
# A larger $w$ makes the kernel narrower: each query puts its weight on fewer, closer keys (the bright diagonal
# is thinner). That is the whole of attention: a similarity, a softmax, a weighted average. The Transformer
# learns the similarity through $W^Q$ and $W^K$ instead of fixing it, which tutorial 2 looks at.
#
# **In attnkit:** `attnkit.layers.attention` (scores, `attention_weights`, `Attention`);
# `attnkit experiment kernel-regression` runs this comparison as a measured claim.

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. Write the weights of the slide's own kernel, the negative Euclidean distance: `laplace_weights(queries, keys,
#    bandwidth)` returning $\mathrm{softmax}_i(-w\,|x - x_i|)$, shape (Q, K).
# 2. Write the query and key 2-vectors for a bandwidth $w$: `gaussian_qk(queries, keys, bandwidth)` returning
#    `(Q, K)` of shapes (Q, 2) and (K, 2) such that `softmax(Q @ K.T)` equals `nadaraya_watson(..., bandwidth)`'s
#    weights.
# 3. *Predict, then run:* make the kernel very wide (bandwidth $w = 0.01$: every key looks alike to every query).
#    What does the prediction at every query become? `"the mean of all values"`, `"the value of the nearest key"`
#    or `"zero"`.
# 4. *Predict, then run:* now make it very narrow ($w = 100$). Same choices.

# %%
from attnkit.exercises import exercise

CHOICES = ("the mean of all values", "the value of the nearest key", "zero")


def what_the_prediction_becomes(bandwidth):
    """Which of CHOICES nadaraya_watson's prediction at every test query comes closest to, at this bandwidth."""
    predicted = nadaraya_watson(x_test, x_train, y_train, bandwidth)[0]  # (Q,)
    nearest = y_train[(x_test[:, None] - x_train[None, :]).abs().argmin(-1)]  # (Q,)
    candidates = (y_train.mean().expand_as(predicted), nearest, torch.zeros_like(predicted))
    errors = [float((predicted - c).abs().max()) for c in candidates]
    print(f"measured at w = {bandwidth}: largest gap to the mean {errors[0]:.3f}, to the nearest key's value "
          f"{errors[1]:.3f}, to zero {errors[2]:.3f}")
    return CHOICES[errors.index(min(errors))]


@exercise(1, hint="each row is a softmax over the keys of minus w times |x - x_i|")
def check_1(laplace_weights):
    expected = torch.softmax(-2.0 * (x_test[:, None] - x_train[None, :]).abs(), dim=-1)
    return torch.allclose(laplace_weights(x_test, x_train, 2.0), expected, atol=1e-6)


@exercise(2, hint="expand -(w (x - x_i))^2 / 2 and drop the term without x_i")
def check_2(gaussian_qk):
    q, k = gaussian_qk(x_test, x_train, 1.7)
    return torch.allclose(torch.softmax(q @ k.T, dim=-1), nadaraya_watson(x_test, x_train, y_train, 1.7)[1],
                          atol=1e-6)


@exercise(3, hint="at w = 0.01 every score -(w (x - x_i))^2 / 2 is nearly 0: what does a softmax of equal scores give?",
          choices=CHOICES)
def check_3(prediction):
    return prediction == what_the_prediction_becomes(0.01)


@exercise(4, hint="at w = 100 the closest key's score beats every other by a margin that grows with w^2",
          choices=CHOICES)
def check_4(prediction):
    return prediction == what_the_prediction_becomes(100.0)


laplace_weights = None  # your function here
gaussian_qk = None  # your function here
prediction_3 = None  # one of CHOICES
prediction_4 = None  # one of CHOICES
for check, answer in ((check_1, laplace_weights), (check_2, gaussian_qk), (check_3, prediction_3),
                      (check_4, prediction_4)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 3. The mean of all values: equal scores give equal weights, $1/K$ each, whatever the query; the curve flattens
#    to a line. 4. The value of the nearest key: the weights become one-hot on the closest key, and the curve a
#    staircase through the training points (it follows their noise). The bandwidth trades one for the other, which
#    is why the tutorial learns it.

# %% tags=["solution"] jupyter={"source_hidden": true}
def laplace_solution(queries, keys, bandwidth):
    return torch.softmax(-bandwidth * (queries[:, None] - keys[None, :]).abs(), dim=-1)  # (Q, K)


def gaussian_qk_solution(queries, keys, bandwidth):
    w2 = bandwidth**2  # -(w (x - x_i))^2 / 2 = w^2 x x_i - w^2 x_i^2 / 2 + (a term of x alone)
    return torch.stack([w2 * queries, torch.ones_like(queries)], -1), torch.stack([keys, -w2 * keys**2 / 2], -1)


assert check_1(laplace_solution) and check_2(gaussian_qk_solution)
assert check_3("the mean of all values") and check_4("the value of the nearest key")
assert not check_2(lambda queries, keys, bandwidth: gaussian_qk_solution(queries, keys, 1.0))  # a wrong answer
assert not check_3("the value of the nearest key") and not check_4("zero")
assert not check_1(lambda queries, keys, bandwidth: queries @ keys)  # an error in the answer: wrong, not a crash
