"""The real data sets in ../shared/data (beside the repository, never copied into it): tests that read them skip,
with the reason, where they are absent."""

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def shared(*parts: str) -> Path:
    """The path of a shared data file; skips the calling test when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data {path} is absent (see ../shared/data/README.md)")
    return path
