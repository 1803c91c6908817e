"""`attnkit convert RUN --to-gguf OUT --type Q4_K_M` (llama.cpp's K-quants, made by its own quantizer in a child
process): the file runs in llama.cpp near the f16 file, its tensors are K-quants where their rows allow and llama.cpp's
fallback elsewhere, and a quantizer that fails, crashes or is interrupted leaves nothing behind."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from export_runs import LAYOUTS, random_run

from attnkit.cli import main
from attnkit.errors import ConfigError
from attnkit.interop import gguf as gguf_export
from attnkit.interop import gguf_kquants
from attnkit.interop.gguf import GGUF_TYPES, GGUFType, convert_to_gguf
from attnkit.interop.gguf_kquants import KQUANT_TYPES, SUPER_BLOCK, QuantizerError

gguf = pytest.importorskip("gguf", reason="GGUF export needs the gguf package (pip install 'attnkit[export]')")

PROMPT = [40, 7, 300, 12, 99, 5, 250, 31]
LAYOUT = {**LAYOUTS["default"], "d_ff": 256}  # ffn_down's rows hold 256 values: one K-quant super-block
K_FAMILY = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
FALLBACK = {"Q4_K_M": {"Q5_0", "Q8_0"}, "Q6_K": {"Q8_0"}}  # llama.cpp's per-tensor fallbacks (Q4_K_M's attn_v: q6_K)


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp", reason="K-quants are made by llama.cpp's quantizer: pip install "
                                                   "'attnkit[kquants]' (llama-cpp-python)")


def _logits(path) -> np.ndarray:
    """llama.cpp's logits (T, V) for PROMPT, one thread, KV cache in f32."""
    import llama_cpp
    from llama_cpp import Llama

    f32 = llama_cpp.GGML_TYPE_F32
    llm = Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1, type_k=f32, type_v=f32)
    llm.eval(PROMPT)
    return np.asarray(llm.scores[: len(PROMPT)])


def test_k_quants_are_command_line_choices():
    assert list(GGUF_TYPES) + list(KQUANT_TYPES) == list(GGUFType.__args__)


def test_k_quant_files_run_in_llama_cpp_as_near_the_f16_file_as_their_bits_allow(tmp_path, llama_cpp, caplog):
    """Q6_K within 1.5x q8_0's distance from the f16 file's logits, Q4_K_M nearer than q4_0 and farther than Q6_K:
    the yardsticks are the gguf package's own types, exported from the same run and run in the same llama.cpp."""
    run = random_run(tmp_path, LAYOUT)
    logits = {}
    for type in ["f16", "q8_0", "q4_0", "Q4_K_M", "Q6_K"]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            export = convert_to_gguf(run, tmp_path / f"{type}.gguf", type=type)
        logits[type] = _logits(tmp_path / f"{type}.gguf")
        if type in KQUANT_TYPES:
            _check_tensors(tmp_path, type, export.tensor_types, caplog.records, llama_cpp)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run", *(f"{t}.gguf" for t in logits)])
    distance = {t: np.abs(v - logits["f16"]).max() / np.abs(logits["f16"]).max() for t, v in logits.items()}
    assert 0 < distance["Q6_K"] < 1.5 * distance["q8_0"], distance
    assert distance["Q6_K"] < distance["Q4_K_M"] < distance["q4_0"], distance


def _check_tensors(folder, type: str, tensor_types: dict[str, str], records, llama_cpp) -> None:
    """The file's tensors: K-quants where their rows hold whole super-blocks, llama.cpp's fallback elsewhere, each
    within its type's rounding of the f16 file's; each written with a progress line, the fallbacks said in one."""
    reader = gguf.GGUFReader(folder / f"{type}.gguf")
    assert reader.fields["general.file_type"].contents() == getattr(llama_cpp, KQUANT_TYPES[type])
    stored = {t.name: t for t in reader.tensors}
    assert tensor_types == {name: t.tensor_type.name for name, t in stored.items()}
    reference = {t.name: t for t in gguf.GGUFReader(folder / "f16.gguf").tensors}
    for name, tensor in stored.items():
        kind, row = tensor.tensor_type.name, int(tensor.shape[0])  # GGUF lists ggml's order: a row's length first
        if len(tensor.shape) == 1:
            assert kind == "F32", name
        elif row % SUPER_BLOCK == 0:
            assert kind in K_FAMILY, name
        else:
            assert kind in FALLBACK[type], name
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        original = gguf.quants.dequantize(reference[name].data, reference[name].tensor_type)
        assert np.abs(values - original).max() <= {"Q4_K_M": 0.15, "Q6_K": 0.03}[type] * np.abs(original).max()
    assert stored["blk.0.ffn_down.weight"].tensor_type.name in K_FAMILY
    said = [record.getMessage() for record in records]
    for index, name in enumerate(stored, 1):  # progress: each tensor as llama.cpp writes it
        assert sum(line.startswith(f"quantizing [{index}/{len(stored)}] {name}: ") for line in said) == 1, name
    fallback = [line for line in said if "fallback type" in line]
    kept = stored["blk.0.attn_k.weight"].tensor_type.name.lower()  # rows of 64
    assert len(fallback) == 1 and f"blk.0.attn_k.weight {kept}" in fallback[0]


def test_an_unknown_type_is_refused_naming_the_accepted_ones(tmp_path, capsys):
    run = random_run(tmp_path, LAYOUT)
    with pytest.raises(ConfigError, match=r"choose one of f32, .*q4_0, or llama.cpp's Q2_K, .*Q4_K_M, .*IQ4_XS"):
        convert_to_gguf(run, tmp_path / "model.gguf", type="q4_k_m")
    assert main(["convert", str(run), "--to-gguf", str(tmp_path / "model.gguf"), "--type", "q4_k_m"]) == 2
    assert "invalid choice: 'q4_k_m'; did you mean 'Q4_K_M'?" in capsys.readouterr().err  # not q4_1, nearer by letters
    assert main(["convert", str(run), "--to-gguf", str(tmp_path / "model.gguf"), "--type", "int3"]) == 2
    said = capsys.readouterr().err
    assert "invalid choice: 'int3'" in said and all(f"'{t}'" in said for t in [*GGUF_TYPES, *KQUANT_TYPES])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_without_llama_cpp_python_the_k_quants_are_refused_in_one_line(tmp_path, monkeypatch):
    run = random_run(tmp_path, LAYOUT)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(ConfigError) as refused:
        convert_to_gguf(run, tmp_path / "model.gguf", type="Q4_K_M")
    said = str(refused.value)
    assert "\n" not in said and "pip install 'attnkit[kquants]'" in said and "--type f16" in said
    assert "llama-quantize model-f16.gguf model-Q4_K_M.gguf Q4_K_M" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("child, said", [
    ("import os; os.abort()", "crashed (Aborted)"),  # a native crash, as llama.cpp's GGML_ASSERT ends
    ("import sys; print('llama_model_quantize: failed to quantize: bad tensor', file=sys.stderr); sys.exit(1)",
     "failed (exit status 1)"),
])
def test_a_quantizer_that_fails_or_crashes_leaves_no_output_and_no_temporary_file(tmp_path, monkeypatch, child,
                                                                                    said):
    run = random_run(tmp_path, LAYOUT)
    (tmp_path / "model.gguf").write_bytes(b"the previous export")
    monkeypatch.setattr(gguf_kquants, "_CHILD", child)
    monkeypatch.setattr(gguf_export, "check_quantizer", lambda type: None)  # runs where llama_cpp is absent too
    with pytest.raises(QuantizerError, match=rf"quantizer {re.escape(said)} making Q4_K_M; nothing was written"):
        convert_to_gguf(run, tmp_path / "model.gguf", type="Q4_K_M", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "run"]
    assert (tmp_path / "model.gguf").read_bytes() == b"the previous export"


def test_ctrl_c_while_quantizing_ends_the_quantizer_and_leaves_nothing(tmp_path, llama_cpp, monkeypatch):
    run = random_run(tmp_path, LAYOUT)
    children = []
    popen = gguf_kquants.subprocess.Popen

    def interrupted(line, *args):
        if line.startswith("quantizing ["):
            raise KeyboardInterrupt  # at the first tensor, as Ctrl-C would

    def recorded(*args, **kwargs):
        children.append(popen(*args, **kwargs))
        return children[-1]

    monkeypatch.setattr(gguf_kquants.subprocess, "Popen", recorded)
    monkeypatch.setattr(gguf_kquants.log, "info", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_to_gguf(run, tmp_path / "model.gguf", type="Q4_K_M")
    assert len(children) == 1 and children[0].returncode is not None  # ended, not left running
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_command_line_writes_a_k_quant(tmp_path, llama_cpp, capsys):
    run = random_run(tmp_path, LAYOUT)
    out = tmp_path / "model.gguf"
    assert main(["convert", str(run), "--to-gguf", str(out), "--type", "Q6_K"]) == 0
    assert f"(Q6_K) to {out}" in capsys.readouterr().out
    assert gguf.GGUFReader(out).fields["general.file_type"].contents() == llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K


def test_what_a_killed_k_quant_export_left_is_removed_by_the_next(tmp_path, llama_cpp):
    run = random_run(tmp_path, LAYOUT)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a writer killed mid-way: its f16 file and its partial output
    for role in ("scratch", "partial"):
        (tmp_path / f".model.gguf.{role}-{dead}").write_bytes(b"left by a killed export")
    convert_to_gguf(run, tmp_path / "model.gguf", type="Q6_K")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "run"]


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel ends the child through Linux's PR_SET_PDEATHSIG")
def test_the_quantizer_ends_when_attnkit_is_killed_outright(tmp_path):
    """SIGKILL gives attnkit no moment to end its child; the kernel ends it. The child here is the real one's first
    lines, then a wait in place of llama.cpp, writing its process id to `out`."""
    pid_file = tmp_path / "child.pid"
    attnkit = textwrap.dedent(f"""
        from pathlib import Path
        from attnkit.interop import gguf_kquants
        gguf_kquants._CHILD = gguf_kquants._DIES_WITH_PARENT + (
            "import os, sys, time; open(sys.argv[2], 'w').write(str(os.getpid())); time.sleep(300)")
        gguf_kquants.quantize_gguf(Path("unused.gguf"), Path({str(pid_file)!r}), "Q4_K_M")
    """)
    parent = subprocess.Popen([sys.executable, "-c", attnkit])
    child = None
    try:
        deadline = time.monotonic() + 60  # a bound on a hung test, not a speed asked of the code
        while child is None and parent.poll() is None and time.monotonic() < deadline:
            child = int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text() else None
            time.sleep(0.05)
        assert child is not None and _running(child), "the stand-in quantizer never started"
        parent.kill()
        parent.wait()
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child)
    finally:
        parent.kill()
        parent.wait()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)
