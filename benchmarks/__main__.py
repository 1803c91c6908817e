"""`python -m benchmarks [NAME] [ARGS...]`: run one benchmark; with no name, the speed suite (`speed.py`).

Names: `speed`, and every `bench_<name>.py` in this folder (e.g. `tokenize`, `generate`); `list` shows them.
Each module's `main(argv)` takes the remaining arguments.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return ["speed"] + sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    name, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else ("speed", argv)
    if name == "list":
        print("\n".join(available()))
        return 0
    if name not in available():
        print(f"unknown benchmark {name!r}; choose one of: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{'speed' if name == 'speed' else 'bench_' + name}")
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
