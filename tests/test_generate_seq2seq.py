"""Encoder-decoder decoding: the cache changes nothing, beam search of width 1 is greedy, and a beam as wide as
the vocabulary finds what exhaustive search finds."""

import itertools

import pytest
import torch
from generate_models import POSITIONS, greedy_translate_without_cache, tiny_model  # noqa: F401

from attnkit.errors import BrokenOutputs, InputError
from attnkit.generate import beam_search, greedy_translate
from attnkit.generate.beam import translate_ids
from attnkit.models.greedy import EmptyTranslation, translation_pair
from attnkit.tokenize import CharTokenizer

BOS, EOS = 11, 12
SOURCES = [[1, 2, 3, EOS], [4, 5, 6, 7, 8, 9, EOS], [10, EOS]]


@pytest.mark.parametrize("position", POSITIONS)
def test_cached_greedy_equals_recomputing_everything(position):
    model, _ = tiny_model("encoder-decoder", position=position)
    batched = greedy_translate(model, SOURCES, bos_id=BOS, eos_id=EOS, max_length=12)
    for source, result in zip(SOURCES, batched, strict=True):
        assert result == greedy_translate_without_cache(model, source, bos=BOS, eos=EOS, max_length=12)


@pytest.mark.parametrize("position", ["sinusoidal", "rope"])
def test_beam_size_one_equals_greedy(position):
    model, _ = tiny_model("encoder-decoder", position=position, seed=1)
    greedy = greedy_translate(model, SOURCES, bos_id=BOS, eos_id=EOS, max_length=12)
    for early_stopping in (True, False):
        beam = beam_search(
            model, SOURCES, bos_id=BOS, eos_id=EOS, beam_size=1, max_length=12, early_stopping=early_stopping
        )
        assert beam == greedy


def test_greedy_stops_at_eos_without_returning_it():
    model, _ = tiny_model("encoder-decoder", position="learned", seed=2)
    free = greedy_translate(model, SOURCES, bos_id=BOS, eos_id=-1, max_length=10)  # -1: no token ends it
    eos = free[1][3]
    stopped = greedy_translate(model, SOURCES, bos_id=BOS, eos_id=eos, max_length=10)
    assert stopped == [row[: row.index(eos)] if eos in row else row for row in free]


def _exhaustive_best(model, source, *, bos, eos, max_length, length_penalty):
    """Score every target of up to max_length tokens: those ending in EOS and those cut at max_length."""
    vocab = model.lm_head.out_features
    others = [v for v in range(vocab) if v != eos]
    best, best_score = None, float("-inf")
    for length in range(1, max_length + 1):
        endings = [eos] + (others if length == max_length else [])
        for body, end in itertools.product(itertools.product(others, repeat=length - 1), endings):
            target = [bos, *body, end]
            with torch.no_grad():
                logits = model(torch.tensor([source]), torch.tensor([target[:-1]])).logits[0]
            logprob = float(logits.log_softmax(-1).gather(1, torch.tensor(target[1:])[:, None]).sum())
            score = logprob / length**length_penalty
            if score > best_score:
                best, best_score = target[1:-1] if end == eos else target[1:], score
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_beam_as_wide_as_the_vocabulary_finds_the_exhaustive_best(length_penalty):
    """Vocabulary 5, targets of at most 2 tokens: a beam of 5 keeps every first token, so it must find the best."""
    model, _ = tiny_model("encoder-decoder", position="sinusoidal", vocab_size=5, seed=11)
    sources, bos, eos = [[1, 2, 0], [3, 1], [2], [0, 0, 1, 2]], 3, 4
    found = beam_search(
        model, sources, bos_id=bos, eos_id=eos, beam_size=5, max_length=2, length_penalty=length_penalty
    )
    expected = [
        _exhaustive_best(model, s, bos=bos, eos=eos, max_length=2, length_penalty=length_penalty) for s in sources
    ]
    assert found == expected
    greedy = greedy_translate(model, sources, bos_id=bos, eos_id=eos, max_length=2)
    assert greedy != expected  # this model is one where greedy decoding misses the best target


def test_wider_beams_score_at_least_as_well_as_greedy():
    model, _ = tiny_model("encoder-decoder", position="learned", seed=4)

    def score(source, target):
        full = [BOS, *target, EOS]
        with torch.no_grad():
            logits = model(torch.tensor([source]), torch.tensor([full[:-1]])).logits[0]
        return float(logits.log_softmax(-1).gather(1, torch.tensor(full[1:])[:, None]).sum()) / (len(full) - 1)

    greedy = greedy_translate(model, SOURCES, bos_id=BOS, eos_id=EOS, max_length=20)
    beams = beam_search(model, SOURCES, bos_id=BOS, eos_id=EOS, beam_size=4, max_length=20, early_stopping=False)
    for source, g, b in zip(SOURCES, greedy, beams, strict=True):
        if len(g) < 20:  # greedy ended with EOS, so both are complete hypotheses
            assert score(source, b) >= score(source, g) - 1e-9


def test_beam_batch_equals_each_source_alone():
    model, _ = tiny_model("encoder-decoder", position="relative", seed=5)
    batched = beam_search(model, SOURCES, bos_id=BOS, eos_id=EOS, beam_size=3, max_length=10)
    alone = [beam_search(model, [s], bos_id=BOS, eos_id=EOS, beam_size=3, max_length=10)[0] for s in SOURCES]
    assert batched == alone


def test_bad_beam_arguments_are_clear_errors():
    model, _ = tiny_model("encoder-decoder")
    with pytest.raises(InputError, match="beam_size=0"):
        beam_search(model, SOURCES, bos_id=BOS, eos_id=EOS, beam_size=0, max_length=5)
    with pytest.raises(InputError, match="max_length=0"):
        greedy_translate(model, SOURCES, bos_id=BOS, eos_id=EOS, max_length=0)
    with pytest.raises(InputError, match="source sequence is empty"):
        greedy_translate(model, [[1], []], bos_id=BOS, eos_id=EOS, max_length=5)
    for early_stopping in ("never", 0, None):  # transformers' "never" is no rule here: not read as True
        with pytest.raises(InputError, match=f"early_stopping={early_stopping!r} must be True or False"):
            beam_search(model, SOURCES, bos_id=BOS, eos_id=EOS, beam_size=2, max_length=5,
                        early_stopping=early_stopping)


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A tiny random Marian model (transformers) and the same checkpoint loaded by attnkit, its EOS made likelier
    (final_logits_bias) so that hypotheses end with EOS as well as at the length limit."""
    interop_models = pytest.importorskip("interop_models")
    from attnkit.interop import hf

    directory = tmp_path_factory.mktemp("marian")
    reference = interop_models.hf_model("marian", directory, seed=3)
    with torch.no_grad():
        reference.final_logits_bias[0, reference.config.eos_token_id] += 4.0
    reference.save_pretrained(directory)
    return reference, hf.load(directory).model


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("early_stopping", [True, False])
@pytest.mark.parametrize(("beam_size", "max_length"), [(3, 6), (5, 4)])
def test_beam_search_finds_what_transformers_beam_search_finds(marian, length_penalty, early_stopping, beam_size,
                                                               max_length):
    """Same checkpoint, same scores (sum log p / (tokens + EOS) ** length_penalty), same stopping rule: the same best
    hypothesis, whether it ends with EOS or at the length limit. At the limit the step's first K candidates are all
    finished, EOS or not: a source whose EOS candidates filled its K hypotheses there lost the others (5 beams,
    length 4: [55, 55, 55] where transformers finds [55, 55, 55, 55])."""
    reference, model = marian
    pad, eos, vocab = reference.config.pad_token_id, reference.config.eos_token_id, reference.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    sources = [[*torch.randint(3, vocab, (n,), generator=generator).tolist(), eos] for n in (5, 3, 8, 6, 4, 7)]
    ours = beam_search(model, sources, bos_id=pad, eos_id=eos, beam_size=beam_size, max_length=max_length,
                       length_penalty=length_penalty, early_stopping=early_stopping)
    ended = 0
    for source, found in zip(sources, ours, strict=True):
        with torch.no_grad():
            best = reference.generate(
                input_ids=torch.tensor([source]), num_beams=beam_size, max_new_tokens=max_length,
                length_penalty=length_penalty,
                early_stopping=early_stopping, do_sample=False, forced_eos_token_id=None, bad_words_ids=None,
                decoder_start_token_id=pad, eos_token_id=eos, pad_token_id=pad,
            )[0, 1:].tolist()  # after the decoder's start token (pad, Marian's BOS)
        ended += eos in best
        assert found == (best[: best.index(eos)] if eos in best else best)
    assert 0 < ended  # some hypotheses end with EOS, so the comparison covers finished ones


@pytest.mark.parametrize("early_stopping", [True, False])
def test_num_return_sequences_are_transformers_n_best_hypotheses_best_first(marian, early_stopping):
    """transformers' num_return_sequences: each source's n best finished hypotheses, best first, source by source."""
    reference, model = marian
    pad, eos, vocab = reference.config.pad_token_id, reference.config.eos_token_id, reference.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    sources = [[*torch.randint(3, vocab, (n,), generator=generator).tolist(), eos] for n in (5, 3, 8)]
    ours = beam_search(model, sources, bos_id=pad, eos_id=eos, beam_size=4, max_length=6, num_return_sequences=3,
                       early_stopping=early_stopping)
    assert len(ours) == 3 * len(sources)
    assert ours[::3] == beam_search(model, sources, bos_id=pad, eos_id=eos, beam_size=4, max_length=6,
                                    early_stopping=early_stopping)
    for index, source in enumerate(sources):
        with torch.no_grad():
            found = reference.generate(
                input_ids=torch.tensor([source]), num_beams=4, num_return_sequences=3, max_new_tokens=6,
                early_stopping=early_stopping, do_sample=False, forced_eos_token_id=None, bad_words_ids=None,
                decoder_start_token_id=pad, eos_token_id=eos, pad_token_id=pad,
            )[:, 1:].tolist()
        expected = [row[: row.index(eos)] if eos in row else row for row in found]  # padded after EOS alone
        assert ours[3 * index: 3 * index + 3] == expected
    for n in (0, 5, True):
        with pytest.raises(InputError, match=f"num_return_sequences={n!r} must be an integer from 1 to beam_size=4"):
            beam_search(model, sources, bos_id=pad, eos_id=eos, beam_size=4, max_length=6, num_return_sequences=n)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_nan_logits_in_fp16_are_refused_naming_the_dtype_not_decoded_into_a_translation(beam_size):
    """Activations past fp16's largest number give nan logits: greedy decoding took their argmax as a token (a
    translation of padding), beam search found no hypothesis and failed with an IndexError."""
    model, _ = tiny_model("encoder-decoder", position="sinusoidal", seed=2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(30)
    assert translate_ids(model, SOURCES, bos_id=BOS, eos_id=EOS, beam_size=beam_size, max_length=5)  # float64
    with pytest.raises(BrokenOutputs, match="nan.*in fp16 the activations may overflow.*--dtype bf16"):
        translate_ids(model.half(), SOURCES, bos_id=BOS, eos_id=EOS, beam_size=beam_size, max_length=5)


def test_greedy_translation_refuses_logits_that_are_no_distribution_as_sampling_does():
    """Greedy translation checks its tokens with the sampling path's check (`check_drawn`): logits all at -inf (no
    token possible) are refused as nan logits are, where argmax took token 0 for a translation."""
    model, _ = tiny_model("encoder-decoder", position="sinusoidal", seed=2)
    model.lm_head.register_forward_hook(lambda _, __, logits: torch.full_like(logits, float("-inf")))
    with pytest.raises(BrokenOutputs, match=r"logits for row\(s\) \[0, 1, 2\] are no probability distribution"):
        greedy_translate(model, SOURCES, bos_id=BOS, eos_id=EOS, max_length=5)


def test_a_translation_pair_frames_a_given_target_or_the_models_own_translation():
    """`translation_pair` (what the attention maps, `attnkit inspect` and the explorer read): the source with EOS,
    the target given or the model's own greedy translation, framed BOS ... EOS; an empty own translation names the
    caller's fix."""
    tokenizer = CharTokenizer("abcdefghij", special_tokens=["pad", "bos", "eos", "unk"])  # a-j: 0-9, then specials
    assert (tokenizer.bos_id, tokenizer.eos_id) == (BOS, EOS)
    model, _ = tiny_model("encoder-decoder", seed=3, vocab_size=tokenizer.vocab_size)
    given = translation_pair(model, tokenizer, "abc", "ji", max_length=8, instead="give a target")
    assert (given.source, given.written) == ([0, 1, 2, EOS], [9, 8])
    assert (given.decoder_input, given.predicted, given.target) == ([BOS, 9, 8], [9, 8, EOS], [BOS, 9, 8, EOS])
    own = translation_pair(model, tokenizer, "abc", None, max_length=8, instead="give a target")
    assert own.written == greedy_translate(model, [[0, 1, 2, EOS]], bos_id=BOS, eos_id=EOS, max_length=8)[0]
    assert own.written, "the tiny model writes EOS first: choose another seed"
    model.lm_head.register_forward_hook(lambda _, __, logits: logits.index_fill(-1, torch.tensor([EOS]), 1e6))
    with pytest.raises(EmptyTranslation, match=r"translation of the source is empty .*: give a target"):
        translation_pair(model, tokenizer, "abc", None, max_length=8, instead="give a target")
    with pytest.raises(InputError, match="becomes no tokens"):
        translation_pair(model, tokenizer, "abc", "", max_length=8, instead="give a target")


def test_a_translation_pair_holds_both_sides_to_the_models_context():
    """With `context` (max_seq_len), the source with EOS and the decoder's input (BOS and the target) must each fit,
    a target that fills the context exactly is read, and the model's own translation stops where BOS and it fill it:
    the one check the attention maps, `attnkit inspect` and the explorer share."""
    tokenizer = CharTokenizer("abcdefghij", special_tokens=["pad", "bos", "eos", "unk"])
    model, _ = tiny_model("encoder-decoder", seed=3, vocab_size=tokenizer.vocab_size)
    fits = translation_pair(model, tokenizer, "abcde", "abcde", max_length=8, instead="give a target", context=6)
    assert fits.decoder_input == [BOS, 0, 1, 2, 3, 4]
    with pytest.raises(InputError, match=r"the target with BOS has 7 tokens; this model reads at most 6 \(max_seq_len"):
        translation_pair(model, tokenizer, "abc", "abcdef", max_length=8, instead="give a target", context=6)
    with pytest.raises(InputError, match=r"the source with EOS has 7 tokens; this model reads at most 6"):
        translation_pair(model, tokenizer, "abcdef", "abc", max_length=8, instead="give a target", context=6)
    model.lm_head.register_forward_hook(lambda _, __, logits: logits.index_fill(-1, torch.tensor([EOS]), -1e6))
    own = translation_pair(model, tokenizer, "abc", None, max_length=48, instead="give a target", context=6)
    assert len(own.decoder_input) == 6  # never ends: cut where the context does, not 48 tokens past it


def padded_translator():
    """An encoder-decoder of 16 ids whose tokenizer writes 13 (BOS 11, EOS 12; padded as Marian's and nanoGPT's
    vocabularies are), the padding ids made likely."""
    model, _ = tiny_model("encoder-decoder", vocab_size=16, seed=3)
    with torch.no_grad():
        model.encoder.embeddings.token.weight[13:] *= 50  # the output head shares the embedding's rows
    return model


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translation_never_writes_a_padded_vocabularys_ids_past_the_tokenizers(beam_size):
    """Greedy translation and beam search chose the ids past the target tokenizer's (which name no text) where the
    model made them likely; with `writable` (Pipeline.translate passes the tokenizer's size) they never do, and the
    rest is the search's own over the ids below."""
    model = padded_translator()
    search = dict(bos_id=BOS, eos_id=EOS, max_length=8, beam_size=beam_size)
    free = translate_ids(model, SOURCES, **search)
    assert max(max(t, default=0) for t in free) >= 13  # the padding ids win without the mask
    held = translate_ids(model, SOURCES, **search, writable=13)
    assert all(t < 13 for target in held for t in target)
    if beam_size == 1:  # greedy: the argmax among the ids below 13 at every step, recomputed without the cache
        for source, target in zip(SOURCES, held, strict=True):
            ids = [BOS]
            for _ in range(8):
                out = model(torch.tensor([source]), torch.tensor([ids])).logits[0, -1, :13]
                if int(out.argmax()) == EOS:
                    break
                ids.append(int(out.argmax()))
            assert target == ids[1:]


def test_a_source_with_fewer_hypotheses_than_num_return_sequences_is_refused_not_shifted_onto_the_next():
    """A beam of 16 over 13 tokens at max_length 1 finishes 13 hypotheses a source: asked for 16, the results of
    three sources came back as 39 in a row, the later sources' moved onto the earlier ones' places. It is refused
    naming the cause; as many as each source has come back source by source."""
    model, _ = tiny_model("encoder-decoder", seed=1)
    search = dict(bos_id=BOS, eos_id=EOS, beam_size=16, max_length=1)
    with pytest.raises(InputError, match=r"source\(s\) \[0, 1, 2\] ended with \[13\] finished hypotheses, fewer than "
                                         r"num_return_sequences=16"):
        beam_search(model, SOURCES, **search, num_return_sequences=16)
    results = beam_search(model, SOURCES, **search, num_return_sequences=13)
    assert len(results) == 3 * 13
    for index, source in enumerate(SOURCES):
        assert results[index * 13:(index + 1) * 13] == beam_search(model, [source], **search, num_return_sequences=13)


@pytest.fixture(scope="module")
def marian_long(tmp_path_factory):
    """A tiny random Marian model and attnkit's load of it, EOS as likely as drawn: translations run long enough to
    repeat themselves."""
    interop_models = pytest.importorskip("interop_models")
    from attnkit.interop import hf

    directory = tmp_path_factory.mktemp("marian-long")
    return interop_models.hf_model("marian", directory, seed=4), hf.load(directory).model


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("settings", [dict(repetition_penalty=2.0), dict(no_repeat_ngram_size=1),
                                      dict(repetition_penalty=0.5, no_repeat_ngram_size=2)],
                         ids=["penalty", "unigrams", "reward-and-bigrams"])
def test_repetition_penalty_and_ngram_blocking_translate_as_transformers_does(marian_long, beam_size, settings):
    """transformers' generate applies both to a Marian model's decoder input (its start token, pad, included):
    greedy to the logits, beam search to the log-probabilities; attnkit's translation does the same."""
    reference, model = marian_long
    pad, eos, vocab = reference.config.pad_token_id, reference.config.eos_token_id, reference.config.vocab_size
    generator = torch.Generator().manual_seed(2)
    sources = [[*torch.randint(3, vocab, (n,), generator=generator).tolist(), eos] for n in (5, 3, 8, 6)]
    plain = translate_ids(model, sources, bos_id=pad, eos_id=eos, max_length=10, beam_size=beam_size)
    ours = translate_ids(model, sources, bos_id=pad, eos_id=eos, max_length=10, beam_size=beam_size, **settings)
    assert ours != plain  # the settings change some translation: the comparison below can fail
    for source, found in zip(sources, ours, strict=True):
        with torch.no_grad():
            best = reference.generate(
                input_ids=torch.tensor([source]), num_beams=beam_size, max_new_tokens=10, early_stopping=True,
                do_sample=False, forced_eos_token_id=None, bad_words_ids=None, decoder_start_token_id=pad,
                eos_token_id=eos, pad_token_id=pad, **settings,
            )[0, 1:].tolist()
        assert found == (best[: best.index(eos)] if eos in best else best)
