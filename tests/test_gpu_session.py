"""benchmarks/gpu_session.sh, the one script a rented GPU machine runs: its CUDA tests are every test module that
holds one (a module left out would go unrun there without a word), and a part it does not know is refused before
any part runs."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"


def test_the_session_runs_every_test_module_that_holds_a_gpu_test():
    marked = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\s*=.*pytest\.mark\.gpu\b)", re.MULTILINE)
    holding = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("test_*.py")
               if marked.search(path.read_text(encoding="utf-8"))}
    assert holding, "no test module is marked gpu"
    assert set(re.findall(r"tests/test_\w+\.py", SCRIPT.read_text())) == holding


def test_an_unknown_part_is_refused_naming_the_parts(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "tests", "benchmark"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "unknown part benchmark: tests, train, serve, decode, variants or experiments" in result.stdout
    assert not (tmp_path / "pytest-gpu.txt").exists()  # refused before any part ran
