"""Checks every language model with a decoding state of its own (`models.stateful_lm.StatefulLM`: the convolutional
and feed-forward LMs) must pass: stepping through the state over left-padded rows equals each row alone, greedy
generation equals recomputation from scratch past the context, the state's reorder follows its rows, a step of
another batch than the state's is refused, a short run
learns, bad inputs are clear errors, and the family trains, resumes bit for bit and generates from the command
line. Where a family declares a receptive field, the model reads exactly that many tokens; its config refuses what
cannot work, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import cli
from attnkit.checkpoint import load_config, load_model
from attnkit.config import ModelConfig
from attnkit.errors import ConfigError, InputError
from attnkit.generate import generate_tokens


def assert_steps_through_the_state_equal_each_row_alone(model, vocab: int, lengths=(20, 14), prefill: int = 8):
    """A prefill of `prefill` columns then one token a step, the shorter row left-padded: each row's real positions
    get the logits of a pass over that row alone. Returns the state after the last step."""
    rows = [torch.randint(0, vocab, (n,)).tolist() for n in lengths]
    width = max(lengths)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    state = model.allocate_cache(len(rows))
    with torch.no_grad():
        steps = [model(ids[:, :prefill], attention_mask=mask[:, :prefill], cache=state).logits]
        for t in range(prefill, width):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, : t + 1], cache=state).logits)
        stepped = torch.cat(steps, dim=1)  # (B, T, V)
        for row, (tokens, padded) in enumerate(zip(rows, mask, strict=True)):
            alone = model(torch.tensor([tokens])).logits[0]
            torch.testing.assert_close(stepped[row][padded.bool()], alone, rtol=1e-5, atol=1e-5)
    assert state.length == width
    return state


def assert_greedy_generation_equals_recomputation(model, new_tokens: int = 25, context_len: int = 8) -> None:
    """`generate_tokens` through the state equals the argmax of passes from scratch, past `context_len`: the state
    never fills, so the window never slides."""
    prompts = [[3, 4, 5, 6, 7], [8, 9]]
    generated = generate_tokens(model, prompts, max_new_tokens=new_tokens, context_len=context_len)
    for prompt, tokens in zip(prompts, generated, strict=True):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(new_tokens):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert tokens == ids[len(prompt):]


def assert_reorder_follows_rows(model, vocab: int) -> None:
    """A state reordered to rows [2, 0] continues as a state that read those rows alone."""
    ids = torch.randint(0, vocab, (3, 6))
    state, reordered = model.allocate_cache(3), model.allocate_cache(2)
    with torch.no_grad():
        model(ids, cache=state)
        state.reorder(torch.tensor([2, 0]))
        model(ids[[2, 0]], cache=reordered)
        following = torch.tensor([[1], [5]])
        torch.testing.assert_close(model(following, cache=state).logits, model(following, cache=reordered).logits)


def train_resume_and_generate(preset: str, tmp_path: Path, capsys, *, explain: bool = False) -> ModelConfig:
    """`attnkit train --preset PRESET` for 6 steps in one run and in two (--resume between), equal to the bit;
    `attnkit generate` prints what `attnkit.load(run).generate` returns. Returns the run's config."""
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. the dog sat on the log. " * 40)
    common = ["--preset", preset, "--data", str(text), "--tokenizer", "char", "--batch-size", "4",
              "--eval-every", "3", "--no-progress", "--sample-tokens", "0", "--set", "max_seq_len=32",
              "--set", "dropout=0.1", "--set", "eval_batches=2"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    shown = ["--explain"] if explain else []
    assert cli.main(["train", *common, "--out", str(whole), "--max-steps", "6", *shown]) == 0
    if explain:
        assert "training plan" in capsys.readouterr().err
    assert cli.main(["train", *common, "--out", str(split), "--max-steps", "3"]) == 0
    assert cli.main(["train", "--out", str(split), "--resume", "--max-steps", "6", "--no-progress",
                     "--sample-tokens", "0"]) == 0
    a, b = load_model(whole)[0].state_dict(), load_model(split)[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # resumed bit for bit

    expected = attnkit.load(whole, device="cpu").generate("the c", max_new_tokens=40, temperature=0)[0]
    capsys.readouterr()
    assert cli.main(["generate", "--run", str(whole), "--prompt", "the c", "--max-new-tokens", "40",
                     "--temperature", "0", *shown]) == 0
    captured = capsys.readouterr()
    assert expected in captured.out
    if explain:
        assert "inference plan" in captured.err
    return load_config(whole)


def assert_a_short_run_halves_the_loss(model, make_batch, steps: int = 60) -> None:
    """Adam at 1e-2 for `steps` steps on `make_batch()` ids (B, T), each predicting the next: the loss starts near
    ln(V) (above 2 for 11 tokens) and its last 5 steps average under half the first."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        ids = make_batch()
        loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 2.0
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]


def assert_bad_inputs_are_clear_errors(model, vocab: int) -> None:
    """An id outside the vocabulary, and padding between real tokens, are InputErrors naming the problem."""
    with pytest.raises(InputError, match="vocabulary|vocab"):
        model(torch.tensor([[vocab]]))
    with pytest.raises(InputError, match="padding between real tokens"):
        model(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[1, 0, 1]]))


def assert_a_step_of_another_batch_is_refused(model, vocab: int) -> None:
    """After a prefill of 3 rows, a step of 2 rows, or of 1 (which a running average broadcast over all 3, silently),
    is an InputError naming the state, both sizes and the fix; the state is left as the prefill left it."""
    state = model.allocate_cache(3)
    with torch.no_grad():
        model(torch.randint(0, vocab, (3, 4)), cache=state)
        name = type(state).__name__
        for rows in (2, 1):
            pattern = rf"^the {name} holds 3 sequences but input_ids holds {rows}; .*batch_size={rows}$"
            with pytest.raises(InputError, match=pattern):
                model(torch.zeros(rows, 1, dtype=torch.long), cache=state)
    assert state.rows == 3 and state.length == 4


def assert_the_last_prediction_reads_exactly(model, reach: int, vocab: int) -> None:
    """Over a text of reach + 5 tokens, the token reach - 1 positions before the last (just inside) changes the last
    logits; the one reach back (just outside), and every one before it, changes nothing."""
    length = reach + 5
    ids = torch.randint(0, vocab, (1, length))
    last = length - 1

    def last_logits(position: int | slice) -> torch.Tensor:
        changed = ids.clone()
        changed[0, position] = (changed[0, position] + 1) % vocab
        return model(changed).logits[0, -1]

    with torch.no_grad():
        base = model(ids).logits[0, -1]
        assert not torch.allclose(last_logits(last - reach + 1), base)  # just inside
        torch.testing.assert_close(last_logits(last - reach), base, rtol=0, atol=0)  # just outside
        torch.testing.assert_close(last_logits(slice(0, last - reach + 1)), base, rtol=0, atol=0)  # all outside


def assert_config_refuses(family: str, fields: dict, words: list[str]) -> None:
    """`ModelConfig(family=family, **fields)` raises a ConfigError whose message holds every one of `words` (the
    fields at fault and the fix)."""
    with pytest.raises(ConfigError) as err:
        ModelConfig(family=family, **fields)
    for word in words:
        assert word in str(err.value)
