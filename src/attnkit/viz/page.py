"""Attention maps as one self-contained HTML page, in the spirit of BertViz's head view (Vig 2019).

The page carries its data and script inline and fetches nothing: it opens from disk, offline, in any browser.
A reader picks the kind of attention (self-, causal, cross-), the layer, and one head or the mean over heads;
hovering a token draws the lines to what it attends to (or from what attends to it) and highlights those tokens,
a click keeps the selection; beside it a heatmap of the same weights.

The weights travel as base64 float32 (little-endian), exactly the numbers of `AttentionMaps.weights`; the page's
`window.attnkit.weights(view, layer, head)` returns what it draws. Its colour bar is the explorer's
(`serve/static/colour_bar.js`), put inline.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from attnkit.errors import InputError
from attnkit.viz.maps import AttentionMaps


def render_page(all_maps: Sequence[AttentionMaps], *, title: str = "attention") -> str:
    """The page's HTML for one text's maps (one entry per kind). Raises `InputError` when none are given."""
    if not all_maps:
        raise InputError("no attention maps to draw: pass at least one AttentionMaps")
    views = [
        {
            "kind": maps.kind,
            "title": maps.title,
            "query_tokens": list(maps.query_tokens),
            "key_tokens": list(maps.key_tokens),
            "layers": list(maps.layers),
            "heads": list(maps.heads),
            "weights": base64.b64encode(maps.weights.astype("<f4", copy=False).tobytes()).decode("ascii"),
        }
        for maps in all_maps
    ]
    # "<" as \u003c keeps any token text (such as "</script>") from ending the data block early.
    payload = json.dumps({"title": title, "views": views}, ensure_ascii=False).replace("<", "\\u003c")
    template = resources.files("attnkit.viz").joinpath("page.html").read_text(encoding="utf-8")
    # one pass over the template: what is put in is never searched again, so no title or token (a run named
    # "{{DATA}}") can reach the page's structure
    values = {"TITLE": html.escape(title), "DATA": payload, "COLOUR_BAR": _colour_bar_script()}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


_PLACEHOLDER = re.compile(r"\{\{(TITLE|DATA|COLOUR_BAR)\}\}")


def _colour_bar_script() -> str:
    """The colour bar's script, the one the explorer serves (serve/static/colour_bar.js), carried inline."""
    return resources.files("attnkit").joinpath("serve", "static", "colour_bar.js").read_text(encoding="utf-8")


def write_page(all_maps: Sequence[AttentionMaps], path: str | Path, *, title: str = "attention") -> Path:
    """Write `render_page` to `path` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_page(all_maps, title=title), encoding="utf-8")
    os.replace(tmp, path)
    return path

