"""Outputs whole or absent: every command that writes a directory or a file (`convert --to-hf`, `--from-hf`,
`--to-gguf`, `--to-onnx`, `tokenizer train`, `tune`) goes through `attnkit.outputs`. A failure injected at each of
its file-system steps (as a full disk would), a SIGKILL at a random step, or a real full disk leaves the output
absent or as it was, and a retry works; OS refusals are named for what they are."""

from __future__ import annotations

import errno
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnkit import cli
from attnkit.errors import CheckpointError, InputError
from attnkit.outputs import atomic_output, atomic_write, file_mode, files_into, writing

ARMED: dict = {}  # the fault injector's orders, while a writer runs: {"root": Path, "at": n, "seen": 0}
WRITE_EVENTS = ("os.rename", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree")


def _file_system_step(event: str, args: tuple) -> None:
    """The audit hook (installed once): counts the writer's steps under ARMED["root"], and at step ARMED["at"]
    raises a full disk's OSError there, once."""
    if not ARMED or ARMED.get("done"):
        return
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or not (flags & (os.O_WRONLY | os.O_RDWR) or (mode and set(mode) & set("wax+"))):
            return
    elif event not in WRITE_EVENTS or event == "os.mkdir" and os.path.isdir(args[0]):  # mkdir(exist_ok) of one there
        return
    if not str(args[0]).startswith(str(ARMED["root"])):
        return
    ARMED["seen"] += 1
    if ARMED["seen"] == ARMED.get("at"):
        ARMED["done"] = True
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))


sys.addaudithook(_file_system_step)


def listing(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (hidden ones too) -> its bytes (None for a directory)."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny decoder run with a byte-level BPE tokenizer (what every exporter takes)."""
    pytest.importorskip("gguf")
    from export_runs import random_run

    return random_run(tmp_path_factory.mktemp("source"), dict(family="decoder", d_model=32, n_layers=1, n_heads=2,
                                                              d_ff=64, max_seq_len=32, position="rope", norm="rms",
                                                              activation="swiglu", bias=False))


@pytest.fixture(autouse=True)
def quick_tune(monkeypatch):
    """`tune` without its measurements (what it writes is under test here, not what it measures)."""
    import dataclasses

    from attnkit.machine import DEFAULT_PROFILE

    profile = dataclasses.replace(DEFAULT_PROFILE, dtype_speed={"fp32": 1.0, "bf16": 1.5})
    monkeypatch.setattr("attnkit.generate.tune.tune", lambda **kwargs: (profile, ["measured nothing"]))


def writers(run: Path, out: Path, hf_source: Path, text: Path) -> dict[str, list]:
    """Each writing command, its output at `out` (a new path) -> its argv."""
    return {
        "to-hf": ["convert", run, "--to-hf", out],
        "from-hf": ["convert", "--from-hf", hf_source, "--out", out],
        "to-gguf": ["convert", run, "--to-gguf", out.with_suffix(".gguf")],
        "tokenizer": ["tokenizer", "train", "--out", out, "--data", text, "--kind", "char"],
        "tune": ["tune", "--quick", "--out", out.with_suffix(".json")],
    }


@pytest.fixture
def place(run, tmp_path) -> tuple[Path, Path, Path]:
    """(a folder to write in, a Hugging Face directory to read, a text file to train on), the last two outside it."""
    hf_source = tmp_path / "hf"
    assert cli.main(["convert", str(run), "--to-hf", str(hf_source)]) == 0
    text = tmp_path / "text.txt"
    text.write_text("some text to learn a tokenizer from\n" * 20)
    folder = tmp_path / "out"
    folder.mkdir()
    return folder, hf_source, text


@pytest.mark.parametrize("writer", ["to-hf", "from-hf", "to-gguf", "tokenizer", "tune"])
def test_a_failure_at_any_step_leaves_nothing_and_a_retry_works(run, place, capsys, writer):
    folder, hf_source, text = place
    argv = writers(run, folder / "written", hf_source, text)[writer]
    ARMED.update(root=folder, seen=0)  # counting only: how many steps the writer takes
    try:
        assert run_cli(capsys, argv)[0] == 0
        steps = ARMED["seen"]
    finally:
        ARMED.clear()
    whole = listing(folder)
    assert steps >= 2 and not [name for name in whole if name.startswith(".")], whole  # no leftovers when whole
    for path in folder.iterdir():
        __import__("shutil").rmtree(path) if path.is_dir() else path.unlink()
    chosen = sorted(random.Random(writer).sample(range(1, steps + 1), min(steps, 5)) + [steps])
    for at in dict.fromkeys(chosen):
        ARMED.update(root=folder, seen=0, at=at)
        try:
            code, err = run_cli(capsys, argv)
        finally:
            ARMED.clear()
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1, (at, err)
        assert "the disk is full; free some space" in err, (at, err)
        assert listing(folder) == {}, (at, listing(folder))  # nothing half-written, not even hidden
    assert run_cli(capsys, argv)[0] == 0
    assert listing(folder).keys() == whole.keys()


def test_a_failure_while_replacing_keeps_the_previous_output(run, place, capsys):
    folder, hf_source, text = place
    out = folder / "tok"
    assert cli.main(["tokenizer", "train", "--out", str(out), "--data", str(text), "--kind", "char"]) == 0
    before = listing(folder)
    other = text.with_name("other.txt")
    other.write_text("quite different letters: xyzzy qwv\n" * 5)
    argv = ["tokenizer", "train", "--out", out, "--data", other, "--kind", "char", "--overwrite"]
    for at in range(1, 12):
        ARMED.update(root=folder, seen=0, at=at)
        try:
            code, err = run_cli(capsys, argv)
        finally:
            ARMED.clear()
        if code == 0:  # fewer steps than `at`: the replacement went through
            break
        assert "the disk is full" in err and f"{out} is left as it was" in err
        assert listing(folder) == before, at
    assert code == 0 and listing(folder)["tok/attnkit_tokenizer.json"] != before["tok/attnkit_tokenizer.json"]
    assert run_cli(capsys, argv)[0] == 0  # an old output left aside by a failed clean-up is removed now
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


KILLER = """\
import os, signal, sys
from pathlib import Path
root, at = sys.argv[1], int(sys.argv[2])
seen = 0
def hook(event, args):
    global seen
    if event == "open":
        if isinstance(args[0], int) or not (args[2] & (os.O_WRONLY | os.O_RDWR) or set(args[1] or "") & set("wax+")):
            return
    elif event not in {events!r} or event == "os.mkdir" and os.path.isdir(args[0]):
        return
    if str(args[0]).startswith(root):
        seen += 1
        if seen == at:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
from attnkit import cli
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("writer", ["to-hf", pytest.param("from-hf", marks=pytest.mark.slow),
                                    pytest.param("tokenizer", marks=pytest.mark.slow)])
def test_a_sigkill_at_a_random_step_leaves_the_previous_output_and_a_retry_works(run, place, capsys, writer):
    folder, hf_source, text = place
    out = folder / "written"
    argv = [str(a) for a in writers(run, out, hf_source, text)[writer]]
    assert cli.main(argv) == 0
    before = listing(folder)
    argv.append("--overwrite")
    ARMED.update(root=folder, seen=0)
    try:
        assert cli.main(argv) == 0
        steps = ARMED["seen"]
    finally:
        ARMED.clear()
    at = random.Random(os.getpid()).randint(1, steps)  # a different step each run; the assertions name it
    script = textwrap.dedent(KILLER).format(events=set(WRITE_EVENTS))
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(at), *argv], capture_output=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, (at, done.stderr.decode()[-2000:])
    found = listing(folder)
    visible = {name: data for name, data in found.items() if not name.split("/")[0].startswith(".")}
    aside = {name.partition("/")[2]: data for name, data in found.items() if ".replaced-" in name.split("/")[0]}
    aside = {f"{out.name}/{name}" if name else out.name: data for name, data in aside.items()}
    assert visible == before or (not visible and aside == before), (at, steps, sorted(found))  # old, or old aside
    assert cli.main(argv[:-1]) == 2  # the previous output is there (or put back from aside): not replaced unasked
    assert listing(folder) == before  # and what the killed writer left is cleared
    assert cli.main(argv) == 0
    assert not [name for name in listing(folder) if name.startswith(".")]


def test_a_real_full_disk_is_one_line_and_leaves_nothing(run, small_disk, capsys):
    (small_disk / "filler").write_bytes(bytes(48 * 1024))  # what the disk already holds: the model no longer fits
    for argv in (["convert", run, "--to-hf", small_disk / "hf"],
                 ["convert", run, "--to-gguf", small_disk / "model.gguf"]):
        code, err = run_cli(capsys, argv)
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
        assert "the disk is full; free some space, or write to another disk" in err and "is left as it was" in err
        assert [p.name for p in small_disk.iterdir()] == ["filler"]


def test_files_written_get_the_users_umask(run, tmp_path):
    previous = os.umask(0o027)
    try:
        assert file_mode() == 0o640
        atomic_write(tmp_path / "plain.json", "{}")
        assert cli.main(["convert", str(run), "--to-hf", str(tmp_path / "hf")]) == 0
    finally:
        os.umask(previous)
    for path in [tmp_path / "plain.json", *(p for p in (tmp_path / "hf").iterdir() if p.is_file())]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path


# OS errors named for what they are ----------------------------------------------------------------------------------
def test_a_file_where_a_directory_is_needed_is_not_advice_to_remove_it(run, tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for argv in (["convert", run, "--to-hf", a_file], ["tokenizer", "train", "--out", a_file, "--kind", "char",
                                                         "--data", a_file]):
        code, err = run_cli(capsys, argv)
        assert code == 2 and f"{a_file} is a file, where a directory is to be written" in err, err
        assert "remove it" not in err
    code, err = run_cli(capsys, ["tune", "--quick", "--out", a_file / "profile.json"])
    assert code == 2 and "a file is in the way, where a directory is needed" in err and "remove it" not in err, err
    with pytest.raises(OSError) as raised:
        (a_file / "x").parent.mkdir(parents=True, exist_ok=True)
    from attnkit.errors import os_error_message

    line = os_error_message(raised.value, a_file, "writing")
    assert "a file is in the way, where a directory is needed" in line and "never removed" in line
    assert a_file.read_text() == "mine"


@pytest.mark.parametrize(("code", "said"), [(errno.ENOSPC, "the disk is full"),
                                            (errno.EROFS, "the file system is read-only"),
                                            (errno.EACCES, "permission denied")])
def test_each_os_refusal_has_its_own_message(tmp_path, monkeypatch, code, said):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("attnkit.outputs._put_in_place", refuse)
    with pytest.raises(CheckpointError) as raised:
        with atomic_output(tmp_path / "out", directory=True) as partial:
            (partial / "a").write_text("x")
    assert said in str(raised.value) and "already exists" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_a_file_failing_inside_an_output_being_written_is_named_inside_the_output(tmp_path):
    """A writer failing on a file it makes inside an output folder (an exporter's model.onnx) names that file in the
    folder the user asked for, not in the hidden partial folder it is made in."""
    with pytest.raises(CheckpointError) as raised:
        with atomic_output(tmp_path / "o", directory=True) as partial:
            with writing(partial / "model.onnx"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial / "model.onnx"))
    message = str(raised.value)
    assert f"cannot finish writing {tmp_path / 'o' / 'model.onnx'}: the disk is full" in message
    assert ".partial-" not in message and list(tmp_path.iterdir()) == []


def test_files_into_names_its_own_failures_and_passes_on_a_read_of_a_file_elsewhere(tmp_path):
    """The block inside `files_into` is the caller's whole work (an experiment, a drawing): a file it cannot read
    elsewhere is its own error, not a failure to write the output; a full disk inside the folder is the output's."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("kept")
    with pytest.raises(FileNotFoundError) as raised:
        with files_into(out):
            open(tmp_path / "missing-corpus.txt").read()
    assert raised.value.filename == str(tmp_path / "missing-corpus.txt")
    with pytest.raises(CheckpointError) as failed:
        with files_into(out) as partial:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial / "plot.png"))
    assert f"cannot finish writing {out}: the disk is full" in str(failed.value)
    assert "nothing was written" in str(failed.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in out.iterdir()] == ["notes.md"]


def test_an_existing_output_is_replaced_only_on_overwrite_and_never_a_folder_of_other_files(run, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    code, err = run_cli(capsys, ["convert", run, "--to-hf", mine, "--overwrite"])
    assert code == 2 and "holds files of its own and no model" in err and (mine / "notes.txt").exists()
    assert cli.main(["convert", str(run), "--to-hf", str(tmp_path / "hf")]) == 0
    code, err = run_cli(capsys, ["convert", run, "--to-hf", tmp_path / "hf"])
    assert code == 2 and "add --overwrite to replace it" in err
    assert cli.main(["convert", str(run), "--to-hf", str(tmp_path / "hf"), "--overwrite"]) == 0
    with pytest.raises(InputError, match="is a directory, where a file is to be written"):
        with atomic_output(tmp_path / "hf", directory=False, overwrite=True):
            pass


def test_a_file_output_failing_inside_a_folder_output_names_neither_partial(tmp_path):
    """An exporter writing its graph (an output of its own) inside the folder being written: a full disk names the
    file inside the folder the user asked for, and says the folder is left as it was, never the hidden partial."""
    with pytest.raises(CheckpointError) as raised:
        with atomic_output(tmp_path / "o", directory=True) as partial:
            with atomic_output(partial / "model.onnx", directory=False) as graph:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(graph))
    message = str(raised.value)
    assert f"cannot finish writing {tmp_path / 'o' / 'model.onnx'}: the disk is full" in message
    assert ".partial-" not in message and list(tmp_path.iterdir()) == [], message


def _draw_losses(path):
    from attnkit.train.plots import plot_losses

    plot_losses([{"kind": "train", "step": 1, "loss": 2.0}, {"kind": "eval", "step": 1, "val_loss": 2.5}], path)


def _draw_instruments(path):
    from attnkit.viz.instruments import plot_instruments

    plot_instruments([{"kind": "instruments", "step": 1, "grad_norm/0": 1.0}], path)


def _draw_confusion(path):
    from attnkit.tasks.confusion import plot_confusion

    plot_confusion([[3, 1], [0, 4]], ["a", "b"], path)


@pytest.mark.parametrize("draw", [_draw_losses, _draw_instruments, _draw_confusion])
def test_a_picture_that_fails_to_draw_leaves_the_one_before_and_nothing_else(tmp_path, monkeypatch, draw):
    """Every picture goes through `write_figure`: drawn in memory, then written whole. The loss curves and viz's
    pictures were drawn into a fixed temporary file beside the picture by hand, and one whose drawing failed was
    left behind there."""
    from matplotlib.figure import Figure

    path = tmp_path / "picture.png"
    draw(path)
    before = path.read_bytes()
    assert before[:8] == b"\x89PNG\r\n\x1a\n"

    def fails_halfway(self, target, **kwargs):
        if isinstance(target, (str, os.PathLike)):
            Path(target).write_bytes(b"\x89PNG half a picture")
        else:
            target.write(b"\x89PNG half a picture")
        raise RuntimeError("the renderer failed")

    monkeypatch.setattr(Figure, "savefig", fails_halfway)
    with pytest.raises(RuntimeError, match="the renderer failed"):
        draw(path)
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"] and path.read_bytes() == before
