"""Labelled text: the three file layouts, the label vocabulary, CLS-first batches, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shared_data import shared

from attnkit.data.labelled import LabelledData, LabelVocab, read_labelled
from attnkit.data.synthetic import make_task, synthetic_tokenizer
from attnkit.errors import ConfigError, InputError
from attnkit.tasks.layouts import layout_of
from attnkit.tokenize import CharTokenizer


def test_label_first_lines(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text("1 a fine film .\r\n0 dull\n\n1 two  spaces kept\n", encoding="utf-8")
    assert read_labelled(path) == [("a fine film .", "1"), ("dull", "0"), ("two  spaces kept", "1")]


def test_csv_and_tsv_with_headers(tmp_path: Path) -> None:
    csv_path = tmp_path / "reviews.csv"
    csv_path.write_text('id,Text,Label\n1,"good, really good",pos\n2,bad,neg\n', encoding="utf-8")
    assert read_labelled(csv_path) == [("good, really good", "pos"), ("bad", "neg")]
    tsv_path = tmp_path / "glue.tsv"
    tsv_path.write_text('sentence\tlabel\nit \'s "fine"\t1\nno\t0\n', encoding="utf-8")
    assert read_labelled(tsv_path) == [('it \'s "fine"', "1"), ("no", "0")]
    odd = tmp_path / "odd.csv"
    odd.write_text("body,stars\nnice,5\n")
    assert read_labelled(odd, text_column="body", label_column="stars") == [("nice", "5")]
    with pytest.raises(InputError, match=r"\(the first line\) \['body', 'stars'\] has no text column .*add a header"):
        read_labelled(odd)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_text_longer_than_the_csv_modules_field_limit_is_read_whole(tmp_path: Path, suffix: str) -> None:
    """The csv module stops at a field of 131,072 characters (a csv.Error traceback); a long document is a text."""
    sep = "," if suffix == ".csv" else "\t"
    long = "word " * 40_000
    (tmp_path / f"long{suffix}").write_text(f"text{sep}label\nshort{sep}a\n{long}{sep}b\n")
    assert read_labelled(tmp_path / f"long{suffix}") == [("short", "a"), (long.strip(), "b")]


def test_empty_text_or_label_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "sst.txt"
    path.write_text("1 fine\n0\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"sst.txt, line 2: the text is empty \(label '0'\)"):
        read_labelled(path)
    csv_path = tmp_path / "x.csv"
    csv_path.write_text("text,label\nok,1\n  ,0\n")
    with pytest.raises(InputError, match=r"x.csv, line 3: the text is empty"):
        read_labelled(csv_path)
    csv_path.write_text("text,label\nok,\n")
    with pytest.raises(InputError, match=r"line 2: the label is empty"):
        read_labelled(csv_path)
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(InputError, match="empty"):
        read_labelled(empty)


def test_label_vocab_sorting_saving_and_unknown_labels(tmp_path: Path) -> None:
    vocab = LabelVocab.from_labels(["10", "2", "1", "2"])
    assert vocab.labels == ("1", "2", "10")
    assert LabelVocab.from_labels(["pos", "neg"]).labels == ("neg", "pos")
    assert LabelVocab.from_labels(["²", "1"]).labels == ("1", "²")  # a digit int() cannot read: sorted as text
    vocab.save(tmp_path / "labels.json")
    assert LabelVocab.load(tmp_path / "labels.json") == vocab
    assert vocab.encode("10") == 2 and vocab.decode(2) == "10"
    with pytest.raises(InputError, match="label '3' is not among"):
        vocab.encode("3")
    with pytest.raises(InputError, match="cannot read a label vocabulary"):
        LabelVocab.load(tmp_path / "missing.json")


def test_batches_begin_with_cls_and_mask_the_padding() -> None:
    tok = synthetic_tokenizer()
    task = make_task("ab", 200, seed=3)
    data = LabelledData.from_examples(task.labelled(), tok, batch_size=8)
    assert data.label_vocab.labels == ("A", "B")
    for index, indices in enumerate(data.batch_order(0)):
        batch = data.batch(0, index)
        assert batch.ids.shape[0] == batch.labels.shape[0] == len(indices)
        assert (batch.ids[:, 0] == tok.cls_id).all()
        lengths = batch.attention_mask.sum(1)
        for row, i in enumerate(indices):
            source = task.examples[i].source
            assert lengths[row] == len(source) + 2
            assert tok.decode(batch.ids[row, 1 : lengths[row] - 1].tolist()) == source
            assert batch.ids[row, lengths[row] - 1] == tok.sep_id
            assert (batch.ids[row, lengths[row] :] == tok.pad_id).all()
            assert data.label_vocab.decode(int(batch.labels[row])) == task.examples[i].target
    assert batch.labels.dtype == torch.int64 and batch.attention_mask.dtype == torch.bool


def test_without_cls_inputs_begin_with_bos() -> None:
    tok = CharTokenizer("abc", special_tokens=["pad", "bos", "eos", "unk"])
    data = LabelledData.from_examples([("abcabc", "x"), ("a", "y")], tok, batch_size=2, max_len=4)
    batch = data.batch(0, 0)
    rows = sorted(batch.ids.tolist())
    assert rows == sorted([[tok.bos_id, 0, 1, tok.eos_id], [tok.bos_id, 0, tok.eos_id, tok.pad_id]])
    with pytest.raises(InputError, match="label 'z' is not among"):
        LabelledData.from_examples([("a", "z")], tok, label_vocab=data.label_vocab)


def test_only_single_symbol_tasks_are_classification() -> None:
    with pytest.raises(ConfigError, match="no classification"):
        make_task("copy", 5, seed=0).labelled()


def test_sst2_dev() -> None:
    path = shared("sst2", "stsa.binary.dev")
    examples = read_labelled(path)
    assert len(examples) == 872
    assert {label for _, label in examples} == {"0", "1"}
    assert all(text and text == text.strip() for text, _ in examples)


def _sst_like(path: Path, bad: str) -> Path:
    """40 good `<label> <text>` lines, with `bad` as line 7."""
    lines = [f"{i % 2} a sentence number {i}" for i in range(40)]
    lines[6] = bad
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_line_without_its_label_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = _sst_like(tmp_path / "sst.txt", "this film forgot its label")
    with pytest.raises(InputError, match=r"sst.txt, line 7: the label 'this' is a lower-case word.*--bad-labels skip"):
        read_labelled(path)
    assert len(read_labelled(path, bad_labels="skip")) == 39
    assert ("film forgot its label", "this") in read_labelled(path, bad_labels="keep")


def test_a_label_holding_a_space_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("text,label\nfine,pos\nawful,neg\nodd,pos itive\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"x.csv, line 4: the label 'pos itive' holds whitespace"):
        read_labelled(path)
    assert read_labelled(path, bad_labels="skip") == [("fine", "pos"), ("awful", "neg")]


def test_tab_separated_label_lines_split_at_the_tab(tmp_path: Path) -> None:
    path = tmp_path / "tabs.txt"
    path.write_text("1\tgood film\n0\tbad film\n", encoding="utf-8")
    assert read_labelled(path) == [("good film", "1"), ("bad film", "0")]


def _lines(labels: list[str], bad: dict[int, str]) -> str:
    """`<label> <text>` lines with these labels, and the lines (1-based) of `bad` replaced by its texts."""
    lines = [f"{label} a sentence number {i}" for i, label in enumerate(labels)]
    for n, text in bad.items():
        lines[n - 1] = text
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("labels", "why"), [
    (["0", "1"] * 20, "is a lower-case word, where 95% of the lines have numbers"),  # SST-2: a word among numbers
    (["pos", "neg"] * 20, "is on 2 lines only, where 'neg' is on 20"),  # words alike: too rare for a class
    (["World", "Sports", "Business"] * 100, "is a lower-case word, where 99% of the lines have capitalised"),
])
def test_lines_missing_their_label_are_caught_when_they_share_a_first_word(tmp_path: Path, labels, why) -> None:
    path = tmp_path / "train.txt"
    path.write_text(_lines(labels, {7: "the film forgot its label", 21: "the other one too"}), encoding="utf-8")
    with pytest.raises(InputError, match=rf"train.txt, line 7: the label 'the' {why}.*1 more line\(s\) like it: 21"):
        read_labelled(path)
    assert len(read_labelled(path, bad_labels="skip")) == len(labels) - 2
    assert ("other one too", "the") in read_labelled(path, bad_labels="keep")


@pytest.mark.parametrize("labels", [
    ["0"] * 400 + ["1"] * 12,  # 3% of the lines
    ["neg"] * 100 + ["pos"] * 5,  # few lines, yet enough to be a class
    ["a"] * 10 + ["b"] * 10 + ["c"] * 4,  # few lines, and no other class ten times as large
    ["-1"] * 300 + ["1"] * 10,  # numbers alike, signed or not
])
def test_imbalanced_data_sets_are_read_whole(tmp_path: Path, labels) -> None:
    path = tmp_path / "train.txt"
    path.write_text(_lines(labels, {}), encoding="utf-8")
    assert [label for _, label in read_labelled(path)] == labels


def test_a_label_outside_the_known_ones_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "val.txt"
    path.write_text(_lines(["0", "1", "2", "1"], {3: "this film forgot its label"}), encoding="utf-8")
    with pytest.raises(InputError, match=r"val.txt, line 3: the label 'this' is not among the known labels "
                                         r"\['0', '1', '2'\].*--bad-labels skip"):
        read_labelled(path, known=("0", "1", "2"))
    with pytest.raises(InputError, match="val.txt, line 3"):  # a label with no class cannot be kept
        read_labelled(path, known=("0", "1", "2"), bad_labels="keep")
    assert [label for _, label in read_labelled(path, known=("0", "1", "2"), bad_labels="skip")] == ["0", "1", "1"]
    with pytest.raises(InputError, match="every line's label looks wrong, so none is left to read"):
        read_labelled(path, known=("pos", "neg"), bad_labels="skip")
    path.write_text("2 a class on one line, known\n" + _lines(["0", "1"] * 20, {}), encoding="utf-8")
    assert len(read_labelled(path, known=("0", "1", "2"))) == 41  # known labels are never too rare


@pytest.mark.parametrize(("name", "content", "why"), [
    ("x.csv", "label,text\n1,fine\n1,great, fun movie\n0,bad\n", r"a comma inside a text must be quoted"),
    ("x.tsv", "label\ttext\n1\tfine\n1\tgreat\tfun movie\n0\tbad\n", r"a text cannot hold a tab"),
])
def test_a_row_with_more_fields_than_the_header_is_refused_not_cut(tmp_path: Path, name, content, why) -> None:
    """An unquoted comma (or a tab in a TSV text) splits a text in two: its first part was read as the text,
    the rest dropped, with no word said."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=rf"{name}, line 3: 3 fields where the header has 2.*{why}"):
        read_labelled(path)
    path.write_text(content.replace("\n1,great, fun movie", '\n1,"great, fun movie"'), encoding="utf-8")
    if name.endswith(".csv"):
        assert read_labelled(path)[1] == ("great, fun movie", "1")


def test_jsonl_files_read_by_their_keys(tmp_path: Path) -> None:
    """JSON Lines, as `datasets`' to_json writes a split: one object a line, the text and label found by key; a line
    that is not JSON, names a key twice or nests without end is refused naming the line."""
    path = tmp_path / "sst.jsonl"
    path.write_text('\ufeff{"idx": 0, "sentence": "a fine, \\"warm\\" film", "label": 1}\r\n\n'
                    '{"sentence": "dull", "label": 0}\n', encoding="utf-8")
    assert read_labelled(path) == [('a fine, "warm" film', "1"), ("dull", "0")]
    assert layout_of(path) == ("labelled", "a JSON Lines file")  # a tagger's eval refuses it by name
    path.write_text('{"body": "nice", "stars": "5"}\n', encoding="utf-8")
    assert read_labelled(path, text_column="body", label_column="stars") == [("nice", "5")]
    for line, why in [('{"text": "ok", "label": 1', r"line 1 is not valid JSON"),
                      ('{"text": "ok", "label": 1, "text": "fine"}', r"line 1 names text twice in one object"),
                      ('{"text": "ok", "label": ' + "[" * 100_000, r"line 1 is not valid JSON \(nested too deeply"),
                      ('["ok", 1]', r"line 1 holds a JSON list, not an object"),
                      ('{"text": "ok"}', r"line 1 has no label key \(one of \['label'"),
                      ('{"text": "ok", "label": [1, 2]}', r"line 1: the label \[1, 2\] is a list")]:
        path.write_text(line + "\n", encoding="utf-8")
        with pytest.raises(InputError, match=rf"sst.jsonl, {why}"):
            read_labelled(path)


def test_a_label_vocabulary_round_trips_and_damaged_files_are_refused(tmp_path: Path) -> None:
    """labels.json was read with plain json.loads and whatever "labels" held was taken (a string became its letters,
    numbers and repeated labels passed): each damage is refused naming the file and the fix."""
    path = tmp_path / "labels.json"
    vocab = LabelVocab(("neg", "pos", "10"))  # a fine-tuned source's order, not sorted: kept as it is
    vocab.save(path)
    assert LabelVocab.load(path) == vocab
    damaged = {
        '{"labels": "neg"}': "must be a list of strings",
        '{"labels": ["neg", 1]}': "must be a list of strings",
        '{"labels": ["neg", "pos", "neg"]}': "'neg' given more than once",
        '{"labels": []}': "one or more distinct labels",
        '{"labels": ["neg"], "labels": ["pos"]}': "names labels twice",
        '["neg", "pos"]': "must be a JSON object",
        '{"labels": ["neg"': "is not valid JSON",
        '{"names": ["neg"]}': "labels",
    }
    for text, message in damaged.items():
        path.write_text(text, encoding="utf-8")
        with pytest.raises(InputError, match=message) as refused:
            LabelVocab.load(path)
        assert str(path) in str(refused.value) and "LabelVocab.save" in str(refused.value), text


def test_a_label_vocabulary_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    """A write that fails part way (a full disk) leaves the file it replaces as it was, and no partial file beside."""
    import errno

    from attnkit import outputs

    path = tmp_path / "labels.json"
    LabelVocab(("a", "b")).save(path)

    def full_disk(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", full_disk)
    with pytest.raises(Exception, match="space"):
        LabelVocab(("a", "b", "c")).save(path)
    monkeypatch.undo()
    assert LabelVocab.load(path).labels == ("a", "b") and [p.name for p in tmp_path.iterdir()] == ["labels.json"]


def test_a_tsv_quoted_as_pandas_and_the_csv_module_write_it_is_read_whole(tmp_path: Path) -> None:
    """A TSV written by csv.writer(delimiter='\\t') or pandas' to_csv(sep='\\t') quotes a text holding a line break, a
    tab or a quote: it was read raw, a quoted line break stopping it with 'line 2: the label is empty' and a quoted
    text keeping its quotes, doubled. A raw TSV whose text holds quotes (GLUE's SST-2) is still read as it is."""
    import csv

    rows = [("line one\nline two", "pos"), ('he said "hi"', "neg"), ("a\ttab", "pos"), ("plain", "neg")]
    with open(tmp_path / "quoted.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    assert read_labelled(tmp_path / "quoted.tsv") == rows
    (tmp_path / "raw.tsv").write_text('sentence\tlabel\n"the movie" is bad\t0\nit\'s "great\t1\n', encoding="utf-8")
    assert read_labelled(tmp_path / "raw.tsv") == [('"the movie" is bad', "0"), ('it\'s "great', "1")]


def test_a_raw_tsv_is_read_quoted_only_where_csv_would_have_written_it_so(tmp_path: Path) -> None:
    """A raw text quoted whole kept no quotes, and a raw quote opened on one line and closed on a later one joined
    the two rows into one text: read quoted where the rows read whole, csv would not have quoted that text, nor made
    one text of rows that are whole raw. A TSV as pandas' to_csv(sep='\\t') writes it (lines ending in LF) is still
    read quoted."""
    import csv

    (tmp_path / "whole.tsv").write_text('sentence\tlabel\n"a quoted title"\t1\nplain\t0\n', encoding="utf-8")
    assert read_labelled(tmp_path / "whole.tsv") == [('"a quoted title"', "1"), ("plain", "0")]
    (tmp_path / "open.tsv").write_text('sentence\tlabel\n" hello\t0\nworld "\t1\nplain\t0\n', encoding="utf-8")
    assert read_labelled(tmp_path / "open.tsv") == [('" hello', "0"), ('world "', "1"), ("plain", "0")]
    rows = [('"quoted" at the start', "1"), ("two\nlines", "0"), ('"a\ttab"', "1"), ("plain", "0")]
    with open(tmp_path / "pandas.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)
    assert read_labelled(tmp_path / "pandas.tsv") == rows
