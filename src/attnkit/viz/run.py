"""`attnkit viz`: a run's attention over a text as PNG heatmaps and one self-contained HTML page, and the run's
training instruments as a plot.

    RUN/viz/ (or --out)   self_grid.png, causal_grid.png, cross_grid.png     every layer x head
                          {kind}_layer{L}_head{H}.png, {kind}_layer{L}_mean.png
                          alignment.png                                      translation runs
                          attention.html                                     pick kind, layer, head; hover tokens
    RUN/plots/instruments.png                                                when metrics.jsonl has instruments
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from attnkit.checkpoint import TOKENIZER_DIR, load_model
from attnkit.errors import ConfigError, InputError
from attnkit.machine import pick_device
from attnkit.tasks import TaskSpec, unread_options
from attnkit.tokenize import load_tokenizer
from attnkit.viz.extract import attention_maps
from attnkit.viz.heatmap import write_pngs
from attnkit.viz.instruments import plot_run_instruments
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.page import write_page

log = logging.getLogger(__name__)

PAGE_FILE = "attention.html"
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

    def __post_init__(self) -> None:
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ConfigError(f"--max-length {self.max_length!r}: give at least 1 (target tokens the translation may "
                              "have)")
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
    model, config = load_model(run_dir, device=pick_device(settings.device))
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    result.maps = attention_maps(
        model, tokenizer, settings.text, target=settings.target, translate=settings.translate,
        layers=settings.layers, heads=settings.heads,
        max_length=min(settings.max_length, config.max_seq_len - 1),  # BOS and the translation fit the context
    )
    out = Path(settings.out) if settings.out else run_dir / "viz"
    result.pngs = write_pngs(result.maps, out, per_head=settings.per_head)
    result.page = write_page(result.maps, out / PAGE_FILE, title=f"attention: {run_dir.name}")
    log.info("wrote %d pictures and %s", len(result.pngs), result.page)
    return result
