"""The course index: each of the five lectures, in its own order, slide topic by slide topic, to what covers it.

For every topic: the tutorial (docs/tutorials/NAME.py) that builds it, the modules that implement it, the
experiment that tests its claim, the picture that shows it, a page of the documentation, and, where attnkit has
nothing for a topic, the gap stated as a gap. `attnkit lectures` prints it; the site's course index page is
rendered from the same data (`course_index_markdown`), and tests/test_docs.py checks that everything named exists.
Plain data: this module imports nothing of attnkit but its errors, when a course name is wrong.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Topic:
    """One slide topic and what covers it; every reference is checked by the docs test."""

    slide: str  # the topic in the lecture's own words; in parentheses, what attnkit adds and the command to run it
    tutorial: str | None = None  # a tutorial's file stem under docs/tutorials/
    modules: tuple[str, ...] = ()  # dotted modules under attnkit ("layers.attention"), or "module:Name"
    experiment: str | None = None  # an `attnkit experiment` name
    picture: str | None = None  # a PNG under docs/
    page: str | None = None  # a documentation page under docs/ ("user-guide/training.md"), maybe with "#anchor"
    gap: str | None = None  # what attnkit does not cover of this topic
    section: str | None = None  # the heading (## or ###), in the tutorial, of the cells that build it

    @property
    def tutorial_anchor(self) -> str:
        """The section's anchor in the rendered tutorial (Python-Markdown's slug of its heading)."""
        if not self.section:
            return ""
        words = re.sub(r"[^\w\s-]", "", self.section).strip().lower()
        return "#" + re.sub(r"[-\s]+", "-", words)


@dataclass(frozen=True)
class Lecture:
    key: str  # the lecture's file prefix in the shared lectures folder ("000")
    course: str  # the course, as it names itself
    title: str
    short: str  # what `attnkit lectures NAME` accepts besides the key
    topics: tuple[Topic, ...]


T01 = "01_attention_as_weighted_average"
T02 = "02_score_functions"
T03 = "03_self_attention_masks_heads"
T04 = "04_positions"
T05 = "05_rnn_encoder_decoder"
T06 = "06_small_gpt"
T07 = "07_gpt2_to_llama2"
T08 = "08_mlm_pretrain_finetune"
T09 = "09_what_do_the_heads_do"
T10 = "10_ffn_lookup_bpe_pretraining"
T11 = "11_transformer_encoder_decoder"

COST = "rnn-vs-transformer-cost"
COST_PNG = "experiments/rnn-vs-transformer-cost/cost_by_length.png"
BOTTLENECK_PNG = "experiments/bottleneck/accuracy_by_length.png"
ALIGN_PNG = "recurrent/alignment-reverse.png"
HEADS_PNG = "viz/grid.png"
AB_PNG = "experiments/ab-task/attention.png"
LUONG = "Luong's attention, from scratch, with the model's own weights"  # tutorial 5's sections
BAHDANAU = "Bahdanau's attention: the query before the step"
GRADIENT_SHORTCUT = "A shortcut for the gradient"  # tutorial 5: the gradient reaching each source token
SEQUENCE_MODELS = "Three types of sequence model"  # tutorial 5: how far back an LSTM, a CNN, attention read
POST_NORM = "Post-norm: the original block (UvA's Add and Norm)"  # tutorial 6: post-norm beside its pre-norm
RESIDUAL_NORM = "The residual connection and layer normalization, as the lectures write them"  # tutorial 6
NGRAM = "Before neural networks: n-gram models, by counting"  # tutorial 6: the statistical baseline
FEEDFORWARD_PAGE = "user-guide/recurrent.md#before-the-rnn-n-gram-and-feed-forward-language-models"
CHAT_SFT = "Adapting for chat: the loss on the assistant's replies alone"  # tutorial 10

LECTURES: tuple[Lecture, ...] = (
    Lecture("000", "USC CSCI 499 (LMs in NLP, Spring 2024)", "Lecture 11: Transformers: Building Blocks", "usc", (
        Topic("Recap: generation with RNN language models", T05, ("models.recurrent.lm",),
              page="user-guide/recurrent.md", section="The models"),
        Topic("RNNs and parallelizability: O(sequence length) unparallelizable operations", None,
              ("models.recurrent.rnn",), COST, COST_PNG),
        Topic("(Neural) machine translation; sequence-to-sequence encoder-decoder networks (encoder, encoding c, "
              "decoder)", T05, ("models.recurrent.seq2seq",), page="user-guide/recurrent.md", section="The models"),
        Topic("The encoding must capture all of the source: the information bottleneck", T05,
              ("models.recurrent.seq2seq:PlainDecoder",), "bottleneck", BOTTLENECK_PNG,
              section="Going further: reverse a sequence"),
        Topic("The attention mechanism (Bahdanau et al. 2015): one context vector per decoder step, a query scored "
              "against every key", T05, ("models.recurrent.attention", "models.recurrent.seq2seq:BahdanauDecoder"),
              section=BAHDANAU),
        Topic("Seq2seq with attention: dot-product scores, softmax, weighted sum, concatenated with the decoder "
              "state (Luong et al.'s order: the query is the state after the step)", T05,
              ("models.recurrent.seq2seq:LuongDecoder",), section=LUONG),
        Topic("Why attention? performance, the bottleneck solved, a shortcut for vanishing gradients, "
              "interpretability: alignment for free", T05, ("viz", "inspect.head_types:monotonicity"), "bottleneck",
              ALIGN_PNG,
              "user-guide/looking-inside.md", section="Going further: reverse a sequence"),
        Topic("Attention variants: scores, softmax, weighted sum of values (the three steps)", T02,
              ("layers.attention",), section="Four scores, from scratch"),
        Topic("Basic dot-product attention and multiplicative (bilinear) attention", T02,
              ("layers.attention:DotScore", "layers.attention:BilinearScore"), "score-functions",
              "experiments/score-functions/scores.png", section="Four scores, from scratch"),
        Topic("More on attention: a selective summary of the values; a fixed-size representation of an arbitrary "
              "set; attention as a fuzzy lookup in a key-value store", T01, ("layers.attention",),
              section="It is dot-product attention"),
        Topic("Self-attention: keys, queries and values from the same sequence", T03, ("layers.attention:Attention",),
              section="Self-attention: every token is a query"),
        Topic("Self-attention as matrix multiplications: softmax(XQ (XK)^T) XV", T03, ("layers.attention",),
              section="Self-attention: every token is a query"),
        Topic("Why self-attention: information from arbitrarily large contexts without recurrence", T03,
              ("layers.attention",), COST, COST_PNG, section="Self-attention: every token is a query"),
        Topic("Transformers are self-attention networks: stacks of blocks of linear layers, feed-forward networks "
              "and self-attention", T06, ("blocks", "models.stack"), section="The parts, from scratch"),
        Topic("Self-attention only re-averages values: a feed-forward network post-processes each output", T10,
              ("layers.attention:Attention", "layers.feedforward"),
              section="Attention only re-averages; the FFN adds the non-linearity"),
        Topic("Outline only (slides not in the notes): multi-head attention, positional embeddings, putting the "
              "block together", T03, ("layers.attention", "layers.positions", "blocks"),
              picture=HEADS_PNG, page="concepts.md", section="Multi-head attention"),
    )),
    Lecture("001", "UvA Advanced Topics in Computational Semantics", "Attention & Transformers (Ivo Verhoeven)",
            "uva", (
        Topic("The Transformer everywhere: seq2seq, classification (encoder-only), generation (decoder-only)", None,
              ("models.seq2seq", "models.encoder", "models.decoder"), page="user-guide/configs.md",
              gap="vision, speech, multi-modal and graph Transformers: attnkit is text only"),
        Topic("Generation: decoder-only Transformers (sampling with temperature, top-k, top-p; speculative decoding, "
              "a small draft model's tokens checked by the large one in one pass: "
              "`attnkit generate --run RUN --prompt Hi --draft RUN`)", T06,
              ("models.decoder", "generate.sampling", "generate.speculative"),
              page="user-guide/generation.md#speculative-decoding", section="Sampling: temperature, top-k, top-p"),
        Topic("The Transformer's four parts: tokenization, embedding (token + position), attention blocks, output "
              "(linear, softmax)", T06, ("tokenize", "layers.embedding", "blocks", "models.decoder"),
              section="The parts, from scratch"),
        Topic("Encoders and decoders: text comes in, text goes out", T11, ("models.seq2seq",),
              page="user-guide/generation.md", section="The parts, from scratch"),
        Topic("Attention is a matrix product AV: A's entries in (0, 1), its rows summing to 1", T01,
              ("layers.attention:attention_weights",),
              section="Dot-product attention for whole matrices, and why the output is a convex combination"),
        Topic("The result is a convex combination of V: it lies in the convex hull of the values", T01,
              ("layers.attention",), page="testing.md",
              section="Dot-product attention for whole matrices, and why the output is a convex combination"),
        Topic("Permutation equivariance: attention does not care about word order", T03, ("layers.positions",),
              page="testing.md", section="Without positions, attention ignores word order"),
        Topic("Is attention a linear map? Not quite: any length, fewer parameters, weights that depend on the "
              "content", T01, ("layers.attention:Attention",), section="Not just a linear map"),
        Topic("Attention(Q, K, V) = softmax(f(Q, K)) V with a kernel (similarity) function f", T02,
              ("layers.attention:make_score",), section="Four scores, from scratch"),
        Topic("Non-Transformer examples: a soft lookup (the library, its titles and the query)", T10,
              ("layers.attention:Attention",), section="A soft lookup in a library"),
        Topic("Nadaraya-Watson kernel regression", T01, ("experiments.kernel_regression",), "kernel-regression",
              "experiments/kernel-regression/fit.png", section="Nadaraya-Watson kernel regression, from scratch"),
        Topic("Multi-head attention in Transformers", T03, ("layers.attention:Attention",), picture=HEADS_PNG,
              section="Multi-head attention"),
        Topic("Add & Norm: residual connections", T06, ("blocks",), section=RESIDUAL_NORM),
        Topic("Add & Norm: LayerNorm, X_l = LayerNorm(X_{l-1} + SubLayer(X_{l-1}))", T06,
              ("layers.norms", "blocks"), "norm-placement", "experiments/norm-placement/norm_placement.png",
              section=POST_NORM),
        Topic("Feed forward", T06, ("layers.feedforward",), section="The parts, from scratch"),
        Topic("Embedding: position encoding", T04, ("layers.positions", "layers.embedding"),
              "position-extrapolation", "experiments/position-extrapolation/loss_by_length.png",
              section="Sinusoidal positions (Vaswani et al. 2017)"),
        Topic("Tokenization", T10, ("tokenize",), page="user-guide/tokenizers-data.md",
              section="Byte-pair encoding from scratch"),
        Topic("Training Transformers", T06, ("train.trainer",), page="user-guide/training.md",
              section="Train it with attnkit's trainer"),
    )),
    Lecture("002", "UT Austin CS 371N", "Lecture 10: LM 2: Self-attention, Transformers", "ut", (
        Topic("Recap: language models, n-gram models, neural LMs (DANs, feed-forward, RNNs) (counted n-grams with "
              "add-alpha or Kneser-Ney smoothing; Bengio et al.'s window and the deep averaging LM as a family: "
              "`attnkit train --preset bengio-lm-tiny`, `--preset dan-lm-tiny`)", T06,
              ("models.ngram:NGramLM", "models.feedforward.lm:FeedForwardLM", "models.recurrent.lm"),
              page=FEEDFORWARD_PAGE, section=NGRAM),
        Topic("Why RNNs are good (long sequences) and bad (they forget over long strings)", T05,
              ("models.recurrent.lm",), "rnn-forgets", "experiments/rnn-forgets/accuracy_by_distance.png",
              section=SEQUENCE_MODELS),
        Topic("An API for neural nets: h = encode(w_1..w_n), context-sensitive encodings; layers stack; the "
              "Transformer obeys the same API", T06, ("models.stack", "blocks"), section="The parts, from scratch"),
        Topic("The running example: sequences of A and B; the next is B if any B, else A", T03, ("data.synthetic",),
              "ab-task", AB_PNG, section="Going further: train an encoder on the A/B task and look at its heads"),
        Topic("Attention as random access: keys = embeddings, query [0, 1]; scores [0 0 1 0], softmax "
              "[1/6 1/6 1/2 1/6], output [1/2 1/2]", T03, ("layers.attention",), page="testing.md",
              section="One query looking for a B"),
        Topic("Compare to a DAN: the plain average [3/4 1/4]; attention is biased towards B", T03,
              ("experiments.ab_task",),
              "ab-task", "experiments/ab-task/accuracy.png", section="One query looking for a B"),
        Topic("A larger query [0, 10]: scores [0 0 10 0], weights nearly one-hot", T03, ("layers.attention",),
              "scaled-dot", "experiments/scaled-dot/saturation.png",
              section="One query looking for a B"),
        Topic("Decouple keys and query from the embeddings: W^K and W^Q", T03, ("layers.attention:Attention",),
              section="Self-attention: every token is a query"),
        Topic("Self-attention: every word a query against the keys; S = QK^T, K = EW^K, Q = EW^Q", T03,
              ("layers.attention",), section="Self-attention: every token is a query"),
        Topic("Version 2: K = 10E, S = 10EE^T; in reality W^Q is learned", T03, ("layers.attention",),
              section="Self-attention: every token is a query"),
        Topic("This is quadratic", None, ("layers.attention",), COST, COST_PNG),
    )),
    Lecture("003", "UC San Diego COGS 150", "The Transformer architecture (Sean Trott, Winter 2024)", "cogs", (
        Topic("A taxonomy of language models: statistical learning", T06,
              ("models.ngram:NGramLM", "models.recurrent.lm", "models.decoder"), page=FEEDFORWARD_PAGE, section=NGRAM),
        Topic("RNNs' limitations: vanishing and exploding gradients; training hard to parallelize", T05,
              ("models.recurrent.rnn",), COST, COST_PNG, section=GRADIENT_SHORTCUT),
        Topic("Attention lets a model focus: predictions that depend on words far back (the program log, the "
              "battery log)", T03, ("layers.attention",), "ab-task", AB_PNG, section="One query looking for a B"),
        Topic("Relationships between elements (the animal ... it was tired: trained where the adjective decides, "
              "a head from 'it' finds the referent in held-out pairings, `attnkit experiment referent-head`)", None,
              ("viz.head_view", "inspect.referents", "experiments.referent_head"), "referent-head",
              "experiments/referent-head/referent.png", "user-guide/looking-inside.md#what-it-refers-to"),
        Topic("Attention's origins: machine translation and the bottleneck", T05, ("models.recurrent.seq2seq",),
              "bottleneck", BOTTLENECK_PNG, section="Going further: reverse a sequence"),
        Topic("Dot-product attention: relevance as embedding similarity, softmax, weighted average, a context "
              "vector (\"The cat sat on\")", T01, ("layers.attention:DotScore", "layers.attention:attention_weights"),
              section="COGS 150's example: what is relevant to \"on\"?"),
        Topic("The dot product is a coarse measure: can we do better?", T02, ("layers.attention",),
              "score-functions", "experiments/score-functions/scores.png",
              section="Going further: train one attention layer with each score"),
        Topic("Introducing Transformers: a fixed context window, no recurrence, self-attention, several heads, "
              "positional embeddings", T06, ("models.decoder",), section="The parts, from scratch"),
        Topic("Self-attention: query, key (a folder's label), value (its contents)", T03,
              ("layers.attention:Attention",), section="Self-attention: every token is a query"),
        Topic("Scores q_i . k_j, softmax, a weighted sum over j <= i", T03, ("layers.attention",),
              section="Masks: no looking ahead, no attending to padding"),
        Topic("Auto-regressive models mask the future: -inf above the diagonal", T03, ("layers.masks",),
              section="Masks: no looking ahead, no attending to padding"),
        Topic("Self-attention is quadratic", None, ("layers.attention", "experiments.rnn_transformer_cost"), COST,
              COST_PNG),
        Topic("Where Q, K, V come from: learned W^Q, W^K, W^V", T03, ("layers.attention:Attention",),
              section="attnkit's `Attention` computes the same"),
        Topic("The Transformer block: self-attention, feed-forward, residual connections, normalization", T06,
              ("blocks",), section="The parts, from scratch"),
        Topic("The residual connection: \"dog\" + SelfAttention(\"dog\")", T06, ("blocks",),
              section=RESIDUAL_NORM),
        Topic("Layer normalization (like a z-score); GPT-2's two-layer feed-forward network", T06,
              ("layers.norms", "layers.feedforward"), section=RESIDUAL_NORM),
        Topic("Multi-head attention: each head may track another relationship", T03,
              ("layers.attention:Attention",), picture=HEADS_PNG, page="user-guide/looking-inside.md",
              section="Multi-head attention"),
        Topic("Probing and mechanistic interpretability: what these heads actually do (one head tracks syntax, "
              "another proper names?)", T09, ("inspect", "inspect.importance", "inspect.head_types",
                                              "inspect.probes", "inspect.patching", "inspect.logit_lens"),
              "heads-specialise", "experiments/heads-specialise/heads.png", "user-guide/inspect.md",
              section="Finding the induction head"),
        Topic("Positional embeddings: learned, added to the word embeddings", T04,
              ("layers.positions:LearnedPositions", "layers.embedding"), "position-extrapolation",
              "experiments/position-extrapolation/loss_by_length.png",
              section='Learned positions (GPT-2, BERT; COGS 150\'s "begin with random embeddings")'),
        Topic("Transformers are easier to train than RNNs", None, ("models.recurrent",),
              page="recipes.md#multi30k-the-recurrent-baselines-against-the-transformer"),
        Topic("Under the hood, ChatGPT uses a Transformer (plus some other stuff): a pre-trained decoder fine-tuned "
              "on conversations to answer as an assistant (`attnkit train --task chat --data FILE`, then "
              "`attnkit chat RUN`), then taught which of two replies people prefer (Direct Preference Optimization: "
              "`attnkit train --task dpo --init-from RUN --data pairs.jsonl`)", T10,
              ("tasks.chat", "data.chat", "chat_format", "tasks.dpo", "data.preferences"),
              page="user-guide/pretraining-finetuning.md#chat-fine-tuning", section=CHAT_SFT,
              gap="RLHF proper (a reward model learnt from the preferences, then PPO against it) is not implemented: "
                  "DPO learns from the same preference pairs without a reward model or reinforcement learning"),
        Topic("GPT: generative pre-trained Transformers; pre-training, then adapting", T10,
              ("models.decoder", "train.finetune"), page="user-guide/pretraining-finetuning.md",
              section="Generative pre-training when labels are few"),
        Topic("Pre-trained language models: trained on a large corpus by self-supervision, then adapted for a "
              "purpose, so as not to train from scratch", T08, ("data.masking", "models.encoder", "train.finetune"),
              page="user-guide/pretraining-finetuning.md",
              section="Fine-tuning: the same body, a new head, the labels"),
    )),
    Lecture("004", "CMU CS11-711 Advanced NLP (Spring 2025)", "Attention and Transformers (Sean Welleck)", "cmu", (
        Topic("Recap: a sequence model; language modeling p(. | x_<t) = softmax(W h_t)", T06, ("models.decoder",),
              section="The parts, from scratch"),
        Topic("Three types of sequence models: recurrence, convolution, attention (the three at one size, and how far "
              "back each reads: attnkit experiment sequence-models)", T05,
              ("models.recurrent", "models.convolutional", "models.decoder"), experiment="sequence-models",
              page="user-guide/configs.md#the-convolutional-lm-conv-lm", section=SEQUENCE_MODELS),
        Topic("Attention's basic idea (Bahdanau et al. 2015)", T05,
              ("models.recurrent.attention", "models.recurrent.seq2seq:BahdanauDecoder"), section=BAHDANAU),
        Topic("Cross attention: each element attends to another sequence", T11, ("layers.attention:Attention",),
              picture="viz/alignment.png", page="user-guide/looking-inside.md",
              section="What the cross-attention looks at"),
        Topic("Self attention (Cheng et al. 2016, Vaswani et al. 2017)", T03, ("layers.attention:Attention",),
              section="Self-attention: every token is a query"),
        Topic("Calculating attention: query and key vectors, softmax, a weighted sum of the values", T01,
              ("layers.attention",), section="It is dot-product attention"),
        Topic("A graphical example: Bahdanau et al.'s alignment", T05, ("viz",), picture=ALIGN_PNG,
              section="Going further: reverse a sequence"),
        Topic("Score functions (1): nonlinear (Bahdanau), bilinear (Luong)", T02,
              ("layers.attention:AdditiveScore", "layers.attention:BilinearScore"), "score-functions",
              "experiments/score-functions/scores.png", section="Four scores, from scratch"),
        Topic("Score functions (2): dot product; scaled dot product, since the dot product grows with the "
              "dimension", T02, ("layers.attention:DotScore",), "scaled-dot",
              "experiments/scaled-dot/saturation.png", section="Why scale: the dot product grows with the dimension"),
        Topic("Attention is all you need: a sequence-to-sequence model of attention alone", T11,
              ("models.seq2seq", "presets"), page="recipes.md",
              section="Every piece against attnkit's, with the same weights"),
        Topic("Two types of Transformers; stacks of Transformer layers", T06, ("models.stack", "models.decoder"),
              section="The parts, from scratch"),
        Topic("Inputs and embeddings: subwords", T10, ("tokenize",), page="user-guide/tokenizers-data.md",
              section="Byte-pair encoding from scratch"),
        Topic("Positional encoding; sinusoidal encoding (PE_{pos+k} linear in PE_pos)", T04,
              ("layers.positions:SinusoidalPositions",), section="Sinusoidal positions (Vaswani et al. 2017)"),
        Topic("Scaled dot-product self-attention, the matrix version", T03, ("layers.attention", "layers.kernels"),
              section="Self-attention: every token is a query"),
        Topic("Multi-head attention: intuition (I run a small business), concept, code (minGPT's forward)", T03,
              ("layers.attention:Attention",), section="Multi-head attention"),
        Topic("What happens with several heads: Vaswani et al.'s figure 3, BertViz", None, ("viz",),
              picture=HEADS_PNG, page="user-guide/looking-inside.md"),
        Topic("Masking for language-model training", T03, ("layers.masks",),
              section="Masks: no looking ahead, no attending to padding"),
        Topic("Gradients and training instability in deep Transformers", None, ("train.instruments",),
              "norm-placement", "viz/instruments.png", "user-guide/looking-inside.md"),
        Topic("Layer normalization (Ba et al. 2016)", T06, ("layers.norms",), section=RESIDUAL_NORM),
        Topic("Residual connections: Residual(x, f) = f(x) + x", T06, ("blocks",), section=RESIDUAL_NORM),
        Topic("Feed-forward layers; the Block and TransformerLM code", T06, ("layers.feedforward", "blocks"),
              section="The parts, from scratch"),
        Topic("Learned positional encodings: impossible to extrapolate", T04, ("layers.positions:LearnedPositions",),
              "position-extrapolation", "experiments/position-extrapolation/loss_by_length.png",
              section="Going further: train short, read long"),
        Topic("Absolute against relative encodings (Shaw et al. 2018)", T04,
              ("layers.positions:RelativePositions",), section="Relative positions (Shaw et al. 2018)"),
        Topic("Rotary positional encodings (RoPE, Su et al. 2021)", T04, ("layers.positions:RotaryEmbedding",),
              section="RoPE (Su et al. 2021)"),
        Topic("Pre-layer-norm (Xiong et al. 2020)", T06, ("blocks",), "norm-placement",
              "experiments/norm-placement/norm_placement.png", section=POST_NORM),
        Topic("RMSNorm (Zhang and Sennrich 2019)", T07, ("layers.norms",), section="RMSNorm"),
        Topic("Grouped-query attention: shared key/value heads, less memory, faster inference", T07,
              ("layers.attention:Attention", "layers.kv_cache"), "gqa-memory", "experiments/gqa-memory/gqa.png",
              section="Grouped-query attention (Ainslie et al. 2023)"),
        Topic("The original Transformer against Llama and Llama 2 (norm position, norm, non-linearity, positions, "
              "attention)", T07, ("presets", "interop.hf"), page="user-guide/configs.md",
              section="The lecture's table, from attnkit's presets"),
        Topic("How important is it? Transformer++ is about 10x more efficient", None,
              ("experiments.transformer_plus_plus", "presets"), "transformer-plus-plus",
              "experiments/transformer-plus-plus/loss_vs_flops.png"),
        Topic("Transformer training: every position at once, easy to parallelize", T06, ("train.trainer",), COST,
              COST_PNG, section="Train it with attnkit's trainer"),
        Topic("RNNs against Transformers: O(T d^2) against O(T^2 d), a T x T matrix in memory", None,
              ("experiments.rnn_transformer_cost",), COST,
              COST_PNG),
    )),
)

_COLUMNS = ("tutorial", "code", "experiment", "picture")


@dataclass(frozen=True)
class LecturesSettings:
    """What `attnkit lectures` prints; each field is one of its options."""

    course: str | None = field(default=None, metadata={"positional": True})  # usc uva ut cogs cmu, or 000-004
    gaps: bool = False  # only the topics attnkit does not cover, each with what is missing


def find(course: str) -> Lecture:
    """The lecture named by its key ("004") or short name ("cmu")."""
    for lecture in LECTURES:
        if course.lower() in (lecture.key, lecture.short):
            return lecture
    names = ", ".join(f"{lec.short} ({lec.key})" for lec in LECTURES)
    raise KeyError(f"no lecture {course!r}; the lectures are {names}")


def _module_path(ref: str) -> str:
    """`layers.attention:Attention` -> `src/attnkit/layers/attention.py::Attention` (a package: its folder/)."""
    module, _, name = ref.partition(":")
    path = module.replace(".", "/")
    path += ".py" if (Path(__file__).parent / f"{path}.py").is_file() else "/"
    return f"src/attnkit/{path}{'::' + name if name else ''}"


def course_index_text(lectures: tuple[Lecture, ...] = LECTURES, gaps_only: bool = False) -> str:
    """The index as plain text, as `attnkit lectures` prints it."""
    out = []
    for lecture in lectures:
        out.append(f"{lecture.key} {lecture.course}: {lecture.title}  [attnkit lectures {lecture.short}]")
        for number, topic in enumerate(lecture.topics, 1):
            if gaps_only and not topic.gap:
                continue
            out.append(f"  {number:2d}. {topic.slide}")
            covered = (
                ("tutorial", topic.tutorial and f"docs/tutorials/{topic.tutorial}.py"
                             + (f', section "{topic.section}"' if topic.section else "")),
                ("code", ", ".join(_module_path(m) for m in topic.modules)),
                ("experiment", topic.experiment and f"attnkit experiment {topic.experiment}"),
                ("picture", topic.picture and f"docs/{topic.picture}"),
                ("read", topic.page and f"docs/{topic.page}"),
                ("GAP", topic.gap),
            )
            out += [f"      {label + ':':12}{value}" for label, value in covered if value]
        if gaps_only and not any(topic.gap for topic in lecture.topics):
            out.append("      no gaps: attnkit covers every topic of this lecture")
        out.append("")
    return "\n".join(out)


def code_html(ref: str) -> str:
    """`layers.attention:Attention` as inline code that a narrow column breaks only after a dot or a colon."""
    return "<code>" + html.escape(ref).replace(".", ".<wbr>").replace(":", ":<wbr>") + "</code>"


def course_index_markdown(link_prefix: str = "", code_link: Callable[[str], str | None] = lambda ref: None) -> str:
    """The index as the site's page shows it: one table per lecture; links relative to `link_prefix`.
    `code_link(ref)` gives the identifier of a code name's entry in the API reference (`attnkit.layers.attention.
    Attention`, linked through mkdocs-autorefs), or None for a name the reference does not show."""
    out = []
    for lecture in LECTURES:
        out += [f"## {lecture.course}: {lecture.title}", "",
                f"Lecture file `{lecture.key}`; `attnkit lectures {lecture.short}` prints this table.", "",
                "| # | slide topic | tutorial | code | experiment | picture |", "|---|---|---|---|---|---|"]
        for number, topic in enumerate(lecture.topics, 1):
            slide = topic.slide.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")
            if topic.page:
                slide += f" ([read]({link_prefix}{topic.page}))"
            if topic.gap:
                slide += f"<br>**Gap:** {topic.gap}"
            tutorial = (f"[{topic.tutorial[:2]}]({link_prefix}tutorials/{topic.tutorial}.py{topic.tutorial_anchor})"
                        if topic.tutorial else "")
            if topic.section:
                tutorial += f": {topic.section.replace('|', '/')}"
            code = "<br>".join(f"[{code_html(m)}][{code_link(m)}]" if code_link(m) else code_html(m)
                               for m in topic.modules)
            experiment = (f"[{topic.experiment}]({link_prefix}experiments.md#{topic.experiment})"
                          if topic.experiment else "")
            picture = f"[picture]({link_prefix}{topic.picture})" if topic.picture else ""
            out.append(f"| {number} | {slide} | {tutorial} | {code} | {experiment} | {picture} |")
        out.append("")
    return "\n".join(out)


def gaps() -> list[tuple[Lecture, Topic]]:
    """Every topic the index states as a gap."""
    return [(lecture, topic) for lecture in LECTURES for topic in lecture.topics if topic.gap]


def run(settings: LecturesSettings) -> int:
    """`attnkit lectures [COURSE] [--gaps]`."""
    from attnkit.errors import InputError

    try:
        chosen = (find(settings.course),) if settings.course else LECTURES
    except KeyError as err:
        raise InputError(str(err.args[0])) from None
    print(course_index_text(chosen, gaps_only=settings.gaps), end="")
    return 0
