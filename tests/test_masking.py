"""BERT's masking: the 15% / 80-10-10 rates over many batches, special tokens untouched, loss only where masked,
and the same generator state giving the same masks (what bit-exact resume relies on)."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.data.batching import IGNORE_INDEX
from attnkit.data.masking import mask_tokens
from attnkit.errors import ConfigError, InputError

VOCAB = 50
PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIALS = (PAD, CLS, SEP, MASK)


def batch(generator, size=16, length=64):
    """CLS words SEP PAD...: rows of different lengths, words drawn from the non-special ids."""
    ids = torch.randint(4, VOCAB, (size, length), generator=generator)
    lengths = torch.randint(8, length + 1, (size,), generator=generator)
    for row, n in enumerate(lengths.tolist()):
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        ids[row, n:] = PAD
    return ids


def mask(ids, generator, **rates):
    return mask_tokens(ids, mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, generator=generator, **rates)


def test_rates_over_many_batches_match_bert():
    data_gen, mask_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    maskable = chosen = as_mask = as_random = kept = 0
    for _ in range(200):
        ids = batch(data_gen)
        inputs, labels = mask(ids, mask_gen)
        ordinary = ~torch.isin(ids, torch.tensor(SPECIALS))
        picked = labels != IGNORE_INDEX
        maskable += int(ordinary.sum())
        chosen += int(picked.sum())
        as_mask += int((picked & (inputs == MASK)).sum())
        kept += int((picked & (inputs == ids)).sum())
        as_random += int((picked & (inputs != MASK) & (inputs != ids)).sum())
    assert chosen > 15_000
    assert abs(chosen / maskable - 0.15) < 0.005
    assert abs(as_mask / chosen - 0.8) < 0.01
    # a random replacement equals the original with probability 1/46: it then counts as kept
    assert abs(as_random / chosen - 0.1 * 45 / 46) < 0.01
    assert abs(kept / chosen - (0.1 + 0.1 / 46)) < 0.01


def test_other_rates_are_followed():
    generator = torch.Generator().manual_seed(2)
    ids = batch(torch.Generator().manual_seed(3), size=64)
    inputs, labels = mask(ids, generator, mask_prob=0.5, mask_token_prob=0.0, random_token_prob=1.0)
    picked = labels != IGNORE_INDEX
    ordinary = ~torch.isin(ids, torch.tensor(SPECIALS))
    assert abs(int(picked.sum()) / int(ordinary.sum()) - 0.5) < 0.03
    assert not bool((inputs == MASK).any())  # nothing becomes [MASK] when its share is 0


def test_special_tokens_are_never_chosen_nor_used_as_replacements():
    generator = torch.Generator().manual_seed(4)
    for seed in range(20):
        ids = batch(torch.Generator().manual_seed(seed))
        inputs, labels = mask(ids, generator, mask_prob=0.9, mask_token_prob=0.0, random_token_prob=1.0)
        special = torch.isin(ids, torch.tensor(SPECIALS))
        assert bool((labels[special] == IGNORE_INDEX).all())
        assert torch.equal(inputs[special], ids[special])
        assert not bool(torch.isin(inputs[~special], torch.tensor(SPECIALS)).any())


def test_labels_hold_the_original_ids_and_unmasked_positions_carry_no_loss():
    generator = torch.Generator().manual_seed(5)
    ids = batch(torch.Generator().manual_seed(6))
    inputs, labels = mask(ids, generator)
    picked = labels != IGNORE_INDEX
    assert torch.equal(labels[picked], ids[picked])
    assert torch.equal(inputs[~picked], ids[~picked])  # what is not predicted is not changed

    logits = torch.randn(*ids.shape, VOCAB, requires_grad=True)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    grad_norm = logits.grad.norm(dim=-1)  # (B, T)
    assert bool((grad_norm[~picked] == 0).all())
    assert bool((grad_norm[picked] > 0).all())
    expected = F.cross_entropy(logits[picked], ids[picked])  # the mean over the masked positions alone
    torch.testing.assert_close(loss, expected)


def test_the_generator_state_decides_the_masks():
    ids = batch(torch.Generator().manual_seed(7))
    generator = torch.Generator().manual_seed(8)
    state = generator.get_state()
    first = mask(ids, generator)
    second = mask(ids, generator)
    assert not torch.equal(first[1], second[1])  # a new draw for each batch
    generator.set_state(state)
    again = mask(ids, generator)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_a_batch_always_has_a_masked_position():
    ids = torch.tensor([[CLS, 10, 11, SEP]])
    for seed in range(50):
        _, labels = mask(ids, torch.Generator().manual_seed(seed), mask_prob=0.01)
        assert int((labels != IGNORE_INDEX).sum()) >= 1


def test_bad_settings_and_ids_are_refused():
    generator = torch.Generator().manual_seed(0)
    ids = batch(torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="mask_prob"):
        mask(ids, generator, mask_prob=0.0)
    with pytest.raises(ConfigError, match="sum to"):
        mask(ids, generator, mask_token_prob=0.8, random_token_prob=0.3)
    with pytest.raises(InputError, match="token ids must lie"):
        mask(ids + VOCAB, generator)
    with pytest.raises(InputError, match="mask_id"):
        mask_tokens(ids, mask_id=7, vocab_size=VOCAB, special_ids=SPECIALS, generator=generator)
