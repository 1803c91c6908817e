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
# # 09. What do the heads do? Hooks, ablation, the logit lens, patching and probes
#
# **Follows:** COGS 150, "The Transformer architecture": "When we discuss probing and mechanistic interpretability,
# we'll talk about research trying to figure out what these heads actually do ... maybe one head tracks syntax";
# USC CSCI 499, Lecture 11: "attention provides some interpretability".
#
# **You will:** train a two-layer attention-only model on a task whose solution is known (copy a repeated sequence:
# an *induction head*, Olsson et al. 2022); read its attention by hand with PyTorch hooks and check
# `attnkit.inspect` reads the same; find the induction head by its pattern; remove it and watch the loss come back
# (Michel et al. 2019); read every layer through the output layer (the logit lens); put one head's output back from a
# clean run into a corrupted one (activation patching, Meng et al. 2022); and probe the layers for a feature, beside
# a control task (Hewitt and Liang 2019). Then go further: estimate every head's patch from one backward pass
# (attribution patching, Nanda 2023), split the answer's logit into each head's direct share (direct logit
# attribution), read which heads compose from the weights alone (Elhage et al. 2021) and follow one path between two
# heads (path patching, Wang et al. 2022), and train a sparse autoencoder on the stream (Bricken et al. 2023).

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import copy
import math
import os
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
torch.manual_seed(0)
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## A model whose answer is known
#
# Each sequence is $n$ random tokens followed by the same $n$ again. The first half cannot be predicted: no model
# beats a uniform guess there, a loss of $\ln 24$, and the one trained here stays above it. The second half can,
# by one trick: find the earlier copy of the current token and predict the token that followed it. Two attention
# layers suffice: a head in layer 0 writes each token's predecessor into its position, and a head in layer 1
# matches the current token against those predecessors. Training halves are 4 to 8 tokens long, so no fixed
# offset finds the copy. Layer 0 has four heads, layer 1 one.

# %%
from attnkit.inspect.induction import InductionTask, attention_only_decoder, train_induction

task = InductionTask(vocab_size=24, half=8, shortest=4, batch=32)
model = attention_only_decoder(vocab_size=24, d_model=32, n_heads=(4, 1), max_seq_len=16)
losses = train_induction(model, task, steps=400 if BUDGET == "full" else 150, lr=1e-2)
ids = task.ids(torch.Generator().manual_seed(5), batch=32)  # (32, 16): held-out repeated sequences
first, repeated = task.half_losses(model, ids)
print(f"loss on the first half {first:.2f} (ln 24 = {math.log(24):.2f}), on the repeated half {repeated:.2f}")
if BUDGET == "full":  # the text says what the full run shows; a change that moves it must change the text
    assert first > math.log(24) > repeated, (first, repeated)

# %% [markdown]
# ## Reading attention with a hook, from scratch
#
# PyTorch calls a module's *forward hooks* with its inputs and outputs. Hook the first block: its input is the
# residual stream $x$; the pattern is $\mathrm{softmax}(q k^\top / \sqrt{D} + \text{causal mask})$ with $q$ and $k$
# computed from the normed stream. `attnkit.inspect.trace` names the same activations (`blocks.0.resid_pre`,
# `blocks.0.attn.pattern`) and reads them with hooks of its own, which exist only during the call.

# %%
seen = {}
block = model.stack.blocks[0]
handle = block.register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
with torch.no_grad():
    model(ids[:, :-1])
handle.remove()

attention = block.self_attn
with torch.no_grad():
    h = block.attn_norm(seen["x"])  # (B, T, C)
    q = attention.q_proj(h).unflatten(-1, (4, 8)).transpose(1, 2)  # (B, T, C) -> (B, H, T, D)
    k = attention.k_proj(h).unflatten(-1, (4, 8)).transpose(1, 2)
    length = q.shape[2]
    causal = torch.triu(torch.full((length, length), float("-inf")), diagonal=1)  # -inf above the diagonal
    ours = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + causal, dim=-1)  # (B, H, T, T)

from attnkit.inspect import hook_points, trace

read = trace(model, ids[:, :-1], names=["blocks.0.resid_pre", "blocks.0.attn.pattern", "blocks.1.attn.pattern"])
torch.testing.assert_close(read["blocks.0.resid_pre"], seen["x"])
torch.testing.assert_close(read["blocks.0.attn.pattern"], ours)
print(len(hook_points(model)), "hook points, e.g.", list(hook_points(model))[:6])

# %% [markdown]
# ## Finding the induction head
#
# A head's *induction score* is the weight a query $t$ puts on the keys $j \le t$ whose *previous* token equals
# token $t$ (the token after an earlier copy), averaged over the queries that have such keys. On our sequences that is
# the key $n - 1$ back in the second half.

# %%
def induction_score(pattern, ids):
    """pattern (B, H, T, T), ids (B, T) -> (H,)."""
    same_as_previous = torch.zeros(ids.shape[0], ids.shape[1], ids.shape[1], dtype=torch.bool)
    same_as_previous[:, :, 1:] = ids[:, :, None] == ids[:, None, :-1]  # token t == token j - 1
    keys = same_as_previous & torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()  # and j <= t
    weight = (pattern * keys[:, None]).sum(-1)  # (B, H, T)
    counted = keys.any(-1)[:, None].expand_as(weight)
    return (weight * counted).sum((0, 2)) / counted.sum((0, 2))


from attnkit.inspect.head_types import head_types, self_scores

inputs = ids[:, :-1]
torch.testing.assert_close(induction_score(read["blocks.1.attn.pattern"], inputs),
                           self_scores(read["blocks.1.attn.pattern"], inputs)["induction"])
types = head_types(model, inputs)
for row in types.rows():
    print(f"{row['site']} head {row['head']}: previous {row['previous']:.2f}  induction {row['induction']:.2f}  "
          f"-> {row['type']}")
if BUDGET == "full":  # the text below: no previous-token head in layer 0, the induction head in layer 1
    assert [row["type"] for row in types.rows()] == ["-", "-", "-", "-", "induction"], list(types.rows())

fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
for ax, (name, title) in zip(axes, [("blocks.0.attn.pattern", "layer 0, head 0"),
                                    ("blocks.1.attn.pattern", "layer 1, head 0")], strict=True):
    ax.imshow(read[name][0, 0], cmap="viridis")
    ax.set(title=title, xlabel="key", ylabel="query")
fig.tight_layout()
plt.show()

# %% [markdown]
# In layer 1, the second half's rows put their weight on a diagonal $n - 1$ to the left of the main one: each
# query looks at the token after its earlier copy. Layer 0 is less tidy than the textbook circuit: in the full run
# none of its heads is a previous-token head (each puts between a quarter and a third of its weight on the
# previous token, and head 0, drawn, spreads over several recent keys). The predecessor reaches the induction
# head's keys from the four together, as the ablations and path patching below show.
#
# ## Ablation: does the model need it?
#
# Michel et al. (2019) remove one head at a time and measure the loss. Removing head $h$ sets its output (the $D$
# columns of its output projection's input) to zero; doing it on a copy of the weights, by hand, and with
# `zero_ablate` at the point `blocks.1.attn.z` gives the same loss.

# %%
from attnkit.inspect import zero_ablate
from attnkit.inspect.importance import head_importance
from attnkit.inspect.inputs import Batch

targets = ids[:, 1:].clone()
targets[:, : task.half] = -100  # score the repeated half alone
by_hand = copy.deepcopy(model)
with torch.no_grad():
    by_hand.stack.blocks[1].self_attn.o_proj.weight[:, 0:32] = 0  # layer 1 has one head of width 32
    loss_by_hand = F.cross_entropy(by_hand(inputs).logits.flatten(0, 1), targets.flatten())
ablated = trace(model, inputs, names=[], edits={"blocks.1.attn.z": zero_ablate(head=0)}).output.logits
torch.testing.assert_close(F.cross_entropy(ablated.flatten(0, 1), targets.flatten()), loss_by_hand)

importance = head_importance(model, Batch((inputs,), targets))
for site, head, rise in importance.top(5):
    print(f"{site} head {head}: the repeated half's loss rises by {rise:+.3f} nats when it is removed")

# %% [markdown]
# ## The logit lens: where does the answer form?
#
# Read the residual stream after each block through the final norm and the output layer, as if the model stopped
# there (nostalgebraist 2020). The last row is the model's own output.

# %%
from attnkit.inspect.logit_lens import logit_lens

lens = logit_lens(model, inputs)
streams = trace(model, inputs, names=["blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post"])
with torch.no_grad():
    ours = torch.stack([model.lm_head(model.stack.final_norm(streams[n])) for n in streams.cache])
torch.testing.assert_close(lens.logits, ours)
torch.testing.assert_close(lens.logits[-1], model(inputs).logits.detach())
ranks = lens.ranks()[:, :, task.half:].float().mean((1, 2))  # the repeated half's positions
for name, rank in zip(lens.layers, ranks, strict=True):
    print(f"{name}: the final answer's mean rank on the repeated half {rank:.1f}")

# %% [markdown]
# ## Patching: which head carries the answer?
#
# Replace the first half of each sequence by other random tokens: the repeated half is no longer a repeat, and the
# model's answer at the last position is lost. Run the corrupted input again with one head's output taken from the
# clean run: the share of the logit difference (the answer's logit minus another token's) that comes back is what
# that head carries (Meng et al. 2022; Wang et al. 2022).

# %%
from attnkit.inspect.patching import patch_heads

clean = ids[:8]
corrupted = clean.clone()
corrupted[:, : task.half] = task.ids(torch.Generator().manual_seed(9), batch=8)[:, : task.half]
answer, wrong = clean[:, -1], (clean[:, -1] + 1) % 24
patched = patch_heads(model, Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],)), answer=answer, wrong=wrong)
print(f"logit difference clean {patched.clean:.2f}, corrupted {patched.corrupted:.2f}")
for site, row in zip(patched.rows, patched.restored, strict=True):
    print(site, [f"{v:.2f}" for v in row.tolist() if not math.isnan(v)])

# by hand: the clean run's head output replaces the corrupted one's (a pre-hook on o_proj), then the same share
clean_z = trace(model, clean[:, :-1], names=["blocks.1.attn.z"])["blocks.1.attn.z"]  # (B, T, H, D)
o_proj = model.stack.blocks[1].self_attn.o_proj
handle = o_proj.register_forward_pre_hook(lambda module, args: (clean_z.flatten(-2),))
with torch.no_grad():
    logits = model(corrupted[:, :-1]).logits[:, -1]
handle.remove()
difference = (logits.gather(1, answer[:, None]) - logits.gather(1, wrong[:, None])).mean()
share = (difference - patched.corrupted) / (patched.clean - patched.corrupted)
torch.testing.assert_close(share, patched.restored[1, 0], atol=1e-4, rtol=0)

# %% [markdown]
# ## Probes, and a control task
#
# Does a layer's stream tell whether the current token appeared before? Train a linear classifier on each layer's
# states. A probe can score well by memorising token identities, so Hewitt and Liang (2019) compare it with a
# *control task*: each token type gets one random label, drawn from the real labels' distribution. Selectivity is
# the real accuracy minus the control accuracy.

# %%
from attnkit.inspect.probes import probe

seen_before = torch.tensor([[int(row[t] in row[:t]) for t in range(inputs.shape[1])] for row in inputs.tolist()])
for name in streams.cache:
    result = probe(streams[name].flatten(0, 1), seen_before.flatten(), inputs.flatten(), layer=name, steps=200)
    print(f"{name}: accuracy {result.accuracy:.2f}, control {result.control_accuracy:.2f}, "
          f"selectivity {result.selectivity:+.2f} (majority label {result.majority:.2f})")

# %% [markdown]
# Read the selectivity, not the accuracy. Where the control task is solved as well as the real one (at the
# embeddings, 24 token types are easily told apart in 32 dimensions), a high accuracy says more about what a linear
# probe can memorise than about what the layer computes.
#
# The same analyses run on any trained run from the command line: `attnkit inspect RUN heads --text ...`,
# `head-types`, `logit-lens`, `patch --text ... --corrupt ...` and `probe --conll FILE`
# ([the guide](../../user-guide/inspect/)).

# %% [markdown]
# ## Attribution patching: every head from one backward pass
#
# Patching runs the model once per head. Attribution patching (Nanda 2023; Syed et al. 2023) estimates all of them
# from one corrupted forward and backward pass: the change a patch makes is, to first order, the activation's change
# times the metric's gradient there, $(a_{clean} - a_{corrupted}) \cdot \partial m / \partial a$. Where the model
# is far from linear over the change, integrating the gradient along the path from the corrupted to the clean
# activation (`steps=`) does better.

# %%
from attnkit.inspect.attribution import attribute_heads

estimated = attribute_heads(model, Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],)), answer=answer, wrong=wrong)
integrated = attribute_heads(model, Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],)), answer=answer,
                             wrong=wrong, steps=4)
for site, exact, plain, path_integral in zip(patched.rows, patched.restored, estimated.restored, integrated.restored,
                                             strict=True):
    print(site, "patching", [f"{v:.2f}" for v in exact.tolist() if not math.isnan(v)],
          "estimate", [f"{v:.2f}" for v in plain.tolist() if not math.isnan(v)],
          "integrated", [f"{v:.2f}" for v in path_integral.tolist() if not math.isnan(v)])

# by hand, the induction head's estimate: its clean output minus its corrupted one, times the gradient of the
# logit difference at the corrupted run (o_proj's input made a leaf to differentiate by)
leaf = {}


def differentiable(module, args):
    leaf["z"] = args[0].detach().requires_grad_()
    return (leaf["z"],)


handle = o_proj.register_forward_pre_hook(differentiable)
logits = model(corrupted[:, :-1]).logits[:, -1]
handle.remove()
(grad,) = torch.autograd.grad((logits.gather(1, answer[:, None]) - logits.gather(1, wrong[:, None])).mean(), leaf["z"])
first_order = ((clean_z.flatten(-2) - leaf["z"].detach()) * grad).sum() / (patched.clean - patched.corrupted)
torch.testing.assert_close(float(first_order), float(estimated.restored[1, 0]), rtol=1e-4, atol=1e-5)

# %% [markdown]
# ## Direct logit attribution: who writes the answer?
#
# With pre-norm blocks the stream the final norm reads is a sum: the embeddings plus every sublayer's write, and an
# attention sublayer's write is a sum over its heads. Freeze the final norm's scale at its value on this input and
# the norm is linear, so the logit difference splits into each writer's *direct* share (Elhage et al. 2021): what it
# adds straight into the answer, not what it does through later layers.

# %%
from attnkit.inspect.logit_attribution import logit_attribution

attribution = logit_attribution(model, clean[:, :-1], answer=answer, wrong=wrong)
for name, share in attribution.top(4):
    print(f"{name}: {share:+.2f} of the logit difference {attribution.total.mean():.2f}")
torch.testing.assert_close(attribution.values.sum(0), attribution.total, atol=1e-4, rtol=0)  # the shares add up

# by hand, the induction head's share: its write, centred and divided by the final norm's frozen scale, read along
# the norm's gain times the output layer's answer row minus its wrong row
writes = trace(model, clean[:, :-1], names=["blocks.1.attn.out", "blocks.1.resid_post"])
final = writes["blocks.1.resid_post"][:, -1]  # (B, C): the stream the final norm reads at the last position
norm = model.stack.final_norm
scale = (final.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, 1)
write = writes["blocks.1.attn.out"][:, -1]  # (B, C): layer 1 has one head and no bias
direction = (model.lm_head.weight[answer] - model.lm_head.weight[wrong]).detach()  # (B, C)
share = ((write - write.mean(-1, keepdim=True)) / scale * norm.weight.detach() * direction).sum(-1)  # (B,)
torch.testing.assert_close(share, attribution["blocks.1.attn head 0"], atol=1e-4, rtol=1e-4)

# %% [markdown]
# ## Circuits in the weights: which heads compose?
#
# Activations say what a head did on these inputs; its weights say what it can do on any. Head $h$'s QK circuit
# $W_Q W_K^\top$ scores a query against a key, its OV circuit $W_V W_O$ says what it writes for the key it reads
# (each a $C \times C$ matrix of rank $D$, kept as two factors). A later head *composes* with an earlier one when it
# reads what that one wrote: through its queries, its keys or its values. An induction head is a K-composition: its
# keys read the previous-token head's output. The score is
# $\|W_{OV}^{s} W_{QK}^{r\top}\|_F / (\|W_{OV}^{s}\|_F \|W_{QK}^{r}\|_F)$ (Elhage et al. 2021).

# %%
from attnkit.inspect.circuits import composition_scores, head_weights

composition = composition_scores(model)
for row in composition.top(4):
    print(f"{row['kind'].upper()}-composition {row['sender']} head {row['sender head']} -> {row['receiver']} "
          f"head {row['receiver head']}: {row['score']:.3f}")

# by hand, the K-composition of each layer-0 head into the induction head, from the dense C x C matrices
ov = head_weights(model, "blocks.0.attn").ov().dense()  # (4, C, C)
qk = head_weights(model, "blocks.1.attn").qk().dense()[0]  # (C, C)
by_hand = torch.linalg.matrix_norm(ov @ qk.T) / (torch.linalg.matrix_norm(ov) * torch.linalg.matrix_norm(qk))
torch.testing.assert_close(composition.table("k", "blocks.0.attn", "blocks.1.attn")[:, 0], by_hand, rtol=1e-4,
                           atol=1e-5)

# %% [markdown]
# **Path patching** (Wang et al. 2022) asks the same question of the activations: put the layer-0 heads' clean
# output back into the corrupted run *only where the induction head's keys read it* (every other head frozen at
# its corrupted output), and see how much of the answer returns. Corrupt the first half's odd positions: a
# second-half token $x_i$ ($i$ odd) then finds no key whose predecessor is $x_i$, though the token after it is intact.
# The keys should bring the answer back; the queries (the current token, unchanged) should not.

# %%
from attnkit.inspect.path_patching import loss_metric, path_patch

odd = torch.arange(1, task.half, 2)
broken = ids.clone()
broken[:, odd] = (ids[:, odd] + 1 + torch.randint(0, 23, (ids.shape[0], len(odd)),
                                                   generator=torch.Generator().manual_seed(3))) % 24
scored = torch.full_like(ids[:, 1:], -100)
positions = torch.tensor([task.half + i for i in range(1, task.half - 1, 2)])  # x_i (i odd) predicts x_(i+1)
scored[:, positions] = ids[:, 1:][:, positions]
for via in "qkv":
    path = path_patch(model, Batch((ids[:, :-1],)), Batch((broken[:, :-1],)), sender=("blocks.0.attn", [0, 1, 2, 3]),
                      receiver=("blocks.1.attn", 0), via=via, metric=loss_metric(scored))
    print(f"layer 0 -> the induction head's {via}: {path.restored:+.2f} of the advantage restored")

# %% [markdown]
# ## A sparse autoencoder on the stream
#
# The stream has 32 dimensions, and the model may pack more features than that into it (superposition, Elhage et al.
# 2022). A sparse autoencoder learns an overcomplete dictionary whose features, a few at a time, rebuild each
# activation (Bricken et al. 2023); the TopK form keeps the $k$ largest (Gao et al. 2024). Its quality is read three
# ways: how many features fire per token ($L_0$), how much of the variance it rebuilds, and the model's loss with the
# reconstruction spliced in place of the stream.

# %%
from attnkit.inspect.inputs import lm_batch
from attnkit.inspect.sae import SAEConfig, evaluate, point_activations, spliced_loss, train_sae

stream_batches = [lm_batch(task.ids(torch.Generator().manual_seed(100 + i), batch=32)) for i in range(8)]
config = SAEConfig(d_in=32, d_sae=128, architecture="topk", k=4, hook_name="blocks.0.resid_post")
sae, sae_losses = train_sae(config, lambda: point_activations(model, stream_batches[:6], config.hook_name),
                            steps=400 if BUDGET == "full" else 100, lr=3e-3)
held_out = torch.cat(list(point_activations(model, stream_batches[6:], config.hook_name)))  # (N, C)
metrics = spliced_loss(model, sae, stream_batches[6:], evaluate(sae, [held_out]),
                       torch.cat(list(point_activations(model, stream_batches[:2], config.hook_name))))
print(f"L0 {metrics.l0:.1f}, explained variance {metrics.explained_variance:.2f}, dead {metrics.dead_share:.0%}; "
      f"loss clean {metrics.clean_loss:.2f}, with the SAE {metrics.spliced_loss:.2f}, "
      f"with the stream mean-ablated {metrics.ablated_loss:.2f}")

# by hand: the features are the k largest of (x - b_dec) W_enc + b_enc, the rest zero; and the normalised error
with torch.no_grad():
    pre = (held_out - sae.b_dec) @ sae.W_enc + sae.b_enc  # (N, F)
    kept = pre.topk(4, dim=-1)
    features = torch.zeros_like(pre).scatter(-1, kept.indices, kept.values.relu())
    rebuilt = features @ sae.W_dec + sae.b_dec
    nmse = (rebuilt - held_out).pow(2).sum() / (held_out - held_out.mean(0)).pow(2).sum()
torch.testing.assert_close(features, sae.encode(held_out))
torch.testing.assert_close(float(nmse), metrics.normalised_mse, rtol=1e-4, atol=1e-6)

# %% [markdown]
# The same runs from the command line on any trained run: `attnkit inspect RUN circuits` (the composition scores
# and each head's OV spectrum) and `attnkit inspect RUN sae --point blocks.1.resid_post --input FILE --k 8` (the
# SAE saved in SAELens's layout, and each feature's top-activating contexts in `sae.md`).
#
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. Write `previous_score(pattern)`: for a pattern (B, H, T, T), each head's mean weight on the key just before
#    the query, over the queries t >= 1.
# 2. Which head of layer 0 puts the most weight on the previous token? Give its index.
# 3. Write `induction_targets(tokens)`: for a list of tokens, at each position $t$ the token an induction head
#    predicts next: the one that followed the most recent earlier occurrence of `tokens[t]`, or -1 where
#    `tokens[t]` has not occurred before.
# 4. *Predict, then run:* zero-ablate layer 1's head, as above. Do the logits change at the *first* position too,
#    where there is nothing to copy yet? `"yes"` or `"no"`.

# %%
from attnkit.exercises import exercise

layer0 = read["blocks.0.attn.pattern"]


@exercise(1, hint="pattern[..., t, t - 1] for t = 1 .. T-1, averaged over the batch and those queries")
def check_1(previous_score):
    return torch.allclose(previous_score(layer0), self_scores(layer0, inputs)["previous"], atol=1e-5)


@exercise(2, hint="compute previous_score(layer0) and take the largest")
def check_2(head):
    return head == int(self_scores(layer0, inputs)["previous"].argmax())


@exercise(3, hint="walk left to right, remembering where each token was last seen; predict what came after it")
def check_3(induction_targets):
    for row in [row.tolist() for row in ids[:4]] + [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]:
        earlier = [[s for s in range(t) if row[s] == row[t]] for t in range(len(row))]  # earlier occurrences
        if list(induction_targets(row)) != [row[e[-1] + 1] if e else -1 for e in earlier]:
            return False
    return True


@exercise(4, hint="ablation removes the head's output at every position, whatever its pattern does there",
          choices=("yes", "no"))
def check_4(prediction):
    with torch.no_grad():
        gap = (ablated[:, 0] - model(inputs).logits[:, 0]).abs().max().item()
    print(f"measured: the first position's logits move by up to {gap:.3f}")
    return prediction == ("yes" if gap > 1e-5 else "no")


previous_score = None  # your function here
head = None  # your number here
induction_targets = None  # your function here
prediction_4 = None  # "yes" or "no"
for check, answer_given in ((check_1, previous_score), (check_2, head), (check_3, induction_targets),
                            (check_4, prediction_4)):
    print(check(answer_given))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 4. Yes: at the first position the head can only attend to that token itself, and it writes its value there like
#    anywhere else. Zero-ablation removes the head's whole output, not only the behaviour we named it for, which is
#    why patching (replacing with another input's output) is the finer instrument.

# %% tags=["solution"] jupyter={"source_hidden": true}
def previous_score_solution(pattern):
    length = pattern.shape[-1]
    return pattern[..., torch.arange(1, length), torch.arange(0, length - 1)].mean((0, 2))  # (H,)


assert check_1(previous_score_solution) and check_2(int(previous_score_solution(layer0).argmax()))
assert not check_1(lambda pattern: pattern.diagonal(dim1=-2, dim2=-1).mean((0, 2)))  # a wrong answer: itself
assert not check_2(int(previous_score_solution(layer0).argmin()))
def induction_targets_solution(tokens):
    last_seen, targets = {}, []
    for t, token in enumerate(tokens):
        targets.append(tokens[last_seen[token] + 1] if token in last_seen else -1)
        last_seen[token] = t
    return targets


assert check_3(induction_targets_solution) and check_4("yes")
assert not check_3(lambda tokens: [-1] * len(tokens)) and not check_4("no")
