"""Tokenizers: lossless round trips, the Tiny Shakespeare compression claim, save/load, Hugging Face
directories, the CLI, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from shared_data import shared
from tokenizers import Tokenizer as HFTok
from tokenizers import models, pre_tokenizers

from attnkit.cli import main
from attnkit.errors import ConfigError, InputError
from attnkit.tokenize import (
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    explain,
    load_tokenizer,
    require_id,
    train_bpe,
    train_tokenizer,
)

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.\r\n" * 20,
    "def f(x):\n    return x * 2  # doubled\n\n" * 20,
    "한국어 텍스트와 emoji 😀🎉 and accents: café, naïve, Ærø.\n" * 10,
]


@pytest.fixture(scope="module")
def bpe() -> HFTokenizer:
    return train_bpe(TRAINING_TEXT, vocab_size=400)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00")))
@example(text="")
@example(text="😀🎉👩‍👩‍👧")
@example(text="한국어 텍스트")
@example(text="line one\r\nline two\r\n")
@example(text="\x01\x02\x1b[31m\x7f\t\x0b\x0c\u2028")
@example(text="<eos><pad> are ordinary text here")
def test_bpe_round_trip_is_lossless(bpe: HFTokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="ab c\n!\r"))
def test_char_round_trip_on_its_alphabet(text: str) -> None:
    tok = CharTokenizer.from_texts(["ab c\n!\r"])
    assert tok.decode(tok.encode(text)) == text


def test_special_token_strings_in_text_are_text(bpe: HFTokenizer) -> None:
    ids = bpe.encode("<eos> <pad>")
    assert not set(ids) & {bpe.eos_id, bpe.pad_id}
    assert bpe.decode([bpe.bos_id, *ids, bpe.eos_id]) == "<eos> <pad>"
    assert bpe.decode([bpe.bos_id], skip_special=False) == "<bos>"


def test_char_ids_follow_code_point_order_then_specials() -> None:
    tok = CharTokenizer.from_texts(["hello"])
    assert tok.alphabet == "ehlo"
    assert tok.encode("hole") == [1, 3, 2, 0]
    assert tok.vocab_size == 4 + 7
    assert [tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id] == [4, 5, 6, 7]
    assert tok.decode([tok.bos_id, 1, tok.pad_id]) == "h"


def test_char_unknown_policies() -> None:
    assert CharTokenizer("ab").encode("axb") == [0, CharTokenizer("ab").unk_id, 1]
    assert CharTokenizer("ab", unknown="skip").encode("axb") == [0, 1]
    with pytest.raises(InputError, match=r"'x' at position 1"):
        CharTokenizer("ab", unknown="error").encode("axb")
    with pytest.raises(ConfigError):
        CharTokenizer("ab", unknown="ignore")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="outside the char vocabulary"):
        CharTokenizer("ab").decode([99])


def test_tinyshakespeare_bpe_1024_halves_the_validation_split() -> None:
    text = shared("tinyshakespeare", "input.txt").read_text(encoding="utf-8")
    n_train = int(len(text) * 0.9)
    tok = train_tokenizer("bpe", [text[:n_train]], vocab_size=1024)
    assert tok.vocab_size == 1024
    val = text[n_train:]
    ids = tok.encode(val)
    assert len(ids) <= len(val) / 2, f"{len(ids)} tokens for {len(val)} characters"
    assert tok.decode(ids) == val


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_load_keeps_ids_and_fingerprint(tmp_path: Path, kind: str) -> None:
    tok = train_tokenizer(kind, TRAINING_TEXT, vocab_size=300)
    tok.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert isinstance(back, Tokenizer)
    assert back.kind == kind
    assert back.fingerprint() == tok.fingerprint()
    assert back.vocab_size == tok.vocab_size
    assert [back.token_id(r) for r in ("pad", "bos", "eos", "unk", "mask", "cls", "sep")] == [
        tok.token_id(r) for r in ("pad", "bos", "eos", "unk", "mask", "cls", "sep")
    ]
    text = TRAINING_TEXT[0][:60]
    assert back.encode(text) == tok.encode(text)
    assert back.encode_batch([text, "x"]) == [tok.encode(text), tok.encode("x")]


def test_fingerprint_tells_tokenizers_apart() -> None:
    a = train_tokenizer("bpe", TRAINING_TEXT, vocab_size=300)
    assert a.fingerprint() == train_tokenizer("bpe", TRAINING_TEXT, vocab_size=300).fingerprint()
    assert a.fingerprint() != train_tokenizer("bpe", TRAINING_TEXT, vocab_size=310).fingerprint()
    assert CharTokenizer("ab").fingerprint() != CharTokenizer("abc").fingerprint()


def test_train_from_files(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("zebra\n", encoding="utf-8")
    tok = train_tokenizer("char", [path, "q"])
    assert tok.alphabet == "\nabeqrz"


def _wordpiece_dir(tmp_path: Path, *, with_config: bool) -> Path:
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat"])}
    tok = HFTok(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.enable_truncation(max_length=3)  # as BERT's tokenizer.json carries max_length 512
    directory = tmp_path / "bert"
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    if with_config:
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"cls_token": "[CLS]", "sep_token": {"content": "[SEP]"}, "pad_token": "[PAD]"})
        )
    return directory


@pytest.mark.parametrize("with_config", [False, True])
def test_hf_directory_is_used_as_it_is(tmp_path: Path, with_config: bool) -> None:
    tok = load_tokenizer(_wordpiece_dir(tmp_path, with_config=with_config))
    assert tok.kind == "hf"
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert (tok.bos_id, tok.eos_id) == (2, 3)  # BERT has no BOS/EOS: they borrow CLS/SEP
    assert tok.encode("the cats sat") == [5, 6, 7, 8]  # no [CLS]/[SEP] added, no truncation
    tok.save(tmp_path / "saved")
    back = load_tokenizer(tmp_path / "saved")
    assert back.kind == "hf" and back.fingerprint() == tok.fingerprint()


def test_hf_gpt2_style_tokenizer_pads_with_endoftext(tmp_path: Path) -> None:
    eot = {role: "<|endoftext|>" for role in ("pad", "bos", "eos", "unk")}
    trained = train_bpe(TRAINING_TEXT, vocab_size=300, special_tokens=eot)
    trained.save(tmp_path)
    (tmp_path / "attnkit_tokenizer.json").unlink()  # a bare tokenizer.json, as GPT-2 ships it
    tok = load_tokenizer(tmp_path)
    assert tok.kind == "hf"
    assert tok.bos_id == tok.eos_id == tok.pad_id == trained.eos_id
    assert tok.cls_id is None
    with pytest.raises(InputError, match="no cls token"):
        require_id(tok, "cls")


def test_hf_missing_or_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot read the Hugging Face tokenizer .*put back the one its model came"):
        load_tokenizer(tmp_path / "broken")
    with pytest.raises(InputError, match="tokenizer.json"):
        HFTokenizer.from_dir(tmp_path)
    with pytest.raises(InputError, match=r"attnkit_tokenizer.json .* or tokenizer.json"):
        load_tokenizer(tmp_path)


def test_unknown_kind_and_bad_sizes_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown tokenizer kind 'unigram'; choose one of char, bpe, wordpiece, hf"):
        train_tokenizer("unigram", ["abc"], vocab_size=300)
    with pytest.raises(ConfigError, match="not trained"):
        train_tokenizer("hf", ["abc"])
    with pytest.raises(ConfigError, match="at least"):
        train_bpe(["abc"], vocab_size=100)
    with pytest.raises(ConfigError, match="unknown special token roles"):
        train_bpe(["abc"], vocab_size=300, special_tokens=["pad", "bos", "eos", "unk", "begin"])


def test_explain_shows_ids_pieces_and_partial_bytes() -> None:
    tok = train_bpe(["ab ab ab"], vocab_size=270)
    lines = explain(tok, "ab😀").splitlines()
    assert lines[0] == "3 characters -> 5 tokens, 0.60 characters per token"
    assert lines[1] == "ids: " + " ".join(map(str, tok.encode("ab😀")))
    assert lines[3].split() == [str(tok.encode("ab")[0]), "ab", "'ab'"]
    assert [line.split()[-1] for line in lines[4:]] == ["b'\\xf0'", "b'\\x9f'", "b'\\x98'", "b'\\x80'"]


def test_cli_train_and_encode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "corpus.txt"
    data.write_text("".join(TRAINING_TEXT), encoding="utf-8")
    out = tmp_path / "tok"
    assert (
        main(["tokenizer", "train", "--data", str(data), "--kind", "bpe", "--vocab-size", "300", "--out", str(out)])
        == 0
    )
    assert (out / "tokenizer.json").is_file() and (out / "attnkit_tokenizer.json").is_file()
    capsys.readouterr()
    assert main(["tokenizer", "encode", "--tokenizer", str(out), "--text", "The quick fox"]) == 0
    printed = capsys.readouterr().out
    tok = load_tokenizer(out)
    assert "ids: " + " ".join(map(str, tok.encode("The quick fox"))) in printed
    assert "Ġquick" in printed or "Ġ" in printed


def test_cli_reports_bad_kind_and_missing_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenizer", "train", "--kind", "nope", "--out", str(tmp_path / "t")]) == 2
    assert "invalid choice: 'nope' (choose from 'char', 'bpe', 'wordpiece')" in capsys.readouterr().err
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path), "--text", "x"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err
    CharTokenizer.from_texts(["abc"]).save(tmp_path / "run" / "tokenizer")  # a run holds its tokenizer in a folder
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "run"), "--text", "x"]) == 2
    assert f"give its tokenizer folder, {tmp_path / 'run' / 'tokenizer'}" in capsys.readouterr().err


def test_tokenizer_encode_of_text_not_utf8_gives_advice_it_can_follow(tmp_path: Path, capsys) -> None:
    """`--text $'caf\\xe9'` was told to read it from a file with --encoding-errors replace, options tokenizer
    encode does not have: the advice is the caller's."""
    CharTokenizer.from_texts(["café"]).save(tmp_path / "tok")
    text = b"caf\xe9".decode("utf-8", "surrogateescape")  # as Python reads the command line
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "tok"), "--text", text]) == 2
    err = capsys.readouterr().err
    assert "is not UTF-8 (byte 0xe9 at character 3): give --text in UTF-8" in err and "--encoding-errors" not in err


def test_tokenizer_train_refuses_an_empty_corpus_and_a_vocab_size_for_char(tmp_path: Path, capsys) -> None:
    """An empty file trained a BPE of the 256 bytes alone and said nothing; --vocab-size with --kind char was
    ignored without a word (as `attnkit train` refuses it)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert main(["tokenizer", "train", "--data", str(empty), "--out", str(tmp_path / "t")]) == 2
    assert "the training text is empty" in capsys.readouterr().err and not (tmp_path / "t").exists()
    with pytest.raises(InputError, match="the training text is empty"):
        train_tokenizer("bpe", ["", ""], vocab_size=300)
    text = tmp_path / "text.txt"
    text.write_text("".join(TRAINING_TEXT), encoding="utf-8")
    assert main(["tokenizer", "train", "--data", str(text), "--kind", "char", "--vocab-size", "100",
                 "--out", str(tmp_path / "c")]) == 2
    assert "--vocab-size 100 sets the size of a BPE" in capsys.readouterr().err


def test_a_bpe_smaller_than_asked_is_said(caplog) -> None:
    """Merges need pairs seen twice or more: a short text gives fewer tokens than --vocab-size asks."""
    with caplog.at_level("WARNING", logger="attnkit.tokenize"):
        tok = train_bpe(["hello world"], vocab_size=5000)
    assert tok.vocab_size < 5000
    assert f"{tok.vocab_size} tokens of the 5,000 asked" in caplog.text



def test_bpe_learns_what_hugging_faces_own_byte_level_trainer_learns() -> None:
    """The `bpe` kind is Hugging Face's reference byte-level BPE (`ByteLevelBPETokenizer`, GPT-2's scheme) trained by
    its own trainer on Tiny Shakespeare from the file: the same vocabulary, the same merges in the same order, the
    same ids. (Hugging Face's file trainer reads a file a line at a time, so on a text whose whitespace runs cross
    lines, such as indented code, its merges of those runs differ; attnkit reads the text whole, as it encodes it.)"""
    from tokenizers import ByteLevelBPETokenizer

    path = shared("tinyshakespeare", "input.txt")
    ours = train_tokenizer("bpe", [path], vocab_size=1024)
    theirs = ByteLevelBPETokenizer()
    theirs.train([str(path)], vocab_size=1024, min_frequency=2, special_tokens=list(ours.specials.values()),
                 show_progress=False)
    ours_model, their_model = json.loads(ours.to_str())["model"], json.loads(theirs.to_str())["model"]
    assert ours_model["vocab"] == their_model["vocab"] and ours_model["merges"] == their_model["merges"]
    for text in ("To be, or not to be: unseen.", "日本 👩‍👧 한국어", "  two  spaces\r\n"):
        assert ours.encode(text) == theirs.encode(text).ids


def test_training_a_tokenizer_shows_the_text_read_as_it_goes(tmp_path: Path, monkeypatch) -> None:
    """A tokenizer trained on a large corpus read it for minutes without a word (attnkit tokenizer train, attnkit
    train): a bar now moves by each file's bytes as it is read, with --progress (on a terminal by default)."""
    import attnkit.tokenize as tokenize

    (tmp_path / "corpus").mkdir()
    files = []
    for i, text in enumerate(TRAINING_TEXT):
        files.append(tmp_path / "corpus" / f"{i}.txt")
        files[-1].write_text(text, encoding="utf-8")
    bars = []

    class Bar:
        def __init__(self, **kwargs) -> None:
            self.kwargs, self.moved = kwargs, []
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def update(self, n: int) -> None:
            self.moved.append(n)

    monkeypatch.setattr(tokenize, "tqdm", Bar)
    train_tokenizer("wordpiece", files, vocab_size=200, progress=True)
    sizes = [f.stat().st_size for f in files]
    # a WordPiece reads the text twice, first for its characters (its '##' pieces): both readings show a bar
    assert [bar.kwargs["desc"] for bar in bars] == ["reading the text for its characters", "reading the text"]
    for bar in bars:
        assert bar.kwargs["total"] == sum(sizes) and bar.moved == sizes and not bar.kwargs["disable"]
    for flag, shown in (("--progress", True), ("--no-progress", False)):
        assert main(["tokenizer", "train", "--data", str(tmp_path / "corpus"), "--kind", "char", flag,
                     "--out", str(tmp_path / flag)]) == 0
        assert bars[-1].kwargs["disable"] is not shown and sum(bars[-1].moved) == sum(sizes)


@pytest.mark.parametrize("meta", ["[]", '{"kind": "bpe"}', '{"kind": "char", "specials": {"pad": "<pad>"}}',
                                  '{"kind": "char", "alphabet": 5, "specials": {}, "unknown": "unk"}',
                                  '{"kind": "bpe", "specials": ["pad"]}', '{"kind": "bpe", "specials": {"pad": 3}}'])
def test_a_changed_tokenizer_description_is_one_clear_error(tmp_path: Path, bpe: HFTokenizer, meta: str) -> None:
    """attnkit_tokenizer.json was read unchecked: a list, a missing field or one of the wrong type was an
    AttributeError, KeyError, TypeError or ValueError out of load_tokenizer."""
    bpe.save(tmp_path / "tok")
    (tmp_path / "tok" / "attnkit_tokenizer.json").write_text(meta, encoding="utf-8")
    with pytest.raises(InputError, match=r"attnkit_tokenizer.json is not the description attnkit saves with a "
                                         r"tokenizer \(.*\): put back the file saved with it"):
        load_tokenizer(tmp_path / "tok")


def test_the_texts_of_a_sentencepiece_tokenizers_tokens_add_up_to_the_text(bpe: HFTokenizer) -> None:
    """attnkit tokenizer encode showed a SentencePiece '▁is' (Llama's, Mistral's) as 'is': a piece decoded alone loses
    the space it stands for. Each token's text now holds it, so the texts add up to the text, as byte-level ones do."""
    from tokenizers import decoders, trainers

    from attnkit.tokenize import token_texts

    hf = HFTok(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    hf.train_from_iterator(["Paris is big and Paris is old"] * 20,
                           trainers.BpeTrainer(vocab_size=100, special_tokens=["<unk>", "<s>", "</s>", "<pad>"]))
    sentencepiece = HFTokenizer(hf, kind="hf", specials={"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"})
    for tok in (sentencepiece, bpe):
        for text in ("Paris is big", "is  old Paris"):
            assert "".join(token_texts(tok, tok.encode(text))) == text
    assert explain(sentencepiece, "Paris is").splitlines()[-1].endswith("  ' is'")
