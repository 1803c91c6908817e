"""Token classification: CoNLL and CoNLL-U reading, BIO/BIOES checks, labels on first pieces only, seqeval's scores,
and a tagger trained from the command line on a synthetic entity set (tests/tagging_data.py) to entity F1 >= 0.95."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tagging_data import tagging_sentences

import attnkit
from attnkit import build_model, cli
from attnkit.config import ModelConfig
from attnkit.data import IGNORE_INDEX, LabelVocab
from attnkit.errors import ConfigError, InputError
from attnkit.tasks.conll import check_scheme, read_tagged, tag_scheme, write_conll
from attnkit.tasks.tag import TaggedData, align, tag_predictions, tag_scores
from attnkit.tokenize import CharTokenizer, HFTokenizer, train_tokenizer

CONLLU = """# sent_id = 1
1\tAnna\tAnna\tPROPN\tNNP\t_\t2\tnsubj\t_\tNER=B-PER
2\tlives\tlive\tVERB\tVBZ\t_\t0\troot\t_\tNER=O
3-4\tin'the\t_\t_\t_\t_\t_\t_\t_\t_
3\tin\tin\tADP\tIN\t_\t5\tcase\t_\tNER=O
4\tthe\tthe\tDET\tDT\t_\t5\tdet\t_\tNER=O
5\tcity\tcity\tNOUN\tNN\t_\t2\tobl\t_\tNER=O
5.1\tghost\tghost\tX\tX\t_\t_\t_\t_\tNER=O

"""


def test_conll_and_conllu_files_read_into_words_and_tags(tmp_path):
    conll = tmp_path / "a.conll"
    conll.write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n",
                     encoding="utf-8")
    assert read_tagged(conll) == [(["EU", "rejects"], ["B-ORG", "O"]), (["Peter"], ["B-PER"])]
    conllu = tmp_path / "a.conllu"
    conllu.write_text(CONLLU, encoding="utf-8")
    words = ["Anna", "lives", "in", "the", "city"]  # no multiword range, no empty node
    assert read_tagged(conllu) == [(words, ["PROPN", "VERB", "ADP", "DET", "NOUN"])]
    assert read_tagged(conllu, column="NER") == [(words, ["B-PER", "O", "O", "O", "O"])]
    with pytest.raises(InputError, match="--tag-column"):
        read_tagged(conllu, column="deps")
    bad = tmp_path / "bad.conll"
    bad.write_text("word\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.conll:1: 'word' has no tag"):
        read_tagged(bad)


def test_write_conll_reads_back(tmp_path):
    sentences = tagging_sentences(5, seed=3)
    write_conll(tmp_path / "s.conll", sentences)
    assert read_tagged(tmp_path / "s.conll") == sentences


def test_tag_schemes_are_told_apart_and_checked():
    assert tag_scheme({"O", "B-PER", "I-PER"}) == "BIO"
    assert tag_scheme({"O", "S-PER", "B-LOC", "E-LOC"}) == "BIOES"
    assert tag_scheme({"NOUN", "VERB"}) is None
    check_scheme([(["a", "b"], ["B-PER", "I-PER"])], "BIO", "f")
    with pytest.raises(InputError, match="I-PER follows O"):
        check_scheme([(["a", "b"], ["O", "I-PER"])], "BIO", "f")
    with pytest.raises(InputError, match="I-LOC follows B-PER"):
        check_scheme([(["a", "b"], ["B-PER", "I-LOC"])], "BIO", "f")
    check_scheme([(["a", "b", "c"], ["B-LOC", "E-LOC", "S-PER"])], "BIOES", "f")
    with pytest.raises(InputError, match="leaves unclosed"):
        check_scheme([(["a", "b"], ["B-LOC", "O"])], "BIOES", "f")


def test_labels_sit_on_first_pieces_and_nothing_else_carries_loss():
    tokenizer = train_tokenizer("bpe", ["Johnathan lives in Paris"] * 20, vocab_size=300)
    words, tags = ["Johnathan", "lives", "in", "Paris"], [1, 0, 0, 2]
    aligned = align(tokenizer, words, tags, max_len=64)
    pieces = tokenizer.encode_batch(words)
    assert aligned.ids[0] in (tokenizer.cls_id, tokenizer.bos_id)
    for word, first, tag in zip(pieces, aligned.firsts, tags, strict=True):
        assert aligned.ids[first:first + len(word)] == word
        assert aligned.labels[first] == tag
        assert all(label == IGNORE_INDEX for label in aligned.labels[first + 1:first + len(word)])
    assert sum(label != IGNORE_INDEX for label in aligned.labels) == len(words)
    short = align(tokenizer, words, tags, max_len=1 + len(pieces[0]) + 1)  # room for the first word only
    assert short.firsts[0] is not None and short.firsts[1:] == [None, None, None]


def test_align_stops_encoding_once_no_word_fits():
    """A text of thirty thousand words costs what one of max_len words does: once no word can fit, the rest are cut
    off without being encoded (a megabyte text sent to a tagger held the tokenizer for seconds)."""
    tokenizer = train_tokenizer("bpe", ["Johnathan lives in Paris"] * 20, vocab_size=300)

    class Counting:  # the tokenizer, counting the words it encodes
        def __init__(self) -> None:
            self.words = 0

        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode_batch(self, texts):
            self.words += len(texts)
            return tokenizer.encode_batch(texts)

    words, counting = ["Johnathan", "lives", "in", "Paris"] * 8_000, Counting()
    aligned = align(counting, words, None, max_len=64)
    head = align(tokenizer, words[:64], None, max_len=64)
    assert aligned.ids == head.ids and aligned.firsts == head.firsts + [None] * (len(words) - 64)
    assert counting.words <= 2 * 64


def test_words_past_the_context_are_said_to_count_as_o_not_as_mistakes(caplog):
    """Scores give such a word O (right where its tag is O, an entity among them missed); the warning called them
    mistakes, and, read by attnkit eval too, spoke of training."""
    tokenizer = CharTokenizer.from_texts(["abcdefgh "])
    with caplog.at_level("WARNING", logger="attnkit.tasks.tag"):
        TaggedData.from_sentences([(["abc", "de", "fgh"], ["B-X", "O", "O"])], tokenizer,
                                  label_vocab=LabelVocab(("B-X", "O")), max_len=8, batch_size=1)
    assert "1 words lie beyond max_seq_len=8 pieces: the model does not read them, and scores count them as " \
           "tagged 'O' (an entity among them missed)" in caplog.text


def two_sentences_and_a_tagger(label_smoothing: float = 0.0) -> tuple[TaggedData, LabelVocab, torch.nn.Module]:
    """Two sentences of character pieces, labels on first pieces, and a tiny untrained tagger for them."""
    tokenizer = CharTokenizer.from_texts(["abcdefgh "])
    vocab = LabelVocab(("B-X", "O"))
    data = TaggedData.from_sentences([(["abc", "de"], ["B-X", "O"]), (["h"], ["O"])], tokenizer, label_vocab=vocab,
                                     max_len=16, batch_size=2)
    config = ModelConfig(family="encoder", encoder_head="tag", n_classes=2, vocab_size=tokenizer.vocab_size,
                         d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16, dropout=0.0,
                         label_smoothing=label_smoothing)
    torch.manual_seed(0)
    return data, vocab, build_model(config).eval()


def test_the_loss_skips_continuation_pieces_and_padding():
    """The model's loss equals cross-entropy over first pieces alone, whatever the other positions predict."""
    data, vocab, model = two_sentences_and_a_tagger()
    batch = data.collate([0, 1])
    out = model(batch.ids, attention_mask=batch.attention_mask, labels=batch.labels)
    firsts = [(row, f) for row, a in enumerate(data.aligned) for f in a.firsts]
    logits = torch.stack([out.logits[r, f] for r, f in firsts])
    gold = torch.tensor([vocab.encode(t) for _, tags in data.sentences for t in tags])
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(logits, gold))
    _, count, predicted = tag_predictions(model, data)
    assert count == 3 and [len(p) for p in predicted] == [2, 1]


def test_the_scored_loss_is_the_likelihood_with_label_smoothing_on():
    """tag_predictions' loss is the plain cross-entropy over first pieces, not the model's label-smoothed one."""
    data, _, model = two_sentences_and_a_tagger(label_smoothing=0.3)
    batch = data.collate([0, 1])
    logits = model(batch.ids, attention_mask=batch.attention_mask).logits  # (B, T, 2)
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), reduction="sum")
    total, count, _ = tag_predictions(model, data)
    assert count == 3 and total == pytest.approx(plain.item(), rel=1e-5)


def test_scores_are_seqeval_entity_scores_and_word_accuracy():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    predicted = [["B-PER", "I-PER", "O", "O"]]
    scores = tag_scores(gold, predicted, "BIO")
    assert scores["precision"] == 1.0 and scores["recall"] == 0.5 and scores["f1"] == pytest.approx(2 / 3)
    assert scores["accuracy"] == 0.75
    assert tag_scores([["NOUN", "VERB"]], [["NOUN", "NOUN"]], None) == {"accuracy": 0.5}


@pytest.mark.parametrize("scheme, tags", [
    ("BIO", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
    ("BIOES", ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]),
])
def test_entity_scores_equal_seqevals_on_drawn_sentences(scheme, tags):
    """Per-sentence entity counts, summed (what training, eval and several ranks add up), give seqeval's corpus
    precision, recall, F1 and accuracy, on drawn gold and predicted tags, broken transitions included."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    generator = torch.Generator().manual_seed(0)

    def draw(n: int) -> list[str]:
        return [tags[i] for i in torch.randint(0, len(tags), (n,), generator=generator).tolist()]

    for _ in range(100):
        gold = [draw(int(n)) for n in torch.randint(1, 9, (int(torch.randint(1, 6, (1,), generator=generator)),),
                                                    generator=generator)]
        predicted = [draw(len(words)) for words in gold]
        ours = tag_scores(gold, predicted, scheme)
        assert ours == pytest.approx({
            "precision": precision_score(gold, predicted, zero_division=0),
            "recall": recall_score(gold, predicted, zero_division=0),
            "f1": f1_score(gold, predicted, zero_division=0), "accuracy": accuracy_score(gold, predicted)})


def _untrained_tagger(run: Path, tokenizer) -> Path:
    """`run`: a tiny encoder tagger of labels B-X and O, untrained, with `tokenizer` and no task.json."""
    from attnkit.checkpoint import save_model

    config = ModelConfig(family="encoder", encoder_head="tag", n_classes=2, vocab_size=tokenizer.vocab_size,
                         d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32)
    torch.manual_seed(0)
    save_model(build_model(config), config, run)
    tokenizer.save(run / "tokenizer")
    (run / "labels.json").write_text(json.dumps({"labels": ["B-X", "O"]}))
    return run


def test_attnkit_tag_reads_the_words_of_a_conll_file(tmp_path, capsys):
    """A CoNLL file given to attnkit tag was read as lines of text: each 'word tag' line a text of its own, the gold
    tag tagged as a word, with no word said. Its sentences are read as the words they hold."""
    run = _untrained_tagger(tmp_path / "run", CharTokenizer.from_texts(["abcdefgh"]))
    write_conll(tmp_path / "in.conll", [(["abc", "de"], ["B-X", "O"]), (["h"], ["O"])])
    assert cli.main(["tag", str(run), "--input", str(tmp_path / "in.conll"), "--format", "conll"]) == 0
    expected = attnkit.load(run).tag([["abc", "de"], ["h"]])
    assert capsys.readouterr().out == "".join("".join(f"{w.word}\t{w.label}\n" for w in words) + "\n"
                                              for words in expected)
    (tmp_path / "names.txt").write_text("abc de\nfg h\n\nbad ce\n", encoding="utf-8")  # texts of two words apiece
    assert cli.main(["tag", str(run), "--input", str(tmp_path / "names.txt")]) == 0
    assert [len(line.split()) for line in capsys.readouterr().out.splitlines()] == [2, 2, 0, 2]


def test_attnkit_tag_reads_a_one_line_conll_file_as_its_word(tmp_path, capsys):
    """A CoNLL file of one line was still read as a text, its gold tag tagged as a second word; it is read as the
    sentence of one word it holds. A one-line text of two words stays a text."""
    run = _untrained_tagger(tmp_path / "run", CharTokenizer.from_texts(["abcdefgh"]))
    (tmp_path / "in.conll").write_text("abc\tB-X\n", encoding="utf-8")
    assert cli.main(["tag", str(run), "--input", str(tmp_path / "in.conll"), "--format", "conll"]) == 0
    [words] = attnkit.load(run).tag([["abc"]])
    assert capsys.readouterr().out == f"abc\t{words[0].label}\n\n"
    (tmp_path / "names.txt").write_text("abc de\n", encoding="utf-8")
    assert cli.main(["tag", str(run), "--input", str(tmp_path / "names.txt")]) == 0
    assert [w.split("/")[0] for w in capsys.readouterr().out.split()] == ["abc", "de"]


@pytest.mark.slow  # 200 steps of a small encoder: a minute or two on an idle laptop CPU
def test_a_tagger_trains_from_the_command_line_to_entity_f1_095(tmp_path, capsys):
    """The synthetic entity set of tests/tagging_data.py (closed lists of people, places and companies in six
    templates): trained from CoNLL files, scored by attnkit eval as by training, used by attnkit tag and load."""
    run = _tagger_run(tmp_path, 600, "--set", "d_model=64", "--set", "d_ff=128", "--max-steps", "200",
                      "--batch-size", "32", "--eval-every", "200", "--lr", "3e-3")
    capsys.readouterr()
    config = json.loads((run / "config.json").read_text())
    assert config["encoder_head"] == "tag" and config["n_classes"] == 7  # the task implied its head
    trained = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "f1" in r][-1]
    assert trained["f1"] >= 0.95, trained
    assert cli.main(["eval", str(run), "--data", str(tmp_path / "dev.conll")]) == 0
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert report["rows"][0]["f1"] == pytest.approx(trained["f1"], abs=1e-9)
    assert report["rows"][0]["accuracy"] == pytest.approx(trained["accuracy"], abs=1e-9)
    capsys.readouterr()
    assert cli.main(["tag", str(run), "--text", "Anna lives in New York .", "--format", "conll"]) == 0
    assert capsys.readouterr().out.splitlines()[:5] == ["Anna\tB-PER", "lives\tO", "in\tO", "New\tB-LOC",
                                                        "York\tI-LOC"]
    pipeline = attnkit.load(run)
    words = pipeline.tag(["Hooli hired Greta Lind last year ."])[0]
    assert [w.label for w in words] == ["B-ORG", "O", "B-PER", "I-PER", "O", "O", "O"]
    assert not hasattr(pipeline, "classify") and not hasattr(pipeline, "generate")


def test_inconsistent_training_tags_are_refused_before_training(tmp_path):
    from attnkit.train import TrainRequest, prepare

    (tmp_path / "bad.conll").write_text("Anna\tI-PER\nlives\tO\n\nBen\tB-PER\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="I-PER follows O"):
        prepare(TrainRequest(out=str(tmp_path / "run"), task="tag", data={"data": (str(tmp_path / "bad.conll"),),
                                                                          "tokenizer": "char"}))
    with pytest.raises(ConfigError, match="encoder_head"):
        prepare(TrainRequest(out=str(tmp_path / "run2"), task="tag", overrides=["encoder_head=classify"],
                             data={"data": (str(tmp_path / "bad.conll"),), "tokenizer": "char"}))


def _metaspace_tokenizers(text: str) -> tuple[HFTokenizer, HFTokenizer]:
    """A SentencePiece-style BPE (Metaspace: '▁be') trained here, and the same with Llama 2's tokenizer.json layout
    (no pre-tokenizer; the normalizer prepends '▁' and writes spaces as '▁', so ' be' alone is '▁', '▁be')."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=120, special_tokens=list(specials.values())))
    llama = Tokenizer.from_str(tok.to_str())
    llama.pre_tokenizer = None
    llama.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    return HFTokenizer(tok, kind="hf", specials=specials), HFTokenizer(llama, kind="hf", specials=specials)


def test_words_become_the_pieces_of_the_running_text_where_the_space_starts_the_word():
    """Byte-level BPE and SentencePiece write a word's space into it ('Ġbe', '▁be'); each word encoded on its own
    with the tokenizer's space between gave 'Ġ', 'b', 'e', pieces such a model seldom reads. A run's tagger now reads
    the running text's own pieces, each word's label on its first, with the offsets of transformers' fast tokenizer
    (`word_ids`)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    text = "To be or not to be , that is the question : whether 'tis nobler in the mind . " * 10
    words = "To be or not to be , that is the question".split()
    byte_level = train_tokenizer("bpe", [text], vocab_size=300)
    metaspace, llama = _metaspace_tokenizers(text)
    for tokenizer in (byte_level, metaspace, llama):
        assert tokenizer.space_starts_word
        running = tokenizer.encode(" ".join(words))
        aligned = align(tokenizer, words, list(range(len(words))), max_len=64, word_pieces="running")
        assert aligned.ids[1:-1] == running, tokenizer.pieces(aligned.ids)
        assert [aligned.labels[f] for f in aligned.firsts] == list(range(len(words)))
        assert sum(label != IGNORE_INDEX for label in aligned.labels) == len(words)
        fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.to_str()))(
            " ".join(words), add_special_tokens=False)
        assert fast["input_ids"] == running
        if tokenizer is not llama:  # a text without a pre-tokenizer is one word to transformers
            assert aligned.firsts == [1 + fast.word_ids().index(i) for i in range(len(words))]
        old = align(tokenizer, words, None, max_len=64)  # a run trained before: each word on its own
        assert old.ids[1:-1] != running
    assert byte_level.pieces(align(byte_level, words[:2], None, 64, "running").ids[1:-1]) == ["To", "Ġbe"]
    # past the first max_len words (cut off, too long to fit), a word still carries its space
    long = ["Johnathanxyzqwvk"] * 4 + ["be", "or"]
    cut = align(byte_level, long, None, max_len=4, word_pieces="running")
    assert cut.firsts[:4] == [None] * 4 and byte_level.pieces(cut.ids[1:-1]) == ["Ġbe", "Ġor"]
    characters = CharTokenizer.from_texts(["abc de"])  # its space is a character: as before
    assert align(characters, ["abc", "de"], None, 16, "running") == align(characters, ["abc", "de"], None, 16)


def _tagger_run(tmp_path: Path, n_sentences: int, *flags: str) -> Path:
    """tmp_path/run: a tagger trained with a byte-level BPE of 300 tokens on `n_sentences` synthetic sentences (a
    sixth as many in tmp_path/dev.conll to validate on), with the training `flags`."""
    write_conll(tmp_path / "train.conll", tagging_sentences(n_sentences, seed=0))
    write_conll(tmp_path / "dev.conll", tagging_sentences(n_sentences // 6, seed=1))
    run = tmp_path / "run"
    assert cli.main(["train", "--task", "tag", "--data", str(tmp_path / "train.conll"), "--val-data",
                     str(tmp_path / "dev.conll"), "--out", str(run), "--vocab-size", "300", "--no-progress",
                     *flags]) == 0
    return run


def _rewrite_task(where: Path, task: dict) -> None:
    """Write `task` as the task.json of the run or checkpoint `where`, its checksum with it."""
    from attnkit.checkpoint import digest, read_checksums, write_checksums

    (where / "task.json").write_text(json.dumps(task))
    write_checksums(where, {**read_checksums(where), "task.json": digest(where / "task.json")})


def _tagged_by_hand(run: Path, words: list[str], word_pieces: str) -> list[tuple[str, float]]:
    """What a tagger run says of `words` read as `word_pieces` says: each word's label and probability."""
    pipeline = attnkit.load(run)
    aligned = align(pipeline.tokenizer, words, None, pipeline.config.max_seq_len, word_pieces)
    with torch.no_grad():
        probs = pipeline.model(torch.tensor([aligned.ids])).logits[0].float().softmax(-1)
    return [(pipeline.labels[int(probs[f].argmax())], float(probs[f].max())) for f in aligned.firsts]


def test_a_byte_level_tagger_records_its_word_pieces_and_every_reader_keeps_them(tmp_path, capsys):
    """A tagger trained end to end with a byte-level BPE records in task.json that its words are the running text's
    pieces; attnkit eval scores as training did, attnkit tag and load read them so, a fine-tuned run keeps them. A
    run without the record (trained before it) keeps reading each word on its own, resumed too; a damaged one is
    refused."""
    from attnkit.errors import CheckpointError

    run = _tagger_run(tmp_path, 120, "--set", "d_model=32", "--set", "d_ff=64", "--set", "n_layers=1", "--set",
                      "max_seq_len=48", "--max-steps", "6", "--batch-size", "16", "--eval-every", "6")
    assert json.loads((run / "task.json").read_text()) == {"task": "tag", "word_pieces": "running", "frame": "attnkit"}
    trained = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "f1" in r][-1]
    assert cli.main(["eval", str(run), "--data", str(tmp_path / "dev.conll")]) == 0
    report = json.loads((run / "eval" / "eval.json").read_text())["rows"][0]
    assert report["val_loss"] == pytest.approx(trained["val_loss"], rel=1e-5)
    assert report["accuracy"] == pytest.approx(trained["accuracy"], abs=1e-9)
    words = "Hooli hired Greta Lind last year .".split()
    running, own = _tagged_by_hand(run, words, "running"), _tagged_by_hand(run, words, "own")
    assert running != own
    capsys.readouterr()
    assert cli.main(["tag", str(run), "--text", " ".join(words), "--format", "conll"]) == 0
    assert capsys.readouterr().out.split() == [x for word, (label, _) in zip(words, running, strict=True)
                                              for x in (word, label)]
    assert [(w.label, pytest.approx(w.probability, rel=1e-5)) for w in attnkit.load(run).tag([words])[0]] == running
    assert cli.main(["train", "--task", "tag", "--data", str(tmp_path / "train.conll"), "--out",
                     str(tmp_path / "tuned"), "--init-from", str(run), "--max-steps", "1", "--no-progress"]) == 0
    assert json.loads((tmp_path / "tuned" / "task.json").read_text())["word_pieces"] == "running"

    for where in (run, *run.glob("checkpoints/*")):  # as a run trained before the record existed wrote it
        _rewrite_task(where, {"task": "tag"})
    assert [(w.label, pytest.approx(w.probability, rel=1e-5)) for w in attnkit.load(run).tag([words])[0]] == own
    assert cli.main(["train", "--resume", "--out", str(run), "--max-steps", "7", "--no-progress"]) == 0
    assert json.loads((run / "task.json").read_text())["word_pieces"] == "own"
    _rewrite_task(run, {"task": "tag", "word_pieces": "spaced"})
    with pytest.raises(CheckpointError, match="word_pieces='spaced'"):
        attnkit.load(run).tag([words])


def test_an_onnx_folder_of_a_tagger_says_how_its_words_become_pieces(tmp_path):
    """runtime.json told every tagger's runtime to encode each word alone and join them with a space's ids; a tagger
    that reads the running text's pieces (its task.json says so) is described as that."""
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")
    from attnkit.checkpoint import save_model
    from attnkit.interop.onnx import convert_to_onnx

    tokenizer, run = train_tokenizer("bpe", ["Anna lives in Paris ."] * 20, vocab_size=300), tmp_path / "run"
    config = ModelConfig(family="encoder", encoder_head="tag", n_classes=2, vocab_size=tokenizer.vocab_size,
                         d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    save_model(build_model(config), config, run)
    tokenizer.save(run / "tokenizer")
    (run / "task.json").write_text(json.dumps({"task": "tag", "word_pieces": "running"}))
    convert_to_onnx(run, tmp_path / "onnx")
    words = json.loads((tmp_path / "onnx" / "runtime.json").read_text())["words"]
    assert "between_ids" not in words and "joined by single spaces once" in words["how"]


def test_a_tagger_without_a_task_json_reads_the_running_texts_pieces(tmp_path):
    """A tagger with no task.json (converted from Hugging Face, whose taggers learn each word with its leading space
    by `is_split_into_words`) was read as each word on its own, a lone space piece between words it never saw; it is
    read as the running text's pieces, by load and by its ONNX folder's runtime.json."""
    run = _untrained_tagger(tmp_path / "run", train_tokenizer("bpe", ["Anna lives in Paris ."] * 20, vocab_size=300))
    assert not (run / "task.json").exists()
    words = "Anna lives in Paris .".split()
    running, own = _tagged_by_hand(run, words, "running"), _tagged_by_hand(run, words, "own")
    assert running != own
    assert [(w.label, pytest.approx(w.probability, rel=1e-5)) for w in attnkit.load(run).tag([words])[0]] == running
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")
    from attnkit.interop.onnx import convert_to_onnx

    convert_to_onnx(run, tmp_path / "onnx")
    described = json.loads((tmp_path / "onnx" / "runtime.json").read_text())["words"]
    assert "between_ids" not in described and "joined by single spaces once" in described["how"]


def test_a_tokenizer_with_cls_and_no_sep_frames_a_tagged_text_as_a_classified_one():
    """One function decides the framing (`frame_ids`): with CLS and no SEP, a tagged text began with BOS where a
    classified one begins with CLS; both read `CLS text EOS` now."""
    from attnkit.data.labelled import LabelledData

    tokenizer = CharTokenizer.from_texts(["abc"], special_tokens={"pad": "<pad>", "bos": "<bos>", "eos": "<eos>",
                                                                  "cls": "<cls>", "unk": "<unk>"})
    classified = LabelledData.from_examples([("ab c", "x")], tokenizer).ids[0].tolist()
    tagged = align(tokenizer, ["ab", "c"], None, 16).ids
    assert tagged == classified and tagged[0] == tokenizer.cls_id and tagged[-1] == tokenizer.eos_id


def test_a_conllu_file_is_told_by_one_rule_whatever_the_suffixs_case(tmp_path):
    """layout_of took A.CONLLU for CoNLL-U and read_tagged read it as CoNLL (each line's last column, 'SpaceAfter=No'
    and '_' for tags): one rule, is_conllu, says which for both, and for attnkit inspect probe's --column."""
    from attnkit.tasks.conll import is_conllu
    from attnkit.tasks.layouts import layout_of

    upper = tmp_path / "A.CONLLU"
    upper.write_text(CONLLU, encoding="utf-8")
    assert is_conllu(upper) and not is_conllu(tmp_path / "a.conll")
    assert layout_of(upper) == ("tagged", "a .conllu file")
    assert read_tagged(upper) == [(["Anna", "lives", "in", "the", "city"], ["PROPN", "VERB", "ADP", "DET", "NOUN"])]
