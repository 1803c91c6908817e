"""Tiny random run directories for the command-line tests: a decoder and a two-class encoder classifier."""

from __future__ import annotations

from pathlib import Path


def tiny_runs(root: Path) -> dict[str, Path]:
    """{"lm": a decoder run, "clf": a two-class encoder classifier run} under `root`, random and tiny, each with a
    char tokenizer."""
    from attnkit import build_model
    from attnkit.checkpoint import save_model
    from attnkit.config import ModelConfig
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz .\n")
    runs = {}
    for name, changes in (("lm", dict(family="decoder")), ("clf", dict(family="encoder", n_classes=2))):
        config = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                             max_seq_len=24, **changes)
        save_model(build_model(config).eval(), config, root / name)
        tokenizer.save(root / name / "tokenizer")
        runs[name] = root / name
    return runs
