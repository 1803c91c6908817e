"""llguidance's grammars, built and checked with no tokenizer: a regular expression or a Lark grammar to the grammar
text llguidance follows, refused at once where llguidance finds it malformed.

Two layers use it: generate/constrained.py's `Grammar` (constrained decoding, Willard & Louf 2023) and the
`attnkit generate` command (tasks/lm.py), which checks --regex and --grammar before its model loads.

Needs the `structured` extra (`pip install 'attnkit[structured]'`, llguidance).
"""

from __future__ import annotations

import functools
import re

from attnkit.errors import ConfigError, InputError

EXTRA = "structured"  # pyproject.toml's optional extra that brings llguidance
_POINTER = re.compile(r"\s*\^+\s*|\s*\d+ \|.*")  # a line of llguidance's message that points into the source


def llguidance():
    """The llguidance module, or ConfigError naming the extra that installs it."""
    try:
        import llguidance as module
    except ImportError:
        raise ConfigError(f"structured output (a JSON schema, JSON mode, tool calls) needs llguidance: "
                          f"pip install 'attnkit[{EXTRA}]'") from None
    return module


def checked(source: str, name: str) -> str:
    """The grammar text `source`, once llguidance finds it well formed without a tokenizer; InputError otherwise,
    naming `name` ("regular expression") and llguidance's reason on one line (its lines that quote the source and
    point a caret into it left out)."""
    error = _malformed(source)
    if error:
        reason = " ".join(line.strip() for line in error.splitlines() if line.strip() and not _POINTER.fullmatch(line))
        raise InputError(f"the {name} cannot be followed: {reason[:300]}")
    return source


@functools.lru_cache(maxsize=16)
def _malformed(source: str) -> str:
    """llguidance's reason the grammar text `source` is malformed ("" where it is well formed), built once per text:
    `attnkit generate` checks its --regex or --grammar before the model loads, and the pipeline's grammar of the same
    text that follows finds the verdict here."""
    return llguidance().LLMatcher.validate_grammar(source)


def regex_grammar(pattern: str) -> str:
    """The grammar of text that `pattern` matches whole (llguidance's syntax, Rust's regex), checked."""
    if not isinstance(pattern, str) or not pattern:
        raise InputError(f"a regular expression is a non-empty string, not {pattern!r}")
    return checked(llguidance().LLMatcher.grammar_from_regex(pattern), "regular expression")


def lark_grammar(text: str) -> str:
    """The grammar that Lark `text` (llguidance's syntax) describes, checked."""
    return checked(llguidance().LLMatcher.grammar_from_lark(text), "grammar")
