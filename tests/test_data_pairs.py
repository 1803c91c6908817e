"""Parallel corpora: reading, padded batches that never mix padding into real tokens, bucketing, resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import shared

from attnkit.data.batching import IGNORE_INDEX, pad
from attnkit.data.pairs import PairBatch, PairData, read_parallel, read_tsv_pairs
from attnkit.data.synthetic import make_task, synthetic_tokenizer
from attnkit.errors import InputError
from attnkit.tokenize import CharTokenizer


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return synthetic_tokenizer()


@pytest.fixture(scope="module")
def data(tok: CharTokenizer) -> PairData:
    return PairData.from_pairs(make_task("reverse", 500, seed=0, min_len=1, max_len=20).pairs(), tok, batch_size=16)


def test_read_parallel_and_tsv(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_text("ein Hund\nzwei Katzen\n\ndrei\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("a dog\r\ntwo cats\r\nnothing\r\nthree\r\n", encoding="utf-8")
    pairs = read_parallel(tmp_path / "train.de", tmp_path / "train.en")
    assert pairs == [("ein Hund", "a dog"), ("zwei Katzen", "two cats"), ("drei", "three")]  # empty side skipped
    (tmp_path / "pairs.tsv").write_text("ein Hund\ta dog\n\nzwei\ttwo\n", encoding="utf-8")
    assert read_tsv_pairs(tmp_path / "pairs.tsv") == [("ein Hund", "a dog"), ("zwei", "two")]


def test_tsv_pairs_are_read_raw_or_quoted_as_labelled_tsvs_are(tmp_path: Path) -> None:
    """Pairs read by the rule of `read_labelled`'s TSVs: quoted where csv wrote them (a text holding a line break
    or a tab read whole, where each line was a row), raw otherwise (a quote opened on one line and closed on the
    next is two rows' text)."""
    import csv

    pairs = [("two\nlines", "deux lignes"), ("a\ttab", "une tabulation"), ('"quoted"', "«cité»")]
    with open(tmp_path / "quoted.tsv", "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows(pairs)
    assert read_tsv_pairs(tmp_path / "quoted.tsv") == pairs
    (tmp_path / "raw.tsv").write_text('" hello\tbonjour\nworld "\tmonde\n"a title"\tun titre\n', encoding="utf-8")
    assert read_tsv_pairs(tmp_path / "raw.tsv") == [('" hello', "bonjour"), ('world "', "monde"),
                                                    ('"a title"', "un titre")]


def test_mismatched_line_counts_name_both(tmp_path: Path) -> None:
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    with pytest.raises(InputError, match=r"a.de has 3 lines, .*a.en has 2"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")


def test_bad_pair_files_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.tsv").write_text("ok\tfine\nno tab here\n")
    with pytest.raises(InputError, match=r"bad.tsv, line 2: .*no tab"):
        read_tsv_pairs(tmp_path / "bad.tsv")
    (tmp_path / "empty.de").write_text("")
    (tmp_path / "x.en").write_text("x\n")
    with pytest.raises(InputError, match="empty.de is empty"):
        read_parallel(tmp_path / "empty.de", tmp_path / "x.en")
    (tmp_path / "blank.tsv").write_text("\t\n \tx\n")
    with pytest.raises(InputError, match="no pairs with text on both sides"):
        read_tsv_pairs(tmp_path / "blank.tsv")


def test_a_third_column_is_refused_not_read_into_the_target(tmp_path: Path) -> None:
    """Tatoeba's pairs (source, target, attribution): the attribution would be translated as part of the target."""
    (tmp_path / "tatoeba.tsv").write_text("Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272\n")
    with pytest.raises(InputError, match=r"tatoeba.tsv, line 1: .*found 3 columns; .*cut -f1,2"):
        read_tsv_pairs(tmp_path / "tatoeba.tsv")


def _check_batch(batch: PairBatch, data: PairData, indices: np.ndarray, tok: CharTokenizer) -> None:
    assert batch.src_ids.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.int64
    assert batch.src_mask.dtype == batch.tgt_mask.dtype == torch.bool
    for row, i in enumerate(indices):
        src, tgt = data.src[i], data.tgt[i]
        n_src, n_tgt = len(src), len(tgt) - 1
        assert batch.src_mask[row].tolist() == [True] * n_src + [False] * (batch.src_ids.shape[1] - n_src)
        assert batch.tgt_mask[row].tolist() == [True] * n_tgt + [False] * (batch.tgt_in.shape[1] - n_tgt)
        real_src = batch.src_ids[row][batch.src_mask[row]]
        assert real_src.tolist() == list(src) and tok.pad_id not in real_src[:-1].tolist()
        assert real_src[-1] == tok.eos_id
        assert (batch.src_ids[row][~batch.src_mask[row]] == tok.pad_id).all()
        assert batch.tgt_in[row, 0] == tok.bos_id and batch.tgt_in[row][batch.tgt_mask[row]].tolist() == list(tgt[:-1])
        assert batch.tgt_out[row][batch.tgt_mask[row]].tolist() == list(tgt[1:])
        assert batch.tgt_out[row, n_tgt - 1] == tok.eos_id
        assert (batch.tgt_out[row][~batch.tgt_mask[row]] == IGNORE_INDEX).all()
        assert (batch.tgt_in[row][~batch.tgt_mask[row]] == tok.pad_id).all()


def test_batches_never_mix_padding_into_real_tokens(data: PairData, tok: CharTokenizer) -> None:
    order = data.batch_order(epoch=0)
    assert len(order) == data.num_batches
    for index, indices in enumerate(order):
        _check_batch(data.batch(0, index), data, indices, tok)


def test_every_example_once_per_epoch_deterministic_and_resumable(data: PairData) -> None:
    for epoch in range(3):
        seen = np.concatenate(data.batch_order(epoch))
        assert sorted(seen.tolist()) == list(range(len(data)))
        assert len(data.batch_order(epoch)) == data.num_batches
    assert [b.tolist() for b in data.batch_order(1)] != [b.tolist() for b in data.batch_order(0)]
    twin = PairData(data.src, data.tgt, src_pad_id=data.src_pad_id, tgt_pad_id=data.tgt_pad_id, batch_size=16)
    assert [b.tolist() for b in twin.batch_order(2)] == [b.tolist() for b in data.batch_order(2)]
    resumed = list(data.iter_epoch(1, start=5))
    full = list(data.iter_epoch(1))
    assert len(resumed) == len(full) - 5
    for a, b in zip(resumed, full[5:], strict=True):
        torch.testing.assert_close(a.tgt_out, b.tgt_out)


def test_bucketing_cuts_padding(data: PairData) -> None:
    bucketed = sum(data.batch(0, i).src_mask.numel() for i in range(data.num_batches))
    unsorted = PairData(data.src, data.tgt, src_pad_id=0, tgt_pad_id=0, batch_size=16, bucket_batches=1)
    random_batches = sum(unsorted.batch(0, i).src_mask.numel() for i in range(unsorted.num_batches))
    assert bucketed < 0.8 * random_batches


def test_eval_batches_cover_all_in_fixed_order(data: PairData) -> None:
    batches = list(data.eval_batches())
    assert sum(b.src_ids.shape[0] for b in batches) == len(data)
    assert [b.src_ids.shape[1] for b in batches] == sorted(b.src_ids.shape[1] for b in batches)


def test_max_len_and_separate_tokenizers() -> None:
    src_tok, tgt_tok = CharTokenizer("abc"), CharTokenizer("xyz")
    data = PairData.from_pairs([("abcabc", "xyzxyzxyz")], src_tok, tgt_tok, max_len=4, batch_size=1)
    batch = data.batch(0, 0)
    assert batch.src_ids.tolist() == [[0, 1, 2, src_tok.eos_id]]
    assert batch.tgt_in.tolist() == [[tgt_tok.bos_id, 0, 1, 2]]
    assert batch.tgt_out.tolist() == [[0, 1, 2, tgt_tok.eos_id]]
    assert batch.to("cpu").n_tgt_tokens == 4
    with pytest.raises(InputError, match="max_len"):
        PairData.from_pairs([("a", "x")], src_tok, tgt_tok, max_len=1)


def test_pad_helper() -> None:
    ids, mask = pad([[5, 6, 7], [8]], value=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    ids, mask = pad([[5, 6, 7], [], [8]], value=-1, left=True)
    assert ids.tolist() == [[5, 6, 7], [-1, -1, -1], [-1, -1, 8]]
    assert mask.tolist() == [[True, True, True], [False, False, False], [False, False, True]]
    with pytest.raises(InputError, match="no sequences"):
        pad([], value=0)


def test_multi30k_val_reads_line_aligned() -> None:
    de, en = shared("multi30k", "val.de"), shared("multi30k", "val.en")
    pairs = read_parallel(de, en)
    assert len(pairs) == 1014
    tok = CharTokenizer.from_texts(s + t for s, t in pairs)
    data = PairData.from_pairs(pairs, tok, batch_size=64)
    batch = data.batch(0, 0)
    assert batch.src_ids.shape[0] == 64 and tok.decode(batch.tgt_in[0].tolist()) in {t for _, t in pairs}


def test_pairs_with_a_missing_side_are_skipped_naming_their_lines(tmp_path: Path, caplog) -> None:
    """The warning counted the pairs skipped and named none of them: a side missing or shifted was not found."""
    (tmp_path / "pairs.tsv").write_text("ein Hund\ta dog\n\nzwei\t\n\tthree\nvier\tfour\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="attnkit.data.pairs"):
        assert read_tsv_pairs(tmp_path / "pairs.tsv") == [("ein Hund", "a dog"), ("vier", "four")]
    assert "pairs.tsv: skipped 2 of 4 pairs with an empty side (line 3, 4)" in caplog.text
    (tmp_path / "a.de").write_text("".join(f"{n}\n" if n % 2 else "\n" for n in range(14)), encoding="utf-8")
    (tmp_path / "a.en").write_text("".join(f"{n}\n" for n in range(14)), encoding="utf-8")
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnkit.data.pairs"):
        assert len(read_parallel(tmp_path / "a.de", tmp_path / "a.en")) == 7
    assert "skipped 7 of 14 pairs with an empty side (line 1, 3, 5, 7, 9 and 2 more)" in caplog.text


def test_a_translation_folder_reads_gzip_compressed_language_files(tmp_path: Path) -> None:
    """train.de.gz / train.en.gz (and valid.*.gz) are read as train.de / train.en are; the languages listed are de
    and en, not gz."""
    import gzip

    from attnkit.errors import ConfigError
    from attnkit.tasks.translate import pairs
    from attnkit.train.job import DataConfig

    for name, de, en in (("train", "ein Hund\nzwei Katzen\n", "a dog\ntwo cats\n"), ("valid", "drei\n", "three\n")):
        (tmp_path / f"{name}.de.gz").write_bytes(gzip.compress(de.encode()))
        (tmp_path / f"{name}.en.gz").write_bytes(gzip.compress(en.encode()))
    data = DataConfig(task="translate", data=(str(tmp_path),), src_lang="de", tgt_lang="en")
    assert pairs(data, seed=0) == ([("ein Hund", "a dog"), ("zwei Katzen", "two cats")], [("drei", "three")])
    (tmp_path / "train.fr").write_text("un chien\ndeux chats\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"suffixes \['de', 'en', 'fr'\]"):
        pairs(DataConfig(task="translate", data=(str(tmp_path),)), seed=0)
    train, val = pairs(DataConfig(task="translate", data=(str(tmp_path),), src_lang="fr", tgt_lang="en"), seed=0)
    assert sorted(train + val) == [("deux chats", "two cats"), ("un chien", "a dog")]  # plain beside gzip-compressed
    with pytest.raises(InputError, match=r"holds no train\.it or train\.it\.gz \(its train\.\* files"):
        pairs(DataConfig(task="translate", data=(str(tmp_path),), src_lang="it", tgt_lang="en"), seed=0)
