"""Language-model data: the memmap cache, the split, random windows and evaluation batches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import shared

from attnkit.data.corpus import stdlib_files
from attnkit.data.lm import LMData, token_dtype
from attnkit.errors import InputError
from attnkit.tokenize import CharTokenizer, HFTokenizer, train_bpe


@pytest.fixture
def corpus(tmp_path: Path) -> list[Path]:
    files = []
    for name, text in [("a.txt", "hello world\n" * 50), ("b.txt", "goodbye moon\n" * 50)]:
        files.append(tmp_path / name)
        files[-1].write_text(text, encoding="utf-8")
    return files


def test_tinyshakespeare_char_stream_has_the_classic_split(tmp_path: Path) -> None:
    path = shared("tinyshakespeare", "input.txt")
    tok = CharTokenizer.from_texts([path.read_text(encoding="utf-8")])
    data = LMData.prepare([path], tok, tmp_path, progress=False)
    assert len(tok.alphabet) == 65
    assert (len(data.train), len(data.val)) == (1_003_854, 111_540)
    assert isinstance(data.tokens, np.memmap) and data.tokens.dtype == np.uint16
    assert tok.decode(data.train[:14]) == "First Citizen:"


def test_cache_is_reused_when_nothing_changed_and_rebuilt_when_a_file_did(tmp_path: Path, corpus) -> None:
    tok = CharTokenizer.from_texts(["helowrdgbyemn \n!"])
    cache = tmp_path / "cache"
    first = LMData.prepare(corpus, tok, cache, progress=False)
    assert not first.reused
    built = first.path.stat().st_mtime_ns
    second = LMData.prepare(corpus, tok, cache, progress=False)
    assert second.reused and second.path == first.path and first.path.stat().st_mtime_ns == built
    np.testing.assert_array_equal(second.tokens, first.tokens)
    assert second.meta["n_tokens"] == len(first.tokens)
    assert [f["size"] for f in second.meta["files"]] == [p.stat().st_size for p in corpus]
    assert second.meta["tokenizer"] == tok.fingerprint()

    corpus[1].write_text("goodbye moon!\n" * 50, encoding="utf-8")
    third = LMData.prepare(corpus, tok, cache, progress=False)
    assert not third.reused and third.path == first.path
    assert len(third.tokens) == len(first.tokens) + 50

    st = corpus[0].stat()  # same size, newer mtime: rebuilt too
    os.utime(corpus[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert not LMData.prepare(corpus, tok, cache, progress=False).reused

    other = CharTokenizer.from_texts(["helowrdgbyemn \n!?"])
    changed_tok = LMData.prepare(corpus, other, cache, progress=False)
    assert not changed_tok.reused and changed_tok.path != first.path


def test_truncated_cache_is_rebuilt(tmp_path: Path, corpus) -> None:
    tok = CharTokenizer.from_texts(["helowrdgbyemn \n"])
    first = LMData.prepare(corpus, tok, tmp_path, progress=False)
    with open(first.path, "r+b") as f:
        f.truncate(10)
    again = LMData.prepare(corpus, tok, tmp_path, progress=False)
    assert not again.reused and len(again.tokens) == len(first.tokens)


def test_files_are_joined_with_eos_and_empty_files_skipped(tmp_path: Path) -> None:
    texts = ["ab", "", "ba"]
    files = [tmp_path / f"{i}.txt" for i in range(3)]
    for f, t in zip(files, texts, strict=True):
        f.write_text(t)
    tok = CharTokenizer("ab")
    data = LMData.prepare(files, tok, tmp_path / "cache", val_fraction=0.0, progress=False)
    assert data.tokens.tolist() == [0, 1, tok.eos_id, 1, 0]
    assert len(data.val) == 0


def test_bpe_stream_over_the_stdlib_uses_uint16(tmp_path: Path) -> None:
    files = stdlib_files(max_bytes=150_000)
    tok = train_bpe([f.read_text(encoding="utf-8") for f in files[:3]], vocab_size=512)
    data = LMData.prepare(files, tok, tmp_path, progress=False)
    assert data.tokens.dtype == np.uint16
    n_files = sum(1 for f in files if f.stat().st_size)
    assert int((np.asarray(data.tokens) == tok.eos_id).sum()) == n_files - 1
    first = files[0].read_text(encoding="utf-8")
    assert tok.decode(data.tokens[: len(tok.encode(first))]) == first


def test_token_dtype() -> None:
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def test_windows_never_cross_the_split_and_targets_are_shifted() -> None:
    data = LMData.from_ids(np.arange(1000, dtype=np.uint16), val_fraction=0.1)
    assert (len(data.train), len(data.val)) == (900, 100)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        x, y = data.sample_batch("train", 16, 32, gen)
        assert x.shape == y.shape == (16, 32) and x.dtype == y.dtype == torch.int64
        assert int(y.max()) < 900  # the last train target is token 899
        torch.testing.assert_close(y, x + 1)
        x, y = data.sample_batch("val", 16, 32, gen)
        assert int(x.min()) >= 900
        torch.testing.assert_close(y, x + 1)
    x, _ = data.sample_batch("val", 2000, 99, gen)  # the only window: the whole split
    assert int(x.min()) == 900 and int(x.max()) == 998


def test_sampling_is_driven_by_the_generator() -> None:
    data = LMData.from_ids(np.arange(10_000) % 300)
    gen = torch.Generator().manual_seed(1234)
    state = gen.get_state()
    first = [data.sample_batch("train", 4, 8, gen) for _ in range(3)]
    gen.set_state(state)
    again = [data.sample_batch("train", 4, 8, gen) for _ in range(3)]
    for (x1, y1), (x2, y2) in zip(first, again, strict=True):
        torch.testing.assert_close(x1, x2)
        torch.testing.assert_close(y1, y2)
    assert not torch.equal(first[0][0], first[1][0])


def test_eval_batches_predict_every_val_token_once() -> None:
    data = LMData.from_ids(np.arange(2000), val_fraction=0.25)
    batches = list(data.iter_eval_batches("val", batch_size=3, seq_len=10))
    targets = torch.cat([y.flatten() for _, y in batches])
    assert targets.tolist() == list(range(1501, 1501 + len(targets)))
    assert len(targets) == (len(data.val) - 1) // 10 * 10
    capped = list(data.iter_eval_batches("val", batch_size=3, seq_len=10, max_batches=2))
    assert len(capped) == 2
    assert int(capped[0][0][0, 0]) == 1500 and int(capped[-1][0][-1, -1]) > 1900  # spread over the split
    assert [b[0].tolist() for b in capped] == [
        b[0].tolist() for b in data.iter_eval_batches("val", batch_size=3, seq_len=10, max_batches=2)
    ]


def test_too_short_split_and_bad_arguments_are_clear_errors() -> None:
    data = LMData.from_ids(np.arange(100), val_fraction=0.05)
    with pytest.raises(InputError, match="the val split has 5 tokens, fewer than one window"):
        data.sample_batch("val", 2, 8, torch.Generator())
    with pytest.raises(InputError, match="unknown split"):
        data.sample_batch("test", 2, 8, torch.Generator())
    with pytest.raises(InputError, match="val_fraction"):
        LMData.from_ids(np.arange(10), val_fraction=1.0)
    with pytest.raises(InputError, match="empty"):
        LMData.from_ids([])


def test_empty_and_binary_corpora_are_clear_errors(tmp_path: Path) -> None:
    tok = CharTokenizer("ab")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InputError, match=r"no text in the 1 data file\(s\)"):
        LMData.prepare([empty], tok, tmp_path / "cache", progress=False)
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(InputError, match="blob.bin looks like a binary file"):
        LMData.prepare([empty, binary], tok, tmp_path / "cache", progress=False)
    assert not list((tmp_path / "cache").glob("*.bin"))  # nothing half-written is left behind
    with pytest.raises(InputError, match="no data files"):
        LMData.prepare([], tok, tmp_path / "cache")
    with pytest.raises(InputError, match="cannot read .*missing.txt"):
        LMData.prepare([tmp_path / "missing.txt"], tok, tmp_path / "cache")


def test_a_full_disk_while_caching_is_one_line_and_leaves_nothing(tmp_path: Path, small_disk: Path) -> None:
    text = tmp_path / "big.txt"
    text.write_text("hello world\n" * 20_000)  # 240,000 tokens: 480 KB of uint16 for a 64 KiB disk
    cache = small_disk / "cache"
    with pytest.raises(InputError) as err:
        LMData.prepare([text], CharTokenizer("helo wrd\n"), cache, progress=False)
    one_line = f"cannot finish writing the token cache in {cache}: the disk is full; free some space, or write to " \
               "another disk"
    assert str(err.value) == one_line
    assert not list(cache.iterdir())  # the partial cache is gone: the space is free again


def test_a_cache_directory_that_cannot_be_made_is_one_line(tmp_path: Path, corpus) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(InputError, match=f"cannot finish writing the token cache in {a_file / 'cache'}: part of the "
                                         "path is a file"):
        LMData.prepare(corpus, CharTokenizer("helowrdgbyemn \n!"), a_file / "cache", progress=False)


@pytest.mark.parametrize("damage", ["edited bin", "meta not an object", "meta without n_tokens", "meta not utf-8"])
def test_a_cache_changed_since_it_was_written_is_rebuilt(tmp_path: Path, corpus, damage: str, caplog) -> None:
    """The .bin was checked by its size alone: a byte changed in place was trained on as it was (ids the text never
    held), and a .json that was valid JSON but not the one written stopped the run with a traceback."""
    tok = CharTokenizer.from_texts(["helowrdgbyemn \n"])
    first = LMData.prepare(corpus, tok, tmp_path, progress=False)
    tokens = np.array(first.tokens)
    meta_path = first.path.with_suffix(".json")
    if damage == "edited bin":
        with open(first.path, "r+b") as f:
            f.seek(6)
            f.write(bytes([tok.vocab_size + 3, 0]))
    elif damage == "meta not an object":
        meta_path.write_text("[]", encoding="utf-8")
    elif damage == "meta without n_tokens":
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        del meta["n_tokens"]
        meta_path.write_text(json.dumps(meta), encoding="utf-8")
    else:
        meta_path.write_bytes(b"\xff\xfe{}")
    again = LMData.prepare(corpus, tok, tmp_path, progress=False)
    assert not again.reused
    np.testing.assert_array_equal(np.array(again.tokens), tokens)
    if damage == "edited bin":
        assert "not the one its" in caplog.text


def llama_style_tokenizer(text: str, *, bos: bool = False, eos: bool = False) -> HFTokenizer:
    """A byte-fallback BPE trained split at spaces, encoding as Hugging Face's conversion of Llama 2's SentencePiece
    model does: a normalizer that puts '▁' before the text and writes its spaces as '▁'; with `bos`, its
    post-processor puts BOS before every text, as a converted Llama's does (`starts_with_bos`), and with `eos` EOS
    after it too (LlamaTokenizerFast's add_eos_token=True)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=[f"<0x{b:02X}>" for b in range(256)]))
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>" if eos else "<s> $A", special_tokens=[
            ("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    return HFTokenizer(tok, kind="hf", specials={"unk": "<unk>", "bos": "<s>", "eos": "</s>"})


WORDS = "the quick brown fox, jumps over  the lazy dog; 12,345 times é😀 "


@pytest.mark.parametrize(("text", "tokenizer"), [
    (WORDS * 400, "bpe"), (WORDS * 400, "llama"), ((WORDS + "\n\n\n") * 300, "bpe")],
    ids=["one-line", "one-line-llama-style", "newline-runs"])
def test_one_huge_file_of_one_line_is_tokenized_in_bounded_batches_with_progress(
        tmp_path: Path, monkeypatch, text: str, tokenizer: str) -> None:
    """A file was handed to the tokenizer whole (its ids as one Python list: gigabytes for a large file) and the
    progress bar stood still until it was done; a line was never cut, so a file of one line was one piece. Now the
    tokenizer gets about _FLUSH_CHARS at a time, the bar moves with each batch, and the tokens are the whole text's:
    also where the tokenizer puts '▁' before every text (Llama's: it added one at each cut) and where newlines come in
    runs (a cut after a run's first newline split GPT-2's 'ĊĊ')."""
    import attnkit.data.lm as lm

    path = tmp_path / "one-line.txt"
    path.write_text(text, encoding="utf-8")
    tok = train_bpe([text[:2000]], vocab_size=300) if tokenizer == "bpe" else llama_style_tokenizer(text[:2000])
    monkeypatch.setattr(lm, "_PIECE_CHARS", 500)
    monkeypatch.setattr(lm, "_FLUSH_CHARS", 2000)
    batches, moves = [], []

    class Bar:
        def __init__(self, **kwargs) -> None:
            assert kwargs["total"] == path.stat().st_size

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def update(self, n: int) -> None:
            moves.append(n)

    encode_batch = tok.encode_batch
    monkeypatch.setattr(tok, "encode_batch", lambda texts: batches.append(sum(map(len, texts))) or encode_batch(texts))
    monkeypatch.setattr(lm, "tqdm", Bar)
    data = LMData.prepare([path], tok, tmp_path / "cache", val_fraction=0.0)
    np.testing.assert_array_equal(np.array(data.tokens), tok.encode(text))
    assert len(batches) >= 10 and max(batches) <= 2000 + 4 * 500
    assert sum(moves) == path.stat().st_size and sum(1 for n in moves if n) >= 10


def test_a_tokenizer_that_starts_texts_with_bos_starts_each_file_of_the_stream_with_it(tmp_path: Path, corpus,
                                                                                         monkeypatch) -> None:
    """A converted Llama is prompted after BOS (its tokenizer starts every text with one) but was fine-tuned on a
    stream without any: each file starts with BOS now, as Hugging Face's run_clm puts it before each document. A
    cache built without it is not reused."""
    import attnkit.data.lm as lm

    tok = llama_style_tokenizer("hello world goodbye moon\n" * 20, bos=True)
    assert tok.starts_with_bos
    texts = [path.read_text(encoding="utf-8") for path in corpus]
    expected = [tok.bos_id, *tok.encode(texts[0]), tok.eos_id, tok.bos_id, *tok.encode(texts[1])]
    monkeypatch.setattr(lm, "bos_first", lambda _tokenizer: False)  # the stream as it was built before
    before = LMData.prepare(corpus, tok, tmp_path, progress=False)
    monkeypatch.undo()
    data = LMData.prepare(corpus, tok, tmp_path, progress=False)
    assert not data.reused and data.bos_first and not before.bos_first
    assert np.asarray(data.tokens).tolist() == expected
    assert np.asarray(before.tokens).tolist() == [*tok.encode(texts[0]), tok.eos_id, *tok.encode(texts[1])]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_stream_of_attnkits_own_tokenizers_holds_no_bos_and_keeps_its_cache(tmp_path: Path, corpus, kind) -> None:
    """attnkit's own tokenizers start no text with BOS: their stream is each file's tokens with EOS between them, as
    before BOS was put before a converted Llama's files, in a cache of the same name (runs reuse theirs)."""
    import hashlib

    texts = [path.read_text(encoding="utf-8") for path in corpus]
    tok = CharTokenizer.from_texts(texts) if kind == "char" else train_bpe(texts, vocab_size=300)
    data = LMData.prepare(corpus, tok, tmp_path, progress=False)
    assert np.asarray(data.tokens).tolist() == [*tok.encode(texts[0]), tok.eos_id, *tok.encode(texts[1])]
    identity = {"format": 2, "tokenizer": tok.fingerprint(), "files": [str(f.resolve()) for f in corpus],
                "encoding_errors": "strict"}  # the cache's key as it was
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    assert data.path == tmp_path / f"lm-{key}.bin" and not data.bos_first


def test_a_llama_tokenizer_that_closes_texts_with_eos_still_starts_the_stream_as_transformers_does(tmp_path: Path,
                                                                                                      corpus) -> None:
    """A Llama tokenizer with add_eos_token frames a text `<s> text </s>`; its BOS is no classifier's CLS, so its
    stream is what run_clm concatenates from transformers' own ids, `<s> a </s> <s> b </s>`, but the last EOS, and a
    prompt starts with BOS. A RoBERTa-style frame, the same ids where `<s>` is also CLS, starts nothing."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tok = llama_style_tokenizer("hello world goodbye moon\n" * 20, bos=True, eos=True)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()))
    texts = [path.read_text(encoding="utf-8") for path in corpus]
    concatenated = [i for text in texts for i in hf(text)["input_ids"]]
    assert tok.starts_with_bos
    assert np.asarray(LMData.prepare(corpus, tok, tmp_path, progress=False).tokens).tolist() == concatenated[:-1]
    roberta = HFTokenizer(Tokenizer.from_str(tok.to_str()), kind="hf",
                          specials={"unk": "<unk>", "bos": "<s>", "eos": "</s>", "cls": "<s>", "sep": "</s>"})
    assert roberta.own_frame == tok.own_frame and not roberta.starts_with_bos


def test_resuming_a_run_whose_stream_had_no_bos_says_its_windows_changed(tmp_path: Path, corpus, caplog) -> None:
    """A converted Llama's run trained before its files were started with BOS is resumed on a stream with it: said in
    one warning, where its data state records which stream it trained on."""
    from attnkit.tasks.lm import LMTask

    tok = llama_style_tokenizer("hello world goodbye moon\n" * 20, bos=True)
    task = LMTask(LMData.prepare(corpus, tok, tmp_path, progress=False), batch_size=2, seq_len=8, seed=0)
    state = task.data_state()
    assert state["bos_first"] is True
    with caplog.at_level("WARNING", logger="attnkit.tasks.lm"):
        task.load_data_state(state)
        assert not caplog.records
        task.load_data_state({"generator": state["generator"]})  # a run's state from before
    assert [r.getMessage() for r in caplog.records] == [
        "this run's training data was tokenized without BOS at the start of each file, where its tokenizer starts "
        "every text with one; it is tokenized with it now, as the model is prompted, so the resumed run's windows "
        "differ from those it trained on"]


def test_a_corpus_mostly_unknown_names_the_tokenizers_own_unknown_piece(tmp_path: Path) -> None:
    """The refusal said '<unk>' for every tokenizer: a WordPiece's unknown piece is [UNK]."""
    from attnkit.tokenize import train_wordpiece

    tok = train_wordpiece(["the quick brown fox jumps over the lazy dog\n" * 20], vocab_size=60)
    path = tmp_path / "greek.txt"
    path.write_text("ΑΒΓΔ ΕΖΗΘ ΙΚΛΜ\n" * 80, encoding="utf-8")
    with pytest.raises(InputError, match=r"of the tokens of .*greek.txt are \[UNK\]: the tokenizer \(wordpiece, "):
        LMData.prepare([path], tok, tmp_path / "cache", val_fraction=0.0)


def test_a_rank_handed_rank_0s_cache_reads_it_without_tokenizing_or_hashing(tmp_path: Path, corpus,
                                                                             monkeypatch) -> None:
    """In a distributed run rank 0 tokenizes and hashes the corpus (`token_cache`) and the other ranks read the
    cache it hands them; a rank whose disk lacks that .bin (another machine's) makes its own."""
    import attnkit.data.lm as lm
    from attnkit.tasks import TaskContext, task_spec
    from attnkit.train.job import DataConfig

    tok = CharTokenizer.from_texts(p.read_text() for p in corpus)
    made = lm.token_cache(corpus, tok, tmp_path / "cache", progress=False)  # rank 0's
    expected = np.asarray(LMData.prepare(corpus, tok, tmp_path / "cache", progress=False).tokens)

    def refuse(*args, **kwargs):
        raise AssertionError("a rank given rank 0's cache tokenized or hashed the corpus again")

    with monkeypatch.context() as patched:
        patched.setattr(lm, "file_digest", refuse)
        patched.setattr(lm, "_build", refuse)
        asked = []
        context = TaskContext(
            data=DataConfig(data=tuple(map(str, corpus)), eval_batches=1), tokenizer=tok, config=None, batch_size=2,
            seed=0, seq_len=8, cache=tmp_path / "cache", files=corpus,
            on_rank_0=lambda make, what: asked.append(what) or made)
        task, _ = task_spec("lm").make(context)
        assert asked == ["the token cache"] and np.array_equal(np.asarray(task.data.tokens), expected)
    elsewhere = lm.TokenCache(tmp_path / "other-machine" / made.path.name, made.meta, True)
    data = LMData.prepare(corpus, tok, tmp_path / "here", progress=False, cache=elsewhere)
    assert data.path.parent == tmp_path / "here" and np.array_equal(np.asarray(data.tokens), expected)
