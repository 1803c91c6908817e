"""Helpers of the command-line tests: tiny random run directories (a decoder and a two-class encoder classifier),
and each command's parser."""

from __future__ import annotations

import argparse
from pathlib import Path


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """'train' -> its parser, 'tokenizer train' -> its parser, for every command."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = subparsers(sub)
                found.update({f"{name} {k}": v for k, v in inner.items()} if inner else {name: sub})
    return found


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
