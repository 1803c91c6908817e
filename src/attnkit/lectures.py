"""The course index: each of the five lectures, in its own order, slide topic by slide topic, to what covers it.

For every topic: the tutorial (docs/tutorials/NAME.py) that builds it, the modules that implement it, the
experiment that tests its claim, the tests in tests/ that hold the code to it, the picture that shows it, a page of
the documentation, and, where attnkit has nothing for a topic, the gap stated as a gap. `attnkit lectures` prints it;
the site's course index page is rendered from the same data (`course_index_markdown`), and tests/test_docs.py checks
that everything named exists.
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
    tests: tuple[str, ...] = ()  # "test_file.py::test_name" under tests/: the tests that hold what the topic says

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

# The tests that hold a topic's claim, named as pytest names them under tests/ (several topics share some)
TEST_ROWS = "test_attention.py::test_rows_sum_to_one_and_outputs_lie_in_the_hull_of_values"
TEST_DOT = "test_attention.py::test_dot_and_scaled_dot_against_float64"
TEST_BIL = "test_attention.py::test_bilinear_against_float64"
TEST_ADD = "test_attention.py::test_additive_against_float64"
TEST_WORKED = "test_attention.py::test_lecture_worked_example"
TEST_MHA = "test_attention.py::test_matches_torch_multihead_attention"
TEST_SDPA_PATH = "test_attention.py::test_sdpa_fast_path_equals_explicit_path"
TEST_CAUSAL = "test_attention.py::test_causal_attention_leaks_nothing_from_the_future"
TEST_CROSS = "test_attention.py::test_cross_attention_attends_to_the_context"
TEST_GQA = "test_attention.py::test_grouped_heads_equal_multi_head_attention_with_each_kv_head_repeated"
TEST_ENC_BLOCK = "test_torch_parity.py::test_encoder_block_matches_torch_encoder_layer"
TEST_DEC_BLOCK = "test_torch_parity.py::test_decoder_block_matches_torch_decoder_layer"
TEST_TRANSFORMER = "test_torch_parity.py::test_encoder_decoder_matches_torch_transformer"
TEST_SDPA = "test_torch_parity.py::test_attention_matches_scaled_dot_product_attention"
TEST_BOTTLENECK = "test_experiments_false_claims.py::test_bottleneck_does_not_hold_where_attention_reads_one_vector"
TEST_SCORES = "test_experiments_false_claims.py::test_score_functions_does_not_hold_where_no_score_attends"
TEST_SCALED = ("test_experiments_false_claims.py::"
    "test_scaled_dot_does_not_hold_where_the_unscaled_scores_shrink_as_d_grows")
TEST_AB = "test_experiments_false_claims.py::test_ab_task_does_not_hold_for_attention_that_cannot_choose_where_to_look"
TEST_EXTRAP = ("test_experiments_false_claims.py::"
    "test_position_extrapolation_does_not_hold_where_the_learned_table_reaches_every_length")
TEST_NORM_PLACE = ("test_experiments_false_claims.py::"
    "test_norm_placement_does_not_hold_where_post_norm_is_built_as_pre_norm")
TEST_LN = "test_norms_feedforward.py::test_layer_norm_equals_torch_and_the_written_out_formula"
TEST_RMS = "test_norms_feedforward.py::test_rms_norm_against_float64"
TEST_FFN = "test_norms_feedforward.py::test_feedforward_activations"
TEST_SIN = "test_positions.py::test_sinusoidal_matches_the_paper_formula"
TEST_SIN_LINEAR = "test_positions.py::test_sinusoidal_encoding_at_pos_plus_k_is_a_linear_function_of_pos"
TEST_PERM = "test_models.py::test_encoder_without_positions_is_permutation_equivariant_and_with_positions_is_not"
TEST_MASK = "test_masks.py::test_each_part_of_the_mask_matches_its_definition"
TEST_HF = "test_interop_hf_parity.py::test_fp32_logits_equal_transformers"
TEST_VARIANTS = "test_models_variants.py::test_every_variant_keeps_the_lectures_properties"
TEST_CACHE = "test_models.py::test_decoder_kv_cache_equals_full_forward"
TEST_CONTEXT = "test_experiments_sequence_models.py::test_loss_by_context_is_flat_past_a_models_reach_and_not_within_it"
TEST_HEADS = "test_viz.py::test_decoder_maps_are_the_reference_weights_with_the_tokenizers_pieces"
TEST_SPECIALISE = ("test_experiments_false_claims.py::"
    "test_heads_specialise_does_not_hold_where_there_is_nothing_to_learn")
TEST_EXTRAP_REFUSED = ("test_generate_decoder.py::"
    "test_a_context_beyond_a_learned_position_table_is_refused_before_decoding")
TEST_FINETUNE = "test_finetune.py::test_pretrain_finetune_and_eval_from_the_command_line"
TESTS_COST = ("test_experiments_false_claims.py::"
    "test_rnn_vs_transformer_cost_does_not_hold_where_the_machine_drifts_and_t_does_not_matter",
    "test_experiments_false_claims.py::test_rnn_vs_transformer_cost_control_catches_a_drift_of_the_transformer_alone")
TESTS_BPE = ("test_tokenize.py::test_bpe_learns_what_hugging_faces_own_byte_level_trainer_learns",
    "test_tokenize.py::test_bpe_round_trip_is_lossless")
TESTS_NGRAM = ("test_ngram.py::test_drawn_corpora_sum_to_one_and_equal_the_brute_force",
    "test_ngram.py::test_kneser_ney_bigram_is_the_hand_count")
TESTS_ALIGN = ("test_viz.py::test_recurrent_translation_alignment_per_decoding_step",
    "test_inspect_trace.py::test_the_recurrent_decoders_steps_are_joined_into_its_alignment")
TESTS_BAHDANAU = ("test_recurrent.py::test_bahdanau_decoder_against_hand_stepped_reference",
    "test_recurrent.py::test_source_attention_against_formula")
TESTS_TRAIN = ("test_train.py::test_resume_continues_bit_for_bit",
    "test_train.py::test_k_micro_batches_of_b_train_as_one_batch_of_k_times_b")

LECTURES: tuple[Lecture, ...] = (
    Lecture("000", "USC CSCI 499 (LMs in NLP, Spring 2024)", "Lecture 11: Transformers: Building Blocks", "usc", (
        Topic("Recap: generation with RNN language models", T05, ("models.recurrent.lm",),
              page="user-guide/recurrent.md", section="The models",
              tests=("test_recurrent.py::test_lm_generation_carries_its_state_past_the_context",
                     "test_recurrent.py::test_greedy_with_cached_state_equals_recomputation")),
        Topic("RNNs and parallelizability: O(sequence length) unparallelizable operations", None,
              ("models.recurrent.rnn",), COST, COST_PNG, tests=TESTS_COST),
        Topic("(Neural) machine translation; sequence-to-sequence encoder-decoder networks (encoder, encoding c, "
              "decoder)", T05, ("models.recurrent.seq2seq",), page="user-guide/recurrent.md", section="The models",
              tests=("test_recurrent.py::test_step_by_step_decode_equals_teacher_forcing",
                     "test_recurrent.py::test_bottleneck_lstm_seq2seq_against_lstm_cells_stepped_by_hand")),
        Topic("The encoding must capture all of the source: the information bottleneck", T05,
              ("models.recurrent.seq2seq:PlainDecoder",), "bottleneck", BOTTLENECK_PNG,
              section="Going further: reverse a sequence",
              tests=("test_recurrent.py::test_plain_decoder_reads_only_the_final_states", TEST_BOTTLENECK)),
        Topic("The attention mechanism (Bahdanau et al. 2015): one context vector per decoder step, a query scored "
              "against every key", T05, ("models.recurrent.attention", "models.recurrent.seq2seq:BahdanauDecoder"),
              section=BAHDANAU,
              tests=TESTS_BAHDANAU),
        Topic("Seq2seq with attention: dot-product scores, softmax, weighted sum, concatenated with the decoder "
              "state (Luong et al.'s order: the query is the state after the step)", T05,
              ("models.recurrent.seq2seq:LuongDecoder",), section=LUONG,
              tests=("test_recurrent.py::test_luong_decoder_against_hand_stepped_reference",)),
        Topic("Why attention? performance, the bottleneck solved, a shortcut for vanishing gradients, "
              "interpretability: alignment for free", T05, ("viz", "inspect.head_types:monotonicity"), "bottleneck",
              ALIGN_PNG,
              "user-guide/looking-inside.md", section="Going further: reverse a sequence",
              tests=("test_recurrent.py::test_attention_learns_faster_than_the_bottleneck", *TESTS_ALIGN)),
        Topic("Attention variants: scores, softmax, weighted sum of values (the three steps)", T02,
              ("layers.attention",), section="Four scores, from scratch",
              tests=(TEST_DOT, TEST_ROWS)),
        Topic("Basic dot-product attention and multiplicative (bilinear) attention", T02,
              ("layers.attention:DotScore", "layers.attention:BilinearScore"), "score-functions",
              "experiments/score-functions/scores.png", section="Four scores, from scratch",
              tests=(TEST_DOT, TEST_BIL, TEST_SCORES)),
        Topic("More on attention: a selective summary of the values; a fixed-size representation of an arbitrary "
              "set; attention as a fuzzy lookup in a key-value store", T01, ("layers.attention",),
              section="It is dot-product attention",
              tests=(TEST_ROWS,)),
        Topic("Self-attention: keys, queries and values from the same sequence", T03, ("layers.attention:Attention",),
              section="Self-attention: every token is a query",
              tests=(TEST_MHA,)),
        Topic("Self-attention as matrix multiplications: softmax(XQ (XK)^T) XV", T03, ("layers.attention",),
              section="Self-attention: every token is a query",
              tests=(TEST_SDPA, TEST_SDPA_PATH)),
        Topic("Why self-attention: information from arbitrarily large contexts without recurrence", T03,
              ("layers.attention",), COST, COST_PNG, section="Self-attention: every token is a query",
              tests=(TEST_CONTEXT, *TESTS_COST)),
        Topic("Transformers are self-attention networks: stacks of blocks of linear layers, feed-forward networks "
              "and self-attention", T06, ("blocks", "models.stack"), section="The parts, from scratch",
              tests=(TEST_ENC_BLOCK, TEST_DEC_BLOCK)),
        Topic("Self-attention only re-averages values: a feed-forward network post-processes each output", T10,
              ("layers.attention:Attention", "layers.feedforward"),
              section="Attention only re-averages; the FFN adds the non-linearity",
              tests=(TEST_FFN,
                     "test_experiments_false_claims.py::test_a_block_without_attention_reads_the_current_token_alone")),
        Topic("Outline only (slides not in the notes): multi-head attention, positional embeddings, putting the "
              "block together", T03, ("layers.attention", "layers.positions", "blocks"),
              picture=HEADS_PNG, page="concepts.md", section="Multi-head attention",
              tests=(TEST_MHA, TEST_SIN, TEST_ENC_BLOCK)),
    )),
    Lecture("001", "UvA Advanced Topics in Computational Semantics", "Attention & Transformers (Ivo Verhoeven)",
            "uva", (
        Topic("The Transformer everywhere: seq2seq, classification (encoder-only), generation (decoder-only)", None,
              ("models.seq2seq", "models.encoder", "models.decoder"), page="user-guide/configs.md",
              gap="vision, speech, multi-modal and graph Transformers: attnkit is text only",
              tests=(TEST_HF,)),
        Topic("Generation: decoder-only Transformers (sampling with temperature, top-k, top-p; speculative decoding, "
              "a small draft model's tokens checked by the large one in one pass: "
              "`attnkit generate --run RUN --prompt Hi --draft RUN`)", T06,
              ("models.decoder", "generate.sampling", "generate.speculative"),
              page="user-guide/generation.md#speculative-decoding", section="Sampling: temperature, top-k, top-p",
              tests=("test_generate_sampling.py::test_temperature_scales_the_logits_and_zero_is_greedy",
                     "test_generate_sampling.py::test_top_k_keeps_exactly_the_k_largest",
                     "test_generate_sampling.py::test_top_p_keeps_the_smallest_set_reaching_p",
                     "test_generate_speculative.py::"
                     "test_the_acceptance_rule_gives_the_targets_distribution_and_a_wrong_one_fails")),
        Topic("The Transformer's four parts: tokenization, embedding (token + position), attention blocks, output "
              "(linear, softmax)", T06, ("tokenize", "layers.embedding", "blocks", "models.decoder"),
              section="The parts, from scratch",
              tests=("test_tokenize.py::test_bpe_round_trip_is_lossless", TEST_DEC_BLOCK, TEST_HF)),
        Topic("Encoders and decoders: text comes in, text goes out", T11, ("models.seq2seq",),
              page="user-guide/generation.md", section="The parts, from scratch",
              tests=(TEST_TRANSFORMER,)),
        Topic("Attention is a matrix product AV: A's entries in (0, 1), its rows summing to 1", T01,
              ("layers.attention:attention_weights",),
              section="Dot-product attention for whole matrices, and why the output is a convex combination",
              tests=(TEST_ROWS,)),
        Topic("The result is a convex combination of V: it lies in the convex hull of the values", T01,
              ("layers.attention",), page="testing.md",
              section="Dot-product attention for whole matrices, and why the output is a convex combination",
              tests=(TEST_ROWS,)),
        Topic("Permutation equivariance: attention does not care about word order", T03, ("layers.positions",),
              page="testing.md", section="Without positions, attention ignores word order",
              tests=(TEST_PERM,
                     "test_models_variants.py::test_an_encoder_without_positions_is_permutation_equivariant")),
        Topic("Is attention a linear map? Not quite: any length, fewer parameters, weights that depend on the "
              "content", T01, ("layers.attention:Attention",), section="Not just a linear map",
              tests=(TEST_SDPA,)),
        Topic("Attention(Q, K, V) = softmax(f(Q, K)) V with a kernel (similarity) function f", T02,
              ("layers.attention:make_score",), section="Four scores, from scratch",
              tests=(TEST_DOT, TEST_BIL, TEST_ADD)),
        Topic("Non-Transformer examples: a soft lookup (the library, its titles and the query)", T10,
              ("layers.attention:Attention",), section="A soft lookup in a library",
              tests=(TEST_ROWS,)),
        Topic("Nadaraya-Watson kernel regression", T01, ("experiments.kernel_regression",), "kernel-regression",
              "experiments/kernel-regression/fit.png", section="Nadaraya-Watson kernel regression, from scratch",
              tests=("test_experiments_false_claims.py::test_kernel_regression_does_not_hold_where_the_truth_is_flat",)),
        Topic("Multi-head attention in Transformers", T03, ("layers.attention:Attention",), picture=HEADS_PNG,
              section="Multi-head attention",
              tests=(TEST_MHA,)),
        Topic("Add & Norm: residual connections", T06, ("blocks",), section=RESIDUAL_NORM,
              tests=(TEST_ENC_BLOCK,)),
        Topic("Add & Norm: LayerNorm, X_l = LayerNorm(X_{l-1} + SubLayer(X_{l-1}))", T06,
              ("layers.norms", "blocks"), "norm-placement", "experiments/norm-placement/norm_placement.png",
              section=POST_NORM,
              tests=(TEST_LN, TEST_ENC_BLOCK, TEST_NORM_PLACE)),
        Topic("Feed forward", T06, ("layers.feedforward",), section="The parts, from scratch",
              tests=(TEST_FFN,)),
        Topic("Embedding: position encoding", T04, ("layers.positions", "layers.embedding"),
              "position-extrapolation", "experiments/position-extrapolation/loss_by_length.png",
              section="Sinusoidal positions (Vaswani et al. 2017)",
              tests=(TEST_SIN, TEST_EXTRAP)),
        Topic("Tokenization", T10, ("tokenize",), page="user-guide/tokenizers-data.md",
              section="Byte-pair encoding from scratch", tests=TESTS_BPE),
        Topic("Training Transformers", T06, ("train.trainer",), page="user-guide/training.md",
              section="Train it with attnkit's trainer", tests=TESTS_TRAIN),
    )),
    Lecture("002", "UT Austin CS 371N", "Lecture 10: LM 2: Self-attention, Transformers", "ut", (
        Topic("Recap: language models, n-gram models, neural LMs (DANs, feed-forward, RNNs) (counted n-grams with "
              "add-alpha or Kneser-Ney smoothing; Bengio et al.'s window and the deep averaging LM as a family: "
              "`attnkit train --preset bengio-lm-tiny`, `--preset dan-lm-tiny`)", T06,
              ("models.ngram:NGramLM", "models.feedforward.lm:FeedForwardLM", "models.recurrent.lm"),
              page=FEEDFORWARD_PAGE, section=NGRAM,
              tests=("test_ngram.py::test_drawn_corpora_sum_to_one_and_equal_the_brute_force",
                     "test_ngram.py::test_kneser_ney_bigram_is_the_hand_count",
                     "test_feedforward_lm.py::"
                     "test_the_window_ignores_every_token_older_than_its_K_and_reads_the_oldest_of_them",
                     "test_feedforward_lm.py::test_the_average_is_invariant_to_permuting_the_prefix")),
        Topic("Why RNNs are good (long sequences) and bad (they forget over long strings)", T05,
              ("models.recurrent.lm",), "rnn-forgets", "experiments/rnn-forgets/accuracy_by_distance.png",
              section=SEQUENCE_MODELS,
              tests=("test_experiments_rnn_forgets.py::"
                     "test_each_scored_token_is_the_one_d_back_and_no_nearer_token_tells_it",
                     "test_experiments_rnn_forgets.py::test_a_transformer_that_forgets_too_is_against_the_claim")),
        Topic("An API for neural nets: h = encode(w_1..w_n), context-sensitive encodings; layers stack; the "
              "Transformer obeys the same API", T06, ("models.stack", "blocks"), section="The parts, from scratch",
              tests=(TEST_ENC_BLOCK, TEST_VARIANTS)),
        Topic("The running example: sequences of A and B; the next is B if any B, else A", T03, ("data.synthetic",),
              "ab-task", AB_PNG, section="Going further: train an encoder on the A/B task and look at its heads",
              tests=("test_data_synthetic.py::test_ab_is_the_lectures_task_and_balanced", TEST_AB)),
        Topic("Attention as random access: keys = embeddings, query [0, 1]; scores [0 0 1 0], softmax "
              "[1/6 1/6 1/2 1/6], output [1/2 1/2]", T03, ("layers.attention",), page="testing.md",
              section="One query looking for a B",
              tests=(TEST_WORKED,)),
        Topic("Compare to a DAN: the plain average [3/4 1/4]; attention is biased towards B", T03,
              ("experiments.ab_task",),
              "ab-task", "experiments/ab-task/accuracy.png", section="One query looking for a B",
              tests=(TEST_WORKED, TEST_AB)),
        Topic("A larger query [0, 10]: scores [0 0 10 0], weights nearly one-hot", T03, ("layers.attention",),
              "scaled-dot", "experiments/scaled-dot/saturation.png",
              section="One query looking for a B",
              tests=(TEST_WORKED, TEST_SCALED)),
        Topic("Decouple keys and query from the embeddings: W^K and W^Q", T03, ("layers.attention:Attention",),
              section="Self-attention: every token is a query",
              tests=(TEST_MHA,)),
        Topic("Self-attention: every word a query against the keys; S = QK^T, K = EW^K, Q = EW^Q", T03,
              ("layers.attention",), section="Self-attention: every token is a query",
              tests=(TEST_DOT, TEST_MHA)),
        Topic("Version 2: K = 10E, S = 10EE^T; in reality W^Q is learned", T03, ("layers.attention",),
              section="Self-attention: every token is a query",
              tests=(TEST_WORKED, TEST_MHA)),
        Topic("This is quadratic", None, ("layers.attention",), COST, COST_PNG, tests=TESTS_COST),
    )),
    Lecture("003", "UC San Diego COGS 150", "The Transformer architecture (Sean Trott, Winter 2024)", "cogs", (
        Topic("A taxonomy of language models: statistical learning", T06,
              ("models.ngram:NGramLM", "models.recurrent.lm", "models.decoder"), page=FEEDFORWARD_PAGE, section=NGRAM,
              tests=TESTS_NGRAM),
        Topic("RNNs' limitations: vanishing and exploding gradients; training hard to parallelize", T05,
              ("models.recurrent.rnn",), COST, COST_PNG, section=GRADIENT_SHORTCUT,
              tests=("test_recurrent.py::test_attention_learns_faster_than_the_bottleneck", *TESTS_COST)),
        Topic("Attention lets a model focus: predictions that depend on words far back (the program log, the "
              "battery log)", T03, ("layers.attention",), "ab-task", AB_PNG, section="One query looking for a B",
              tests=(TEST_WORKED, TEST_AB)),
        Topic("Relationships between elements (the animal ... it was tired: trained where the adjective decides, "
              "a head from 'it' finds the referent in held-out pairings, `attnkit experiment referent-head`)", None,
              ("viz.head_view", "inspect.referents", "experiments.referent_head"), "referent-head",
              "experiments/referent-head/referent.png", "user-guide/looking-inside.md#what-it-refers-to",
              tests=("test_inspect_referents.py::"
                     "test_referent_accuracy_counts_the_sentences_where_a_heads_weight_from_the_pronoun_is_more_on_the_referent",
                     "test_inspect_referents.py::"
                     "test_the_claims_checks_compare_the_head_with_the_control_and_with_chance_not_an_unstated_bar")),
        Topic("Attention's origins: machine translation and the bottleneck", T05, ("models.recurrent.seq2seq",),
              "bottleneck", BOTTLENECK_PNG, section="Going further: reverse a sequence",
              tests=(TEST_BOTTLENECK,)),
        Topic("Dot-product attention: relevance as embedding similarity, softmax, weighted average, a context "
              "vector (\"The cat sat on\")", T01, ("layers.attention:DotScore", "layers.attention:attention_weights"),
              section="COGS 150's example: what is relevant to \"on\"?",
              tests=(TEST_DOT, TEST_ROWS)),
        Topic("The dot product is a coarse measure: can we do better?", T02, ("layers.attention",),
              "score-functions", "experiments/score-functions/scores.png",
              section="Going further: train one attention layer with each score",
              tests=(TEST_BIL, TEST_ADD, TEST_SCORES)),
        Topic("Introducing Transformers: a fixed context window, no recurrence, self-attention, several heads, "
              "positional embeddings", T06, ("models.decoder",), section="The parts, from scratch",
              tests=("test_models.py::test_decoder_is_causal", TEST_VARIANTS)),
        Topic("Self-attention: query, key (a folder's label), value (its contents)", T03,
              ("layers.attention:Attention",), section="Self-attention: every token is a query",
              tests=(TEST_MHA,)),
        Topic("Scores q_i . k_j, softmax, a weighted sum over j <= i", T03, ("layers.attention",),
              section="Masks: no looking ahead, no attending to padding",
              tests=(TEST_CAUSAL,)),
        Topic("Auto-regressive models mask the future: -inf above the diagonal", T03, ("layers.masks",),
              section="Masks: no looking ahead, no attending to padding",
              tests=(TEST_MASK, TEST_CAUSAL)),
        Topic("Self-attention is quadratic", None, ("layers.attention", "experiments.rnn_transformer_cost"), COST,
              COST_PNG, tests=TESTS_COST),
        Topic("Where Q, K, V come from: learned W^Q, W^K, W^V", T03, ("layers.attention:Attention",),
              section="attnkit's `Attention` computes the same",
              tests=(TEST_MHA,)),
        Topic("The Transformer block: self-attention, feed-forward, residual connections, normalization", T06,
              ("blocks",), section="The parts, from scratch",
              tests=(TEST_ENC_BLOCK, TEST_DEC_BLOCK)),
        Topic("The residual connection: \"dog\" + SelfAttention(\"dog\")", T06, ("blocks",),
              section=RESIDUAL_NORM,
              tests=(TEST_ENC_BLOCK,)),
        Topic("Layer normalization (like a z-score); GPT-2's two-layer feed-forward network", T06,
              ("layers.norms", "layers.feedforward"), section=RESIDUAL_NORM,
              tests=(TEST_LN, TEST_FFN)),
        Topic("Multi-head attention: each head may track another relationship", T03,
              ("layers.attention:Attention",), picture=HEADS_PNG, page="user-guide/looking-inside.md",
              section="Multi-head attention",
              tests=(TEST_MHA, TEST_SPECIALISE)),
        Topic("Probing and mechanistic interpretability: what these heads actually do (one head tracks syntax, "
              "another proper names?; and steering a model by activation addition: "
              "`attnkit inspect RUN steer --text Hello --steer Love Hate`)", T09,
              ("inspect", "inspect.importance", "inspect.head_types", "inspect.probes", "inspect.patching",
               "inspect.logit_lens", "inspect.steering"),
              "heads-specialise", "experiments/heads-specialise/heads.png", "user-guide/inspect.md",
              section="Finding the induction head",
              tests=("test_inspect_analyses.py::test_the_detector_names_the_induction_head_and_no_other",
                     "test_inspect_analyses.py::test_ablating_the_induction_head_alone_costs_the_repeated_half",
                     "test_inspect_analyses.py::test_patching_the_induction_head_restores_the_answer",
                     "test_inspect_analyses.py::test_a_probe_reads_a_planted_feature_and_not_its_control_task",
                     "test_inspect_analyses.py::test_the_logit_lens_last_layer_is_the_models_own_logits",
                     "test_inspect_steering.py::test_adding_a_tokens_unembedding_raises_its_logit_by_the_predicted_amount")),
        Topic("Positional embeddings: learned, added to the word embeddings", T04,
              ("layers.positions:LearnedPositions", "layers.embedding"), "position-extrapolation",
              "experiments/position-extrapolation/loss_by_length.png",
              section='Learned positions (GPT-2, BERT; COGS 150\'s "begin with random embeddings")',
              tests=(TEST_EXTRAP, TEST_EXTRAP_REFUSED)),
        Topic("Transformers are easier to train than RNNs", None, ("models.recurrent",),
              page="recipes.md#multi30k-the-recurrent-baselines-against-the-transformer",
              tests=("test_recurrent_cli.py::test_seq2seq_variants_train_resume_and_translate_from_the_command_line",),
              gap="no experiment decides the claim: the Multi30k table (read) measured it once, at equal time on one "
                  "CPU (sacreBLEU 22.3 for the Transformer, 14.4 and 4.4 for the GRUs with and without attention), "
                  "and the test named shows only that the recurrent translators train, resume and translate"),
        Topic("Under the hood, ChatGPT uses a Transformer (plus some other stuff): a pre-trained decoder fine-tuned "
              "on conversations to answer as an assistant (`attnkit train --task chat --data FILE`, then "
              "`attnkit chat RUN`), then taught which of two replies people prefer (Direct Preference Optimization: "
              "`attnkit train --task dpo --init-from RUN --data pairs.jsonl`), or a reward model learnt from the same "
              "pairs (`attnkit train --task reward --init-from RUN --data pairs.jsonl`) and the best of N samples kept "
              "by it (`attnkit generate RUN --prompt Hi --best-of 8 --reward runs/rm`)", T10,
              ("tasks.chat", "data.chat", "chat_format", "tasks.dpo", "data.preferences", "tasks.reward",
               "tasks.best_of"),
              picture="guides/reward-best-of-n.png",
              page="user-guide/pretraining-finetuning.md#chat-fine-tuning", section=CHAT_SFT,
              gap="PPO, RLHF's second half (the policy optimised against the reward model), is not implemented: "
                  "best-of-N spends decoding instead, and DPO learns from the pairs without reinforcement learning",
              tests=("test_chat_finetune.py::"
                     "test_the_loss_is_the_mean_cross_entropy_over_the_replies_of_each_conversation_alone",
                     "test_dpo.py::test_the_loss_and_reward_metrics_equal_trls_dpo_trainer_on_the_same_log_probs",
                     "test_reward.py::test_the_loss_its_gradients_and_metrics_equal_trls_reward_trainer_on_the_same_"
                     "llama",
                     "test_reward.py::test_best_of_n_keeps_the_highest_reward_and_the_first_of_equal_ones")),
        Topic("GPT: generative pre-trained Transformers; pre-training, then adapting", T10,
              ("models.decoder", "train.finetune"), page="user-guide/pretraining-finetuning.md",
              section="Generative pre-training when labels are few",
              tests=(TEST_FINETUNE,)),
        Topic("Pre-trained language models: trained on a large corpus by self-supervision, then adapted for a "
              "purpose, so as not to train from scratch", T08, ("data.masking", "models.encoder", "train.finetune"),
              page="user-guide/pretraining-finetuning.md",
              section="Fine-tuning: the same body, a new head, the labels",
              tests=("test_masking.py::test_rates_over_many_batches_match_bert",
                     "test_finetune.py::test_a_classifier_from_an_mlm_run_has_its_body_exactly_and_a_fresh_head")),
    )),
    Lecture("004", "CMU CS11-711 Advanced NLP (Spring 2025)", "Attention and Transformers (Sean Welleck)", "cmu", (
        Topic("Recap: a sequence model; language modeling p(. | x_<t) = softmax(W h_t)", T06, ("models.decoder",),
              section="The parts, from scratch",
              tests=(TEST_HF, "test_models.py::test_tied_embeddings_share_one_table")),
        Topic("Three types of sequence models: recurrence, convolution, attention (the three at one size, and how far "
              "back each reads: attnkit experiment sequence-models)", T05,
              ("models.recurrent", "models.convolutional", "models.decoder"), experiment="sequence-models",
              page="user-guide/configs.md#the-convolutional-lm-conv-lm", section=SEQUENCE_MODELS,
              tests=("test_experiments_sequence_models.py::"
                     "test_the_verdict_follows_whether_attention_reads_past_the_receptive_field",
                     "test_conv_lm.py::test_the_receptive_field_is_exactly_what_the_config_says",
                     "test_conv_lm.py::test_equals_a_stack_built_by_hand_from_conv1d")),
        Topic("Attention's basic idea (Bahdanau et al. 2015)", T05,
              ("models.recurrent.attention", "models.recurrent.seq2seq:BahdanauDecoder"), section=BAHDANAU,
              tests=TESTS_BAHDANAU),
        Topic("Cross attention: each element attends to another sequence", T11, ("layers.attention:Attention",),
              picture="viz/alignment.png", page="user-guide/looking-inside.md",
              section="What the cross-attention looks at",
              tests=(TEST_CROSS, TEST_DEC_BLOCK)),
        Topic("Self attention (Cheng et al. 2016, Vaswani et al. 2017)", T03, ("layers.attention:Attention",),
              section="Self-attention: every token is a query",
              tests=(TEST_MHA,)),
        Topic("Calculating attention: query and key vectors, softmax, a weighted sum of the values", T01,
              ("layers.attention",), section="It is dot-product attention",
              tests=(TEST_DOT, TEST_ROWS)),
        Topic("A graphical example: Bahdanau et al.'s alignment", T05, ("viz",), picture=ALIGN_PNG,
              section="Going further: reverse a sequence", tests=TESTS_ALIGN),
        Topic("Score functions (1): nonlinear (Bahdanau), bilinear (Luong)", T02,
              ("layers.attention:AdditiveScore", "layers.attention:BilinearScore"), "score-functions",
              "experiments/score-functions/scores.png", section="Four scores, from scratch",
              tests=(TEST_ADD, TEST_BIL, TEST_SCORES)),
        Topic("Score functions (2): dot product; scaled dot product, since the dot product grows with the "
              "dimension", T02, ("layers.attention:DotScore",), "scaled-dot",
              "experiments/scaled-dot/saturation.png", section="Why scale: the dot product grows with the dimension",
              tests=(TEST_DOT, TEST_SCALED)),
        Topic("Attention is all you need: a sequence-to-sequence model of attention alone", T11,
              ("models.seq2seq", "presets"), page="recipes.md",
              section="Every piece against attnkit's, with the same weights",
              tests=(TEST_TRANSFORMER, TEST_HF)),
        Topic("Two types of Transformers; stacks of Transformer layers", T06, ("models.stack", "models.decoder"),
              section="The parts, from scratch",
              tests=(TEST_ENC_BLOCK, TEST_DEC_BLOCK)),
        Topic("Inputs and embeddings: subwords", T10, ("tokenize",), page="user-guide/tokenizers-data.md",
              section="Byte-pair encoding from scratch", tests=TESTS_BPE),
        Topic("Positional encoding; sinusoidal encoding (PE_{pos+k} linear in PE_pos)", T04,
              ("layers.positions:SinusoidalPositions",), section="Sinusoidal positions (Vaswani et al. 2017)",
              tests=(TEST_SIN_LINEAR,)),
        Topic("Scaled dot-product self-attention, the matrix version", T03, ("layers.attention", "layers.kernels"),
              section="Self-attention: every token is a query",
              tests=(TEST_SDPA, TEST_SDPA_PATH)),
        Topic("Multi-head attention: intuition (I run a small business), concept, code (minGPT's forward)", T03,
              ("layers.attention:Attention",), section="Multi-head attention",
              tests=(TEST_MHA,)),
        Topic("What happens with several heads: Vaswani et al.'s figure 3, BertViz", T03, ("viz",),
              "heads-specialise", HEADS_PNG, "user-guide/looking-inside.md",
              section="Going further: train an encoder on the A/B task and look at its heads",
              tests=(TEST_HEADS, "test_inspect_trace.py::test_the_pattern_read_is_the_weights_need_weights_returns",
                     TEST_SPECIALISE)),
        Topic("Masking for language-model training", T03, ("layers.masks",),
              section="Masks: no looking ahead, no attending to padding",
              tests=(TEST_MASK, TEST_CAUSAL)),
        Topic("Gradients and training instability in deep Transformers", None, ("train.instruments",),
              "norm-placement", "viz/instruments.png", "user-guide/looking-inside.md",
              tests=("test_instruments.py::test_gradient_norms_per_block", "test_experiments_norm_placement.py::"
                     "test_post_norm_gradients_grow_toward_the_output_and_pre_norm_ones_do_not")),
        Topic("Layer normalization (Ba et al. 2016)", T06, ("layers.norms",), section=RESIDUAL_NORM,
              tests=(TEST_LN,)),
        Topic("Residual connections: Residual(x, f) = f(x) + x", T06, ("blocks",), section=RESIDUAL_NORM,
              tests=(TEST_ENC_BLOCK,)),
        Topic("Feed-forward layers; the Block and TransformerLM code", T06, ("layers.feedforward", "blocks"),
              section="The parts, from scratch",
              tests=(TEST_FFN, TEST_DEC_BLOCK)),
        Topic("Learned positional encodings: impossible to extrapolate", T04, ("layers.positions:LearnedPositions",),
              "position-extrapolation", "experiments/position-extrapolation/loss_by_length.png",
              section="Going further: train short, read long",
              tests=(TEST_EXTRAP, TEST_EXTRAP_REFUSED)),
        Topic("Absolute against relative encodings (Shaw et al. 2018)", T04,
              ("layers.positions:RelativePositions",), section="Relative positions (Shaw et al. 2018)",
              tests=("test_positions.py::test_relative_attention_with_zero_embeddings_equals_plain_attention",
                     "test_positions.py::test_relative_attention_is_shift_invariant_without_absolute_positions")),
        Topic("Rotary positional encodings (RoPE, Su et al. 2021)", T04, ("layers.positions:RotaryEmbedding",),
              section="RoPE (Su et al. 2021)",
              tests=("test_positions.py::test_rope_scores_depend_only_on_relative_position",
                     "test_positions.py::test_rope_preserves_norms")),
        Topic("Pre-layer-norm (Xiong et al. 2020)", T06, ("blocks",), "norm-placement",
              "experiments/norm-placement/norm_placement.png", section=POST_NORM,
              tests=("test_experiments_norm_placement.py::"
                     "test_post_norm_gradients_grow_toward_the_output_and_pre_norm_ones_do_not",
                     TEST_ENC_BLOCK,
                     TEST_NORM_PLACE)),
        Topic("RMSNorm (Zhang and Sennrich 2019)", T07, ("layers.norms",), section="RMSNorm",
              tests=(TEST_RMS,)),
        Topic("Grouped-query attention: shared key/value heads, less memory, faster inference", T07,
              ("layers.attention:Attention", "layers.kv_cache"), "gqa-memory", "experiments/gqa-memory/gqa.png",
              section="Grouped-query attention (Ainslie et al. 2023)",
              tests=(TEST_GQA, "test_experiments_false_claims.py::"
                     "test_gqa_memory_does_not_hold_where_every_variant_keeps_all_its_key_value_heads")),
        Topic("The original Transformer against Llama and Llama 2 (norm position, norm, non-linearity, positions, "
              "attention)", T07, ("presets", "interop.hf"), page="user-guide/configs.md",
              section="The lecture's table, from attnkit's presets",
              tests=(TEST_HF, "test_presets.py::test_published_parameter_counts")),
        Topic("How important is it? Transformer++ is about 10x more efficient", None,
              ("experiments.transformer_plus_plus", "presets"), "transformer-plus-plus",
              "experiments/transformer-plus-plus/loss_vs_flops.png",
              tests=("test_experiments_false_claims.py::"
                     "test_transformer_plus_plus_does_not_hold_where_the_two_recipes_are_swapped",)),
        Topic("Transformer training: every position at once, easy to parallelize", T06, ("train.trainer",), COST,
              COST_PNG, section="Train it with attnkit's trainer",
              tests=(TEST_CACHE, *TESTS_COST)),
        Topic("RNNs against Transformers: O(T d^2) against O(T^2 d), a T x T matrix in memory", None,
              ("experiments.rnn_transformer_cost",), COST,
              COST_PNG, tests=TESTS_COST),
    )),
)

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
                ("tests", f"\n{'':18}".join(f"tests/{test}" for test in topic.tests)),
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


def tested_by_html(test: str) -> str:
    """`test_attention.py::test_rows_sum_to_one` as code whose long name breaks at its underscores, in a block of its
    own (class `tested-by`, the site's stylesheet), so that one test's wrapped lines read apart from the next's."""
    return ('<code class="tested-by">' + html.escape(test).replace("::", "::<wbr>").replace("_", "_<wbr>")
            + "</code>")


def course_index_markdown(link_prefix: str = "", code_link: Callable[[str], str | None] = lambda ref: None) -> str:
    """The index as the site's page shows it: one table per lecture; links relative to `link_prefix`.
    `code_link(ref)` gives the identifier of a code name's entry in the API reference (`attnkit.layers.attention.
    Attention`, linked through mkdocs-autorefs), or None for a name the reference does not show."""
    out = []
    for lecture in LECTURES:
        out += [f"## {lecture.course}: {lecture.title}", "",
                f"Lecture file `{lecture.key}`; `attnkit lectures {lecture.short}` prints this table.", "",
                "| # | slide topic | tutorial | code | experiment | tests | picture |", "|---|---|---|---|---|---|---|"]
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
            tests = "".join(tested_by_html(test) for test in topic.tests)
            picture = f"[picture]({link_prefix}{topic.picture})" if topic.picture else ""
            out.append(f"| {number} | {slide} | {tutorial} | {code} | {experiment} | {tests} | {picture} |")
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
