"""Faults a hostile user finds next, each refused before it costs time or harms other work: damaged run files that
would build a model for minutes, and the like. Each test fails without the fix it holds."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_helpers import tiny_runs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import build_model, cli
from attnkit import checkpoint as checkpoint_module
from attnkit.checkpoint import CHECKSUMS_FILE, CONFIG_FILE, WEIGHTS_FILE, load_model, save_model
from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError, CheckpointError, InputError
from attnkit.outputs import atomic_output, atomic_write, refuse_special


@pytest.fixture
def run(tmp_path) -> Path:
    """A tiny random decoder run (weights and config), without checksums: a directory written by hand, or one whose
    checksums.json was removed, so that only the files themselves are checked."""
    config = ModelConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=24)
    save_model(build_model(config).eval(), config, tmp_path / "run")
    (tmp_path / "run" / CHECKSUMS_FILE).unlink()
    return tmp_path / "run"


def edit_config(run: Path, **changes) -> None:
    path = run / CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("weights", ["intact", "truncated"])
def test_a_config_far_deeper_than_its_weights_is_refused_before_the_model_is_built(run, monkeypatch, weights):
    # 100,000 layers of width 16 fit in memory (about 0.9 GB), so only strict loading refused them, after building
    # the model for many minutes and with a list of a million missing tensors (or, where the weights file was damaged
    # too, that file's error, after the same build)
    edit_config(run, n_layers=100_000)
    refusal = (r"config\.json describes a model of [\d,]+ parameters, but .*model\.safetensors holds [\d,]+ "
               r"values in all")
    if weights == "truncated":
        path = run / WEIGHTS_FILE
        path.write_bytes(path.read_bytes()[:100])
        refusal = r"model\.safetensors is not a readable safetensors file \(truncated or corrupted\?\)"

    def built(config, **_):
        raise AssertionError(f"a model of {config.n_layers} layers was built before the weights were compared")

    monkeypatch.setattr(checkpoint_module, "build_model", built)
    with pytest.raises(CheckpointError, match=refusal):
        load_model(run)


def test_a_config_close_to_its_weights_still_gets_strict_loadings_list(run):
    edit_config(run, d_ff=40)  # a few more values than stored: each misshapen tensor is named, as before
    with pytest.raises(CheckpointError, match=r"shape mismatches: .*mlp\.up_proj\.weight: checkpoint \(32, 16\) vs "
                                              r"model \(40, 16\)"):
        load_model(run)


def test_a_hugging_face_config_far_deeper_than_its_weights_is_refused_before_the_model_is_built(tmp_path,
                                                                                                  monkeypatch):
    transformers = pytest.importorskip("transformers")
    from attnkit.interop import hf

    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=40, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    edit_config(tmp_path / "gpt2", n_layer=100_000)

    def built(config, **_):
        raise AssertionError(f"a model of {config.n_layers} layers was built before the weights were compared")

    monkeypatch.setattr(hf, "build_model", built)
    with pytest.raises(CheckpointError, match=r"gpt2/config\.json describes a model of [\d,]+ parameters, but the "
                                              r"weights of .*gpt2 holds [\d,]+ values in all"):
        hf.load(tmp_path / "gpt2")


def test_every_kind_of_run_holds_the_values_its_config_describes(tmp_path):
    """The margin of twice is for damage alone: each family's run, with a classifier head, untied, in bfloat16 and
    with LoRA adapters (saved beside its base weights) stores what its config describes, and loads."""
    import torch

    from attnkit import presets
    from attnkit.models.families import estimate_parameters, families
    from attnkit.train.lora import apply_lora

    def kinds(config):
        yield "plain", config, None
        for field, value in (("n_classes", 3), ("tie_embeddings", False)):
            if hasattr(config, field):
                yield f"{field}={value}", config.replace(**{field: value}), None
        yield "bfloat16", config, torch.bfloat16
        if config.family == "decoder":
            yield "lora", config, "lora"

    for family in families():
        for kind, config, change in kinds(presets.get(family.example)):
            model = build_model(config).eval()
            if change == "lora":
                apply_lora(model, rank=2, alpha=4.0)
            elif change is not None:
                model.to(change)
            directory = tmp_path / f"{family.name}-{kind}"
            save_model(model, config, directory)
            stored = checkpoint_module.stored_values(directory / WEIGHTS_FILE)
            assert stored == estimate_parameters(config), (family.name, kind)
            load_model(directory)


@pytest.fixture
def fifo(tmp_path) -> Path:
    """A named pipe: as /dev/null or /dev/stdout, a path that exists and is no file, which renaming an output over it
    would replace (as root, `attnkit tune --out /dev/null` left /dev/null a regular file, for every process)."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_an_output_is_never_renamed_over_a_device_a_pipe_or_a_socket(fifo):
    with pytest.raises(InputError, match=r"pipe is a device, a pipe or a socket, not a file"):
        atomic_write(fifo, "{}")
    with pytest.raises(InputError, match=r"--to-gguf .*pipe is a device, a pipe or a socket"):
        with atomic_output(fifo, directory=False, overwrite=True, flag="--to-gguf") as partial:
            partial.write_text("{}")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_device_and_a_socket_are_refused_as_a_pipe_is():
    """The test above holds a pipe; /dev/null (asked of the check alone, so that a failure writes nothing over it) and
    a Unix socket are refused the same way."""
    import socket

    with pytest.raises(InputError, match=r"/dev/null is a device, a pipe or a socket, not a file"):
        refuse_special(Path("/dev/null"), flag="--out")
    directory = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path is at most 107 bytes
    try:
        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(str(directory / "sock"))
            with pytest.raises(InputError, match=r"sock is a device, a pipe or a socket, not a file"):
                atomic_write(directory / "sock", "{}")
            assert stat.S_ISSOCK((directory / "sock").stat().st_mode)
    finally:
        shutil.rmtree(directory)


def test_attnkit_tune_refuses_a_pipe_as_its_profile_before_measuring(fifo, capsys):
    assert cli.main(["tune", "--quick", "--out", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit: error: --out {fifo} is a device, a pipe or a socket") and err.count("\n") == 1
    assert stat.S_ISFIFO(fifo.stat().st_mode)


# What a damaged or hand-made safetensors header may say of a tensor: its type, its shape, where its bytes lie
HEADER_VALUES = {
    "dtype": st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "I8", "U8", "BOOL", "F8_E4M3", "Q4", "", "f32"]),
    "shape": st.lists(st.integers(min_value=-2, max_value=2**62), max_size=3),
    "data_offsets": st.lists(st.integers(min_value=-1, max_value=2**64), min_size=0, max_size=3),
}
SIZE_FIELDS = st.sampled_from(["n_layers", "d_model", "d_ff", "n_heads", "vocab_size", "max_seq_len"])


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    config = ModelConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=24)
    directory = tmp_path_factory.mktemp("fuzz") / "run"
    save_model(build_model(config).eval(), config, directory)
    (directory / CHECKSUMS_FILE).unlink()  # so that the reader's own checks meet every change
    return directory


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_checkpoint_loads_or_is_refused_by_name_never_a_traceback(saved_run, data):
    # a damaged header, a truncated file or a changed size in the config: the run loads, or is refused with an
    # AttnkitError; any other exception fails. A config far larger than its weights (n_layers=2**70) must be refused
    # before its model is built, header readable or not, else an example takes minutes or all the memory
    raw = (saved_run / WEIGHTS_FILE).read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    names = sorted(name for name in header if name != "__metadata__")
    for name in data.draw(st.lists(st.sampled_from(names), max_size=2, unique=True), label="tensors"):
        key = data.draw(st.sampled_from(sorted(HEADER_VALUES)), label=f"{name} field")
        header[name][key] = data.draw(HEADER_VALUES[key], label=f"{name}.{key}")
    text = json.dumps(header).encode()
    declared = data.draw(st.sampled_from([len(text), len(text) - 1, len(text) + 8, 2**63]), label="header length")
    cut = data.draw(st.sampled_from([None, 8 + len(text) + 4, 5]), label="truncated at")
    directory = Path(tempfile.mkdtemp(dir=saved_run.parent))
    config = json.loads((saved_run / CONFIG_FILE).read_text())
    if data.draw(st.booleans(), label="config changed"):
        config[data.draw(SIZE_FIELDS, label="size field")] = data.draw(
            st.sampled_from([0, -1, 3, 100_000, 10**9, 2**70]), label="size")
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    (directory / WEIGHTS_FILE).write_bytes((struct.pack("<Q", declared) + text + raw[8 + length:])[:cut])
    try:
        load_model(directory)
    except AttnkitError:
        pass  # refused by name: each case's message is held by the tests of the check that makes it
    finally:
        shutil.rmtree(directory)


# A refused run leaves --out as it found it; a data file with no text is named ---------------------------------------
TINY_TRAIN = ["--tokenizer", "char", "--preset", "gpt2-tiny", "--set", "n_layers=1", "d_model=16", "n_heads=2",
              "d_ff=32", "max_seq_len=64", "--max-steps", "2", "--batch-size", "2", "--no-progress",
              "--sample-tokens", "0"]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (itself included), a file's bytes, None for a folder; {} where `root` is absent."""
    paths = [root, *root.rglob("*")] if root.exists() else []
    return {str(p.relative_to(root.parent)): p.read_bytes() if p.is_file() else None for p in paths}


@pytest.mark.parametrize("place", ["new", "new and nested", "an empty folder", "a run, --overwrite"])
def test_a_run_refused_after_its_data_is_read_leaves_out_as_it_found_it(tmp_path, capsys, place):
    # the data is tokenized into out/cache, then found too short for one window: nothing may stay behind (the lock,
    # the run's marker, the cache), and a run --overwrite was to replace is untouched
    text = tmp_path / "short.txt"
    text.write_text("a text too short for one window\n")
    out = tmp_path / ("a/b/run" if place == "new and nested" else "run")
    overwrite = []
    if place == "an empty folder":
        out.mkdir()
    elif place == "a run, --overwrite":
        config = ModelConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=24)
        save_model(build_model(config).eval(), config, out)
        checkpoint_module.mark_run(out)
        (out / "cache").mkdir()
        (out / "cache" / "lm-old.bin").write_bytes(b"\0\1")
        overwrite = ["--overwrite"]
    before = tree(tmp_path / "a" if place == "new and nested" else out)
    assert cli.main(["train", "--data", str(text), "--out", str(out), *TINY_TRAIN, *overwrite]) == 2
    err = capsys.readouterr().err
    assert f"the training split of {text} has" in err and "fewer than one window needs (65)" in err, err
    assert tree(tmp_path / "a" if place == "new and nested" else out) == before


def write_meanwhile(folder: Path) -> dict[str, bytes | None]:
    """What another program writes into `folder` while a run prepares there: a file and a folder holding one."""
    (folder / "notes.txt").write_text("not the run's\n")
    (folder / "other").mkdir()
    (folder / "other" / "data.txt").write_text("nor this\n")
    return {f"{folder.name}/notes.txt": b"not the run's\n", f"{folder.name}/other": None,
            f"{folder.name}/other/data.txt": b"nor this\n"}


@pytest.mark.parametrize("when", ["after the claim, in a folder that held files", "during the claim, in a new folder"])
def test_a_refused_run_removes_only_what_it_made(tmp_path, capsys, monkeypatch, when):
    # the clean-up of a refused run removed every name that was not in --out before: a file another program saved
    # there meanwhile (or in a folder the claim had just made) went with the run's own
    from attnkit.train import job, rundir

    text = tmp_path / "short.txt"
    text.write_text("a text too short for one window\n")
    out = tmp_path / "run"
    written = {}
    if when.startswith("after"):
        out.mkdir()
        (out / "kept.txt").write_text("kept\n")
        real_mark = job.mark_run
        monkeypatch.setattr(job, "mark_run", lambda folder: (written.update(write_meanwhile(out)), real_mark(folder)))
    else:
        real_flock = rundir.fcntl.flock
        monkeypatch.setattr(rundir.fcntl, "flock", lambda fd, how: (written.update(write_meanwhile(out)),
                                                                     real_flock(fd, how))[1])
    before = tree(out)
    assert cli.main(["train", "--data", str(text), "--out", str(out), *TINY_TRAIN]) == 2
    assert "fewer than one window needs (65)" in capsys.readouterr().err
    assert written and tree(out) == {**before, **written, "run": None}


def test_a_refused_run_leaves_a_claim_this_process_held_before_it(tmp_path, capsys):
    # claim() returns early for a directory the process owns already; the refusal then released that earlier claim,
    # the lock with it, and removed what had been made since it
    import fcntl

    from attnkit.train import rundir

    text = tmp_path / "short.txt"
    text.write_text("a text too short for one window\n")
    out = tmp_path / "run"
    assert rundir.claim(out) and not rundir.claim(out)
    try:
        (out / "cache").mkdir()
        (out / "cache" / "earlier.bin").write_bytes(b"\0")
        assert cli.main(["train", "--data", str(text), "--out", str(out), *TINY_TRAIN]) == 2
        assert "fewer than one window needs (65)" in capsys.readouterr().err
        assert (out / "cache" / "earlier.bin").is_file()
        fd = os.open(out / rundir.LOCK_FILE, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # still locked: the claim is held
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        rundir.release(out, refused=True)
    assert not out.exists()


def test_a_refused_run_through_a_linked_out_leaves_the_link_and_its_folder_as_they_were(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("a text too short for one window\n")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "kept.txt").write_text("kept\n")
    (tmp_path / "link").symlink_to(tmp_path / "target", target_is_directory=True)
    before = tree(tmp_path / "target")
    assert cli.main(["train", "--data", str(text), "--out", str(tmp_path / "link"), *TINY_TRAIN]) == 2
    assert "fewer than one window needs (65)" in capsys.readouterr().err
    assert (tmp_path / "link").is_symlink() and tree(tmp_path / "target") == before


def test_a_refused_resume_leaves_the_run_it_was_to_continue_whole(tmp_path, capsys):
    # a run trained on a long text, resumed on one too short for a window: refused after the new text is tokenized
    # into the run's cache/; the run's own files, its cache and its checkpoints must all stay
    long_text, short_text = tmp_path / "long.txt", tmp_path / "short.txt"
    long_text.write_text("the cat sat on the mat and the dog ran after it. " * 40)
    short_text.write_text("the cat sat on the mat.")
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(long_text), "--out", str(out), *TINY_TRAIN]) == 0
    capsys.readouterr()
    before = tree(out)
    assert (out / "cache").is_dir() and len(before) > 10, sorted(before)
    assert cli.main(["train", "--data", str(short_text), "--out", str(out), "--resume", "--max-steps", "4",
                     "--no-progress"]) == 2
    assert "fewer than one window needs (65)" in capsys.readouterr().err
    lock = "run/.lock"  # says which process held the run last: rewritten by each claim
    assert {**tree(out), lock: None} == {**before, lock: None}


@pytest.mark.parametrize(("content", "message"), [
    ("", "{path} holds no text (it is empty): give --data a file with the text to score"),
    (" \n\t\r\n", "{path} holds no text (only white space): give --data a file with the text to score"),
    ("a", "{path} holds 1 token(s), and perplexity predicts each token from those before it, so it needs at least 2"),
])
def test_attnkit_eval_names_a_data_file_with_no_text_to_score(tmp_path, capsys, content, message):
    runs = tiny_runs(tmp_path)
    path = tmp_path / "scored.txt"
    path.write_text(content)
    assert cli.main(["eval", str(runs["lm"]), "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit: error: " + message.format(path=path)) and err.count("\n") == 1, err
    assert not (runs["lm"] / "eval").exists()


@pytest.fixture
def nothing_written_in_root(monkeypatch):
    """Fail, rather than write, where a command would create a file or folder directly under `/`."""
    real_open, real_mkdir = os.open, os.mkdir

    def in_root(path) -> bool:  # through links too: a link to / names the root as well
        return os.path.dirname(os.path.realpath(os.fsdecode(path))) == os.sep

    def guarded_open(path, flags, *args, **kwargs):
        assert not (flags & os.O_CREAT and in_root(path)), f"a file was about to be made in /: {path}"
        return real_open(path, flags, *args, **kwargs)

    def guarded_mkdir(path, *args, **kwargs):
        assert not in_root(path) or os.path.exists(path), f"a folder was about to be made in /: {path}"
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded_open)
    monkeypatch.setattr(os, "mkdir", guarded_mkdir)


@pytest.mark.parametrize("command", ["train", "viz", "inspect", "eval"])
def test_the_file_system_root_as_out_is_refused_in_one_line(tmp_path, capsys, nothing_written_in_root, command):
    # a run, a page of pictures, a report or eval.json spread among the system's folders (as root, nothing stopped
    # it), or a traceback where no name for the output's temporary sibling could be made from "/"
    runs = tiny_runs(tmp_path)
    (tmp_path / "text.txt").write_text("the cat sat on the mat\n")
    argv = {"train": ["train", "--data", "synthetic:copy", *TINY_TRAIN],
            "viz": ["viz", str(runs["lm"]), "--text", "the cat"],
            "inspect": ["inspect", str(runs["lm"]), "--text", "the cat sat"],
            "eval": ["eval", str(runs["lm"]), "--data", str(tmp_path / "text.txt")]}[command]
    assert cli.main([*argv, "--out", "/"]) == 2
    err = capsys.readouterr().err
    assert err == "attnkit: error: --out / is the file system's root: give a folder of the output's own\n"


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "sae", "--point", "blocks.0.resid_post"], ["viz"]])
def test_inspect_and_viz_refuse_the_root_before_the_run_loads(tmp_path, capsys, monkeypatch, nothing_written_in_root,
                                                               command):
    # the report was refused only when written, after the analysis (an SAE's training), and an SAE saved out/sae,
    # /sae for --out /, which no check asked about; viz drew every map first
    from attnkit.inspect import command as inspect_command
    from attnkit.viz import run as viz_run

    for module in (inspect_command, viz_run):
        monkeypatch.setattr(module, "load_model", lambda *args, **kwargs: pytest.fail("the run was loaded"))
    argv = [command[0], str(tiny_runs(tmp_path)["lm"]), *command[1:], "--text", "the cat sat", "--out", "/"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ("attnkit: error: --out / is the file system's root: give a folder of the "
                                       "output's own\n")


@pytest.mark.parametrize("spelling", ["//", "/.", "up to the root", "a link to /"])
def test_the_file_system_root_is_refused_however_it_is_spelled(tmp_path, capsys, nothing_written_in_root, spelling):
    out = {"up to the root": str(tmp_path) + "/.." * len(tmp_path.parts), "a link to /": str(tmp_path / "root")}
    out = out.get(spelling, spelling)
    (tmp_path / "root").symlink_to(os.sep, target_is_directory=True)
    assert cli.main(["train", "--data", "synthetic:copy", *TINY_TRAIN, "--out", out]) == 2
    assert capsys.readouterr().err == f"attnkit: error: --out {out} is the file system's root: give a folder of the " \
                                      "output's own\n"


def test_an_empty_out_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--data", "synthetic:copy", *TINY_TRAIN, "--out", ""]) == 2
    assert capsys.readouterr().err == ("attnkit: error: --out is empty: give the run's own directory (e.g. --out "
                                       "runs/NAME)\n")
    assert list(tmp_path.iterdir()) == []


UNBLOCK = """
import os, sys, time
fifo, opened, parent = sys.argv[1], sys.argv[2], os.getppid()
while os.getppid() == parent:  # the test's process gone (killed): stop too
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader, as with the fix
        pass
    else:  # a reader waits on it: said before the close that lets its read end
        open(opened, "a").close()
        os.close(fd)
    time.sleep(0.2)
"""


class UnblockedFifos:
    """FIFOs opened for writing and closed every 0.2 s by another process (a reader stuck in native code holds the
    GIL), so that a reader waiting on one gets an end of file and its test fails, not hangs; `waited_on` names those a
    reader opened."""

    def __init__(self, marks: Path) -> None:
        self.marks, self.writers = marks, []

    def make(self, path: Path) -> Path:
        os.mkfifo(path)
        mark = self.marks / f"{len(self.writers)}-{path.name}"
        self.writers.append(subprocess.Popen([sys.executable, "-c", UNBLOCK, str(path), str(mark)]))
        return path

    def waited_on(self) -> list[str]:
        return sorted(mark.name for mark in self.marks.iterdir())


@pytest.fixture
def unblocked_fifos(tmp_path_factory):
    fifos = UnblockedFifos(tmp_path_factory.mktemp("fifo_readers"))
    yield fifos
    for writer in fifos.writers:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("place", ["listed in checksums.json", "no checksums.json", "a link to a FIFO"])
def test_a_fifo_in_place_of_a_run_file_is_named_not_waited_on(tmp_path, capsys, unblocked_fifos, place):
    # a run's model.safetensors swapped for a FIFO (or a link to one): the header count opened it and waited for a
    # writer forever; with checksums.json, the file was called missing
    run = tiny_runs(tmp_path)["lm"]
    if place != "listed in checksums.json":
        (run / CHECKSUMS_FILE).unlink()
    (run / WEIGHTS_FILE).unlink()
    if place == "a link to a FIFO":
        (run / WEIGHTS_FILE).symlink_to(unblocked_fifos.make(tmp_path / "fifo"))
    else:
        unblocked_fifos.make(run / WEIGHTS_FILE)
    assert cli.main(["generate", str(run), "--prompt", "ab", "--max-new-tokens", "2"]) == 2
    where = (f"where {run / CHECKSUMS_FILE} lists a file" if place == "listed in checksums.json"
             else "where a safetensors file should be")
    assert capsys.readouterr().err.startswith(f"attnkit: error: {run / WEIGHTS_FILE} is a FIFO, not a file, {where}")
    with pytest.raises(CheckpointError, match=r"train_state.json is a FIFO, not a file, where a JSON file should be"):
        checkpoint_module.read_json(unblocked_fifos.make(run / "train_state.json"))
    assert unblocked_fifos.waited_on() == []  # named from what stands there, never opened (the message alone would
    # not tell: a read that the writer's close ended is refused by name as well)
