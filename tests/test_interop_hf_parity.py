"""Hugging Face checkpoints in attnkit give the reference's numbers: logits (fp32 and bf16), greedy generation."""

import copy

import pytest
import torch
from interop_models import FAMILIES, PAD, VOCAB, batch, hf_model

from attnkit.generate import generate_tokens
from attnkit.interop import hf

FP32_TOLERANCE = 1e-5
# Of the logits' scale: a few bf16 steps (one step at |x| = 4 is 0.03), since the two compute in different orders
# (on CPU, attnkit's bf16 attention runs as float32 matrix products, transformers' through SDPA's bf16 kernel). The
# real bar is the second check below: no further from the fp32 numbers than transformers' own bf16 run.
BF16_TOLERANCE = 4e-2


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (directory, reference model) for every tiny family, built once for the module."""
    built = {}
    for name in FAMILIES:
        directory = tmp_path_factory.mktemp(name)
        built[name] = (directory, hf_model(name, directory))
    return built


def _compare(name, reference, model, seed):
    """(reference, attnkit) outputs at the real (unpadded) positions of one padded batch."""
    ids, mask = batch(seed)
    with torch.no_grad():
        if name.startswith("marian"):
            tgt, tgt_mask = batch(seed + 100, length=7)
            tgt = tgt % reference.config.decoder_vocab_size
            ref = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
            ours = model(ids, tgt, src_mask=mask, tgt_mask=tgt_mask)
            real = tgt_mask.bool()
            return [(ref.logits[real], ours.logits[real])]
        if name.startswith("bert"):
            types = (torch.arange(ids.shape[1]) >= ids.shape[1] // 2).long().expand_as(ids)  # segments A then B
            ref = reference(input_ids=ids, attention_mask=mask, token_type_ids=types)
            ours = model(ids, attention_mask=mask, token_type_ids=types)
            if name == "bert":  # bare encoder: every real token's state, and the pooler's output
                return [(ref.last_hidden_state[mask.bool()], ours.hidden_states[mask.bool()]),
                        (ref.pooler_output, ours.logits)]
            if name in ("bert-mlm", "bert-tagger"):  # a prediction at each real position
                return [(ref.logits[mask.bool()], ours.logits[mask.bool()])]
            return [(ref.logits, ours.logits)]
        ref = reference(input_ids=ids, attention_mask=mask)
        ours = model(ids, attention_mask=mask)
        return [(ref.logits[mask.bool()], ours.logits[mask.bool()])]


@pytest.mark.parametrize("name", FAMILIES)
def test_fp32_logits_equal_transformers(checkpoints, name):
    directory, reference = checkpoints[name]
    model = hf.load(directory).model
    for seed in range(3):
        for expected, got in _compare(name, reference, model, seed):
            torch.testing.assert_close(got, expected, atol=FP32_TOLERANCE, rtol=FP32_TOLERANCE)


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_logits_equal_transformers_bf16(checkpoints, name):
    """Within 2e-2 of the logits' scale of transformers in bf16, and no further from the fp32 numbers than
    transformers' own bf16 run is (their rounding orders differ, so neither is the exact reference)."""
    directory, reference = checkpoints[name]
    model = hf.load(directory, dtype=torch.bfloat16).model
    reference_bf16 = copy.deepcopy(reference).to(torch.bfloat16)  # the shared fp32 reference stays untouched
    for seed in range(3):
        exact = _compare(name, reference, hf.load(directory).model, seed)
        for (expected, got), (truth, _) in zip(_compare(name, reference_bf16, model, seed), exact, strict=True):
            assert got.dtype == torch.bfloat16
            got, expected = got.float(), expected.float()
            scale = truth.abs().max()
            assert (got - expected).abs().max() <= BF16_TOLERANCE * scale
            assert (got - truth).abs().mean() <= 1.5 * (expected - truth).abs().mean() + 1e-3 * scale


def test_padding_changes_no_real_output(checkpoints):
    """The padded batch's real positions equal each sequence run alone (so the comparisons above cover padding)."""
    directory, _ = checkpoints["llama"]
    model = hf.load(directory).model
    ids, mask = batch(0)
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        for row in range(ids.shape[0]):
            length = int(mask[row].sum())
            alone = model(ids[row : row + 1, :length]).logits[0]
            torch.testing.assert_close(padded[row, :length], alone, atol=1e-5, rtol=1e-5)


GENERATION_CASES = [
    ("gpt2", [[5, 17, 33, 8, 61, 4], [42, 7, 90, 3, 3, 18], [9, 9, 80, 3, 11, 12]]),
    ("llama", [[5, 17, 33, 8, 61, 4], [42, 7, 90, 3, 3, 18], [9, 9, 80, 3, 11, 12]]),
    # Left padding: transformers' GPT-2 gives padded rows shifted positions in generate, Llama's rotary positions
    # are relative, so padded and unpadded rows agree there.
    ("llama", [[5, 17, 33, 8, 61], [42, 7], [9, 9, 80, 3, 11, 12, 13]]),
    ("llama-tied", [[5, 17, 33, 8, 61], [42, 7], [9, 9, 80, 3, 11, 12, 13]]),
]


@pytest.mark.parametrize(("name", "prompts"), GENERATION_CASES)
def test_greedy_generation_equals_transformers_generate(checkpoints, name, prompts):
    directory, reference = checkpoints[name]
    loaded = hf.load(directory)
    ours = generate_tokens(loaded.model, prompts, max_new_tokens=12, context_len=loaded.config.max_seq_len, pad_id=PAD)

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    reference.generation_config.eos_token_id = None  # run the full 12 tokens, as attnkit does without stop ids
    with torch.no_grad():
        out = reference.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD
        )
    assert out[:, width:].tolist() == ours
    assert len({tuple(row) for row in ours}) > 1  # the prompts lead to different continuations


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("settings", [
    dict(temperature=0.8),
    dict(temperature=1.3, top_k=10, top_p=0.9),
    dict(temperature=1.0, min_p=0.1, repetition_penalty=1.3),
])
def test_sampled_generation_equals_transformers_generate_under_the_same_seed(checkpoints, name, settings):
    """The same logits processors in transformers' order, and a draw that is torch.multinomial's own: attnkit seeded
    s writes what transformers' generate writes after torch.manual_seed(s), token for token."""
    from attnkit.generate import make_generator
    from attnkit.generate.sampling import check_sampling

    directory, reference = checkpoints[name]
    loaded = hf.load(directory)
    sampling, _ = check_sampling(**settings)
    prompt = [5, 17, 33, 8, 61]
    texts = set()
    for seed in range(3):
        ours = generate_tokens(loaded.model, [prompt], max_new_tokens=12, context_len=loaded.config.max_seq_len,
                               sampling=sampling, generator=make_generator(seed, "cpu"))[0]
        torch.manual_seed(seed)
        with torch.no_grad():
            theirs = reference.generate(torch.tensor([prompt]), do_sample=True, max_new_tokens=12, min_new_tokens=12,
                                        eos_token_id=None, pad_token_id=PAD, top_k=settings.get("top_k", 0),
                                        **{k: v for k, v in settings.items() if k != "top_k"})
        assert theirs[0, len(prompt):].tolist() == ours
        texts.add(tuple(ours))
    assert len(texts) > 1  # the seeds draw different texts: the draws, not the argmax, agree


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize(("n", "temperature"), [(1, 0.0), (2, 0.0), (3, 0.0), (2, 1.0)])
def test_no_repeat_ngram_generation_equals_transformers(checkpoints, name, n, temperature):
    """no_repeat_ngram_size: the tokens that would repeat an n-gram of the prompt and reply are never chosen, as
    transformers' NoRepeatNGramLogitsProcessor bans them; greedy and seeded samples alike, token for token. A batch
    gives each prompt's own tokens (the padding is no part of a row's n-grams)."""
    from attnkit.generate import make_generator
    from attnkit.generate.sampling import check_sampling

    directory, reference = checkpoints[name]
    loaded = hf.load(directory)
    sampling, _ = check_sampling(temperature=temperature, no_repeat_ngram_size=n)
    prompts = [[5, 17, 5, 17, 33], [42, 7]]
    greedy = temperature == 0.0
    alone = []
    for prompt in prompts:
        ours = generate_tokens(loaded.model, [prompt], max_new_tokens=14, context_len=loaded.config.max_seq_len,
                               sampling=sampling, generator=make_generator(0, "cpu"))[0]
        torch.manual_seed(0)
        with torch.no_grad():
            theirs = reference.generate(torch.tensor([prompt]), do_sample=not greedy, max_new_tokens=14,
                                        min_new_tokens=14, eos_token_id=None, pad_token_id=PAD, top_k=0,
                                        no_repeat_ngram_size=n, **({} if greedy else {"temperature": temperature}))
        assert theirs[0, len(prompt):].tolist() == ours
        sequence = prompt + ours
        grams = [tuple(sequence[i:i + n]) for i in range(len(sequence) - n + 1)]
        assert all(grams[i] not in grams[:i] for i in range(len(prompt) - n + 1, len(grams)))  # the reply's are new
        alone.append(ours)
    if greedy:
        assert generate_tokens(loaded.model, prompts, max_new_tokens=14, context_len=loaded.config.max_seq_len,
                               sampling=sampling, pad_id=PAD) == alone


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_new_tokens_holds_back_the_stop_token_as_transformers_does(checkpoints, name, temperature):
    """min_new_tokens: with the stop token the model's own first choice (so a text would end at once), no stop
    token among the first 5 tokens, then the text ends at it: transformers' generate(min_new_tokens=5), greedy and
    seeded."""
    from attnkit.generate import make_generator
    from attnkit.generate.sampling import check_sampling

    directory, reference = checkpoints[name]
    loaded = hf.load(directory)
    prompt, context = [5, 17, 33, 8, 61], loaded.config.max_seq_len
    stop = generate_tokens(loaded.model, [prompt], max_new_tokens=1, context_len=context)[0][0]
    assert generate_tokens(loaded.model, [prompt], max_new_tokens=20, context_len=context, stop_ids={stop}) == [[]]
    sampling, _ = check_sampling(temperature=temperature)
    greedy = temperature == 0.0
    for seed in range(1 if greedy else 3):
        ours = generate_tokens(loaded.model, [prompt], max_new_tokens=20, context_len=context, stop_ids={stop},
                               min_new_tokens=5, sampling=sampling, generator=make_generator(seed, "cpu"))[0]
        torch.manual_seed(seed)
        with torch.no_grad():
            theirs = reference.generate(torch.tensor([prompt]), do_sample=not greedy, max_new_tokens=20,
                                        min_new_tokens=5, eos_token_id=stop, pad_token_id=PAD, top_k=0,
                                        **({} if greedy else {"temperature": temperature}))[0, len(prompt):].tolist()
        assert ours == (theirs[: theirs.index(stop)] if stop in theirs else theirs)
        assert len(ours) >= 5


def test_loaded_config_reads_the_checkpoint_options(checkpoints):
    names = ("llama", "llama-tied", "marian", "marian-two-vocabularies", "bert")
    configs = {name: hf.load(checkpoints[name][0]).config for name in names}
    llama = configs["llama"]
    assert (llama.n_kv_heads, llama.rope_theta, llama.norm_eps, llama.tie_embeddings) == (2, 500.0, 1e-5, False)
    assert configs["llama-tied"].resolved.n_kv_heads == 1 and configs["llama-tied"].tie_embeddings
    marian = configs["marian"]
    assert (marian.sinusoidal_layout, marian.activation, marian.scale_embeddings) == ("halves", "silu", True)
    assert marian.tgt_vocab_size is None and marian.lm_head_bias
    separate = configs["marian-two-vocabularies"]
    assert (separate.tgt_vocab_size, separate.n_layers, separate.resolved.n_decoder_layers) == (77, 1, 2)
    bert = configs["bert"]
    assert (bert.type_vocab_size, bert.embedding_norm, bert.pooler, bert.norm_position) == (2, True, True, "post")
    assert VOCAB == llama.vocab_size == marian.vocab_size
