"""Packed sequences (`data/packing.py`, `attnkit train --pack`): whole documents fill rows, a document mask keeps them
apart and positions restart at each, so a packed batch's loss and gradients are those of its documents trained one
per row."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnkit import ModelConfig, build_model, cli
from attnkit.data.batching import IGNORE_INDEX
from attnkit.data.packing import document_ends, pack_rows, pieces
from attnkit.tokenize import CharTokenizer


def test_rows_hold_whole_documents_in_order_with_their_own_positions():
    tokens = np.arange(100, 113)  # documents [100..103], [104..108], [109..112]
    cut = pieces(np.array([4, 9, 13]), seq_len=6)
    assert cut.tolist() == [[0, 4], [4, 9], [9, 13]]
    rows = pack_rows(tokens, cut, 6)
    assert rows.input_ids.tolist() == [[100, 101, 102, 0, 0, 0], [104, 105, 106, 107, 0, 0], [109, 110, 111, 0, 0, 0]]
    packed = pack_rows(tokens, cut, 8)  # 3 + 4 positions fit in a row of 8; the third document starts the next
    assert packed.input_ids[0].tolist() == [100, 101, 102, 104, 105, 106, 107, 0]
    assert packed.labels[0].tolist() == [101, 102, 103, 105, 106, 107, 108, IGNORE_INDEX]
    assert packed.documents[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert packed.positions[0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert packed.real_tokens == rows.real_tokens == 10 and packed.padding_share < rows.padding_share


def test_a_long_document_is_cut_so_that_each_target_is_predicted_once():
    cut = pieces(np.array([10]), seq_len=4)
    assert cut.tolist() == [[0, 5], [4, 9], [8, 10]]  # targets 1-4, 5-8, 9


def test_documents_end_after_eos_and_with_lines_after_each_line_break():
    tokenizer = CharTokenizer(list("ab\n"))
    ids = np.array(tokenizer.encode("ab\nba\nab") + [tokenizer.eos_id] + tokenizer.encode("bb"))
    assert document_ends(ids, tokenizer, "files").tolist() == [9, 11]
    assert document_ends(ids, tokenizer, "lines").tolist() == [3, 6, 9, 11]


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_documents_one_per_row(position):
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=30, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=16,
                         position=position, dropout=0.0)
    model = build_model(config).double()
    rng = np.random.default_rng(0)
    documents = [rng.integers(1, 30, n) for n in (5, 7, 3, 9, 4)]
    tokens = np.concatenate(documents)
    cut = pieces(np.cumsum([len(d) for d in documents]), seq_len=12)
    rows = pack_rows(tokens, cut, 12)
    assert len(rows.labels) == 2  # 4 + 6 + 2 positions, then 8 + 3 and padding
    packed = rows.batch(np.arange(2))
    loss = model(packed.input_ids, labels=packed.labels, position_ids=packed.position_ids,
                 document_ids=packed.document_ids).loss
    packed_grads = torch.autograd.grad(loss, list(model.parameters()))
    total, count = 0.0, 0
    for document in documents:
        ids = torch.from_numpy(document).long()[None]
        total = total + model(ids[:, :-1], labels=ids[:, 1:]).loss * (len(document) - 1)
        count += len(document) - 1
    assert count == int((packed.labels != IGNORE_INDEX).sum())
    alone = total / count
    torch.testing.assert_close(loss, alone)
    for got, expected in zip(packed_grads, torch.autograd.grad(alone, list(model.parameters())), strict=True):
        torch.testing.assert_close(got, expected)


def test_attnkit_train_pack_trains_on_packed_rows_and_counts_real_tokens(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("".join(f"a short line {i} of text\n" for i in range(300)))
    out = tmp_path / "run"
    assert cli.main(["train", "--out", str(out), "--data", str(text), "--tokenizer", "char", "--pack", "lines",
                     "--max-steps", "2", "--batch-size", "2", "--seq-len", "32", "--no-progress", "--eval-every", "2",
                     "--set", "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=32"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tokens = [r["tokens"] for r in records if r.get("kind") == "train"]
    assert 0 < tokens[0] < 2 * 32  # real tokens: a row of 32 holds one line of 21-23 characters and its neighbours,
    assert tokens[0] >= 2 * 32 - 2 * 23  # with less than a line's padding at its end


def test_pack_refuses_a_recurrent_model_naming_the_fix(tmp_path, capsys):
    text = tmp_path / "lines.txt"
    text.write_text("a line of text\n" * 200)
    assert cli.main(["train", "--out", str(tmp_path / "run"), "--data", str(text), "--tokenizer", "char", "--pack",
                     "--max-steps", "1", "--preset", "lstm-lm-tiny", "--no-progress"]) == 2
    assert "no attention to mask: drop --pack" in capsys.readouterr().err
