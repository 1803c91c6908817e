"""Training instruments: attention entropy, residual-stream norm and gradient norm per layer, against values computed
independently; logged at each evaluation and drawn from metrics.jsonl."""

import json
import math

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.image import imread
from torch.testing import assert_close

from attnkit.config import ModelConfig
from attnkit.models import build_model
from attnkit.train.instruments import attention_entropy, gradient_norms, measure_activations
from attnkit.viz.instruments import instruments_figure, plot_run_instruments, read_instruments


def _model(**kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=32, **kw))


def test_entropy_is_log_s_for_uniform_rows_and_zero_for_one_hot():
    uniform = torch.full((2, 3, 4, 8), 1 / 8)
    assert_close(attention_entropy(uniform), torch.tensor(math.log(8)))
    one_hot = torch.zeros(1, 1, 3, 5)
    one_hot[..., 2] = 1.0
    assert float(attention_entropy(one_hot)) == 0.0


def test_activations_match_the_reference_weights_and_hidden_states():
    model = _model().eval()
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        out = model(ids, need_weights=True)
        hidden = []
        handles = [b.register_forward_hook(lambda m, a, o: hidden.append(o[0])) for b in model.stack.blocks]
        model(ids)
        for handle in handles:
            handle.remove()
        with measure_activations(model, max_calls=1) as measured:
            model(ids)
            model(torch.randint(0, 40, (2, 10)))  # beyond max_calls: not counted
    summary = measured.summary()
    for layer in range(2):
        weights = out.attentions[layer]["self"]
        expected = -(weights * weights.clamp_min(1e-30).log()).sum(-1).mean()
        assert summary[f"attention_entropy/stack.causal.{layer}"] == pytest.approx(float(expected), rel=1e-5)
        norm = hidden[layer].norm(dim=-1).mean()
        assert summary[f"residual_norm/stack.{layer}"] == pytest.approx(float(norm), rel=1e-5)


def test_gradient_norms_per_block():
    model = _model()
    ids = torch.randint(0, 40, (2, 10))
    model(ids, labels=ids).loss.backward()
    norms = gradient_norms(model)
    assert set(norms) == {"grad_norm/stack.0", "grad_norm/stack.1"}
    for layer, block in enumerate(model.stack.blocks):
        expected = torch.cat([p.grad.flatten() for p in block.parameters()]).norm()
        assert norms[f"grad_norm/stack.{layer}"] == pytest.approx(float(expected), rel=1e-5)


def test_plot_is_drawn_from_metrics(tmp_path):
    records = [{"kind": "eval", "step": 1, "val_loss": 3.0}] + [
        {"kind": "instruments", "step": step, "attention_entropy/stack.causal.0": 2.0 - step / 10,
         "residual_norm/stack.0": 1.0 + step, "grad_norm/stack.0": 0.5 * step, "grad_norm/stack.1": step}
        for step in (10, 20, 30)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "instr')
    assert len(read_instruments(tmp_path / "metrics.jsonl")) == 3  # the torn last line is skipped
    image = imread(plot_run_instruments(tmp_path))
    assert image.shape[0] > 600 and image[..., :3].std() > 0.05
    assert plot_run_instruments(tmp_path / "nowhere") is None


def test_each_legend_stands_beside_its_panel_and_can_be_read():
    names = [f"decoder.{kind}.{layer}" for kind in ("causal", "cross") for layer in range(3)]
    records = [{"kind": "instruments", "step": step, **{f"attention_entropy/{n}": 1.0 + i / 10 for i, n in
                                                          enumerate(names)}, "grad_norm/decoder.0": step / 100}
               for step in (100, 200, 300)]
    fig = instruments_figure(records, title="run")
    fig.tight_layout()
    renderer = FigureCanvasAgg(fig).get_renderer()
    assert len(fig.axes) == 2
    for ax in fig.axes:
        legend = ax.get_legend()
        box = legend.get_window_extent(renderer)
        assert box.x0 >= ax.get_window_extent(renderer).x1  # hides no line
        assert box.x1 <= fig.bbox.x1 and box.y0 >= fig.bbox.y0  # not cut off
        assert min(text.get_fontsize() for text in legend.get_texts()) >= 9
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == names


@pytest.fixture
def tiny_request(monkeypatch):
    from attnkit.train import TrainRequest

    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (400, 16))

    def make(out, **settings):
        return TrainRequest(
            out=str(out), task="translate", overrides=["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64",
                                                       "max_seq_len=24"],
            data={"data": ("synthetic:reverse",), "eval_batches": 1, "bleu_samples": 4},
            settings={"max_steps": 4, "batch_size": 4, "warmup": 1, "eval_every": 2, **settings}, progress=False,
        )

    return make


def test_training_logs_instruments_at_each_evaluation(tmp_path, tiny_request):
    from attnkit.train import prepare

    prepare(tiny_request(tmp_path / "run")).fit()
    records = read_instruments(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [2, 4]
    sites = [f"{stack}.{kind}.{layer}" for stack, kinds in (("encoder", ["self"]), ("decoder", ["causal", "cross"]))
             for layer in range(2) for kind in kinds]
    blocks = [f"{stack}.{layer}" for stack in ("encoder", "decoder") for layer in range(2)]
    for record in records:
        assert {f"attention_entropy/{s}" for s in sites} | {f"residual_norm/{b}" for b in blocks} | \
            {f"grad_norm/{b}" for b in blocks} == set(record) - {"kind", "step"}
        assert all(0 <= record[f"attention_entropy/{s}"] <= math.log(24) for s in sites)
        assert all(record[f"grad_norm/{b}"] > 0 for b in blocks)
    assert plot_run_instruments(tmp_path / "run") == tmp_path / "run" / "plots" / "instruments.png"


def test_instruments_can_be_switched_off(tmp_path, tiny_request):
    from attnkit.train import prepare

    prepare(tiny_request(tmp_path / "run", instruments=False, max_steps=2)).fit()
    assert read_instruments(tmp_path / "run" / "metrics.jsonl") == []


def test_tensorboard_logger_writes_the_same_numbers(tmp_path, tiny_request):
    pytest.importorskip("tensorboard", reason="the optional extra attnkit[tensorboard] is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from attnkit.train import prepare

    prepare(tiny_request(tmp_path / "run", logger="tensorboard")).fit()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    logged = sorted((e.step, e.value) for e in events.Scalars("eval/val_loss"))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = sorted((r["step"], r["val_loss"]) for r in records if r["kind"] == "eval")
    assert [s for s, _ in logged] == [s for s, _ in expected] == [2, 4]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)  # float32 in the events
    assert "grad_norm/decoder.1" in events.Tags()["scalars"]


def test_tensorboard_drops_the_steps_a_resume_from_an_earlier_checkpoint_retrains(tmp_path, tiny_request):
    pytest.importorskip("tensorboard", reason="the optional extra attnkit[tensorboard] is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from attnkit.train import prepare

    run = tmp_path / "run"
    prepare(tiny_request(run, logger="tensorboard")).fit()
    again = tiny_request(run, logger="tensorboard")
    again.resume = str(run / "checkpoints" / "step_000002")  # forks there: steps 3 and 4 train again
    prepare(again).fit()
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for tag, kind, key in (("train/loss", "train", "loss"), ("eval/val_loss", "eval", "val_loss")):
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        expected = [(r["step"], r[key]) for r in records if r["kind"] == kind]
        assert [s for s, _ in logged] == [s for s, _ in expected], tag  # each step once, as in metrics.jsonl
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_tensorboard_writes_one_event_file_per_session_that_logs(tmp_path, tiny_request):
    """The writer opens with the first record (purging the steps a resume retrains): a resume leaves no empty file."""
    pytest.importorskip("tensorboard", reason="the optional extra attnkit[tensorboard] is not installed")
    from attnkit.train import prepare

    run = tmp_path / "run"
    prepare(tiny_request(run, logger="tensorboard")).fit()
    again = tiny_request(run, logger="tensorboard")
    again.resume = str(run / "checkpoints" / "step_000002")
    prepare(again).fit()
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_tensorboard_missing_is_a_clear_error(tmp_path, tiny_request, monkeypatch):
    import builtins

    from attnkit.errors import ConfigError
    from attnkit.train import prepare

    real_import = builtins.__import__

    def without_tensorboard(name, *args, **kwargs):
        if name == "torch.utils.tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_tensorboard)
    with pytest.raises(ConfigError, match=r"pip install 'attnkit\[tensorboard\]'"):
        prepare(tiny_request(tmp_path / "run", logger="tensorboard"))


def test_cli_train_draws_the_instruments_and_viz_redraws_them(tmp_path, monkeypatch, capsys):
    from attnkit.cli import main

    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (400, 16))
    out = tmp_path / "run"
    args = ["train", "--data", "synthetic:copy", "--out", str(out), "--max-steps", "2", "--eval-every", "1",
            "--batch-size", "4", "--warmup", "1", "--no-progress", "--sample-tokens", "0", "--tokenizer", "char",
            "--set", "d_model=32", "--set", "n_layers=2", "--set", "n_heads=2", "--set", "d_ff=64",
            "--set", "max_seq_len=24"]
    assert main(args) == 0
    assert f"{out}/plots/instruments.png" in capsys.readouterr().out
    assert [r["step"] for r in read_instruments(out / "metrics.jsonl")] == [1, 2]
    (out / "plots" / "instruments.png").unlink()
    assert main(["viz", "--run", str(out)]) == 0  # no text: the instruments plot alone
    assert (out / "plots" / "instruments.png").is_file()
    assert main([*args[:4], str(tmp_path / "quiet"), *args[5:], "--no-instruments"]) == 0
    assert read_instruments(tmp_path / "quiet" / "metrics.jsonl") == []


@pytest.mark.parametrize("attention", ["bahdanau", "luong-general"])
def test_recurrent_entropy_covers_every_decoding_step_of_each_pass(attention):
    """Bahdanau's decoder calls its attention once a decoding step: the instrument's first `max_calls` forward
    passes are whole passes, every step of them, not the first `max_calls` steps of the first pass."""
    from attnkit.models.recurrent import recurrent_seq2seq

    torch.manual_seed(0)
    model = recurrent_seq2seq(src_vocab_size=20, tgt_vocab_size=20, embedding_dim=8, hidden=12, encoder_hidden=12,
                              n_layers=1, cell="gru", attention=attention, bidirectional=True).eval()
    with torch.no_grad():
        for parameter in model.decoder.attention.parameters():
            parameter.mul_(8)  # sharp attention, whose entropy differs from step to step
    batches = [(torch.randint(0, 20, (2, 7)), torch.randint(0, 20, (2, 6))) for _ in range(3)]
    with torch.no_grad():
        passes = [model(src, tgt, need_weights=True) for src, tgt in batches]
        expected = [attention_entropy(out.attentions[0]["cross"]) for out in passes]  # every step of each pass
        with measure_activations(model, max_calls=2) as measured:
            for src, tgt in batches:
                model(src, tgt)
    assert_close(measured.summary()["attention_entropy/decoder.cross.0"], float(sum(expected[:2]) / 2), rtol=1e-5,
                 atol=1e-6)
