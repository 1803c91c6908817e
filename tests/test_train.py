"""The training loop on tiny models and synthetic data: bit-for-bit resume, the non-finite stop, gradient
accumulation, evaluation per task, refusal of mismatched resumes."""

import json
import math

import pytest
import torch

from attnkit.checkpoint import digest, load_model, read_checksums, write_checksums
from attnkit.errors import CheckpointError, ConfigError
from attnkit.generate import translate_batched
from attnkit.tasks.common import EpochTask
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainingDiverged, TrainRequest, prepare
from attnkit.train.metrics import MetricsLog
from attnkit.train.state import checkpoints, find_checkpoint
from attnkit.train.trainer import Trainer

TINY = ["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64", "max_seq_len=24", "dropout=0.1"]
DATA = {"lm": "synthetic:copy", "mlm": "synthetic:copy", "translate": "synthetic:reverse", "classify": "synthetic:ab"}


@pytest.fixture(autouse=True)
def small_and_single_threaded(monkeypatch):
    """Small synthetic sets; one thread, since tiny ops on two threads crawl when other processes share the cores."""
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (2000, 48))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def request(out, task="lm", *, overrides=(), resume=False, **settings):
    defaults = dict(max_steps=8, batch_size=4, grad_accum=2, lr=3e-3, warmup=2, eval_every=4, seed=7)
    return TrainRequest(
        out=str(out), task=task, overrides=[*TINY, *overrides], data={"data": (DATA[task],), "eval_batches": 2,
                                                                        "bleu_samples": 8},
        settings={**defaults, **settings}, resume=resume, progress=False,
    )


def weights(run_dir):
    model, _ = load_model(run_dir)
    return model.state_dict()


def train_losses(run_dir):
    return [(r["step"], r["loss"]) for r in MetricsLog(run_dir / "metrics.jsonl").records("train")]


@pytest.mark.parametrize("task", ["lm", "mlm", "translate", "classify"])
def test_resume_continues_bit_for_bit(tmp_path, task):
    """2N steps in one go == N steps, stop, resume, N steps: identical weights and identical logged losses
    (dropout on, two micro-batches per step, warmup + cosine; mlm: the same tokens masked after the resume)."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    prepare(request(whole, task)).fit()
    first = prepare(request(split, task)).fit(stop_at=5)  # not at an evaluation: the plain save path
    assert first.step == 5 and first.reason == "stop_at"
    resumed = prepare(request(split, task, resume=True))
    assert resumed.step == 5
    resumed.fit()
    assert train_losses(split) == train_losses(whole)
    a, b = weights(whole), weights(split)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("task", ["lm", "mlm", "translate", "classify"])
def test_validation_loss_is_the_likelihood_not_the_label_smoothed_training_loss(tmp_path, task):
    """With label smoothing on, training's loss is no likelihood (Szegedy et al. 2016); val_loss and val_ppl are of
    the plain cross-entropy, so they equal the same model's scores with smoothing off."""
    trainer = prepare(request(tmp_path, task, overrides=["label_smoothing=0.2"], max_steps=4, eval_every=4))
    trainer.fit()
    model = trainer.model.eval()
    with torch.inference_mode():
        smoothed = trainer.task.evaluate(model)
        model.label_smoothing = 0.0
        plain = trainer.task.evaluate(model)
    assert smoothed == pytest.approx(plain, rel=1e-5)


@pytest.mark.parametrize("budget", [dict(max_steps=2), dict(max_time=1e-3)])
def test_resuming_a_run_whose_budget_is_spent_says_that_nothing_is_left_to_train(tmp_path, caplog, budget):
    prepare(request(tmp_path, max_steps=4)).fit()
    with caplog.at_level("WARNING", logger="attnkit.train.trainer"):
        result = prepare(request(tmp_path, resume=True, **budget)).fit()
    assert result.step == 4
    fix = "give --max-steps above 4" if "max_steps" in budget else "give a longer --max-time"
    assert f"nothing is left to train; {fix}" in caplog.text


def test_a_warmup_longer_than_the_run_is_named_with_the_peak_it_reaches(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="attnkit.train.trainer"):
        prepare(request(tmp_path / "short", max_steps=4, warmup=100))
    assert "--warmup 100 covers all 4 steps: the learning rate rises to 0.04 of --lr" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnkit.train.trainer"):
        prepare(request(tmp_path / "long", max_steps=4, warmup=3))
    assert "--warmup" not in caplog.text


def test_a_resume_whose_settings_move_the_learning_rate_says_where_it_jumps(tmp_path, caplog):
    """The logged rates are the schedule's: the finished run ends at lr * min_lr_ratio, and a longer --max-steps puts
    step 5 of cosine(warmup 2, 8 steps) at 0.1 + 0.9 * (1 + cos(pi * 3/6)) / 2 = 0.55 of lr."""
    prepare(request(tmp_path, max_steps=4, eval_every=4)).fit()
    assert MetricsLog(tmp_path / "metrics.jsonl").records("train")[-1]["lr"] == pytest.approx(3e-3 * 0.1)
    with caplog.at_level("WARNING", logger="attnkit.train.trainer"):
        prepare(request(tmp_path, resume=True, max_steps=4))
    assert "the learning rate of step" not in caplog.text
    with caplog.at_level("WARNING", logger="attnkit.train.trainer"):
        trainer = prepare(request(tmp_path, resume=True, max_steps=8))
    expected = 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert f"the learning rate of step 5 is {expected:.3g} under the resumed settings, where the run's own schedule " \
           f"had {3e-3 * 0.1:.3g}: it jumps there at once" in caplog.text
    trainer.fit(stop_at=5)
    assert MetricsLog(tmp_path / "metrics.jsonl").records("train")[-1]["lr"] == pytest.approx(expected)


def test_a_resume_with_nothing_to_train_says_nothing_of_the_learning_rate(tmp_path, caplog):
    prepare(request(tmp_path, max_steps=4, eval_every=4)).fit()
    with caplog.at_level("WARNING", logger="attnkit.train.trainer"):
        prepare(request(tmp_path, resume=True, max_steps=4, lr=1e-3))
    assert "nothing is left to train" in caplog.text
    assert "the learning rate of step" not in caplog.text


def test_only_a_fork_says_it_goes_on_from_a_step_before_the_kept_best(tmp_path, caplog, monkeypatch):
    """After a fork keeps a later best/, the plain resumes of the forked run say only that best/ is kept."""
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, model: {"val_loss": 10.0 - self.step})
    prepare(request(tmp_path, max_steps=4, eval_every=2)).fit()  # best/: step 4
    with caplog.at_level("INFO", logger="attnkit.train.trainer"):
        prepare(request(tmp_path, resume=str(tmp_path / "checkpoints" / "step_000002"), max_steps=3)).fit()
    assert "kept best/ (step 4, val_loss 6.0000), though the run goes on from the earlier step 2" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="attnkit.train.trainer"):
        prepare(request(tmp_path, resume=True, max_steps=5))
    assert "kept best/ (step 4, val_loss 6.0000): the run replaces it only with a better score" in caplog.text


def test_resuming_on_data_with_other_labels_names_both_and_the_way_forward(tmp_path):
    data = tmp_path / "labelled.csv"
    data.write_text("text,label\n" + "".join(f"text {i},{'ab'[i % 2]}\n" for i in range(40)))
    run = TrainRequest(out=str(tmp_path / "run"), task="classify", overrides=TINY, progress=False,
                       data={"data": (str(data),), "tokenizer": "char"}, settings=dict(max_steps=2, batch_size=4))
    prepare(run).fit()
    data.write_text("text,label\n" + "".join(f"text {i},{'abc'[i % 3]}\n" for i in range(40)))
    run.resume = True
    with pytest.raises(CheckpointError, match=r"labels \['a', 'b', 'c'\] differ from the checkpoint's \['a', 'b'\].*"
                       r"resume on data with the run's labels, or .*--init-from .*run --out NEW_RUN"):
        prepare(run)


def test_a_seq_len_beyond_the_models_context_is_refused_before_data_is_read_and_on_resume(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 100)
    new = TrainRequest(out=str(tmp_path / "new"), task="lm", overrides=TINY, progress=False,
                       data={"data": (str(text),), "tokenizer": "char", "seq_len": 48})
    with pytest.raises(ConfigError, match=r"seq_len=48 exceeds the model's max_seq_len=24; lower --seq-len or add "
                                          r"--set max_seq_len=48"):
        prepare(new)
    assert not (tmp_path / "new" / "cache").exists()  # refused before the text was tokenized
    prepare(request(tmp_path / "run", max_steps=2)).fit()
    resumed = request(tmp_path / "run", resume=True)
    resumed.data["seq_len"] = 48
    with pytest.raises(ConfigError, match=r"seq_len=48 exceeds the model's max_seq_len=24; lower --seq-len$"):
        prepare(resumed)


def test_resume_without_restored_state_would_differ(tmp_path):
    """The bit-for-bit test can fail: a fresh run over the same later steps (no restored RNG, data position
    or optimizer state) ends with other weights."""
    prepare(request(tmp_path / "whole")).fit()
    trainer = prepare(request(tmp_path / "other", max_steps=4))
    trainer.fit()
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "other")
    assert any(not torch.equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("dtype", ["fp32", "bf16-master"])
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, dtype):
    trainer = prepare(request(tmp_path, max_steps=20, eval_every=3, dtype=dtype))
    real_loss = trainer.task.loss

    def loss_turning_nan(model, batch):
        loss = real_loss(model, batch)
        return loss * float("nan") if trainer.step + 1 >= 5 else loss

    trainer.task.loss = loss_turning_nan
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step 5") as err:
        trainer.fit()
    assert "step 3" in str(err.value) and "--resume" in str(err.value)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000003"]
    saved = weights(tmp_path)
    for name, tensor in weights(tmp_path / "checkpoints" / "step_000003").items():
        assert torch.equal(saved[name], tensor)
        assert torch.isfinite(tensor).all()
    assert max(step for step, _ in train_losses(tmp_path)) == 4  # the bad step was never logged


def test_huge_learning_rate_is_caught_as_non_finite(tmp_path):
    trainer = prepare(request(tmp_path, max_steps=50, lr=1e30, warmup=0, clip=0.0, eval_every=100))
    with pytest.raises(TrainingDiverged, match=r"at step \d+.*no checkpoint had been written yet"):
        trainer.fit()


def test_gradient_accumulation_weights_micro_batches_by_their_targets(tmp_path):
    """With padded translation batches the step's gradient is that of the mean over every target token of all
    micro-batches, not the mean of the micro-batches' means."""
    trainer = prepare(request(tmp_path, "translate", overrides=["dropout=0.0"], grad_accum=2, clip=0.0))
    sizes = [trainer.task.train.batch(0, i).n_tgt_tokens for i in range(20)]
    start = next(i for i in range(19) if sizes[i] != sizes[i + 1])  # two micro-batches of different sizes
    batches = [trainer.task.train.batch(0, start + i) for i in range(2)]
    counts = [b.n_tgt_tokens for b in batches]
    trainer.task.load_data_state({"epoch": 0, "index": start})
    captured = {}
    trainer.optimizer.step = lambda: captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
    trainer.fit(stop_at=1)
    model = trainer.model
    model.zero_grad()
    total = sum(counts)
    summed = sum(trainer.task.loss(model, b) * n for b, n in zip(batches, counts, strict=True)) / total
    summed.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(captured[name], param.grad, rtol=1e-5, atol=1e-7)


def test_k_micro_batches_of_b_train_as_one_batch_of_k_times_b(tmp_path):
    """lm draws the same windows either way, so its losses, gradient norms (AdamW would hide a gradient scaled by k)
    and updated weights agree to float32's rounding."""
    runs = {}
    for name, batch_size, grad_accum in (("one", 8, 1), ("two", 4, 2)):
        prepare(request(tmp_path / name, overrides=["dropout=0.0"], max_steps=3, eval_every=3,
                        batch_size=batch_size, grad_accum=grad_accum)).fit()
        records = MetricsLog(tmp_path / name / "metrics.jsonl").records("train")
        runs[name] = [(r["step"], r["loss"], r["grad_norm"]) for r in records], weights(tmp_path / name)
    (logged_one, one), (logged_two, two) = runs["one"], runs["two"]
    assert [r[0] for r in logged_one] == [r[0] for r in logged_two] == [1, 2, 3]
    for a, b in zip(logged_one, logged_two, strict=True):
        assert a[1:] == pytest.approx(b[1:], rel=1e-5)
    for name in one:
        torch.testing.assert_close(one[name], two[name], rtol=1e-5, atol=1e-6)


def test_bf16_autocast_trains(tmp_path):
    trainer = prepare(request(tmp_path, max_steps=12, dtype="bf16", lr=1e-2, eval_every=6))
    result = trainer.fit()
    losses = [loss for _, loss in train_losses(tmp_path)]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < sum(losses[:3])
    assert math.isfinite(result.evaluation["val_loss"])


def test_bf16_master_weights_train_save_fp32_and_resume_bit_for_bit(tmp_path):
    """`dtype="bf16-master"`: a bf16 copy computes; the fp32 model is what AdamW updates and checkpoints hold, so a
    stopped run resumes bit for bit, and its losses follow the fp32 run's to bf16 accuracy."""
    whole, split, fp32 = tmp_path / "whole", tmp_path / "split", tmp_path / "fp32"
    trainer = prepare(request(whole, dtype="bf16-master"))
    assert {p.dtype for p in trainer.precision.compute_model.parameters()} == {torch.bfloat16}
    result = trainer.fit()
    assert math.isfinite(result.evaluation["val_loss"])
    assert {t.dtype for t in weights(whole).values() if t.is_floating_point()} == {torch.float32}
    for name, param in trainer.precision.compute_model.named_parameters():
        assert torch.equal(param, trainer.model.get_parameter(name).to(torch.bfloat16)), name
    prepare(request(split, dtype="bf16-master")).fit(stop_at=5)
    prepare(request(split, dtype="bf16-master", resume=True)).fit()
    assert train_losses(split) == train_losses(whole)
    resumed_weights = weights(split)
    for name, tensor in weights(whole).items():
        assert torch.equal(resumed_weights[name], tensor), name
    prepare(request(fp32)).fit()
    for (step, loss), (_, expected) in zip(train_losses(whole), train_losses(fp32), strict=True):
        assert loss == pytest.approx(expected, rel=2e-3), step  # measured within 2.3e-4


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_bf16_master_weights_train_every_task(tmp_path, task):
    result = prepare(request(tmp_path, task, max_steps=4, eval_every=4, dtype="bf16-master")).fit()
    assert all(math.isfinite(v) for v in result.evaluation.values())
    assert {t.dtype for t in weights(tmp_path).values() if t.is_floating_point()} == {torch.float32}


@pytest.mark.parametrize("compile", [pytest.param("blocks", marks=pytest.mark.slow), "model"])
def test_compiled_training_follows_eager_training(tmp_path, compile):
    """Compiling (each block, or the whole model as one graph with its loss, as a GPU's plan does) is a speed option
    only: same losses and weights, same names."""
    trainer = prepare(request(tmp_path / "c", max_steps=4, eval_every=4, compile=compile, overrides=["dropout=0.0"]))
    if compile == "blocks":
        assert any(hasattr(m, "_compiled_call_impl") and m._compiled_call_impl for m in trainer.model.modules())
    else:
        assert trainer.plan.fullgraph and trainer.train_model._orig_mod is trainer.model
    trainer.fit()
    eager = prepare(request(tmp_path / "e", max_steps=4, eval_every=4, overrides=["dropout=0.0"]))
    eager.fit()
    for (step, loss), (_, expected) in zip(train_losses(tmp_path / "c"), train_losses(tmp_path / "e"), strict=True):
        assert loss == pytest.approx(expected, rel=1e-4), step
    compiled_weights, eager_weights = weights(tmp_path / "c"), weights(tmp_path / "e")
    assert compiled_weights.keys() == eager_weights.keys()
    for name, tensor in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], tensor, rtol=1e-4, atol=1e-5)


def test_translation_bleu_compares_detokenized_greedy_output_with_references(tmp_path):
    words = "the a cat dog sees likes small big red old".split()
    lines = [" ".join(words[(i * k) % len(words)] for k in range(1, 7)) for i in range(60)]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{line}\t{line.upper()}\n" for line in lines))
    req = request(tmp_path / "run", "translate", overrides=["max_seq_len=64"])
    req.data.update(data=(str(tsv),), tokenizer="char")
    trainer = prepare(req, translate=translate_batched)
    task, tokenizer = trainer.task, trainer.tokenizer
    assert task.metric == "bleu" and len(task.references) == 6  # 10% of 60 held out
    answer = {tuple(int(t) for t in task.val.src[i]): ref for i, ref in enumerate(task.references)}
    task.translate = lambda model, sources, **kw: [tokenizer.encode(answer[tuple(map(int, s))]) for s in sources]
    assert task.evaluate(trainer.model)["bleu"] == pytest.approx(100.0)
    task.translate = lambda model, sources, **kw: [tokenizer.encode(answer[tuple(map(int, s))].lower())
                                                   for s in sources]
    scores = task.evaluate(trainer.model)
    assert scores["bleu"] < 1.0  # cased: lowercase words match nothing
    assert scores["bleu_lowercased"] == pytest.approx(100.0)  # the published protocol lowercases both sides
    for beam_size in (1, 3):
        task.translate, task.beam_size = translate_batched, beam_size
        assert 0.0 <= task.evaluate(trainer.model)["bleu"] <= 100.0


def test_classification_accuracy_counts_correct_predictions(tmp_path):
    trainer = prepare(request(tmp_path, "classify"))
    task = trainer.task
    trainer.model.eval()
    result = task.evaluate(trainer.model)
    correct = count = 0
    for batch in task.val.eval_batches():
        logits = trainer.model(batch.ids, attention_mask=batch.attention_mask).logits
        correct += int((logits.argmax(-1) == batch.labels).sum())
        count += len(batch.labels)
    assert result["accuracy"] == correct / count
    assert count == len(task.val)


def test_resume_refuses_a_different_model_config(tmp_path):
    prepare(request(tmp_path, max_steps=2, eval_every=2)).fit()
    with pytest.raises(CheckpointError, match=r"d_model: 32 -> 48") as err:
        prepare(request(tmp_path, overrides=["d_model=48"], resume=True))
    assert "Resume without these options" in str(err.value)


def test_resume_compares_a_set_with_the_checkpoints_own_config(tmp_path):
    prepare(request(tmp_path, max_steps=2, eval_every=2)).fit()
    again = request(tmp_path, resume=True)
    again.overrides = ["dropout=0.1"]  # the checkpoint's own value, not the default model's
    assert prepare(again).step == 2
    again.overrides = ["dropout=0.2"]
    with pytest.raises(CheckpointError) as err:
        prepare(again)
    assert str(err.value).split("\n")[1:-1] == ["  dropout: 0.1 -> 0.2"]  # that field alone, not d_model, ...




def test_resume_refuses_a_different_tokenizer(tmp_path):
    prepare(request(tmp_path, max_steps=2, eval_every=2)).fit()
    other = tmp_path / "other-tokenizer"
    CharTokenizer("xyz").save(other)
    req = request(tmp_path, resume=True)
    req.data["tokenizer"] = str(other)
    with pytest.raises(CheckpointError, match="tokenizer: the one in .* is not the checkpoint's"):
        prepare(req)


@pytest.mark.parametrize("change", [{"seed": 8}, {"val_fraction": 0.3}])
def test_resume_refuses_a_seed_or_val_fraction_that_would_redraw_the_held_out_examples(tmp_path, change):
    """Both choose which examples a run holds out for validation (and the seed its batch order and masks): a resumed
    run with others would score on examples it has trained on."""
    prepare(request(tmp_path, "classify", max_steps=2, eval_every=2)).fit()
    again = request(tmp_path, "classify", resume=True, **({} if "val_fraction" in change else change))
    again.data.update({k: v for k, v in change.items() if k == "val_fraction"})
    (name, value), = change.items()
    with pytest.raises(CheckpointError, match=rf"{name}: .* -> {value}: the run's validation set .* is drawn with "
                                              rf"this.*resume without --{name.replace('_', '-')}, or .*--init-from"):
        prepare(again)


def test_resume_refuses_only_the_seed_and_val_fraction_that_draw_the_validation_set(tmp_path):
    """lm scores the stream's tail, which the seed does not draw; --val-fraction is unused beside --val-data; where
    both draw the held-out examples, both are named."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 100, encoding="utf-8")
    rows = [("pos" if i % 3 else "neg", f"{'good' if i % 3 else 'bad'} film number {i}") for i in range(60)]
    for name, part in (("train", rows[:48]), ("val", rows[48:])):
        (tmp_path / f"{name}.txt").write_text("".join(f"{label} {t}\n" for label, t in part), encoding="utf-8")

    def run(out, task, data, **settings):
        made = request(tmp_path / out, task, max_steps=2, eval_every=2, **settings)
        made.data.update({"data": (str(tmp_path / data),), "tokenizer": "char"})
        return made

    prepare(run("lm", "lm", "text.txt")).fit()
    assert prepare(run("lm", "lm", "text.txt", resume=True, seed=8)).settings.seed == 8
    prepare(run("clf", "classify", "train.txt")).fit()
    both = run("clf", "classify", "train.txt", resume=True, seed=8)
    both.data["val_fraction"] = 0.3
    with pytest.raises(CheckpointError, match="seed: 7 -> 8; val_fraction: 0.1 -> 0.3: .* drawn with these.*resume "
                                              "without --seed and --val-fraction, or"):
        prepare(both)
    given = run("given", "classify", "train.txt")
    given.data["val_data"] = (str(tmp_path / "val.txt"),)
    prepare(given).fit()
    again = run("given", "classify", "train.txt", resume=True)
    again.data.update(val_data=(str(tmp_path / "val.txt"),), val_fraction=0.3)
    prepare(again)
    again.settings["seed"] = 8  # the validation set is val.txt whatever the seed
    assert prepare(again).settings.seed == 8


def test_a_batch_size_changed_in_the_middle_of_an_epoch_is_named_with_what_it_does_to_the_epoch(tmp_path, caplog):
    prepare(request(tmp_path, "classify", max_steps=2, eval_every=2)).fit()
    with caplog.at_level("WARNING", logger="attnkit.train.job"):
        prepare(request(tmp_path, "classify", resume=True))
    assert "in the middle of epoch" not in caplog.text
    with caplog.at_level("WARNING", logger="attnkit.train.job"):
        prepare(request(tmp_path, "classify", resume=True, batch_size=8))
    assert ("batch_size x ranks: 4 -> 8 in the middle of epoch 0 (after its batch 4): the rest of the epoch is cut "
            "into batches of the new size in another order") in caplog.text


def test_a_batch_size_changed_for_a_task_whose_state_is_no_epoch_position_is_resumed(tmp_path, monkeypatch):
    """A task of one's own may keep another data state (here a batch count with no epoch): the resume asks
    tasks.common what it is instead of reading its keys."""
    monkeypatch.setattr(EpochTask, "data_state", lambda self: {"index": self.index, "pass": self.epoch})

    def load(self, state):
        self.index, self.epoch = state["index"], state["pass"]

    monkeypatch.setattr(EpochTask, "load_data_state", load)
    prepare(request(tmp_path, "classify", max_steps=2, eval_every=2)).fit()
    assert prepare(request(tmp_path, "classify", resume=True, batch_size=8)).step == 2


def test_a_resume_that_changes_the_language_models_validation_set_says_so(tmp_path, caplog):
    prepare(request(tmp_path, max_steps=2, eval_every=2)).fit()
    with caplog.at_level("WARNING", logger="attnkit.train.job"):
        prepare(request(tmp_path, resume=True, batch_size=8))
    assert ("the validation set changes from 8 windows of 24 tokens to 16 of 24 (eval_batches x batch_size x ranks "
            "windows of seq_len): scores before and after, best/'s among them, are not comparable; keep eval_batches "
            "x batch_size x ranks at 8") in caplog.text
    caplog.clear()
    again = request(tmp_path, resume=True, batch_size=8)
    again.data["eval_batches"] = 1  # 1 x 8 = 2 x 4 windows: the same validation set
    with caplog.at_level("WARNING", logger="attnkit.train.job"):
        prepare(again)
    assert "the validation set changes" not in caplog.text


def saved_by_ranks(checkpoint, ranks: int) -> None:
    """Make `checkpoint` one a run of `ranks` processes saved (its train state's `ranks`, checksums kept whole)."""
    path = checkpoint / "train_state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "ranks": ranks}))
    write_checksums(checkpoint, {**read_checksums(checkpoint), "train_state.json": digest(path)})


def test_the_batch_size_warnings_compare_global_batches(tmp_path, caplog):
    """Tasks draw batch_size x ranks (or batch_tokens x ranks) per step: 2 ranks x 4 resumed on 1 x 8 keeps both
    the lm validation set and an epoch's batches; 1 x 4 after 2 x 4 halves them; batch_size is no part of a batch
    cut by batch_tokens."""
    lm, classify = tmp_path / "lm", tmp_path / "classify"
    prepare(request(lm, max_steps=2, eval_every=2)).fit()
    saved_by_ranks(lm / "checkpoints" / "step_000002", 2)
    for size, warned in ((8, False), (4, True)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="attnkit.train.job"):
            prepare(request(lm, resume=str(lm / "checkpoints" / "step_000002"), batch_size=size))
        assert ("the validation set changes" in caplog.text) == warned, size
    tokens = request(classify, "classify", max_steps=2, eval_every=2)
    tokens.data["batch_tokens"] = 64
    prepare(tokens).fit()
    saved_by_ranks(classify / "checkpoints" / "step_000002", 2)
    for size, batch_tokens, warned in ((8, 128, False), (4, 64, True)):
        again = request(classify, "classify", resume=str(classify / "checkpoints" / "step_000002"), batch_size=size)
        again.data["batch_tokens"] = batch_tokens
        caplog.clear()
        with caplog.at_level("WARNING", logger="attnkit.train.job"):
            prepare(again)
        assert ("in the middle of epoch" in caplog.text) == warned, batch_tokens


def test_resume_refuses_a_different_task(tmp_path):
    prepare(request(tmp_path, max_steps=2, eval_every=2)).fit()
    with pytest.raises(CheckpointError, match="task: 'lm' -> 'classify'"):
        prepare(request(tmp_path, "classify", resume=True))


def test_a_new_run_does_not_overwrite_an_existing_one(tmp_path):
    prepare(request(tmp_path, max_steps=2, eval_every=2)).fit()
    with pytest.raises(ConfigError, match="already holds a run.*--resume.*--overwrite"):
        prepare(request(tmp_path))
    again = request(tmp_path, max_steps=1)
    again.overwrite = True
    prepare(again).fit()
    assert find_checkpoint(tmp_path).name == "step_000001"
    assert [s for s, _ in train_losses(tmp_path)] == [1]


def test_resume_from_an_earlier_checkpoint_forks_the_run(tmp_path):
    prepare(request(tmp_path, max_steps=8, eval_every=2, keep=5)).fit()
    trainer = prepare(request(tmp_path, resume=str(tmp_path / "checkpoints" / "step_000004")))
    assert trainer.step == 4
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000002", "step_000004"]
    assert max(s for s, _ in train_losses(tmp_path)) == 4


def test_a_fork_keeps_a_later_best_and_replaces_it_only_with_a_better_score(tmp_path, caplog):
    """Resuming from an earlier checkpoint drops the later checkpoints, but the best model the run has made stays
    in best/, with its score as the mark the continued run must beat."""
    prepare(request(tmp_path, max_steps=8, eval_every=2, keep=5, lr=1e-2)).fit()
    best = json.loads((tmp_path / "best" / "train_state.json").read_text())
    assert best["step"] > 2
    with caplog.at_level("INFO", logger="attnkit.train.trainer"):
        trainer = prepare(request(tmp_path, resume=str(tmp_path / "checkpoints" / "step_000002"), max_steps=4,
                                  eval_every=2, keep=5, lr=1e-9))
    assert f"kept best/ (step {best['step']}" in caplog.text
    assert trainer.best == best["best"]
    kept = weights(tmp_path / "best")
    trainer.fit()  # a learning rate of 1e-9 scores no better than the later best
    assert json.loads((tmp_path / "best" / "train_state.json").read_text())["step"] == best["step"]
    for name, tensor in weights(tmp_path / "best").items():
        assert torch.equal(tensor, kept[name]), name


@pytest.mark.parametrize("checkpoint", ["best", "checkpoints/step_000002"])
@pytest.mark.parametrize("named", [False, True])
def test_out_naming_a_checkpoint_of_a_run_says_how_to_resume_from_it(tmp_path, checkpoint, named):
    prepare(request(tmp_path, max_steps=4, eval_every=2)).fit()
    with pytest.raises(ConfigError, match=rf"--out {tmp_path / checkpoint} is a checkpoint of the run {tmp_path}, "
                                          rf"not a run directory: continue the run from it with --out {tmp_path} "
                                          rf"--resume {tmp_path / checkpoint} "):
        prepare(request(tmp_path / checkpoint, resume=str(tmp_path / checkpoint) if named else True))


def test_out_naming_a_checkpoint_of_a_run_is_refused_whatever_resume_names(tmp_path):
    """--out RUN/best with --resume RUN (or none, or --overwrite) would nest a run inside RUN's best model."""
    run, other = tmp_path / "run", tmp_path / "other"
    prepare(request(run, max_steps=2, eval_every=2)).fit()
    kept = weights(run / "best")
    for flags in (dict(resume=str(run)), dict(resume=str(run), overwrite=True), dict(overwrite=True), {}):
        with pytest.raises(ConfigError, match=rf"--out {run / 'best'} is a checkpoint of the run {run}, not a run"):
            prepare(request(run / "best", max_steps=4, **flags))
    for name, tensor in weights(run / "best").items():
        assert torch.equal(tensor, kept[name]), name
    assert not (run / "best" / "best").exists() and not list(run.glob(".replaced-*"))
    prepare(request(other, max_steps=2, eval_every=2)).fit()
    with pytest.raises(ConfigError, match=r"--resume without a path to continue it, --overwrite to replace it with "):
        prepare(request(other, max_steps=4, resume=str(run)))


@pytest.mark.parametrize("max_steps", [4, 6])
def test_a_checkpoint_continued_in_a_new_directory_gives_it_a_best_and_a_checkpoint_of_its_own(tmp_path, max_steps):
    """The score to beat is the new directory's own: the source run's best (which lives elsewhere) would keep best/
    from ever being written there; a run with nothing left to train (max_steps 4) still evaluates and saves once."""
    source, new = tmp_path / "source", tmp_path / "new"
    prepare(request(source, max_steps=4, eval_every=2)).fit()
    trainer = prepare(request(new, resume=str(source / "checkpoints" / "step_000004"), max_steps=max_steps,
                              eval_every=2))
    assert trainer.best is None
    trainer.fit()
    best = json.loads((new / "best" / "train_state.json").read_text())
    assert best["step"] == max_steps and best["best"] == best["evaluation"]["val_loss"]
    assert [p.name for p in checkpoints(new)][-1] == f"step_{max_steps:06d}"


def test_task_and_family_must_match(tmp_path):
    with pytest.raises(ConfigError, match="--task translate trains a encoder-decoder model.*vaswani-tiny"):
        prepare(TrainRequest(out=str(tmp_path), task="translate", preset="gpt2-tiny",
                             data={"data": ("synthetic:reverse",)}))


def test_set_accepts_model_data_and_training_keys_and_names_unknown_ones(tmp_path):
    trainer = prepare(request(tmp_path, overrides=["lr=0.002", "seq_len=12", "n_layers=1"]))
    assert trainer.settings.lr == 0.002 and trainer.task.seq_len == 12 and trainer.config.n_layers == 1
    with pytest.raises(ConfigError, match="--set colour: no such setting.*d_model.*seq_len.*warmup"):
        prepare(request(tmp_path / "x", overrides=["colour=blue"]))
