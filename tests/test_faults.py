"""Bad input and faults met as a hostile user meets them: each is refused in one line naming the problem and the fix,
and nothing is built, read or searched without bound. Memory bombs on every load path, integrity of every file a
run needs, bounded inputs and searches, settings that would run as nonsense."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import build_model, cli
from attnkit.checkpoint import CHECKSUMS_FILE, CONFIG_FILE, TOKENIZER_DIR, load_model, save_model
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError, ConfigError, InputError
from attnkit.tokenize import CharTokenizer

FAMILIES = importlib.import_module("attnkit.models.families")  # the module (attnkit.models.families is a function)
HUGE = {"d_model": 1_000_000}  # about 4 TB of fp32 weights for a 47-token vocabulary: no machine has it free


def cli_error(capsys, *argv) -> str:
    """Run the command line; assert it ends in one line (exit 2, no traceback) and return that line."""
    assert cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("attnkit: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny decoder ("lm"), an encoder classifier ("clf") and an encoder-decoder ("mt") run."""
    root = tmp_path_factory.mktemp("runs")
    torch.manual_seed(2)  # the same random weights whatever ran before: "mt" translates "abc" into letters (the
    # explorer's test reads its own translation; at seed 0 it ends at once)
    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz .\n", special_tokens=["pad", "bos", "eos", "unk"])
    found = {}
    for name, family in (("lm", dict(family="decoder")), ("clf", dict(family="encoder", n_classes=2)),
                         ("mt", dict(family="encoder-decoder"))):
        config = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                             max_seq_len=24, **family)
        save_model(build_model(config).eval(), config, root / name)
        tokenizer.save(root / name / TOKENIZER_DIR)
        found[name] = root / name
    return found


def swollen(run: Path, tmp_path: Path, **changes) -> Path:
    """A copy of `run` whose config.json says `changes` (its checksums dropped, as a foreign config would have)."""
    copy = tmp_path / f"swollen-{run.name}"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        (copy / name).write_bytes((run / name).read_bytes())
    (copy / TOKENIZER_DIR).mkdir()
    for path in (run / TOKENIZER_DIR).iterdir():
        (copy / TOKENIZER_DIR / path.name).write_bytes(path.read_bytes())
    config = json.loads((copy / CONFIG_FILE).read_text())
    (copy / CONFIG_FILE).write_text(json.dumps({**config, **changes}))
    return copy


# Memory bombs ----------------------------------------------------------------------------------------------------
def test_a_config_too_large_for_memory_is_refused_before_building_on_every_path(runs, tmp_path, capsys):
    big = swollen(runs["lm"], tmp_path, **HUGE)
    figure = r"4,000,[\d,]+ parameters: its weights alone need 14\d+\.\d GiB but cpu has [\d.]+ GiB free"
    with pytest.raises(ConfigError, match=figure):
        load_model(big)
    with pytest.raises(ConfigError, match=figure):
        attnkit.load(big, device="cpu")
    with pytest.raises(ConfigError, match=figure):
        build_model(ModelConfig.from_json(big / CONFIG_FILE))
    assert "its weights alone need" in cli_error(capsys, "generate", big, "--prompt", "ab", "--device", "cpu")
    assert "its weights alone need" in cli_error(capsys, "eval", big, "--data", "synthetic:copy")
    err = cli_error(capsys, "train", "--init-from", big, "--data", "synthetic:copy", "--out", tmp_path / "init",
                    "--max-steps", "1", "--no-progress")
    assert "its weights alone need" in err and not (tmp_path / "init" / CONFIG_FILE).exists()


def test_a_very_deep_config_is_counted_without_building_every_layer(runs, tmp_path):
    deep = swollen(runs["lm"], tmp_path, n_layers=10_000_000)
    with pytest.raises(ConfigError, match=r"n_layers=10000000.*parameters: its weights alone need"):
        load_model(deep)
    config = ModelConfig.from_json(runs["lm"] / CONFIG_FILE).replace(n_layers=70)
    assert FAMILIES.estimate_parameters(config) == attnkit.count_parameters(config)


def test_force_builds_what_the_estimate_refuses(monkeypatch):
    monkeypatch.setattr(FAMILIES, "free_bytes", lambda device: 1000)
    config = ModelConfig(family="decoder", vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8)
    with pytest.raises(ConfigError, match="but cpu has 0.0 GiB free"):
        build_model(config)
    assert attnkit.count_parameters(build_model(config, force=True)) > 250


def attnkit_process(*argv, stdin=None, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnkit", *map(str, argv)], stdin=stdin, input=input,
                          capture_output=True, timeout=300)


@pytest.mark.slow  # subprocesses (5 s); the closed pipe's test stays
def test_standard_input_is_read_up_to_a_limit_and_a_closed_one_is_named(runs):
    with open("/dev/zero", "rb") as zeros:
        done = attnkit_process("generate", runs["lm"], "--prompt", "-", "--max-prompt-bytes", "1000", stdin=zeros)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert "more than 1,000 bytes (--max-prompt-bytes)" in err and "raise --max-prompt-bytes" in err
    done = subprocess.run(f"{sys.executable} -m attnkit generate {runs['lm']} --prompt - <&-", shell=True,
                          capture_output=True, timeout=300)
    err = done.stderr.decode()
    assert done.returncode == 2 and "standard input is closed" in err and "Traceback" not in err, err


def test_a_beam_too_wide_for_memory_is_refused_with_its_flag(runs, capsys, monkeypatch):
    monkeypatch.setattr("attnkit.generate.pipeline.free_bytes", lambda device: 1000)  # a nearly full machine
    err = cli_error(capsys, "translate", runs["mt"], "--text", "abc", "--beam-size", "8", "--device", "cpu")
    assert "hypotheses" in err and "GiB free" in err and "choose a smaller --beam-size" in err


def test_a_beam_wider_than_the_vocabulary_is_refused_at_once(runs, capsys):
    vocab = attnkit.load(runs["mt"]).config.target_vocab_size
    err = cli_error(capsys, "translate", runs["mt"], "--text", "abc", "--beam-size", "100000", "--device", "cpu")
    assert f"beam_size=100,000 is wider than the target vocabulary ({vocab:,} tokens): give at most {vocab:,}" in err


# Silent nonsense -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "message"), [
    (["--max-length", "0"], "max_length=0 must be a positive integer"),
    (["--max-length", "-3"], "max_length=-3 must be a positive integer"),
    (["--length-penalty", "nan"], "length_penalty=nan must be a finite number"),
    (["--length-penalty", "inf"], "length_penalty=inf must be a finite number"),
    (["--length-penalty", "1e308", "--beam-size", "2"], "length_penalty=1e+308 must be a finite number between"),
])
def test_translation_settings_that_would_run_as_nonsense_are_refused(runs, capsys, flags, message):
    assert message in cli_error(capsys, "translate", runs["mt"], "--text", "abc", "--device", "cpu", *flags)


# Integrity -------------------------------------------------------------------------------------------------------
def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / run.name))


def test_a_run_without_checksums_is_unverified_never_intact_and_refused_when_verification_is_asked(
        runs, tmp_path, capsys, caplog):
    run = copy_run(runs["lm"], tmp_path)
    (run / CHECKSUMS_FILE).unlink()
    with caplog.at_level("WARNING"):
        attnkit.load(run, device="cpu")
    assert "unverified" in caplog.text and "intact" not in caplog.text
    with pytest.raises(CheckpointError, match="has no checksums.json: its files are unverified"):
        attnkit.load(run, device="cpu", verify=True)
    err = cli_error(capsys, "generate", run, "--prompt", "ab", "--verify", "--device", "cpu")
    assert "unverified" in err


def test_a_swapped_tokenizer_is_refused_by_name(runs, tmp_path):
    from attnkit.checkpoint import record_checksums

    run = copy_run(runs["clf"], tmp_path)
    record_checksums(run)  # as a converted run is written: the tokenizer covered
    CharTokenizer("zyxwvutsrqponmlkjihgfedcba .\n").save(run / TOKENIZER_DIR)  # same files, other ids
    with pytest.raises(CheckpointError, match=r"tokenizer/.* is damaged: its SHA-256 differs"):
        attnkit.load(run, device="cpu")


def test_a_tokenizer_not_covered_by_checksums_is_unverified(runs, tmp_path, caplog):
    run = copy_run(runs["clf"], tmp_path)  # saved by save_model, the tokenizer written after its checksums
    with caplog.at_level("WARNING"):
        attnkit.load(run, device="cpu")
    assert "lists no checksum for tokenizer/" in caplog.text and "unverified" in caplog.text
    with pytest.raises(CheckpointError, match="lists no checksum for tokenizer/"):
        attnkit.load(run, device="cpu", verify=True)


def test_convert_refuses_a_tokenizer_with_more_ids_than_the_model_and_writing_beside_another_model(
        tmp_path, capsys):
    pytest.importorskip("transformers")
    from interop_models import VOCAB, hf_model, word_tokenizer
    from tokenizers import Tokenizer, models

    hf_model("gpt2", tmp_path / "hf")
    vocab = {f"w{i}": i for i in range(VOCAB + 50)}  # 50 ids past the embedding table
    Tokenizer(models.WordLevel(vocab, unk_token="w3")).save(str(tmp_path / "hf" / "tokenizer.json"))
    capsys.readouterr()  # transformers' progress bars
    err = cli_error(capsys, "convert", "--from-hf", tmp_path / "hf", "--out", tmp_path / "run")
    assert f"has {VOCAB + 50} ids but the model's vocabulary holds {VOCAB}" in err
    assert not (tmp_path / "run" / CONFIG_FILE).exists()
    word_tokenizer(tmp_path / "hf")  # the model's own
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    listed = json.loads((tmp_path / "run" / CHECKSUMS_FILE).read_text())["sha256"]
    assert "tokenizer/tokenizer.json" in listed  # the converted run's tokenizer is verified with its weights
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text("{}")  # another model's tokenizer, alone
    capsys.readouterr()
    err = cli_error(capsys, "convert", tmp_path / "run", "--to-hf", other)
    assert "already holds a model's files (tokenizer.json)" in err and (other / "tokenizer.json").read_text() == "{}"


# Never overwrite what attnkit did not write -------------------------------------------------------------------
TRAIN = ["--data", "synthetic:copy", "--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set",
         "d_ff=32", "--set", "max_seq_len=24", "--batch-size", "4", "--max-steps", "2", "--eval-every", "2",
         "--no-progress", "--sample-tokens", "0"]


@pytest.fixture(autouse=True)
def small_synthetic_sets(monkeypatch):
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (400, 16))


def test_overwrite_refuses_a_folder_attnkit_did_not_write(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text('{"my": "settings"}')
    (folder / "metrics.jsonl").write_text("my measurements\n")
    err = cli_error(capsys, "train", *TRAIN, "--out", folder, "--overwrite")
    assert "is no run attnkit wrote" in err and "--overwrite replaces only attnkit's runs" in err
    assert (folder / "config.json").read_text() == '{"my": "settings"}'
    assert (folder / "metrics.jsonl").read_text() == "my measurements\n"


def test_a_replaced_run_leaves_nothing_of_its_own_and_old_runs_are_recognised_by_their_layout(tmp_path, capsys):
    from attnkit.checkpoint import RUN_MARKER

    run = tmp_path / "run"
    assert cli.main(["train", *TRAIN, "--out", str(run)]) == 0
    assert (run / RUN_MARKER).is_file()
    assert cli.main(["average", str(run), "--last", "1"]) == 0
    assert (run / "average-last-1").is_dir()
    (run / RUN_MARKER).unlink()  # a run written before the marker: config.json, model.safetensors, train_state.json
    (run / "keep-me.txt").write_text("notes")  # the user's own file beside the run is no part of it
    assert cli.main(["train", *TRAIN, "--out", str(run), "--overwrite"]) == 0
    assert not (run / "average-last-1").exists() and not list(run.glob(".replaced-*"))
    assert (run / "keep-me.txt").read_text() == "notes" and (run / RUN_MARKER).is_file()


def test_tokenizer_train_never_replaces_a_runs_tokenizer(runs, capsys, tmp_path):
    run = copy_run(runs["lm"], tmp_path)
    before = sorted((p.name, p.read_bytes()) for p in (run / TOKENIZER_DIR).iterdir())
    data = tmp_path / "text.txt"
    data.write_text("some other text to learn from\n" * 20)
    for out in (run / TOKENIZER_DIR, run):
        err = cli_error(capsys, "tokenizer", "train", "--out", out, "--data", data, "--kind", "char")
        assert f"is inside the run {run}" in err and "choose another --out" in err
    assert sorted((p.name, p.read_bytes()) for p in (run / TOKENIZER_DIR).iterdir()) == before


def test_experiment_out_into_another_experiments_folder_is_refused(tmp_path, capsys):
    from attnkit.experiments import REGISTRY

    first, second = sorted(REGISTRY)[:2]
    (tmp_path / "results.json").write_text(json.dumps({"name": first}))
    err = cli_error(capsys, "experiment", second, "--out", tmp_path)
    assert f"holds the experiment {first!r}" in err and "choose another --out" in err


# Tracebacks ------------------------------------------------------------------------------------------------------
def test_a_closed_pipe_ends_quietly(tmp_path):
    done = subprocess.run(f"{sys.executable} -m attnkit presets | head -1", shell=True, capture_output=True,
                          timeout=300)
    assert done.stdout.decode().startswith("preset") and done.stderr.decode() == ""


@pytest.mark.parametrize("deep", ['{"a": ' * 100_000 + "1" + "}" * 100_000, "[" * 100_000 + "]" * 100_000])
def test_json_nested_too_deeply_is_one_line(tmp_path, capsys, deep):
    settings = tmp_path / "settings.json"
    settings.write_text(deep)
    assert "is not valid JSON" in cli_error(capsys, "train", "--config", settings, "--out", tmp_path / "r")
    assert "nested too deeply" in cli_error(capsys, "train", "--set", f"lr={deep}", "--out", tmp_path / "r")
    with pytest.raises(ConfigError, match=r"settings.json is not valid JSON \(nested too deeply\)"):
        ModelConfig.from_json(settings)


def test_an_os_refusal_no_check_foresaw_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    data = tmp_path / "text.txt"
    data.write_text("some text to learn from\n" * 20)
    err = cli_error(capsys, "tokenizer", "train", "--out", a_file / "tok", "--data", data, "--kind", "char")
    assert "a file is in the way, where a directory is needed" in err and "never removed" in err
    assert a_file.read_text() == "x"


# Silent nonsense in fine-tuning ------------------------------------------------------------------------------------
def tiny_decoder(**changes):
    config = ModelConfig(family="decoder", vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=8,
                         **changes)
    return build_model(config)


def test_lora_on_a_tied_head_and_freezing_the_body_under_a_tied_head_are_refused():
    from attnkit.train.finetune import prepare_training

    with pytest.raises(ConfigError, match="lm_head shares its weight with stack.embeddings.token .*never train"):
        prepare_training(tiny_decoder(), lora_rank=2, lora_targets=("lm_head",))
    with pytest.raises(ConfigError, match="freeze='body' would freeze the head too: lm_head shares its weight"):
        prepare_training(tiny_decoder(), freeze="body")


def test_lora_on_an_untied_head_trains_its_adapter():
    from attnkit.train.finetune import prepare_training

    model = tiny_decoder(tie_embeddings=False)
    prepare_training(model, lora_rank=2, lora_targets=("lm_head",))
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids, labels=ids).loss.backward()  # the fused loss path, without logits
    assert model.lm_head.lora_b.grad is not None and model.lm_head.lora_b.grad.abs().sum() > 0


def test_eval_with_a_recipe_of_another_task_is_refused(runs, tmp_path, capsys):
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "stsa.binary.dev").write_text("1 a fine film\n0 a dull film\n")
    err = cli_error(capsys, "eval", runs["lm"], "--recipe", "sst2-encoder", "--data-root", tmp_path)
    assert "recipe sst2-encoder evaluates classify runs, but" in err and "is a lm run" in err


# Tracebacks from files written by hand or by other tools -----------------------------------------------------------
def test_damaged_lines_in_metrics_are_skipped_and_a_resume_truncates_past_them(tmp_path):
    from attnkit.train.metrics import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.append({"kind": "train", "step": step, "loss": 1.0})
    with open(log.path, "ab") as handle:
        handle.write(b'5\n[1, 2]\n{"kind": "train", "step": "x"}\n\xff\xfe not utf-8\n' + b"[" * 100_000 + b"\n")
    assert [r["step"] for r in log.records("train")] == [1, 2, 3, "x"]
    log.truncate_after(2)
    assert [r["step"] for r in log.records()] == [1, 2]


@pytest.mark.parametrize("name", ["$x^$", r"run $\frac{1}{$", "a $b$ c"])
def test_names_with_dollar_signs_are_drawn_as_written(tmp_path, name):
    from attnkit.tasks.confusion import plot_confusion
    from attnkit.train.plots import plot_losses
    from attnkit.viz.instruments import plot_instruments

    records = [{"kind": "train", "step": 1, "loss": 2.0}, {"kind": "eval", "step": 1, "val_loss": 2.5}]
    plot_losses(records, tmp_path / "loss.png", title=f"lm: {name}")
    plot_confusion([[3, 1], [0, 4]], [name, "b"], tmp_path / "confusion.png", title=name)
    plot_instruments([{"kind": "instruments", "step": 1, "grad_norm/0": 1.0}], tmp_path / "instruments.png",
                     title=name)
    assert all((tmp_path / f).stat().st_size > 0 for f in ("loss.png", "confusion.png", "instruments.png"))


# Pages and recipes -------------------------------------------------------------------------------------------------
HOSTILE_NAMES = ["{{DATA}}", "{{TITLE}}", "</script><script>alert(1)</script>", "{{DATA}}{{TITLE}}"]


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_no_title_or_token_reaches_the_attention_pages_structure(hostile):
    import numpy as np

    from attnkit.viz.maps import AttentionMaps
    from attnkit.viz.page import render_page

    maps = AttentionMaps(kind="self", weights=np.full((1, 1, 2, 2), 0.5, dtype=np.float32),
                         query_tokens=(hostile, "b"), key_tokens=(hostile, "b"), layers=(0,), heads=(0,))
    page = render_page([maps], title=hostile)
    assert page.count('"views"') == 1  # the data block once, in its own place
    assert "<script>alert(1)</script>" not in page
    head = page[page.index("<title>"):page.index("</title>")]
    assert '"views"' not in head and "weights" not in head


def test_data_given_for_a_recipe_replaces_its_validation_data_too():
    from attnkit import recipes

    recipe = recipes.load("sst2-encoder")
    assert "val_data" in recipe.train
    settings = recipe.settings("train", None, given={"data"})  # no data root needed: nothing of the recipe's read
    assert "data" not in settings and "val_data" not in settings


# Wrong causes ------------------------------------------------------------------------------------------------------
def test_the_real_cause_is_named_for_links_and_directories_in_the_way(runs, tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert "is a symbolic link that loops back on itself" in cli_error(capsys, "generate", tmp_path / "a",
                                                                       "--prompt", "x")
    assert "which does not exist" in cli_error(capsys, "generate", tmp_path / "dangling", "--prompt", "x")
    err = cli_error(capsys, "train", "--init-from", tmp_path / "a", "--data", "synthetic:copy", "--out",
                    tmp_path / "r", "--no-progress")
    assert "--init-from" in err and "loops back on itself" in err and "--preset" not in err
    assert "does not exist" in cli_error(capsys, "train", "--init-from", tmp_path / "none", "--data",
                                         "synthetic:copy", "--out", tmp_path / "r", "--no-progress")
    run = copy_run(runs["lm"], tmp_path)
    (run / "model.safetensors").unlink()
    (run / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="model.safetensors is a directory, where a safetensors file should"):
        load_model(run, verify=False)
    (run / CONFIG_FILE).unlink()
    (run / CONFIG_FILE).mkdir()
    with pytest.raises(CheckpointError, match="config.json is a directory, where the run's config"):
        load_model(run, verify=False)


def test_averaging_more_weights_than_memory_holds_is_refused(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", *TRAIN, "--out", str(run)]) == 0
    monkeypatch.setattr("attnkit.train.average.free_bytes", lambda device: 1000)
    err = cli_error(capsys, "average", run, "--last", "1")
    assert "holds their weights and the mean in memory at once" in err and "average fewer (--last)" in err
    assert not (run / "average-last-1").exists()
    monkeypatch.setattr("attnkit.train.average.free_bytes", lambda device: None)  # not known: not checked
    err = cli_error(capsys, "average", run, "--last", "1", "--out", run / "config.json" / "avg")
    assert "part of the path is a file" in err


def test_a_panic_in_the_rust_tokenizer_is_one_clear_error():
    from tokenizers import Tokenizer, models

    from attnkit.tokenize import HFTokenizer

    class PanicException(BaseException):  # pyo3's, raised when Rust code panics (not importable by name)
        pass

    class Panicking:
        def __init__(self):
            self.inner = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def encode(self, *args, **kwargs):
            raise PanicException("regex stack overflow\nbacktrace ...")

        encode_batch_fast = encode

    tokenizer = HFTokenizer(Panicking(), kind="hf", specials={"unk": "<unk>"})
    with pytest.raises(InputError, match=r"the tokenizer failed on this text \(regex stack overflow\).*shorten"):
        tokenizer.encode("(" * 100_000)
    with pytest.raises(InputError, match="shorten or split the text"):
        tokenizer.encode_batch(["a", "b"])


def test_weights_that_cannot_be_mapped_under_a_memory_limit_are_named_as_such(tmp_path):
    from safetensors.torch import save_file

    big = tmp_path / "big.safetensors"
    save_file({"w": torch.zeros(64 * 2**20 // 4)}, str(big))  # 64 MiB
    script = ("import os, resource\n"
              "from attnkit.checkpoint import load_tensors\n"
              "from attnkit.errors import CheckpointError\n"
              "used = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
              "resource.setrlimit(resource.RLIMIT_AS, (used + 32 * 2**20, resource.RLIM_INFINITY))\n"
              f"try:\n    load_tensors({str(big)!r})\nexcept CheckpointError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "cannot be mapped into memory" in done.stdout and "ulimit -v" in done.stdout, done.stdout + done.stderr


# Advice that leads somewhere ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory) -> Path:
    from export_runs import tokenizer as bpe

    config = ModelConfig(family="recurrent-lm", vocab_size=bpe().vocab_size, cell="lstm", hidden_size=16,
                         n_layers=1, max_seq_len=24)
    run = tmp_path_factory.mktemp("lstm") / "run"
    save_model(build_model(config).eval(), config, run)
    bpe().save(run / TOKENIZER_DIR)
    return run


@pytest.mark.parametrize("target", ["--to-gguf", "--to-onnx", "--to-hf"])
def test_a_recurrent_run_is_told_plainly_it_has_no_export(lstm_run, tmp_path, capsys, target):
    pytest.importorskip("gguf")
    out = tmp_path / {"--to-gguf": "m.gguf", "--to-onnx": "onnx", "--to-hf": "hf"}[target]
    err = cli_error(capsys, "convert", lstm_run, target, out)
    assert "a recurrent-lm model has no export form" in err and "run it with attnkit itself" in err
    assert "use --to" not in err and not out.exists()


def test_export_advice_names_only_targets_that_take_the_family(runs, tmp_path, capsys):
    pytest.importorskip("onnxscript")
    err = cli_error(capsys, "convert", runs["mt"], "--to-gguf", tmp_path / "m.gguf")
    assert "use --to-hf or --to-onnx for it" in err  # an encoder-decoder: Optimum's three graphs
    err = cli_error(capsys, "convert", runs["clf"], "--to-gguf", tmp_path / "m.gguf")
    assert "use --to-hf or --to-onnx for it" in err


def test_explain_on_a_recurrent_run_claims_no_fused_projections(lstm_run, capsys):
    assert cli.main(["generate", str(lstm_run), "--prompt", "ab", "--max-new-tokens", "2", "--explain",
                     "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "q/k/v" in err and "fused" not in err.split("q/k/v")[1].splitlines()[0]
    assert "no query, key and value projections" in err and "SDPA" not in err


def test_the_explorers_step_view_works_for_a_translation_run(runs):
    from attnkit.serve.explorer import Explorer

    pipeline = attnkit.load(runs["mt"], device="cpu")
    explorer = Explorer(pipeline, runs["mt"], watch=runs["mt"], experiments=None)
    text = "abc"
    assert pipeline.translate(text)[0].strip()  # an empty translation is refused, rightly: not what this tests
    for kind in ("self", "causal", "cross"):  # over the model's own translation (an empty Target box)
        for target in (None, ""):
            steps = explorer.step(text, kind=kind, layer=0, head=1, query=1, target=target)
            assert steps["matches_model"] and steps["kind"] == kind
    with pytest.raises(InputError, match=r"Query token 99 is out of range: this view has \d+ query tokens"):
        explorer.step("abc", kind="cross", layer=0, target="ab", query=99)
    with pytest.raises(InputError, match=r"^no attention at layer 99: this model's attention is at layers 0 to \d+, "):
        explorer.step("abc", layer=99)
    with pytest.raises(InputError, match=r"^no florb attention at layer 0: .* kinds self, causal, cross"):
        explorer.step("abc", kind="florb", layer=0)
