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
# # 5. The RNN encoder-decoder, its bottleneck, and attention added to it
#
# **Follows:** USC CSCI 499, Lecture 11 "Transformers: Building Blocks": "Encoder-Decoder Networks" (an encoder,
# an encoding vector $c$, a decoder), "This needs to capture all information about the source sentence.
# Information bottleneck!", "Seq2Seq with Attention" with the dot-product score
# $\mathrm{score}(h^d_t, h^e_j) = h^d_t \cdot h^e_j$, "Concatenate attention output with decoder hidden state",
# and "We get alignment for free!"; COGS 150, "Attention: the origins" (RNN-based translation had a bottleneck;
# attention puts all the hidden states into one fixed-length vector by focusing on what is relevant); CMU 11-711,
# "Attention and Transformers": "Three types of sequence models" (recurrence, convolution, attention); UT CS 371N,
# Lecture 10: "Why are RNNs bad? They 'forget' over long strings".
#
# **You will:** write the encoder-decoder with and without attention in plain PyTorch, check both against
# attnkit's recurrent seq2seq models, then train both on a task whose answer needs the whole source (reversing
# it), measure accuracy by length, and draw the alignment the attention learns; then set the recurrence beside the
# two other types of sequence model, a convolution and attention, and check how far back each one reads.

# %%
# ruff: noqa: E402 (each import sits in the cell that first needs it)
import os
import warnings

import matplotlib.pyplot as plt
import torch

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice in notebooks without ipywidgets
torch.manual_seed(0)
BUDGET = os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full")  # "tiny": seconds (the test suite); "full": the real run
assert BUDGET in ("tiny", "full"), f"ATTNKIT_TUTORIAL_BUDGET={BUDGET!r}: use tiny or full"

# %% [markdown]
# ## The models
#
# attnkit builds both from a config: a GRU encoder and decoder, with `attention="none"` (the decoder sees only the
# encoding $c$) or `attention="luong-dot"`: Luong et al.'s (2015) global attention with the lecture's dot-product
# score, the variant USC's "Seq2Seq with Attention" slides draw (the decoder's new state is the query; the context
# is concatenated with it before the output). Bahdanau et al.'s (2015) original, which the lectures credit with the
# idea, attends *before* the recurrent step; it comes after this one.

# %%
from attnkit import ModelConfig, build_model
from attnkit.data import synthetic_tokenizer

tokenizer = synthetic_tokenizer()  # one character per token: A, B, digits, a-z, + and =, with BOS, EOS, PAD
BOS, EOS, PAD = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id


def seq2seq(attention):
    torch.manual_seed(0)
    return build_model(ModelConfig(family="recurrent-seq2seq", vocab_size=tokenizer.vocab_size, cell="gru",
                                   hidden_size=128, embedding_dim=32, n_layers=1, attention=attention,
                                   tie_embeddings=False, max_seq_len=64))


plain, attentive = seq2seq("none"), seq2seq("luong-dot")
print(plain)

# %% [markdown]
# ## Luong's attention, from scratch, with the model's own weights
#
# 1. The encoder reads the source: hidden states $h^e_1, \ldots, h^e_S$.
# 2. The encoding: the last state, through a small bridge, $s_0 = \tanh(W h^e_S)$, starts the decoder.
# 3. The decoder reads the target shifted right (teacher forcing): states $h^d_1, \ldots, h^d_T$.
# 4. Without attention, $h^d_t$ alone predicts the next token. With attention, $h^d_t$ is the query:
#    $\alpha_t = \mathrm{softmax}_j(h^d_t \cdot h^e_j)$, $c_t = \sum_j \alpha_{tj} h^e_j$, and
#    $\tilde h_t = \tanh(W_c [c_t; h^d_t])$ predicts it.
#
# The query $h^d_t$ is the state *after* the step that read $y_{t-1}$, and the context only joins the read-out: the
# recurrence never sees it. That is Luong et al.'s order, and it lets teacher forcing run the whole target through
# the GRU in one call, then attend for every step at once.

# %%
def encoder_decoder(model, src, tgt, *, attend):
    memory, _ = model.encoder.rnn(model.encoder.embedding(src))  # (B, S, H): every encoder state
    s0 = torch.tanh(model.bridge.hidden_proj(memory[:, -1]))[None]  # (1, B, H): the encoding c -> decoder start
    states, _ = model.decoder.rnn(model.decoder.embedding(tgt), s0)  # (B, T, H)
    if not attend:
        return model.lm_head(states), None  # the bottleneck: s0 is all the decoder knows of the source
    weights = torch.softmax(states @ memory.transpose(1, 2), dim=-1)  # (B, T, S): dot-product attention
    context = weights @ memory  # (B, T, H): one context vector per decoding step
    features = torch.tanh(model.decoder.readout(torch.cat([context, states], dim=-1)))  # [c_t; h_t]
    return model.lm_head(features), weights


src = torch.randint(4, tokenizer.vocab_size - 8, (3, 9))
tgt = torch.randint(4, tokenizer.vocab_size - 8, (3, 7))
with torch.no_grad():
    logits, _ = encoder_decoder(plain, src, tgt, attend=False)
    torch.testing.assert_close(plain(src, tgt).logits, logits)
    logits, weights = encoder_decoder(attentive, src, tgt, attend=True)
    output = attentive(src, tgt, need_weights=True)
    torch.testing.assert_close(output.logits, logits)
    torch.testing.assert_close(output.attentions[0]["cross"][:, 0], weights)  # (B, 1, T, S): one head
print("attnkit's recurrent seq2seq = the from-scratch encoder-decoder, with and without attention (Luong's)")

# %% [markdown]
# ## Bahdanau's attention: the query before the step
#
# Bahdanau et al. (2015) attend from the *previous* state $s_{t-1}$, with the additive score
# $e_{tj} = v^\top \tanh(W s_{t-1} + U h^e_j)$, and feed the context into the recurrence itself:
# $s_t = \mathrm{GRU}([y_{t-1}; c_t], s_{t-1})$; their output layer reads $[c_t; s_t; E y_{t-1}]$. Each context
# needs the state before it, so even teacher forcing is a loop over the target, one step at a time.

# %%
def bahdanau_decoder(model, src, tgt):
    memory, _ = model.encoder.rnn(model.encoder.embedding(src))  # (B, S, H)
    state = torch.tanh(model.bridge.hidden_proj(memory[:, -1]))  # (B, H): s_0
    score, embedded = model.decoder.attention.score, model.decoder.embedding(tgt)  # v, W, U; (B, T, E)
    readin, weights = [], []
    for t in range(tgt.shape[1]):
        e = score.out(torch.tanh(score.query_proj(state)[:, None] + score.key_proj(memory))).squeeze(-1)  # (B, S)
        alpha = torch.softmax(e, dim=-1)  # (B, S): from s_{t-1}, before the step
        context = (alpha[:, :, None] * memory).sum(1)  # (B, H)
        _, state = model.decoder.rnn(torch.cat([embedded[:, t], context], dim=-1)[:, None], state[None])
        state = state[0]  # (B, H): s_t, which read the context
        readin.append(torch.cat([context, state, embedded[:, t]], dim=-1))  # [c_t; s_t; E y_{t-1}]
        weights.append(alpha)
    features = torch.tanh(model.decoder.readout(torch.stack(readin, dim=1)))  # (B, T, F)
    return model.lm_head(features), torch.stack(weights, dim=1)  # (B, T, V), (B, T, S)


bahdanau = seq2seq("bahdanau")
with torch.no_grad():
    logits, weights = bahdanau_decoder(bahdanau, src, tgt)
    output = bahdanau(src, tgt, need_weights=True)
    torch.testing.assert_close(output.logits, logits)
    torch.testing.assert_close(output.attentions[0]["cross"][:, 0], weights)
print("attnkit's attention=\"bahdanau\" = Bahdanau et al.'s decoder, from scratch")

# %% [markdown]
# ## Padding: sources of different lengths in one batch
#
# A batch pads its shorter sources on the right, and `src_mask` says which positions are real. Padding must change
# nothing: the encoder stops at each row's last real token (attnkit packs the sequences for torch's GRU, so the
# encoding $c$ is the last *real* state), and the attention gives padded positions a score of $-\infty$, a weight
# of exactly 0. So each padded row computes what it would alone.

# %%
lengths = torch.tensor([9, 6, 4])  # real tokens per source
src_mask = torch.arange(src.shape[1])[None] < lengths[:, None]  # (B, S): True at real tokens
padded = src.masked_fill(~src_mask, PAD)
for model in (plain, attentive, bahdanau):
    with torch.no_grad():
        output = model(padded, tgt, src_mask=src_mask, need_weights=True)
        for row, n in enumerate(lengths.tolist()):
            alone = model(src[row : row + 1, :n], tgt[row : row + 1]).logits  # the same source, unpadded
            torch.testing.assert_close(output.logits[row : row + 1], alone)
    if output.attentions:
        cross = output.attentions[0]["cross"][:, 0]  # (B, T, S)
        assert (cross.masked_select(~src_mask[:, None, :]) == 0).all(), "a padded source position got weight"
        torch.testing.assert_close(cross.sum(-1), torch.ones(cross.shape[:2]))  # the real ones share all of it
print("padded rows = the same sources alone, with and without attention; padding gets weight exactly 0")

# %% [markdown]
# ## Going further: reverse a sequence
#
# The target is the source backwards (`abcd` -> `dcba`). The first target token is the *last* source token, the
# last target token the *first* one: without attention, all of it must pass through $s_0$, one vector of 128
# numbers however long the source. We train both models on sources of 3 to 16 letters and count exactly
# reversed sequences by length.

# %%
from attnkit.data import make_task, pad
from attnkit.generate.seq2seq import greedy_translate

steps = {"tiny": 10, "full": 800}[BUDGET]
MIN_LEN, MAX_LEN = 3, 16
train = make_task("reverse", 50_000, seed=0, min_len=MIN_LEN, max_len=MAX_LEN).pairs()


def batch(pairs):
    sources = [tokenizer.encode(s) for s, _ in pairs]
    targets = [tokenizer.encode(t) for _, t in pairs]
    src, src_mask = pad(sources, PAD)  # (B, S), right-padded
    tgt_in, _ = pad([[BOS, *t] for t in targets], PAD)  # the decoder reads BOS, y1, y2, ...
    tgt_out, _ = pad([[*t, EOS] for t in targets], -100)  # ... and predicts y1, y2, ..., EOS (-100: no loss)
    return src, src_mask, tgt_in, tgt_out


curves = {}
for name, model in (("no attention", plain), ("Luong dot-product attention", attentive)):
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    curves[name] = []
    for step in range(steps):
        src, src_mask, tgt_in, tgt_out = batch(train[64 * step % len(train) :][:64])
        loss = model(src, tgt_in, src_mask=src_mask, labels=tgt_out).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        curves[name].append(loss.item())
    print(f"{name:27s} training loss {sum(curves[name][-20:]) / len(curves[name][-20:]):.3f} after {steps} steps")

# %% [markdown]
# Score them with attnkit's greedy decoder (`greedy_translate`: encode once, then one token at a time through the
# decoder's recurrent state) on fresh sources of every length.

# %%
lengths = list(range(MIN_LEN, MAX_LEN + 1))
n_test = {"tiny": 5, "full": 200}[BUDGET]
accuracy = {name: [] for name in curves}
for length in lengths:
    test = make_task("reverse", n_test, seed=length, min_len=length, max_len=length)
    sources = [tokenizer.encode(s) for s, _ in test.pairs()]
    for name, model in (("no attention", plain), ("Luong dot-product attention", attentive)):
        model.eval()
        outputs = greedy_translate(model, sources, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=length + 1)
        accuracy[name].append(test.score([tokenizer.decode(o) for o in outputs]))
for name, values in accuracy.items():
    print(f"{name:27s} exact match: length 4 {values[1]:.0%}, 10 {values[7]:.0%}, 16 {values[-1]:.0%}")

# %%
example = "abcdefghijkl"
src, src_mask, tgt_in, _ = batch([(example, example[::-1])])
with torch.no_grad():
    alignment = attentive(src, tgt_in, src_mask=src_mask, need_weights=True).attentions[0]["cross"][0, 0]  # (T, S)
steps_read = ["<bos>", *example[::-1]]  # the decoder's input at each step
peaks = [example[j] for j in alignment.argmax(-1).tolist()]  # the source letter each step weighs most
print("decoder input -> the source letter it weighs most:",
      ", ".join(f"{read}->{peak}" for read, peak in zip(steps_read, peaks, strict=True)))
if BUDGET == "full":  # the text below: after <bos>, most steps weigh most the letter they have just read
    assert peaks[0] == example[-1] and sum(p == r for r, p in zip(steps_read[1:], peaks[1:], strict=True)) > 6, peaks

fig, axes = plt.subplots(1, 3, figsize=(17, 4.5), layout="constrained")
for name, curve in curves.items():
    axes[0].plot(torch.tensor(curve).unfold(0, min(20, len(curve)), 1).mean(1), label=name)
axes[0].set(xlabel="step", ylabel="training loss (mean of 20 steps)", yscale="log", title="training")
for name, values in accuracy.items():
    axes[1].plot(lengths, values, marker="o", label=name)
axes[1].set(xlabel="source length", ylabel="exactly reversed", ylim=(-0.02, 1.02), title="reversing, by length")
for ax in axes[:2]:
    ax.legend()
image = axes[2].imshow(alignment, cmap="viridis", vmin=0, vmax=1)
axes[2].set_xticks(range(len(example)), list(example))
axes[2].set_yticks(range(len(example) + 1), steps_read)
axes[2].set(xlabel="source token (key)", ylabel="decoder input at each step",
            title="the alignment: what each step attends to")
fig.colorbar(image, ax=axes[2])
plt.show()

# %% [markdown]
# Without attention, accuracy falls as the source grows: everything has to fit through one vector. With
# attention, each decoding step looks straight into the source, and the alignment picture (and the line printed
# above it) shows where: after reading `<bos>` the decoder attends to the last letter, the first it must write, and
# the steps draw an anti-diagonal that nobody told it to learn ("we get alignment for free"). Read the line
# closely, though: for most steps the letter weighed most is not the one to write next but the one just read
# (`h->h`, where the step must write `g`). The decoder finds that letter by content, since its own state holds it,
# and the encoder's state there, having read the source left to right, also holds the letter before it: the one
# to write. So the diagonal sits one column right of the ideal alignment of exercise 2. A weight says where a step
# looks; what it reads there is a state that may carry its neighbours too. At the tiny budget neither model has
# learned anything yet; the pictures show untrained weights.
#
# ### A shortcut for the gradient
#
# USC's "Why Attention?" slide gives one more reason: attention "helps with vanishing gradient problem: provides
# shortcut to faraway states". Without it, the loss reaches the first source token only back through $s_0$ and
# every step of the encoder's recurrence; with it, each decoding step's context is a direct path to every encoder
# state. Measure it: the size of the loss's gradient at each source token's embedding, averaged over a batch of
# 16-letter sources, for fresh copies of both models (untrained, so this is the architecture's doing, not
# training's).

# %%
def gradient_by_source_position(model, length=16):
    """The norm of d(loss)/d(embedding) at each source position, averaged over a batch: (length,)."""
    src, src_mask, tgt_in, tgt_out = batch(make_task("reverse", 64, seed=7, min_len=length, max_len=length).pairs())
    embedded = {}

    def keep(module, inputs, output):  # a forward hook on the encoder's embedding: (B, S, E)
        output.retain_grad()
        embedded["source"] = output

    hook = model.encoder.embedding.register_forward_hook(keep)
    try:
        model(src, tgt_in, src_mask=src_mask, labels=tgt_out).loss.backward()
    finally:
        hook.remove()
    return embedded["source"].grad.norm(dim=-1).mean(0)  # (B, S, E) -> (S,)


gradients = {name: gradient_by_source_position(seq2seq(attention)) for name, attention in
             (("no attention", "none"), ("Luong dot-product attention", "luong-dot"))}
first_over_last = {name: (grad[0] / grad[-1]).item() for name, grad in gradients.items()}  # token 1 / token 16
for name, ratio in first_over_last.items():
    print(f"{name:27s} gradient at source token 1 / at token 16: {ratio:.1e}")
assert first_over_last["Luong dot-product attention"] > 100 * first_over_last["no attention"], first_over_last

fig, ax = plt.subplots(figsize=(7, 3.5))
for name, grad in gradients.items():
    ax.plot(range(1, len(grad) + 1), grad / grad[-1], marker="o", label=name)
ax.set(xlabel="source position", ylabel="gradient norm / at the last token", yscale="log",
       title="how much of the loss's gradient reaches each source token (untrained)")
ax.legend()
plt.show()

# %% [markdown]
# Without attention the first token's gradient is a small fraction of the last one's, and on the log scale the
# fall is a straight line: each step back through the GRU multiplies the gradient by about the same shrinking
# factor, the vanishing gradient. With attention every token's gradient is about the same size, whatever its
# distance from the output: that is the shortcut.
#
# **In attnkit:** `attnkit.models.recurrent` (`RecurrentSeq2Seq`, `LuongDecoder` and `BahdanauDecoder`,
# `SourceAttention` with `luong-dot`, `luong-general` and `bahdanau`), presets `gru-seq2seq` and
# `gru-attn-seq2seq`; `attnkit experiment bottleneck` runs the measured comparison, and
# `attnkit train --task translate` trains these models on real pairs.

# %% [markdown]
# ## Three types of sequence model
#
# CMU 11-711's lecture on attention (lecture 004) starts from "three types of sequence models", three ways to
# condition a token's representation on the tokens before it:
#
# - **recurrence**: on an encoding of the history, the state an RNN carries from step to step;
# - **convolution**: on local context, the last $R$ tokens (the *receptive field*) and nothing before them;
# - **attention**: on a weighted average of all the tokens.
#
# UT CS 371N (lecture 10) says what the first costs: RNNs scale to long sequences, but "they 'forget' over long
# strings". Before all three comes Bengio et al.'s (2003) feed-forward LM, a network over the embeddings of the last
# $R$ tokens: local context, as an n-gram model has it. Each is an attnkit language-model family. Build them small
# and untrained, the window as wide as the convolution reaches:

# %%
def language_model(**fields):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, max_seq_len=64, dropout=0.0, **fields)
    return config, build_model(config).double().eval()  # float64: a tiny effect is the model's, not rounding


RECURRENCE, CONVOLUTION, ATTENTION, WINDOW = "recurrence (LSTM)", "convolution (gated CNN)", \
    "attention (Transformer)", "Bengio et al.'s window"
sequence_models = {
    RECURRENCE: language_model(family="recurrent-lm", cell="lstm", hidden_size=32),
    CONVOLUTION: language_model(family="conv-lm", d_model=32, n_layers=2, kernel_size=3, dilation_base=2),
    ATTENTION: language_model(family="decoder", d_model=32, n_layers=2, n_heads=2, d_ff=64),
}
R = sequence_models[CONVOLUTION][0].receptive_field  # the tokens one prediction reads, itself included
sequence_models[WINDOW] = language_model(family="feedforward-lm", context="window", context_size=R,
                                         embedding_dim=16, hidden_size=32)
for name, (config, _) in sequence_models.items():
    reach = f"the last {config.receptive_field} tokens" if config.receptive_field else "every token so far"
    print(f"{name:24s} family {config.family:15s} reads {reach}")

# %% [markdown]
# The causal-reach check: change one token of a text, $d$ positions before the last, and see whether the last
# position's prediction moves. One batch holds the text with each of its tokens changed in turn, so one forward
# pass per model measures every distance.

# %%
def effect_by_distance(model, text, other):
    """The largest change of the last position's logits when the token d back becomes `other`'s, for every d: (T,)."""
    T = len(text)
    back = torch.arange(T)  # d = 0 (the last token itself) ... T - 1 (the first)
    changed = text.repeat(T, 1)  # (T, T): row d is the text with its token d back changed
    changed[back, T - 1 - back] = other[T - 1 - back]
    with torch.no_grad():
        logits = model(torch.cat([text[None], changed])).logits[:, -1]  # (1 + T, V): the last position's
    return (logits[1:] - logits[0]).abs().amax(-1)  # (T,)


def letters_and_changes(length, seed):
    """`length` random letters (T,), and each of them moved on by one (T,): "cab" -> "dbc"."""
    letters = torch.tensor(tokenizer.encode("abcdefghijklmnopqrstuvwxyz"))
    drawn = torch.randint(26, (length,), generator=torch.Generator().manual_seed(seed))
    return letters[drawn], letters[(drawn + 1) % 26]


text, other = letters_and_changes(24, seed=1)
effects = {name: effect_by_distance(model, text, other) for name, (_, model) in sequence_models.items()}
print(f"the last prediction moves, changing the token {R - 1} back (within R = {R}) / {R} back (beyond) / "
      f"{len(text) - 1} back (the first):")
for name, effect in effects.items():
    print(f"  {name:24s} {effect[R - 1]:.1e} / {effect[R]:.1e} / {effect[-1]:.1e}")
for name in (CONVOLUTION, WINDOW):  # local context: the R tokens up to the last, exactly
    assert effects[name][R - 1] > 0 and (effects[name][R:] == 0).all(), name
for name in (RECURRENCE, ATTENTION):  # the whole history: every token reaches the prediction
    assert (effects[name] > 0).all(), name

fig, ax = plt.subplots(figsize=(9, 3.5), layout="constrained")
for name, effect in effects.items():
    reached = effect > 0  # 0 has no place on a log scale: beyond R the local models' lines stop
    ax.plot(torch.arange(len(text))[reached], effect[reached], marker="o", label=name)
ax.axvline(R - 0.5, color="grey", linestyle=":", label=f"the convolution's reach, R = {R}")
ax.set(xlabel="d: how far back the changed token is", ylabel="change of the last logits (largest)", yscale="log",
       title="what reaches the last prediction (untrained, float64)")
ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1, 0.5))
plt.show()

# %% [markdown]
# The convolution and the window read exactly $R$ tokens: change one just beyond and their prediction does not move
# at all (0, not a small number), whatever was written there. The Transformer's prediction moves about as much for
# the first token as for the one before the last: a weighted average of all the tokens, every one within one step.
# The LSTM's moves for every token too, since its state encodes the whole history, but by less and less the further
# back the token is, a straight line on the log scale, as the gradient fell through the GRU above: what a recurrence
# has read fades with every step it takes since. These models are untrained; whether training keeps the distant
# tokens' influence is what the two experiments measure.
#
# **Trained**, in the [experiments gallery](../../experiments/#sequence-models):
# `attnkit experiment sequence-models --budget small` trains an LSTM, a gated CNN (R = 15) and a Transformer decoder
# of about 62k parameters each for 1,000 steps on the same characters, then scores held-out text given only the last
# c tokens. Cutting the context from 64 tokens to 15 raises the Transformer's loss by 0.0093 nats and the LSTM's by
# 0.0070 (each beyond its noise over 9 seeds) and the convolution's by 8e-09, nothing: the verdict is **held**
# (Bengio et al.'s window over the same 15 tokens gains exactly 0 from the tokens past them, and a Kneser-Ney trigram
# reads 2 tokens whatever it is given). [`attnkit experiment rnn-forgets`](../../experiments/#rnn-forgets) asks for
# the token d positions back: from d = 2 to d = 64, next-token accuracy goes LSTM 96% to 12%, plain RNN 100% to 14%
# (chance is 12.5%), Transformer 100% to 100%, at about 17k parameters and 300 steps each, over 5 seeds: **held**.
# So a trained LSTM does use tokens beyond a convolution's reach, and still loses a given token 64 back.
#
# **In attnkit:** the families `recurrent-lm` (`attnkit.models.recurrent.lm`), `conv-lm`
# (`attnkit.models.convolutional`: Dauphin et al.'s gated convolutions, dilated as in WaveNet), `decoder` and
# `feedforward-lm` (`attnkit.models.feedforward`: Bengio et al.'s window, or `context="average"`, the deep averaging
# LM); presets `lstm-lm-tiny`, `gcnn-lm-tiny`, `bengio-lm-tiny` and `dan-lm-tiny`; `config.receptive_field` says how
# far back each reads (None: every token so far). The counted n-gram model (`attnkit.models.ngram.NGramLM`) is in
# tutorial 6; the families' options are in the
# [configs guide](../../user-guide/configs/#the-convolutional-lm-conv-lm).

# %% [markdown]
# ## Exercises
#
# Each exercise comes with a check that says right or wrong (an error in your code counts as wrong, with a hint):
# put your answer where the cell says and run it. *Predict, then run* exercises ask for your prediction first; the
# check runs the experiment and compares. The solutions are folded away at the end.
#
# 1. Luong's "general" score is $h^\top W \bar h$. For a model built with `attention="luong-general"`, write
#    `general_weights(model, states, memory)`: the attention weights (B, T, S) from the decoder states (B, T, H)
#    and the encoder states (B, S, H), with the model's own $W$ (`model.decoder.attention.score.weight`, a linear
#    layer applied to the keys).
# 2. Write `ideal_alignment(S)`: the (S, S) attention weights a perfect reversal model would draw for a source of
#    $S$ tokens, one row per decoding step (the step reading `<bos>`, then $y_1$, ...), one column per source token.
# 3. *Predict, then run:* the source grows from 8 tokens to 16. What the decoder *without* attention receives from
#    the encoder: `"doubles in size"` or `"stays the same size"`?
# 4. *Predict, then run:* a source padded from 4 to 9 tokens in a batch, against the same source alone: the
#    attentive model's logits are `"the same"`, `"slightly different"` or `"very different"`?
# 5. A `conv-lm` layer with kernel size $k$ and dilation $d$ reads its input at $t, t - d, \ldots, t - (k - 1) d$;
#    layer $l$ (from 0) dilates by `dilation_base ** (l % dilation_cycle)` (no cycle: `l % n_layers`). Write
#    `receptive_field(kernel_size, n_layers, dilation_base, dilation_cycle)`: how many tokens, the last included, one
#    prediction of such a model reads. The check builds the models and finds the farthest token that moves their
#    prediction, with `effect_by_distance` from the section above.

# %%
from attnkit.exercises import exercise

general = seq2seq("luong-general")


@exercise(1, hint="score h . (W hbar) for every pair, softmax over the source")
def check_1(general_weights):
    states, memory = torch.randn(2, 5, 128), torch.randn(2, 7, 128)
    with torch.no_grad():
        _, expected = general.decoder.attention(states, memory, None)  # (B, 1, T, S)
        return torch.allclose(general_weights(general, states, memory), expected[:, 0], atol=1e-5)


@exercise(2, hint="step t writes the t-th letter of the reversal: source token S - 1 - t, with all of its weight")
def check_2(ideal_alignment):
    for S in (1, 4, 12):
        expected = torch.zeros(S, S)
        expected[torch.arange(S), S - 1 - torch.arange(S)] = 1.0
        if not torch.allclose(torch.as_tensor(ideal_alignment(S)).float(), expected):
            return False
    return True


def what_the_decoder_receives(model, length):
    """The shape of what the plain decoder starts from: the bridge's s0 from the encoder's last state."""
    source = torch.randint(4, tokenizer.vocab_size - 8, (1, length))
    memory, _ = model.encoder.rnn(model.encoder.embedding(source))  # (1, S, H)
    return tuple(torch.tanh(model.bridge.hidden_proj(memory[:, -1])).shape)  # (1, H): s0


@exercise(3, hint="without attention the decoder starts from s0 = tanh(W h_S) and never reads the encoder again",
          choices=("doubles in size", "stays the same size"))
def check_3(prediction):
    with torch.no_grad():
        shapes = [what_the_decoder_receives(plain, n) for n in (8, 16)]
    print(f"measured: from a source of 8 tokens the decoder receives {shapes[0]}, from 16 tokens {shapes[1]}")
    measured = "stays the same size" if shapes[0] == shapes[1] else "doubles in size"
    return prediction == measured


@exercise(4, hint="padding gets a score of -inf (weight exactly 0), and the encoder stops at the last real token",
          choices=("the same", "slightly different", "very different"))
def check_4(prediction):
    source, target = torch.randint(4, tokenizer.vocab_size - 8, (1, 9)), torch.randint(4, 20, (1, 5))
    real = torch.arange(9)[None] < 4
    with torch.no_grad():
        padded = attentive(source.masked_fill(~real, PAD), target, src_mask=real).logits
        alone = attentive(source[:, :4], target).logits
    gap = (padded - alone).abs().max().item()
    print(f"measured: the largest difference between the logits is {gap:.1e}")
    measured = "the same" if gap < 1e-4 else "slightly different" if gap < 0.1 else "very different"
    return prediction == measured


def measured_receptive_field(kernel_size, n_layers, dilation_base, dilation_cycle):
    """1 + how far back the farthest token that moves an untrained conv-lm's last prediction is."""
    _, model = language_model(family="conv-lm", d_model=16, n_layers=n_layers, kernel_size=kernel_size,
                              dilation_base=dilation_base, dilation_cycle=dilation_cycle)
    return int(effect_by_distance(model, *letters_and_changes(64, seed=2)).nonzero().max()) + 1


@exercise(5, hint="each layer reaches (k - 1) times its dilation further back than the one below it; the token "
                  "itself counts once")
def check_5(receptive_field):
    for settings in ((3, 2, 1, None), (2, 5, 2, None), (4, 6, 2, 3), (5, 3, 3, None)):
        measured = measured_receptive_field(*settings)
        print(f"measured: kernel_size, n_layers, dilation_base, dilation_cycle = {settings} reads {measured} tokens")
        if receptive_field(*settings) != measured:
            return False
    return True


general_weights = None  # your function here
ideal_alignment = None  # your function here
prediction_3 = None  # "doubles in size" or "stays the same size"
prediction_4 = None  # "the same", "slightly different" or "very different"
receptive_field = None  # your function here
for check, answer in ((check_1, general_weights), (check_2, ideal_alignment), (check_3, prediction_3),
                      (check_4, prediction_4), (check_5, receptive_field)):
    print(check(answer))

# %% [markdown] tags=["solution"]
# ### Solutions
#
# 2. The anti-diagonal. The trained model's alignment above is near it but, for most steps, one column to the
#    right: it looks at the letter it has just read, whose encoder state also holds the letter to write. 3. It
#    stays the same size: one vector of 128 numbers, whatever the source's length. That is the bottleneck;
#    attention gives the decoder every encoder state instead, one per source token. 4. The same, to float
#    precision: padded keys get a weight of exactly 0 and the packed GRU stops at each row's last real token, so
#    batching never changes a translation. 5. Layer $l$ reaches $(k - 1) d_l$ tokens further back than its input
#    does, so $R = 1 + (k - 1) \sum_l d_l$: kernel 4, six layers, dilations 1, 2, 4, 1, 2, 4 read
#    $1 + 3 \times 14 = 43$ tokens. Dilation makes the reach grow exponentially with depth (until the cycle
#    restarts), where more layers of kernel $k$ alone add $k - 1$ tokens each: still a fixed window, however wide.
#    `config.receptive_field` computes it.

# %% tags=["solution"] jupyter={"source_hidden": true}
def general_solution(model, states, memory):
    keys = model.decoder.attention.score.weight(memory)  # (B, S, H): W hbar
    return torch.softmax(states @ keys.transpose(1, 2), dim=-1)  # (B, T, S)


assert check_1(general_solution)
assert check_2(lambda S: torch.eye(S).flip(1))
assert check_3("stays the same size") and check_4("the same")


def receptive_field_solution(kernel_size, n_layers, dilation_base, dilation_cycle):
    dilations = [dilation_base ** (layer % (dilation_cycle or n_layers)) for layer in range(n_layers)]
    return 1 + (kernel_size - 1) * sum(dilations)


assert check_5(receptive_field_solution)
assert not check_5(lambda kernel_size, n_layers, dilation_base, dilation_cycle: 1 + (kernel_size - 1) * n_layers)
assert not check_1(lambda model, states, memory: torch.softmax(states @ memory.transpose(1, 2), -1))  # W left out
assert not check_2(torch.eye)  # the diagonal: copying, not reversing
assert not check_3("doubles in size") and not check_4("slightly different")
