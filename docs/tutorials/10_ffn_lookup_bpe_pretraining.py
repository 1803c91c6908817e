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
# # 10. The remaining slides: what the FFN adds, a soft lookup, BPE, pre-training with few labels, chat fine-tuning
#
# **Follows:** the slides the other tutorials leave out. USC CSCI 499, Lecture 11, "Self-Attention and Weighted
# Averages": "there are no element-wise nonlinearities in self-attention; stacking more self-attention layers just
# re-averages value vectors. Solution: add a feed-forward network to post-process each output vector." UvA ATCS,
# "Attention & Transformers", the soft lookup: "We want to find a textbook about NLP in the library (V). We search
# for titles (K) with 'jurafsky' and 'martin' as authors (Q)." CMU 11-711's "Inputs and embeddings: subwords" and
# UvA's "Tokenization", built here as byte-pair encoding (Sennrich et al. 2016). COGS 150's "GPT: generative
# pre-trained Transformers": pre-train on unlabelled text, then adapt with few labels; and its "ChatGPT uses a
# transformer model (plus some other stuff)", of which chat fine-tuning comes first.
#
# **You will:** see that attention alone re-averages and what an FFN adds on a task that needs a non-linearity;
# run the library lookup through attnkit's `Attention`; learn BPE merges in a dozen lines and check them against the
# `tokenizers` library that attnkit trains with; pre-train a small decoder that then learns a task from 16
# labels where the same model from random weights cannot; and chat fine-tune a decoder with
# `attnkit train --task chat`, its loss on the assistant's replies alone.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import copy
import json
import math
import os
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
torch.manual_seed(0)
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## Attention only re-averages; the FFN adds the non-linearity
#
# One attention layer computes $A\,X W_V W_O$: the weights $A = \mathrm{softmax}(QK^\top)$, then a weighted average
# of linear maps of the inputs. Stack two, with their residual connections, and the output is still
# $X + A_1 X M_1 + A_2 (X + A_1 X M_1) M_2$ with $M = W_V W_O$: given the weights, a linear function of $X$. Nothing
# is applied element by element to what the averages return. Check it on attnkit's `Attention` (one head, no
# biases), with the weights it reports:

# %%
from attnkit.layers.attention import Attention
from attnkit.layers.feedforward import FeedForward

C = 16
layers = [Attention(C, 1, bias=False) for _ in range(2)]
x = torch.randn(3, 8, C)  # (B, T, C)
with torch.no_grad():
    h, weights = x, []
    for layer in layers:
        out, w = layer(h, need_weights=True)  # (B, T, C), (B, 1, T, T)
        h, weights = h + out, [*weights, w[:, 0]]
    M1, M2 = ((layer.o_proj.weight @ layer.v_proj.weight).T for layer in layers)  # (C, C): x W_V^T W_O^T
    h1 = x + weights[0] @ x @ M1
    torch.testing.assert_close(h, h1 + weights[1] @ h1 @ M2)
print("two attention layers = averages (by the reported weights) of linear maps of the input")

# %% [markdown]
# So every non-linearity of an attention-only stack sits in *where* it looks: the softmax of the scores. That is
# not nothing (a token's weight on itself grows like $e^{x^\top W x}$, a quadratic in its own features), but it is
# a roundabout way to compute a function of what a token holds. The FFN, $W_2\,\mathrm{GELU}(W_1 x)$ at each
# position, computes it directly.
#
# A task that needs one: each token is a point in the plane, and the model must say, for every token, whether its
# point lies inside a circle (half of them do). No linear function of a point can tell. Two 2-layer stacks of
# attnkit's layers, the same but for the FFNs, train on the same batches.

# %%
class Stack(torch.nn.Module):
    """points (B, T, 2) -> logits (B, T, 2): attention layers with residuals, an FFN after each or none."""

    def __init__(self, *, ffn, n_layers=2):
        super().__init__()
        self.embed, self.readout = torch.nn.Linear(2, C), torch.nn.Linear(C, 2)
        self.attn = torch.nn.ModuleList(Attention(C, 2) for _ in range(n_layers))
        self.ffn = torch.nn.ModuleList(FeedForward(C, 4 * C) for _ in range(n_layers)) if ffn else None

    def forward(self, points):
        x = self.embed(points)  # (B, T, C)
        for i, attn in enumerate(self.attn):
            x = x + attn(x)[0]  # re-average
            if self.ffn is not None:
                x = x + self.ffn[i](x)  # post-process each position
        return self.readout(x)


def circle_batch(n, generator, length=8):
    points = torch.randn(n, length, 2, generator=generator)
    return points, (points.norm(dim=-1) < 1.1774).long()  # 1.1774: the median radius of a 2-d Gaussian


steps = {"tiny": 150, "full": 600}[BUDGET]
test_points, test_inside = circle_batch(256, torch.Generator().manual_seed(99))
circle_accuracy, circle_models = {}, {}
for name, ffn in (("attention only", False), ("attention + FFN", True)):
    torch.manual_seed(0)
    model = circle_models[name] = Stack(ffn=ffn)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)  # the same batches for both
    for _ in range(steps):
        points, inside = circle_batch(64, generator)
        loss = F.cross_entropy(model(points).flatten(0, 1), inside.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        circle_accuracy[name] = (model(test_points).argmax(-1) == test_inside).float().mean().item()
    print(f"{name:16s} {sum(p.numel() for p in model.parameters()):5,} parameters, test accuracy "
          f"{circle_accuracy[name]:.1%}")
assert circle_accuracy["attention + FFN"] >= 0.95, circle_accuracy
assert circle_accuracy["attention + FFN"] > circle_accuracy["attention only"] + 0.03, circle_accuracy

# %%
grid = torch.stack(torch.meshgrid(torch.linspace(-2.5, 2.5, 101), torch.linspace(-2.5, 2.5, 101), indexing="xy"),
                   dim=-1)  # (101, 101, 2)
fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), layout="constrained")
for ax, (name, model) in zip(axes, circle_models.items(), strict=True):
    with torch.no_grad():  # each grid point read as a one-token sequence: what the stack makes of a point alone
        inside = model(grid.reshape(-1, 1, 2)).softmax(-1)[:, 0, 1].reshape(101, 101)
    image = ax.imshow(inside, extent=(-2.5, 2.5, -2.5, 2.5), origin="lower", cmap="RdBu_r", vmin=0, vmax=1)
    ax.add_patch(plt.Circle((0, 0), 1.1774, fill=False, linestyle="--"))
    ax.set(title=f"{name}: {circle_accuracy[name]:.1%} (tokens in context)", xlabel="x", ylabel="y")
fig.colorbar(image, ax=axes, label="P(inside), one token alone")
plt.show()

# %% [markdown]
# Read alone (a one-token sequence, right), a token's attention can only weigh itself: the weight is 1, the layer an
# affine map, and the attention-only stack draws a straight boundary. In context it does better than that
# (printed above), through the softmax; the FFN draws the circle.
#
# ## A soft lookup in a library
#
# UvA's example: the library holds books (the values $V$), each found by its title and authors (the keys $K$); we
# ask for authors "jurafsky" and "martin" (the query $Q$). A hard lookup returns the book whose key equals the
# query, or nothing. Attention returns every book, weighted by how well its key matches: here keys and query are
# bags of author names, the score counts shared names, and the values say what each book is about.

# %%
authors = ["jurafsky", "martin", "manning", "schutze", "raghavan"]
topics = ["NLP", "food", "software", "search"]
library = {  # title: (authors, what it is about)
    "Speech and Language Processing": (["jurafsky", "martin"], {"NLP": 1.0}),
    "The Language of Food": (["jurafsky"], {"food": 1.0, "NLP": 0.3}),
    "Clean Code": (["martin"], {"software": 1.0}),
    "Foundations of Statistical NLP": (["manning", "schutze"], {"NLP": 1.0}),
    "Introduction to Information Retrieval": (["manning", "raghavan", "schutze"], {"search": 1.0, "NLP": 0.3}),
}
K = torch.tensor([[float(a in names) for a in authors] for names, _ in library.values()])  # (books, authors)
V = torch.tensor([[about.get(t, 0.0) for t in topics] for _, about in library.values()])  # (books, topics)
q = torch.tensor([float(a in ("jurafsky", "martin")) for a in authors])  # (authors,)


def soft_lookup(query, keys, values, sharpness):
    weights = torch.softmax(sharpness * (keys @ query), dim=0)  # (books,): shared names, made a distribution
    return weights @ values, weights  # (topics,)


for sharpness in (1.0, 3.0, 10.0):
    found, weights = soft_lookup(q, K, V, sharpness)
    print(f"sharpness {sharpness:4}:", ", ".join(f"{w:.2f} {title[:14]}" for title, w in zip(library, weights,
                                                                                            strict=True)))
    print(f"{'':16}what comes back:", ", ".join(f"{t} {v:.2f}" for t, v in zip(topics, found, strict=True)))
assert list(library)[int(weights.argmax())] == "Speech and Language Processing"

# %% [markdown]
# At sharpness 10 it is nearly the hard lookup: almost all the weight on *Speech and Language Processing*. Softer,
# the two books sharing one author ("jurafsky" alone, "martin" alone) come back in part, and the answer is a blend
# of topics. The same lookup in attnkit's `Attention`: the query and the books as tokens, the sharpness in the
# query's projection, the identity elsewhere, and the values carried in the last channels.

# %%
lookup = Attention(len(authors) + len(topics), 1, score="dot", bias=False)
width = len(authors) + len(topics)
with torch.no_grad():
    for projection in (lookup.q_proj, lookup.k_proj, lookup.v_proj, lookup.o_proj):
        projection.weight.copy_(torch.eye(width))
    lookup.q_proj.weight.mul_(3.0)  # the sharpness
query_token = torch.cat([q, torch.zeros(len(topics))])[None, None]  # (1, 1, width): names only
book_tokens = torch.cat([K, V], dim=-1)[None]  # (1, books, width): names, then what the book is about
with torch.no_grad():
    out, attnkit_weights = lookup(query_token, context=book_tokens, need_weights=True)
found, weights = soft_lookup(q, K, V, 3.0)
torch.testing.assert_close(attnkit_weights[0, 0, 0], weights)
torch.testing.assert_close(out[0, 0, len(authors):], found)
print("attnkit's cross-attention is the library's soft lookup: the same weights, the same blend of topics")

# %% [markdown]
# ## Byte-pair encoding from scratch
#
# A Transformer reads subwords: frequent words whole, rare ones in pieces, and nothing is ever unknown. BPE
# (Sennrich et al. 2016) learns the pieces: start from single symbols (for GPT-2's byte-level BPE, the 256 bytes,
# each shown as a printable character: a space is `Ġ`), count every pair of neighbouring symbols in the corpus's
# words, merge the most frequent pair into a new symbol, and repeat. The list of merges, in order, *is* the
# tokenizer. Below, the merge loop from scratch; the words come from the trained tokenizer's own pre-tokenizer
# (GPT-2's split into words, each with its leading space, and its byte-to-character map).

# %%
def merge(word, pair):
    """The word's symbols with every occurrence of `pair`, left to right, made one symbol."""
    out, i = [], 0
    while i < len(word):
        if word[i : i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def learn_bpe(word_counts, n_merges, min_count=2):
    """word_counts: {tuple of symbols: count} -> the merges, most frequent pair first (ties: the pair whose symbols
    came first in the vocabulary, as the `tokenizers` library breaks them)."""
    words = {word: count for word, count in word_counts.items()}
    order = {s: i for i, s in enumerate(sorted({s for word in words for s in word}))}  # symbol -> id
    merges = []
    while len(merges) < n_merges:
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:], strict=False):  # neighbours
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], order[p[0]], order[p[1]]))
        if pairs[best] < min_count:
            break
        merged = best[0] + best[1]
        order[merged] = len(order)
        merges.append(best)
        new_words = Counter()
        for word, count in words.items():
            new_words[merge(word, best)] += count
        words = new_words
    return merges


# %% [markdown]
# Train attnkit's BPE (`attnkit.tokenize.train_tokenizer("bpe", ...)`, the `tokenizers` library underneath) on a
# small text, learn the merges from scratch on the same words, and compare the two lists. The 300 tokens asked for
# are more than this text can give, so the merging runs until no pair occurs twice: attnkit says so in a line
# of its log above the list (outside a tutorial, that line asks for more text or a smaller `vocab_size`).

# %%
from tokenizers import pre_tokenizers

from attnkit.tokenize import train_tokenizer

text = ("the cat sat on the mat. the cat ate the rat. that rat sat on the hat of the cat. "
        "a fat cat and a thin rat: the rat ran, the cat sat, the mat was flat and the hat was that cat's.")
tokenizer = train_tokenizer("bpe", [text], vocab_size=300)
temporary = tempfile.TemporaryDirectory(prefix="attnkit-tutorial-")  # removed when the kernel stops
folder = Path(temporary.name)
tokenizer.save(folder)
trained = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
           for m in json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]]

split = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)  # [(word, span)], bytes shown
word_counts = Counter(tuple(word) for word, _ in split)
alphabet = pre_tokenizers.ByteLevel.alphabet()  # all 256 byte symbols start in the vocabulary
ours = learn_bpe({**{(s,): 0 for s in alphabet}, **word_counts}, n_merges=len(trained))
assert ours == trained, f"from scratch {ours}\ntrained {trained}"
print(f"{len(ours)} merges, in the same order as the trained tokenizer's; the first ten:",
      ["".join(m) for m in ours[:10]])
ids = tokenizer.encode("the cat sat on the flat mat")
print("'the cat sat on the flat mat' ->", tokenizer.pieces(ids))

# %% [markdown]
# The most frequent pairs merge first (the list printed above), so the commonest words become single tokens, each
# with its leading space, and the rare ones stay in pieces ("flat" was never frequent enough). The merging stops at
# the vocabulary size or when no pair occurs twice (attnkit's `min_frequency=2`).
#
# ## Generative pre-training when labels are few
#
# COGS 150's GPT: pre-train a decoder to predict the next token of unlabelled text, then adapt it. Here the "text"
# is a toy language with a hidden property: each sequence counts up (each token the previous plus one, modulo 16)
# or down, a fifth of its tokens replaced at random. Both kinds use every token equally often, so counting tokens
# says nothing; only the order does. Predicting the next token requires telling the two kinds apart, and
# pre-training learns that from sequences without labels. Then two copies of one small decoder learn to classify
# the direction from a few labelled sequences (a linear layer on the mean of the hidden states, everything
# trained): one starts from the pre-trained weights, one from random weights.

# %%
from attnkit import ModelConfig, build_model

VOCAB, LENGTH = 16, 24


def counting(n, generator):
    """n sequences of LENGTH tokens and their direction: 1 up, 0 down."""
    direction = torch.randint(2, (n,), generator=generator)
    step = torch.where(direction == 1, 1, -1)  # (n,)
    noise = torch.rand(n, LENGTH, generator=generator) < 0.2
    random_tokens = torch.randint(VOCAB, (n, LENGTH), generator=generator)
    ids = torch.zeros(n, LENGTH, dtype=torch.long)
    ids[:, 0] = torch.randint(VOCAB, (n,), generator=generator)
    for t in range(1, LENGTH):
        ids[:, t] = torch.where(noise[:, t], random_tokens[:, t], (ids[:, t - 1] + step) % VOCAB)
    return ids, direction


config = ModelConfig(family="decoder", vocab_size=VOCAB, d_model=32, n_heads=2, n_layers=2, d_ff=64,
                     max_seq_len=LENGTH, dropout=0.0)
torch.manual_seed(0)
pretrained = build_model(config)
optimizer = torch.optim.AdamW(pretrained.parameters(), lr=3e-3)
generator, lm_losses = torch.Generator().manual_seed(0), []
for _ in range({"tiny": 150, "full": 400}[BUDGET]):
    ids, _ = counting(32, generator)  # the directions are drawn, never read
    loss = pretrained(ids[:, :-1], labels=ids[:, 1:]).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    lm_losses.append(loss.item())
print(f"next-token loss {lm_losses[0]:.2f} -> {lm_losses[-1]:.2f} (ln 16 = 2.77: a uniform guess)")

# %%
test_ids, test_direction = counting(500, torch.Generator().manual_seed(9))


def finetune(body, n_labels, seed):
    """Train body + a linear head on n_labels labelled sequences; accuracy on the 500 test sequences."""
    torch.manual_seed(seed)
    head = torch.nn.Linear(config.d_model, 2)
    ids, direction = counting(n_labels, torch.Generator().manual_seed(100 + seed))
    optimizer = torch.optim.AdamW([*body.parameters(), *head.parameters()], lr=3e-3)
    for _ in range(100):
        loss = F.cross_entropy(head(body.stack(ids)[0].mean(1)), direction)  # (B, T, C) -> (B, C) -> (B, 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return (head(body.stack(test_ids)[0].mean(1)).argmax(-1) == test_direction).float().mean().item()


label_counts = {"tiny": (16,), "full": (4, 16, 64)}[BUDGET]
fewshot = {"pre-trained": [], "random weights": []}
for n_labels in label_counts:
    torch.manual_seed(0)
    fewshot["pre-trained"].append(finetune(copy.deepcopy(pretrained), n_labels, seed=1))
    fewshot["random weights"].append(finetune(build_model(config), n_labels, seed=1))
    print(f"{n_labels:3d} labels: pre-trained {fewshot['pre-trained'][-1]:.1%}, "
          f"random weights {fewshot['random weights'][-1]:.1%}")
at_16 = label_counts.index(16)
assert fewshot["pre-trained"][at_16] > fewshot["random weights"][at_16] + 0.2, fewshot
if BUDGET == "full":  # the text below says what the full run shows; a change that moves it must change the text
    random_start = fewshot["random weights"]
    assert random_start[2] > random_start[1] + 0.1 and fewshot["pre-trained"][2] > random_start[2], fewshot

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
left.plot(lm_losses)
left.axhline(torch.log(torch.tensor(16.0)).item(), color="grey", linestyle=":", label="uniform guess, ln 16")
left.set(xlabel="pre-training step", ylabel="next-token loss (nats)", title="pre-training, no labels")
left.legend()
for name, values in fewshot.items():
    right.plot(label_counts, values, marker="o", label=name)
right.axhline(0.5, color="grey", linestyle=":", label="chance")
right.set(xscale="log", xlabel="labelled sequences", ylabel="test accuracy", ylim=(0.3, 1.02),
          title="classifying the direction from few labels")
right.set_xticks(label_counts, [str(n) for n in label_counts])
right.minorticks_off()
right.legend()
plt.show()

# %% [markdown]
# With 16 labels the pre-trained decoder already tells the directions apart; from random weights the same model
# and the same 16 labels stay near chance: its training has to discover, from 16 examples, that the order of the
# tokens is what matters, and pre-training discovered it from thousands of unlabelled ones. More labels close part
# of the gap: at the full budget, which adds 4 and 64, the random start is well above chance with 64 labels but still
# behind the pre-trained one. Tutorial 8 does the same with BERT's masked-LM objective on real reviews, where the
# labels are plentiful and pre-training at that size gains nothing.
#
# **In attnkit:** `attnkit.layers.attention.Attention` and `attnkit.layers.feedforward.FeedForward` (the parts of
# every block, `attnkit.blocks`); `attnkit.tokenize.train_tokenizer` and `attnkit tokenizer train` (byte-level
# BPE); `attnkit train --task lm` to pre-train, then `attnkit train --task classify --init-from RUN` to adapt.

# %% [markdown]
# ## Adapting for chat: the loss on the assistant's replies alone
#
# COGS 150: "Under the hood, ChatGPT uses a transformer model (plus some other stuff)." The first of that other
# stuff is chat (instruction) fine-tuning, the supervised step of Ouyang et al. (2022): the decoder goes on
# predicting the next token, now of conversations written in one fixed format, and the loss counts the assistant's
# tokens alone, so that it learns to answer, not to write the user's questions. (The step after it, learning from
# people's preferences between answers, is `attnkit train --task dpo`: Direct Preference Optimization, which learns
# from pairs of a preferred and a rejected reply without RLHF's reward model and PPO; see the user guide's
# [preference fine-tuning](../../user-guide/pretraining-finetuning/#preference-fine-tuning).) A run with no chat
# template of its own writes a conversation in attnkit's plain format,
#
#     User: face
#     Assistant: FACE<eos>
#
# and the reply is everything after the prompt `User: face\nAssistant:`, EOS included, so that the model also
# learns where to stop. The assistant's job here: say the user's four-letter word (letters a to h) in capitals.
# `attnkit train --task chat` trains on a JSON Lines file of such conversations, holding out 10% of them (words the
# model never sees) for validation. ChatGPT starts from a pre-trained model (`--init-from RUN`, a converted Llama
# among them); this one starts from random weights, so that it trains in seconds.

# %%
import dataclasses
import random

import attnkit
from attnkit.chat_format import DEFAULT_FORMAT
from attnkit.cli import parse, train_request
from attnkit.train.job import prepare

rng = random.Random(0)
words = sorted({"".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(640)})
rng.shuffle(words)
unseen, chat_words = words[:20], words[20:]  # 20 words kept out of the file altogether
chats = folder / "chats.jsonl"
chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": word},
                                                  {"role": "assistant", "content": word.upper()}]}) + "\n"
                         for word in chat_words))
chat_run = folder / "chat"
command = ["train", "--task", "chat", "--data", str(chats), "--tokenizer", "char", "--out", str(chat_run),
           "--device", "cpu", "--set", "d_model=64", "n_layers=2", "n_heads=2", "d_ff=128", "max_seq_len=32",
           "dropout=0.0", "--batch-size", "32", "--lr", "3e-3", "--warmup", "20", "--max-steps", "300",
           "--eval-every", "50"]
print("attnkit", " ".join(command).replace(str(folder), "runs"))  # (the notebook writes to a temp dir)
invocation = parse(command)  # what `attnkit train ...` would run, without running it (as tutorial 6 does)
request = train_request(invocation.settings, *invocation.sections)
if BUDGET == "tiny":  # seconds: twenty steps
    request = dataclasses.replace(request, settings={**request.settings, "max_steps": 20, "eval_every": 10,
                                                     "warmup": 2})
result = prepare(dataclasses.replace(request, progress=False)).fit()
print(f"{len(chat_words)} conversations, {result.step} steps: validation loss on the held-out replies "
      f"{result.evaluation['val_loss']:.4f} nats per token")

# %% [markdown]
# The labels, from scratch: the conversation's tokens, with -100 (no loss) on the prompt's, checked against how
# attnkit reads a conversation (`ChatTemplate.conversation_ids`, chat fine-tuning's reading, which `attnkit serve`,
# `attnkit chat` and `attnkit generate`'s `--chat` share through `ChatTemplate.chat_ids`); then the trained model's
# loss on the replies of words it never saw, and its answers to them (`Pipeline.chat`, which reads a chat as training
# read its conversations and stops at EOS).

# %%
chat_lm = attnkit.load(chat_run, device="cpu")
chat_tokenizer = chat_lm.tokenizer


def chat_labels(user, reply):
    """(T,) ids of 'User: {user}\\nAssistant: {reply}<eos>' and (T,) labels: -100 on the prompt, the ids after it."""
    prompt = chat_tokenizer.encode(f"User: {user}\nAssistant:")
    answer = chat_tokenizer.encode(f" {reply}") + [chat_tokenizer.eos_id]
    return torch.tensor(prompt + answer), torch.tensor([-100] * len(prompt) + answer)


ids, labels = chat_labels("face", "FACE")
theirs, replies = DEFAULT_FORMAT.conversation_ids(
    chat_tokenizer, [{"role": "user", "content": "face"}, {"role": "assistant", "content": "FACE"}])
torch.testing.assert_close(ids, torch.tensor(theirs), rtol=0, atol=0)
torch.testing.assert_close(labels, torch.where(torch.tensor(replies), ids, -100), rtol=0, atol=0)
print("trained on:", repr(chat_tokenizer.decode(labels[labels >= 0].tolist(), skip_special=False)),
      f"({int((labels >= 0).sum())} of {len(ids)} tokens)")

with torch.no_grad():
    losses = [F.cross_entropy(chat_lm.model(ids[None, :-1]).logits[0], labels[1:])  # token t predicts t + 1
              for ids, labels in (chat_labels(word, word.upper()) for word in unseen)]
answers = [chat_lm.chat([{"role": "user", "content": word}], max_new_tokens=8, temperature=0)  # its reply
           for word in unseen]
right = sum(answer == word.upper() for answer, word in zip(answers, unseen, strict=True))
print(f"loss on the replies to {len(unseen)} unseen words: {torch.stack(losses).mean():.4f} nats per token; "
      f"answers right: {right} of {len(unseen)}")
print("  ".join(f"{word} -> {answer}" for word, answer in zip(unseen[:5], answers, strict=False)))
if BUDGET == "full":  # the text below says what the full run shows
    assert right == len(unseen) and result.evaluation["val_loss"] < 0.01, (answers, result.evaluation)

# %%
records = [json.loads(line) for line in (chat_run / "metrics.jsonl").read_text().splitlines()]
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(*zip(*[(r["step"], r["loss"]) for r in records if r.get("kind") == "train"], strict=True), alpha=0.6,
        label="training batch")
ax.plot(*zip(*[(r["step"], r["val_loss"]) for r in records if "val_loss" in r], strict=True), marker="o",
        label="validation (held-out words)")
ax.axhline(4 * math.log(8) / 6, color="grey", linestyle=":", label="capitals, but not which: 4 ln 8 / 6")
ax.set(xlabel="step", ylabel="loss on the replies (nats per token)", yscale="log",
       title="chat fine-tuning: the loss counts the assistant's tokens")
ax.legend()
plt.show()

# %% [markdown]
# The loss counts six tokens a reply (a space, four capitals, EOS). It falls fast to a plateau at
# $4 \ln 8 / 6 \approx 1.39$: the model has learnt the shape of an answer (a space, four capitals from A to H, then
# stop) but not which capitals, a uniform guess among eight for each. Then it learns to copy the user's word, and the
# loss drops to nearly 0: at the full budget every one of the 20 words it never saw comes back in capitals. The
# user's words are random, so a loss on them could never go below $\ln 8$ a letter: counting it would spend the
# model's training on predicting what nobody can, which is why chat fine-tuning leaves the prompt out.
#
# **In attnkit:** `attnkit train --task chat` (`attnkit/tasks/chat.py`; conversations as messages,
# prompt/completion, Alpaca's instruction/input/output or ShareGPT's conversations, `attnkit/data/chat.py`), then
# `attnkit chat RUN` to chat with it turn after turn (or `attnkit generate --run RUN --chat --prompt "face"` for one
# reply, `attnkit serve --run RUN` for the chat API); the format and its labels are
# `attnkit.chat_format.ChatTemplate`. [Pre-training, fine-tuning,
# evaluation](../../user-guide/pretraining-finetuning/#chat-fine-tuning) has the rest.

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. Encode with the learned merges: write `apply_merges(word, merges)`, taking a word's symbols (a tuple such as
#    `tuple("Ġcat")`) and applying the merges in their order, each wherever it occurs, to return the pieces.
# 2. Which sharpness makes the library lookup put a weight of exactly 0.99 on *Speech and Language Processing*?
# 3. Write `pair_counts(word_counts)`: how often each pair of neighbouring symbols occurs, counting each word as
#    often as it occurs (a `Counter` or dict `{(a, b): count}`), the table BPE picks its next merge from.
# 4. *Predict, then run:* turn the library lookup's sharpness up to 50. Its weights become `"uniform over the
#    books"`, `"one-hot on the best match"` or `"one-hot on a random book"`?
# 5. A conversation of several turns: write `turns_labels(pairs)`, taking `[(user, reply), ...]` and returning the
#    (T,) ids and (T,) labels chat fine-tuning trains on, as `chat_labels` does for one turn. Each later turn's
#    prompt follows the earlier reply's EOS on a new line, `\nUser: ...\nAssistant:`.

# %%
from attnkit.exercises import exercise


@exercise(1, hint="apply each merge to the whole word before the next one, in the merges' order")
def check_1(apply_merges):
    words = ["Ġcat", "Ġflat", "Ġthat", "Ġmat", "the"]
    expected = [tokenizer.pieces(tokenizer.encode(w.replace("Ġ", " "))) for w in words]
    print(f"the tokenizer splits them {expected}")
    return [list(apply_merges(tuple(w), ours)) for w in words] == expected


@exercise(2, hint="SLP scores 2s, two other books s, two 0: solve e^{2s} / (e^{2s} + 2 e^s + 2) = 0.99 for e^s")
def check_2(sharpness):
    weight = soft_lookup(q, K, V, float(sharpness))[1][0].item()
    print(f"that sharpness gives SLP a weight of {weight:.4f}")
    return abs(weight - 0.99) < 1e-4


@exercise(3, hint="for every word, every neighbouring pair (zip(word, word[1:])) adds the word's count")
def check_3(pair_counts):
    counted = dict(pair_counts(word_counts))
    best = max(counted, key=counted.get)
    expected = Counter()
    for word, count in word_counts.items():
        for i in range(len(word) - 1):
            expected[word[i], word[i + 1]] += count
    return counted == dict(expected) and counted[best] == counted[ours[0]]  # BPE's first merge is a top pair


@exercise(4, hint="sharpness multiplies every score: the gaps between the books grow 50 times wider",
          choices=("uniform over the books", "one-hot on the best match", "one-hot on a random book"))
def check_4(prediction):
    weights = soft_lookup(q, K, V, 50.0)[1]
    print(f"measured: weights {[round(w, 3) for w in weights.tolist()]}")
    measured = ("one-hot on the best match" if weights.max() > 0.999 and int(weights.argmax()) == 0
                else "uniform over the books" if weights.max() - weights.min() < 0.01 else "one-hot on a random book")
    return prediction == measured


@exercise(5, hint="one turn is chat_labels; a later turn's prompt is '\\nUser: ...\\nAssistant:', its labels -100")
def check_5(turns_labels):
    pairs = [("face", "FACE"), ("bead", "BEAD"), ("cab", "CAB")]
    messages = []
    for user, reply in pairs:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    expected, replies = DEFAULT_FORMAT.conversation_ids(chat_tokenizer, messages)
    ids, labels = (torch.as_tensor(t) for t in turns_labels(pairs))
    expected = torch.tensor(expected)
    return torch.equal(ids, expected) and torch.equal(labels, torch.where(torch.tensor(replies), expected, -100))


apply_merges = None  # your function here
sharpness = None  # your number here
pair_counts = None  # your function here
prediction_4 = None  # "uniform over the books", "one-hot on the best match" or "one-hot on a random book"
turns_labels = None  # your function here
for check, answer in ((check_1, apply_merges), (check_2, sharpness), (check_3, pair_counts), (check_4, prediction_4),
                      (check_5, turns_labels)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 2. With $u = e^s$: $0.99 = u^2 / (u^2 + 2u + 2)$, a quadratic in $u$, solved below. 4. One-hot on the best
#    match: the softmax of scores 50 apart is 1 and $e^{-50}$. A sharp lookup is a dictionary's exact lookup; a
#    soft one blends the values of near matches, and only the soft one has a gradient that says which key should
#    have matched.

# %% tags=["solution"] jupyter={"source_hidden": true}
def apply_merges_solution(word, merges):
    for pair in merges:
        word = merge(word, pair)
    return word


def pair_counts_solution(word_counts):
    pairs = Counter()
    for word, count in word_counts.items():
        for pair in zip(word, word[1:], strict=False):
            pairs[pair] += count
    return pairs


def turns_labels_solution(pairs):
    ids, labels = [], []
    for turn, (user, reply) in enumerate(pairs):
        prompt = chat_tokenizer.encode(("\n" if turn else "") + f"User: {user}\nAssistant:")
        answer = chat_tokenizer.encode(f" {reply}") + [chat_tokenizer.eos_id]
        ids += prompt + answer
        labels += [-100] * len(prompt) + answer
    return torch.tensor(ids), torch.tensor(labels)


# SLP scores 2s, two books s, two 0: 0.99 = e^{2s} / (e^{2s} + 2 e^s + 2), a quadratic in u = e^s
u = (2 * 0.99 + math.sqrt((2 * 0.99) ** 2 + 4 * 0.01 * 2 * 0.99)) / (2 * 0.01)
assert check_1(apply_merges_solution) and check_2(math.log(u))
assert check_3(pair_counts_solution) and check_4("one-hot on the best match")
assert not check_1(lambda word, merges: apply_merges_solution(word, merges[::-1]))  # the merges out of order
assert not check_2(math.log(99))  # a wrong answer: as if SLP competed with one other book
assert not check_3(lambda counts: Counter(p for word in counts for p in zip(word, word[1:], strict=False)))  # once each
assert not check_4("uniform over the books")
assert check_5(turns_labels_solution)
assert not check_5(lambda pairs: chat_labels(*pairs[0]))  # the first turn alone
assert not check_5(lambda pairs: (turns_labels_solution(pairs)[0],) * 2)  # a loss on every token, prompts included
