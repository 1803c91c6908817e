"""Data and settings that do not match are said, not used: a training file rewritten since a run's tokenizer was
built, a recipe's model fields against a model named on the command line, torchrun's launch variables, and
evaluation files that do not fit the run (pairs in the swapped direction, BIO tags training would refuse, a
classifier's file given to a tagger and the reverse)."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch

from attnkit import build_model, cli
from attnkit.checkpoint import save_model
from attnkit.config import ModelConfig
from attnkit.errors import ConfigError, InputError
from attnkit.tasks.layouts import layout_of
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainRequest, prepare
from attnkit.train.distributed import World
from attnkit.train.evaluate import evaluate_run

TINY = ["d_model=16", "n_layers=1", "n_heads=2", "d_ff=32", "max_seq_len=16"]


def lm_request(out, data, **flags) -> TrainRequest:
    return TrainRequest(out=str(out), task="lm", overrides=TINY, progress=False,
                        data={"data": (str(data),), "eval_batches": 1, "seq_len": 8, "tokenizer": "char"},
                        settings=dict(max_steps=1, batch_size=2, warmup=1, eval_every=1, seed=0), **flags)


def test_a_training_file_rewritten_since_the_runs_tokenizer_is_named_not_trained_on_as_unk(tmp_path, caplog):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    prepare(lm_request(tmp_path / "run", text)).fit()
    text.write_text("ΑΒΓΔ ΕΖΗΘ ΙΚΛΜ ΝΞΟΠ ΡΣΤΥ\n" * 80)  # rewritten: letters the run's tokenizer never saw
    with caplog.at_level(logging.WARNING), pytest.raises(InputError) as refusal:
        prepare(lm_request(tmp_path / "run", text, resume=True))
    message = str(refusal.value)
    assert "% of the tokens of" in message and str(text) in message and "are <unk>" in message
    assert "was the file rewritten" in message and "Train a new run on it" in message
    assert f"the data file {text.resolve()} changed since its tokens were cached" in caplog.text


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "0"}, {"WORLD_SIZE": "two"}, {"RANK": "2", "WORLD_SIZE": "2"},
                                 {"RANK": "-1"}, {"LOCAL_RANK": "x", "WORLD_SIZE": "1"}])
def test_torchruns_variables_are_checked_in_one_line(monkeypatch, capsys, tmp_path, env):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="distributed launch variables") as refusal:
        World.from_env()
    assert all(f"{name}={value!r}" in str(refusal.value) for name, value in env.items())
    assert cli.main(["train", "--data", "synthetic:copy", "--out", str(tmp_path / "r"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "distributed launch variables" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_model_named_on_the_command_line_wins_over_a_recipes_model_fields(tmp_path):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("First Citizen:\nBefore we proceed any further\n")
    base = ["train", "--recipe", "shakespeare-char", "--data-root", str(tmp_path)]
    recipe = cli.parse(base).settings
    assert "d_model=128" in recipe.set  # the recipe's model when none is named
    named = cli.parse([*base, "--preset", "gpt2-tiny"]).settings
    assert named.preset == "gpt2-tiny" and not [s for s in named.set if s.startswith(("d_model=", "n_layers="))]
    assert cli.parse([*base, "--preset", "gpt2-tiny", "--set", "d_model=64"]).settings.set[-1] == "d_model=64"
    config = tmp_path / "model.json"
    config.write_text('{"family": "decoder", "d_model": 48, "n_heads": 2}')
    from_file = cli.parse([*base, "--model-config", str(config)]).settings
    assert not [s for s in from_file.set if s.startswith("d_model=")]


# Evaluation files that do not fit the run ---------------------------------------------------------------------------
def test_evaluation_pairs_in_the_swapped_direction_are_named_with_the_fix(tmp_path, capsys):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5))) for _ in range(60)]
    pairs = [(w, w.upper()[::-1]) for w in words]  # lowercase -> uppercase, reversed: the run's direction
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    prepare(TrainRequest(out=str(tmp_path / "run"), task="translate", overrides=TINY, progress=False,
                         data={"data": (str(train),), "tokenizer": "char"},
                         settings=dict(max_steps=30, batch_size=8, eval_every=1000, lr=1e-2, seed=0, warmup=1))).fit()
    (tmp_path / "src.txt").write_text("".join(f"{s}\n" for s, _ in pairs[:20]))
    (tmp_path / "tgt.txt").write_text("".join(f"{t}\n" for _, t in pairs[:20]))
    swapped = tmp_path / "swapped.tsv"
    swapped.write_text("".join(f"{t}\t{s}\n" for s, t in pairs[:20]))
    echo = lambda texts: texts  # noqa: E731  (the translations do not matter to the check)
    with pytest.raises(InputError, match="the pairs look swapped for this run") as refusal:
        evaluate_run(tmp_path / "run", [swapped], translate=echo)
    assert str(swapped) in str(refusal.value) and "Give the source-language side first" in str(refusal.value)
    with pytest.raises(InputError, match="look swapped"):  # two files, the target file first
        evaluate_run(tmp_path / "run", [tmp_path / "tgt.txt", tmp_path / "src.txt"], translate=echo)
    assert evaluate_run(tmp_path / "run", [tmp_path / "src.txt", tmp_path / "tgt.txt"], translate=echo).rows
    assert cli.main(["eval", str(tmp_path / "run"), "--data", str(swapped), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "look swapped" in err and "Traceback" not in err


def small_run(directory, head, labels):
    tokenizer = CharTokenizer.from_texts(["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,-"])
    config = ModelConfig(family="encoder", vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2,
                         d_ff=32, max_seq_len=64, position="learned", encoder_head=head, n_classes=len(labels))
    torch.manual_seed(0)
    tokenizer.save(directory / "tokenizer")
    save_model(build_model(config).eval(), config, directory)
    (directory / "labels.json").write_text(json.dumps({"labels": labels}))
    return directory


def test_a_file_for_the_other_kind_of_run_is_named_for_what_it_is(tmp_path):
    tagger = small_run(tmp_path / "tagger", "tag", ["O", "B-PER", "I-PER"])
    classifier = small_run(tmp_path / "classifier", "classify", ["neg", "pos"])
    texts = tmp_path / "reviews.txt"
    texts.write_text("pos a fine film\nneg not good at all\npos great\n")
    table = tmp_path / "reviews.csv"
    table.write_text("text,label\na fine film,pos\nnot good,neg\n")
    conll = tmp_path / "people.conll"
    conll.write_text("Anna B-PER\nlives O\nhere O\n\nBen B-PER\nruns O\n")
    conllu = tmp_path / "people.conllu"
    conllu.write_text("1\tAnna\t_\tPROPN\t_\t_\t0\troot\t_\t_\n\n")
    for path in (texts, table):
        with pytest.raises(InputError, match="looks like labelled texts for a classifier") as refusal:
            evaluate_run(tagger, [path])
        assert str(path) in str(refusal.value) and "this run is a tagger, scored on CoNLL" in str(refusal.value)
    for path in (conll, conllu):
        with pytest.raises(InputError, match="looks like tagged sentences for a tagger.*this run is a classifier"):
            evaluate_run(classifier, [path], bad_labels="skip")  # not read line by line as labels and skipped
    assert evaluate_run(tagger, [conll]).rows[0]["sentences"] == 2  # its own kind is scored (a classifier's: test_eval)


def test_layouts_are_recognised_strictly(tmp_path):
    def layout(name, text):
        (tmp_path / name).write_text(text)
        found = layout_of(tmp_path / name)
        return found and found[0]

    conll_2003 = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n" \
                 "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n"
    assert layout("train.txt", conll_2003) == "tagged"
    assert layout("sst2.txt", "1 a gripping , funny film .\n0 dull\n1 the best of the year , by far .\n") == "labelled"
    assert layout("one.conll", "Anna B-PER\nlives O\n") is None  # one sentence: a label and one word a line too
    assert layout("pairs.tsv", "word\ttag\nAnna\tB-PER\n\nBen\tB-PER\n") == "tagged"  # CoNLL as TSV
    assert layout("plain.tsv", "sentence\tlabel\nfine\tpos\n") == "labelled"


def test_evaluation_tags_that_training_would_refuse_are_named(tmp_path):
    tagger = small_run(tmp_path / "tagger", "tag", ["O", "B-PER", "I-PER"])
    broken = tmp_path / "broken.conll"
    broken.write_text("Ben B-PER\nruns O\n\nAnna O\nLind I-PER\nsings O\n")
    with pytest.raises(InputError, match=r"sentence 2: I-PER follows O, so it continues no PER entity at 'Lind'") as e:
        evaluate_run(tagger, [broken])
    assert str(broken) in str(e.value) and "convert the file to BIO" in str(e.value)
