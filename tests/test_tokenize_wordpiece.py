"""WordPiece (BERT's tokenizer, trained here): its splits and ids equal transformers' BertTokenizerFast built from the
same vocabulary, uncased and cased; round trips; BERT's special tokens; the saved form; the command line; tagging's
word-to-piece map against BertTokenizerFast's word_ids; and a masked-LM run on it."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_data import shared

import attnkit
from attnkit.cli import main
from attnkit.errors import ConfigError, InputError
from attnkit.tasks.tag import align
from attnkit.tokenize import HFTokenizer, load_tokenizer, train_tokenizer, train_wordpiece

SENTENCES = [
    "To be, or not to be: that is the question.",
    "  ROMEO:\r\nWhither\tgo'st thou, Juliet?",
    "Café naïve ÆRØ façade 日本語 😀 don't",
    "[MASK] and [CLS] are text here; so is <eos>.",
    "unbelievably-long-hyphenated words and 12,345.67 numbers",
]


def _bert_fast(tokenizer: HFTokenizer, directory: Path, *, lowercase: bool):
    """transformers' BertTokenizerFast built from `tokenizer`'s vocabulary alone (a vocab.txt in id order)."""
    transformers = pytest.importorskip("transformers")
    vocab = json.loads(tokenizer.to_str())["model"]["vocab"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("".join(f"{t}\n" for t in sorted(vocab, key=vocab.get)), encoding="utf-8")
    # split_special_tokens: "[MASK]" in a text is text, as attnkit reads it (the data code places special tokens)
    return transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=lowercase,
                                          split_special_tokens=True)


@pytest.fixture(scope="module")
def shakespeare() -> list[Path]:
    return [shared("tinyshakespeare", "input.txt")]


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_wordpiece_splits_as_bert_tokenizer_fast_from_the_same_vocab(shakespeare, tmp_path, lowercase):
    tok = train_tokenizer("wordpiece", shakespeare, vocab_size=2000, lowercase=lowercase)
    assert tok.kind == "wordpiece" and tok.vocab_size == 2000
    bert = _bert_fast(tok, tmp_path, lowercase=lowercase)
    for text in SENTENCES:
        ids = tok.encode(text)
        assert tok.pieces(ids) == bert.tokenize(text), text
        assert [tok.cls_id, *ids, tok.sep_id] == bert(text)["input_ids"], text
        assert tok.decode(ids) == bert.decode(ids, skip_special_tokens=True), text
    pieces = tok.pieces(tok.encode("ROMEO Whither"))
    assert (pieces[0] == "romeo") == lowercase and any(p.startswith("##") for p in pieces)


@pytest.fixture(scope="module")
def uncased_and_bert(shakespeare, tmp_path_factory):
    tok = train_tokenizer("wordpiece", shakespeare, vocab_size=2000)
    return tok, _bert_fast(tok, tmp_path_factory.mktemp("vocab"), lowercase=True)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00")))
def test_wordpiece_ids_equal_bert_tokenizer_fasts_on_drawn_text(uncased_and_bert, text):
    """Any UTF-8 text (control characters, accents, CJK, emoji, punctuation runs): the same ids as BertTokenizerFast."""
    tok, bert = uncased_and_bert
    assert [tok.cls_id, *tok.encode(text), tok.sep_id] == bert(text)["input_ids"]


@settings(max_examples=100, deadline=None)
@given(words=st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGH", min_size=1, max_size=12),
                      min_size=0, max_size=8))
def test_wordpiece_round_trip_gives_the_normalized_text(words):
    """decode(encode(s)) is the text as BERT's normalizer leaves it: lower-cased, one space between words. Words
    made of the training text's letters never fall back to [UNK]."""
    tok = _small_wordpiece()
    text = " ".join(words)
    assert tok.decode(tok.encode(text)) == text.lower()
    assert tok.unk_id not in tok.encode(text)


@functools.cache
def _small_wordpiece() -> HFTokenizer:
    return train_wordpiece(["the quick brown fox jumps over the lazy dog " * 5, "abcdefghijklmnopqrstuvwxyz"],
                           vocab_size=200)


def test_wordpiece_has_berts_special_tokens_and_reads_them_in_text_as_text():
    tok = _small_wordpiece()
    assert tok.specials == {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]", "mask": "[MASK]",
                            "cls": "[CLS]", "sep": "[SEP]"}
    assert tok.pieces([tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]) == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tok.bos_id, tok.eos_id) == (tok.cls_id, tok.sep_id)
    assert tok.own_frame == ((tok.cls_id,), (tok.sep_id,)) and not tok.space_starts_word
    assert tok.mask_id not in tok.encode("[MASK]") and len(tok.encode("[MASK]")) > 1  # brackets and letters
    assert tok.encode("😀") == [tok.unk_id]  # a character it never saw: the word is [UNK], as in BERT


def test_wordpiece_saves_and_loads_as_the_same_tokenizer(tmp_path):
    tok = _small_wordpiece()
    tok.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert isinstance(back, HFTokenizer) and back.kind == "wordpiece"
    assert back.fingerprint() == tok.fingerprint() and back.specials == tok.specials
    assert back.encode("the lazy fox") == tok.encode("the lazy fox")
    assert train_wordpiece(["the quick fox " * 3], vocab_size=200, lowercase=False).fingerprint() != (
        train_wordpiece(["the quick fox " * 3], vocab_size=200).fingerprint())


def test_the_same_text_trains_the_same_wordpiece(tmp_path):
    """tokenizers' WordPieceTrainer numbers its '##' pieces in hash order (huggingface/tokenizers#1794): the same text
    gave a different vocabulary each time. Their pieces are numbered first now, as plain pieces of the vocabulary."""
    draw = random.Random(0)
    syllables = ["ka", "to", "ri", "mu", "sen", "dal", "o", "e", "ith", "qua", "ven", "lor", "é", "ß"]
    words = ["".join(draw.choices(syllables, k=draw.randint(1, 4))) for _ in range(400)]
    text = "\n".join(" ".join(draw.choices(words, k=12)) + "." for _ in range(800))
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    trained = [train_wordpiece([text], vocab_size=200) for _ in range(3)]
    trained.append(train_tokenizer("wordpiece", [tmp_path / "text.txt"], vocab_size=200))
    assert len({tok.fingerprint() for tok in trained}) == 1
    tok = trained[0]
    special = json.loads(tok.to_str())["added_tokens"]
    assert sorted(added["content"] for added in special) == ["[CLS]", "[MASK]", "[PAD]", "[SEP]", "[UNK]"]
    assert tok.decode(tok.encode("kato ritoe")) == "kato ritoe"  # '##' pieces are text, not skipped as special


def test_wordpiece_bad_sizes_and_empty_text_are_clear_errors():
    with pytest.raises(ConfigError, match="too small for WordPiece"):
        train_wordpiece(["abc"], vocab_size=5)
    with pytest.raises(InputError, match="the training text is empty: a WordPiece"):
        train_tokenizer("wordpiece", ["", ""], vocab_size=100)
    with pytest.raises(ConfigError, match="a wordpiece tokenizer needs vocab_size"):
        train_tokenizer("wordpiece", ["abc"])


def test_tokenizer_train_command_trains_a_cased_or_uncased_wordpiece(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("Paris is the Capital of France.\n" * 20, encoding="utf-8")
    for flags, name in (([], "uncased"), (["--no-lowercase"], "cased")):
        assert main(["tokenizer", "train", "--kind", "wordpiece", "--data", str(text), "--vocab-size", "100",
                     "--out", str(tmp_path / name), *flags]) == 0
    assert "wordpiece tokenizer" in capsys.readouterr().out
    assert load_tokenizer(tmp_path / "uncased").pieces(load_tokenizer(tmp_path / "uncased").encode("Paris"))[0] == (
        "paris")
    cased = load_tokenizer(tmp_path / "cased")
    assert cased.pieces(cased.encode("Paris"))[0] == "Paris"
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "cased"), "--text", "Paris"]) == 0
    assert "Paris" in capsys.readouterr().out
    assert main(["tokenizer", "train", "--kind", "bpe", "--no-lowercase", "--data", str(text),
                 "--out", str(tmp_path / "b")]) == 2
    assert "--no-lowercase keeps the case of a WordPiece" in capsys.readouterr().err


def test_tagging_maps_wordpieces_to_words_as_bert_word_ids(shakespeare, tmp_path):
    """A tagged word's label sits on its first piece: the word of each piece equals BertTokenizerFast's word_ids
    for the same words (is_split_into_words), a word that splits at punctuation ("go'st") included."""
    tok = train_tokenizer("wordpiece", shakespeare, vocab_size=1000)
    bert = _bert_fast(tok, tmp_path, lowercase=True)
    words = ["Whither", "go'st", "thou", ",", "Juliet", "Montague-Capulet", "日本"]
    aligned = align(tok, words, list(range(len(words))), max_len=64)
    encoded = bert(words, is_split_into_words=True)
    assert aligned.ids == encoded["input_ids"]
    word_ids = encoded.word_ids()
    assert aligned.firsts == [word_ids.index(w) for w in range(len(words))]
    assert [aligned.labels[i] for i in aligned.firsts] == list(range(len(words)))


def test_an_mlm_run_trains_on_a_wordpiece_it_trains_and_fills_masks(tmp_path, monkeypatch, caplog):
    """attnkit train --task mlm --tokenizer wordpiece: a tiny run trains a WordPiece on its text, frames windows as
    [CLS] ... [SEP], saves the tokenizer with the run, and fill_mask reads [MASK] in the prompt. A folder named
    wordpiece where the command runs is not read, and the run says so."""
    monkeypatch.chdir(tmp_path)
    _small_wordpiece().save(tmp_path / "wordpiece")
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat . the dog sat on the log .\n" * 200, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "--task", "mlm", "--data", str(text), "--tokenizer", "wordpiece", "--vocab-size", "60",
                 "--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=32",
                 "--set", "max_seq_len=32", "--max-steps", "3", "--batch-size", "4", "--no-progress",
                 "--out", str(run)]) == 0
    saved = load_tokenizer(run / "tokenizer")
    assert saved.kind == "wordpiece" and json.loads((run / "config.json").read_text())["vocab_size"] == (
        saved.vocab_size)
    assert saved.fingerprint() != _small_wordpiece().fingerprint()
    assert "the folder wordpiece here is not read: to use the tokenizer saved there, give it as ./wordpiece" in (
        caplog.text)
    [fill] = attnkit.load(run).fill_mask("the cat [MASK] on the mat .", top_k=3)[0]
    assert len(fill.candidates) == 3 and all(t != "[MASK]" for t, _ in fill.candidates)


def test_a_masked_lm_window_of_one_short_text_is_what_bert_tokenizer_fast_makes_of_it(tmp_path):
    """BERT frames a text `[CLS] text [SEP]`. A WordPiece's post-processor frames so, and BOS borrows [CLS]: the
    masked LM's stream took the tokenizer for one that starts every text with BOS (as Llama's does) and put a [CLS]
    without its [SEP] before each file, so a window read [CLS] [CLS] text [SEP]. A text that fits one window now reads
    (its masks undone) as BertTokenizerFast(text) does; a Llama-style tokenizer still starts texts with BOS
    (tests/test_data_lm.py)."""
    import torch

    from attnkit.data.lm import LMData
    from attnkit.tasks.lm import MaskedWindows

    tok = _small_wordpiece()
    assert not tok.starts_with_bos
    text = "the quick brown fox jumps over the lazy dog"
    path = tmp_path / "one.txt"
    path.write_text(text, encoding="utf-8")
    stream = torch.tensor(LMData.prepare([path], tok, tmp_path / "cache", val_fraction=0.0,
                                         progress=False).tokens.tolist())  # (T,)
    inputs, labels = MaskedWindows(tok, len(stream) + 2)(stream[None], torch.Generator().manual_seed(0))  # (1, T + 2)
    read = torch.where(labels == -100, inputs, labels)[0].tolist()  # the window with its masks undone
    assert read == _bert_fast(tok, tmp_path / "bert", lowercase=True)(text)["input_ids"]


def test_tokenizer_encode_shows_the_text_a_piece_inside_a_word_stands_for(tmp_path, capsys):
    """attnkit tokenizer encode's text column showed '##ither' for the text of a piece inside a word: its text is
    'ither'. Axis labels keep the mark ('##ither', as BertViz labels BERT's tokens)."""
    from attnkit.viz.labels import token_labels

    tok = _small_wordpiece()
    ids = tok.encode("the quickest")
    pieces = tok.pieces(ids)
    inside = next(i for i, piece in enumerate(pieces) if piece.startswith("##"))
    tok.save(tmp_path / "tok")
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "tok"), "--text", "the quickest"]) == 0
    row = capsys.readouterr().out.splitlines()[3 + inside].split()
    assert row == [str(ids[inside]), pieces[inside], repr(pieces[inside][2:])]
    assert token_labels(tok, ids)[inside] == pieces[inside]


def test_a_saved_wordpiece_reads_in_transformers_as_in_attnkit(tmp_path):
    """The saved tokenizer.json, as transformers' BertTokenizerFast loads it: the same ids, BERT's five special tokens
    alone (the '##' pieces numbered first as special tokens to the trainer are plain pieces), and a decode that skips
    the special tokens keeps the pieces inside words."""
    transformers = pytest.importorskip("transformers")
    tok = _small_wordpiece()
    tok.save(tmp_path / "tok")
    bert = transformers.BertTokenizerFast(tokenizer_file=str(tmp_path / "tok" / "tokenizer.json"),
                                          **{f"{role}_token": tok.specials[role]
                                             for role in ("pad", "unk", "mask", "cls", "sep")})
    assert sorted(bert.added_tokens_encoder) == ["[CLS]", "[MASK]", "[PAD]", "[SEP]", "[UNK]"]
    for text in ("the quickest brown foxes", "jumpsover lazydogs", "Thé QUICK fox!"):
        ids = tok.encode(text)
        assert any(piece.startswith("##") for piece in tok.pieces(ids)) or text.startswith("Th")
        assert bert(text)["input_ids"] == [tok.cls_id, *ids, tok.sep_id], text
        assert bert.decode(bert(text)["input_ids"], skip_special_tokens=True) == tok.decode(ids), text


def test_a_vocabulary_larger_than_asked_is_said(caplog):
    """A text of more characters than vocab_size trained a WordPiece of far more tokens than asked, in silence: every
    character and its '##' piece are kept. It is said now, naming the sizes and the fix."""
    letters = [chr(c) for c in range(0x3B1, 0x3CA)] + [chr(c) for c in range(0x430, 0x450)]  # Greek, Cyrillic
    tok = train_wordpiece([" ".join(f"a{c}b{c}" for c in letters) * 3], vocab_size=50)
    assert tok.vocab_size > 2 * len(letters)
    assert f"a WordPiece has {tok.vocab_size} tokens, more than the 50 asked" in caplog.text
    assert "give a larger vocab_size" in caplog.text
