"""attnkit's installed version: what `attnkit --version` prints and what a stored experiment names."""

from __future__ import annotations

from importlib import metadata


def installed_version() -> str:
    """The version pip installed, or "unknown (not installed)" where attnkit runs from a checkout (PYTHONPATH=src)
    without being installed."""
    try:
        return metadata.version("attnkit")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"
