"""Decoder generation: the KV cache changes nothing, batching changes nothing, the window slides, rows stop."""

import pytest
import torch
from generate_models import POSITIONS, greedy_without_cache, tiny_model  # noqa: F401

from attnkit.errors import InputError
from attnkit.generate import GREEDY, SamplingConfig, generate_tokens, left_pad, make_generator
from attnkit.generate.decoder import decode_one_token, positions_from_mask, prefill
from attnkit.generate.static_decode import static_step

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [3, 3, 0, 12, 5]]


@pytest.mark.parametrize("position", POSITIONS)
def test_cached_greedy_equals_recomputing_everything(position):
    model, config = tiny_model(position=position)
    for prompt in PROMPTS:
        cached = generate_tokens(model, [prompt], max_new_tokens=12, context_len=config.max_seq_len)[0]
        assert cached == greedy_without_cache(model, prompt, 12)


def test_cached_greedy_equals_recomputing_with_grouped_query_swiglu_rms():
    model, config = tiny_model(position="rope", n_kv_heads=2, activation="swiglu", norm="rms", bias=False)
    cached = generate_tokens(model, [PROMPTS[1]], max_new_tokens=12, context_len=config.max_seq_len)[0]
    assert cached == greedy_without_cache(model, PROMPTS[1], 12)


@pytest.mark.parametrize("position", POSITIONS)
def test_batch_of_different_lengths_equals_each_prompt_alone(position):
    model, config = tiny_model(position=position, seed=1)
    batched = generate_tokens(model, PROMPTS, max_new_tokens=10, context_len=config.max_seq_len)
    alone = [generate_tokens(model, [p], max_new_tokens=10, context_len=config.max_seq_len)[0] for p in PROMPTS]
    assert batched == alone


@pytest.mark.parametrize("position", POSITIONS)
def test_prefill_gives_the_forward_pass_last_logits_of_each_left_padded_row(position):
    """The prefill computes the last position's logits only; they are the full forward pass's, padding and all."""
    model, config = tiny_model(position=position, seed=3)
    window = left_pad(PROMPTS, pad_id=0)
    mask = window.attention_mask
    full = model(window.ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    cache = model.allocate_cache(len(PROMPTS), config.max_seq_len)
    torch.testing.assert_close(prefill(model, window, cache), full[:, -1], rtol=1e-12, atol=1e-12)
    assert cache.length == window.ids.shape[1]


def test_left_padding_and_positions():
    window = left_pad([[7, 8, 9], [5]], pad_id=0)
    assert window.ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert window.attention_mask.tolist() == [[True, True, True], [False, False, True]]
    assert window.padded
    assert positions_from_mask(window.attention_mask).tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_generation_beyond_the_context_slides_the_window(position):
    """Context 24, prompt 20: the cache fills after 4 new tokens; the rest continue from the last 12 tokens."""
    model, config = tiny_model(position=position, seed=2)
    prompt = [(3 * i + 1) % 13 for i in range(20)]
    out = generate_tokens(model, [prompt], max_new_tokens=10, context_len=config.max_seq_len)[0]
    assert len(out) == 10
    first = greedy_without_cache(model, prompt, 5)
    assert out[:5] == first
    window = (prompt + first)[-12:]
    assert out[5:] == greedy_without_cache(model, window, 5)


def _greedy_sliding(model, prompt: list[int], n: int, context_len: int) -> list[int]:
    """Greedy decoding by whole passes over the window a prompt alone has: once it outgrows `context_len`, its last
    `context_len // 2` tokens (the module docstring's rule)."""
    ids, start = list(prompt), 0
    with torch.no_grad():
        for _ in range(n):
            if len(ids) - start > context_len:
                start = len(ids) - context_len // 2
            ids.append(int(model(torch.tensor([ids[start:]])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_a_row_in_a_batch_slides_its_window_when_it_outgrows_the_context_not_when_the_longest_does(position):
    """Context 24, prompts of 5 and 20 tokens, 60 new tokens: each row keeps the context it would have alone."""
    model, config = tiny_model(position=position, seed=1)
    prompts = [[1, 2, 3, 4, 5], [(3 * i + 1) % 13 for i in range(20)]]
    batched = generate_tokens(model, prompts, max_new_tokens=60, context_len=config.max_seq_len)
    assert batched == [_greedy_sliding(model, p, 60, config.max_seq_len) for p in prompts]


def test_stop_tokens_end_each_row_and_are_not_returned():
    model, config = tiny_model(seed=3)
    free = generate_tokens(model, PROMPTS, max_new_tokens=10, context_len=config.max_seq_len)
    stop = free[1][4]
    stopped = generate_tokens(model, PROMPTS, max_new_tokens=10, context_len=config.max_seq_len, stop_ids={stop})
    for row, tokens in zip(free, stopped, strict=True):
        expected = row[: row.index(stop)] if stop in row else row
        assert tokens == expected


def test_on_token_sees_every_token_and_can_stop_a_row():
    model, config = tiny_model(seed=3)
    seen: list[tuple[int, int]] = []

    def hook(row, token):
        seen.append((row, token))
        return row == 0 and len([s for s in seen if s[0] == 0]) == 3

    out = generate_tokens(model, PROMPTS[:2], max_new_tokens=6, context_len=config.max_seq_len, on_token=hook)
    assert len(out[0]) == 3 and len(out[1]) == 6
    assert [t for r, t in seen if r == 1] == out[1]


def test_top_k_one_equals_greedy():
    model, config = tiny_model(position="rope", seed=4)
    greedy = generate_tokens(model, PROMPTS, max_new_tokens=8, context_len=config.max_seq_len, sampling=GREEDY)
    top1 = generate_tokens(
        model, PROMPTS, max_new_tokens=8, context_len=config.max_seq_len,
        sampling=SamplingConfig(temperature=1.5, top_k=1), generator=make_generator(0, "cpu"),
    )
    assert top1 == greedy


def test_same_seed_same_samples_and_another_seed_differs():
    model, config = tiny_model(seed=5)

    def sample(seed):
        return generate_tokens(
            model, PROMPTS, max_new_tokens=15, context_len=config.max_seq_len,
            sampling=SamplingConfig(temperature=1.0, top_p=0.95), generator=make_generator(seed, "cpu"),
        )

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


@torch.no_grad()
def test_repetition_penalty_matches_a_direct_computation():
    model, config = tiny_model(seed=6)
    penalty = 3.0
    ids = list(PROMPTS[1])
    for _ in range(8):  # reference: recompute everything, penalise by hand
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        for token in set(ids):
            logits[token] = logits[token] / penalty if logits[token] > 0 else logits[token] * penalty
        ids.append(int(logits.argmax()))
    out = generate_tokens(
        model, [PROMPTS[1]], max_new_tokens=8, context_len=config.max_seq_len,
        sampling=SamplingConfig(temperature=0.0, repetition_penalty=penalty),
    )
    assert out[0] == ids[len(PROMPTS[1]):]
    assert out[0] != greedy_without_cache(model, PROMPTS[1], 8)  # the penalty mattered


def test_bad_prompts_and_lengths_are_clear_errors():
    model, config = tiny_model()
    with pytest.raises(InputError, match="prompt 1 is empty"):
        generate_tokens(model, [[1], []], max_new_tokens=3, context_len=config.max_seq_len)
    with pytest.raises(InputError, match="prompt 0 has 30 tokens .* holds 24"):
        generate_tokens(model, [[1] * 30], max_new_tokens=3, context_len=config.max_seq_len)
    with pytest.raises(InputError, match="max_new_tokens"):
        generate_tokens(model, [[1]], max_new_tokens=-1, context_len=config.max_seq_len)
    assert generate_tokens(model, [[1], [2, 3]], max_new_tokens=0, context_len=config.max_seq_len) == [[], []]


def test_the_old_mask_names_of_windows_and_sources_still_answer_with_a_warning():
    from attnkit.generate.seq2seq import encode_sources

    window = left_pad([[1, 2], [3]], pad_id=0)
    with pytest.warns(DeprecationWarning, match="Window.attention_mask") as record:
        assert window.mask is window.attention_mask
    assert record[0].filename == __file__
    model, _ = tiny_model("encoder-decoder")
    source = encode_sources(model, [[1, 2], [3]], pad_id=0)
    with pytest.warns(DeprecationWarning, match="Source.src_mask"):
        assert source.mask is source.src_mask


@torch.no_grad()
@pytest.mark.parametrize("presence, frequency", [(2.0, 0.0), (0.0, 1.5), (0.7, -0.4)])
def test_presence_and_frequency_penalties_follow_the_reply_tokens_counts(presence, frequency):
    """OpenAI's definition, over each row's own reply (not its prompt): logit - count x frequency - (count > 0) x
    presence, recomputed here by whole passes, for two prompts in one batch."""
    model, config = tiny_model(seed=6)
    expected = []
    for prompt in PROMPTS[:2]:
        ids, counts = list(prompt), torch.zeros(config.vocab_size)
        for _ in range(10):
            logits = model(torch.tensor([ids])).logits[0, -1].float() - counts * frequency - (counts > 0) * presence
            token = int(logits.argmax())
            ids.append(token)
            counts[token] += 1
        expected.append(ids[len(prompt):])
    sampling = SamplingConfig(temperature=0.0, presence_penalty=presence, frequency_penalty=frequency)
    out = generate_tokens(model, PROMPTS[:2], max_new_tokens=10, context_len=config.max_seq_len, sampling=sampling)
    assert out == expected
    assert out != generate_tokens(model, PROMPTS[:2], max_new_tokens=10, context_len=config.max_seq_len)


@pytest.mark.parametrize(("window", "static"), [(None, False), (4, False), (None, True)])
def test_a_bf16_cache_decodes_an_fp32_model_close_to_its_own_cache(window, static):
    """A cache of another dtype than the model's stores its keys rounded to that dtype and gives them back in the
    model's (vLLM's kv_cache_dtype): a bf16 cache for an fp32 model failed in attention with a RuntimeError ('query,
    key, and value to have the same dtype'). Plain, rolling (sliding-window) and static caches alike."""
    model, _ = tiny_model(position="rope", seed=4, attention_window=window)
    model = model.float()
    steps = []
    for dtype in (torch.float32, torch.bfloat16):
        window_ids = left_pad([PROMPTS[1]], pad_id=0)
        cache = model.allocate_cache(1, 16, dtype=dtype, static=static)
        logits = [prefill(model, window_ids, cache)]
        if static:
            cache.mark_prefilled(window_ids.attention_mask)
        for token in (3, 7, 1, 12, 5):
            window_ids = window_ids.append(torch.tensor([token]))
            if static:
                cache.advance()
                logits.append(static_step(model, torch.tensor([[token]]), cache))
            else:
                logits.append(decode_one_token(model, window_ids, cache))
        assert all(step.dtype == torch.float32 for step in logits)
        steps.append(torch.stack(logits))
    assert not torch.equal(*steps)  # the bf16 cache did round
    torch.testing.assert_close(steps[1], steps[0], rtol=0.05, atol=0.05)


def test_a_kv_cache_of_no_floating_dtype_is_refused_naming_the_fix():
    model, _ = tiny_model()
    with pytest.raises(InputError, match=r"not torch.int8: give a floating dtype \(torch.bfloat16"):
        model.allocate_cache(1, 8, dtype=torch.int8)


class _CountReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the operators that read a tensor's value to the host (`int(t)`, `bool(t)`, `t.item()`) and the
    whole-tensor reductions the model's edge checks run (min, max, aminmax) as they are dispatched; a reduction along
    a dimension (greedy's max over the vocabulary, `max.dim`) stays on the device and is not one of them."""

    WATCHED = ("_local_scalar_dense", "min", "max", "aminmax")  # a read on a GPU; what the edge checks reduce

    def __init__(self) -> None:
        super().__init__()
        self.counts = {name: 0 for name in self.WATCHED}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, overload = (func.__name__.split(".") + ["default"])[:2]
        if name in self.counts and overload == "default":
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_decoding_steps_read_no_input_values_and_decode_the_same(position):
    """The prompt's values are checked once; the steps, whose tokens the model drew and whose positions the cache
    bounds, read nothing more: 8 new tokens make the reads 2 do, with the same tokens as the full forward passes."""
    model, config = tiny_model(position=position, seed=4)
    reads = {}
    for n in (2, 8):
        with _CountReads() as counter:
            out = generate_tokens(model, PROMPTS, max_new_tokens=n, context_len=config.max_seq_len)
        reads[n] = counter.counts
        assert out == [greedy_without_cache(model, prompt, n) for prompt in PROMPTS]
    assert reads[8] == reads[2], reads


def test_a_context_beyond_a_learned_position_table_is_refused_before_decoding():
    model, config = tiny_model(position="learned")
    with pytest.raises(InputError, match="context_len=48 is beyond the 24 positions"):
        generate_tokens(model, [[1, 2]], max_new_tokens=30, context_len=2 * config.max_seq_len)
    rotary, config = tiny_model(position="rope")  # rotations have no end: any context
    assert len(generate_tokens(rotary, [[1, 2]], max_new_tokens=30, context_len=2 * config.max_seq_len)[0]) == 30


def test_a_decoding_reads_the_models_position_table_once_for_every_generation(monkeypatch):
    """The context was checked against the position table by walking the model's modules at every generation (a
    server's every request): the decoding strategy, built once with the model, reads it once."""
    from attnkit.generate.decoder import EagerDecoding

    model, config = tiny_model(position="learned")
    decoding = EagerDecoding(model)
    walks = []
    modules = model.modules
    monkeypatch.setattr(model, "modules", lambda: walks.append(1) or modules())
    for _ in range(2):
        generate_tokens(model, [[1, 2]], max_new_tokens=3, context_len=config.max_seq_len, decoding=decoding)
        with pytest.raises(InputError, match="context_len=48 is beyond the 24 positions"):
            generate_tokens(model, [[1, 2]], max_new_tokens=3, context_len=48, decoding=decoding)
    assert not walks


def test_min_new_tokens_is_checked_in_one_place_against_max_new_tokens_by_the_library_and_decode_n_tokens():
    """min_new_tokens beyond max_new_tokens was accepted by the library (the server refused it), and decode_n_tokens
    took any min_new_tokens unchecked: both now refuse it through sampling.check_min_new_tokens, as the server does."""
    from attnkit.generate.decoder import EagerDecoding, decode_n_tokens

    model, config = tiny_model(position="rope")
    with pytest.raises(InputError, match="min_new_tokens=5 is more than max_new_tokens=4"):
        generate_tokens(model, [[1, 2]], max_new_tokens=4, min_new_tokens=5, context_len=config.max_seq_len)
    decoding = EagerDecoding(model)
    window = left_pad([[1, 2]], pad_id=0, device="cpu")
    cache = decoding.allocate(1, 8, config.max_seq_len)
    logits = decoding.prefill(window, cache)
    for bad, message in ((-1, "min_new_tokens=-1 must be an integer >= 0"), (7, "is more than max_new_tokens=6")):
        with pytest.raises(InputError, match=message):
            decode_n_tokens(model, window, cache, logits, 6, context_len=config.max_seq_len, min_new_tokens=bad)
