"""`attnkit viz`: a run's attention over a text as PNG heatmaps and one self-contained HTML page, and the run's
training instruments as a plot.

    RUN/viz/ (or --out)   self_grid.png, causal_grid.png, cross_grid.png     every layer x head
                          {kind}_layer{L}_head{H}.png, {kind}_layer{L}_mean.png
                          {kind}_layer{L}_head{H}_from{P}.png                --from-token P: BertViz's head view
                          alignment.png                                      translation runs
                          attention.html                                     pick kind, layer, head; hover tokens
                          viz.json                                           the files this call drew; the next
                                                                             call there removes those it does not
                                                                             draw again, and keeps other files
    RUN/plots/instruments.png                                                when metrics.jsonl has instruments
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnkit.checkpoint import TASK_FILE, TOKENIZER_DIR, load_model
from attnkit.errors import ConfigError, InputError
from attnkit.machine import pick_device
from attnkit.outputs import files_into, refuse_root
from attnkit.tasks import TaskSpec, task_record, unread_options
from attnkit.tasks.reading import frame_of
from attnkit.tokenize import load_tokenizer
from attnkit.viz.extract import attention_maps
from attnkit.viz.head_view import write_head_views
from attnkit.viz.heatmap import write_pngs
from attnkit.viz.instruments import plot_run_instruments
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.page import write_page

log = logging.getLogger(__name__)

PAGE_FILE = "attention.html"
MANIFEST = "viz.json"  # the files one call drew: the next call into the folder removes those it does not draw again
_DRAWN_NAME = re.compile(r"[A-Za-z0-9_]+\.(png|html)")
TRANSLATION_OPTIONS = ("target", "translate", "max_length")  # what only a translation run's pictures read


@dataclass(frozen=True)
class VizSettings:
    """What `attnkit viz` draws. Every field is a flag of the command."""

    run: str  # run directory: config.json, model.safetensors, tokenizer/
    text: str | None = field(default=None, metadata={"flags": ("--text", "--source")})
    """the text to look at (a translation run's source); none: the instruments plot alone"""
    target: str | None = None  # translation runs: the target whose alignment with the source to draw
    translate: bool = False  # translation runs: draw the alignment of the model's own greedy translation
    layers: tuple[int, ...] | None = None  # layers to draw (default all)
    heads: tuple[int, ...] | None = None  # heads to draw (default all)
    out: str | None = None  # directory for the pictures and the page (default RUN/viz)
    per_head: bool = True  # one PNG per layer and head besides each layer's mean and the grid
    device: str = "cpu"  # where the model runs
    max_length: int = 64  # --translate: target tokens at most (and no more than the model's context holds)
    from_token: int | None = None
    """also draw BertViz's head view from the token at this position (0: the first), one PNG per layer and head"""

    def __post_init__(self) -> None:
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ConfigError(f"--max-length {self.max_length!r}: give at least 1 (target tokens the translation may "
                              "have)")
        if self.from_token is not None and (isinstance(self.from_token, bool) or self.from_token < 0):
            raise ConfigError(f"--from-token {self.from_token!r}: give a token's position, 0 or more")
        pick_device(self.device)  # a device torch lacks is refused before anything is read or drawn


def inapplicable(spec: TaskSpec, run: str | Path) -> dict[str, str]:
    """The options of `attnkit viz` that `run`, a run of `spec`, does not read, each with why: those of a
    translation's alignment (`TRANSLATION_OPTIONS`) unless its task translates. The command hides and refuses them."""
    return unread_options(spec, TRANSLATION_OPTIONS,
                          lambda task: TRANSLATION_OPTIONS if task.method == "translate" else (), run)


@dataclass
class VizResult:
    """What `run_viz` drew: the maps and the files written."""

    maps: list[AttentionMaps] = field(default_factory=list)
    pngs: list[Path] = field(default_factory=list)
    page: Path | None = None
    instruments: Path | None = None


def run_viz(settings: VizSettings) -> VizResult:
    """Draw what `settings` asks for. Raises `InputError` for a run without a tokenizer and for bad inputs
    (`attention_maps`), `CheckpointError` for a run directory that cannot be read."""
    run_dir = Path(settings.run)
    result = VizResult(instruments=plot_run_instruments(run_dir))
    if settings.text is None:
        if settings.target is not None or settings.translate:
            raise InputError("--target and --translate draw a translation: give the source too (--source TEXT)")
        if result.instruments is None:
            raise InputError(
                f"nothing to draw: give --text TEXT (the attention over it); {run_dir} has no training instruments "
                "in its metrics.jsonl"
            )
        return result
    if not (run_dir / TOKENIZER_DIR).is_dir():
        raise InputError(f"{run_dir} has no {TOKENIZER_DIR}/ directory, so its text cannot become tokens")
    out = Path(settings.out) if settings.out else run_dir / "viz"
    refuse_root(out)  # before the run loads
    model, config = load_model(run_dir, device=pick_device(settings.device))
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    result.maps = attention_maps(
        model, tokenizer, settings.text, target=settings.target, translate=settings.translate,
        layers=settings.layers, heads=settings.heads,
        max_length=settings.max_length,  # translation_pair stops where BOS and the translation fill the context
        context=config.max_seq_len, frame=frame_of(task_record(run_dir), run_dir / TASK_FILE),
    )
    earlier = drawn_before(out)
    with files_into(out) as partial:  # the pictures and the page reach `out` together, after all are drawn
        pngs = write_pngs(result.maps, partial, per_head=settings.per_head)
        if settings.from_token is not None:
            pngs += write_head_views(result.maps, partial, settings.from_token)
        write_page(result.maps, partial / PAGE_FILE, title=f"attention: {run_dir.name}")
        drawn = [*(png.name for png in pngs), PAGE_FILE]
        (partial / MANIFEST).write_text(json.dumps({"files": drawn}, indent=1), encoding="utf-8")
    for name in earlier.difference(drawn):  # an earlier call's pictures of heads or layers not drawn now
        (out / name).unlink(missing_ok=True)
    result.pngs, result.page = [out / png.name for png in pngs], out / PAGE_FILE
    log.info("wrote %d pictures and %s", len(result.pngs), result.page)
    return result


def drawn_before(out: Path) -> set[str]:
    """The files an earlier `attnkit viz` drew in `out`, from its MANIFEST: plain names of PNGs and HTML pages only,
    so a damaged or edited list never names a file elsewhere; none when there is no such list or it is unreadable."""
    try:
        listed = json.loads((out / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return set()
    if not isinstance(listed, list):
        return set()
    return {name for name in listed if isinstance(name, str) and _DRAWN_NAME.fullmatch(name)}
