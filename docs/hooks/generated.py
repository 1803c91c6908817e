"""MkDocs hooks: the site's generated parts, written at build time from the code that owns them.

- `<!-- generated: cli -->` in a page becomes the command-line reference, walked from `attnkit.cli.build_parser()`
  (every command, every option, its help as `--help` prints it), so no option is described twice.
- `<!-- generated: experiments -->` becomes the experiments gallery: each registered experiment's claim and
  lecture (`attnkit.experiments.REGISTRY`) with what its run wrote into docs/experiments/NAME/ (results.json and
  the plots): the verdict, its reason, the checks behind it, the command that redraws it.
- `<!-- generated: lectures -->` becomes the course index, from `attnkit.lectures`.
- `<!-- generated: hf_architectures -->` becomes the table of Hugging Face architectures attnkit converts, from
  the registry `attnkit.interop.keymaps.FAMILIES`.
- Pages others add join the nav by themselves: the tutorials (docs/tutorials/NN_*.py) under "Tutorials" in their
  numbered order, any guide (docs/guides/*.md) the nav does not name under "How-to guides", a page about the
  experiments as a whole (docs/experiments/*.md) under "Results"; a page about one experiment
  (docs/experiments/NAME/*.md) is linked from its gallery entry.
- benchmarks/results/*.png are published under figures/benchmarks/ (they stay where the benchmarks write them).
- onnxruntime-web's files, from node_modules/ (`npm install`), are copied into explorer/vendor/ for the in-browser
  explorer (docs/explorer/); without them that page says what to run.
- Pages load nothing from another host: the scripts a rendered notebook points at a CDN (MathJax, Mermaid) are
  dropped, so a page opens offline (tests/test_docs.py checks every built page).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import importlib
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's attnkit, installed or not

MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.M)
TUTORIAL = re.compile(r"^\d\d_.+\.py$")
REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>", re.I)
FIGURES = "figures/benchmarks"
log = logging.getLogger("mkdocs.hooks.generated")

# The gallery's order: the order a course meets the claims (new experiments follow, by name).
EXPERIMENT_ORDER = (
    "kernel-regression", "ab-task", "scaled-dot", "score-functions", "bottleneck", "rnn-forgets",
    "rnn-vs-transformer-cost", "position-extrapolation", "norm-placement", "gqa-memory", "transformer-plus-plus",
)


# --- the command-line reference -----------------------------------------------------------------------------------
def _cell(text: str) -> str:
    """Text for a markdown table cell: no pipes, no HTML, no emphasis, no links ([SEP] is a token, not a reference)."""
    text = html.escape(" ".join(text.split()), quote=False)
    return text.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_").replace("[", "\\[").replace("]", "\\]")


def _expanded_help(action: argparse.Action, prog: str) -> str:
    """The help as argparse prints it (`%(default)s` and the like filled in)."""
    if not action.help:
        return ""
    values = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    values["prog"] = prog
    if values.get("choices") is not None:
        values["choices"] = ", ".join(map(str, values["choices"]))
    try:
        return action.help % values
    except (KeyError, TypeError, ValueError):
        return action.help


def _invocation(action: argparse.Action) -> str:
    """How the option is written: `--beam-size BEAM_SIZE`, `--progress, --no-progress`, `name`."""
    if not action.option_strings:
        return action.metavar or action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    value = {"+": f"{metavar} [{metavar} ...]", "*": f"[{metavar} ...]", "?": f"[{metavar}]"}.get(
        action.nargs, metavar)
    return ", ".join(f"{flag} {value}" for flag in action.option_strings)


def commands(parser: argparse.ArgumentParser, prefix: str = "attnkit"):
    """(full name, parser, help) for every command, groups' commands included, in the parser's order."""
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                full = f"{prefix} {name}"
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from commands(sub, full)
                else:
                    yield full, sub, helps.get(name, "")


def cli_reference() -> str:
    from attnkit.cli import build_parser

    parser = build_parser()
    lines = ["| command | what it does |", "|---|---|"]
    found = list(commands(parser))
    for name, _, summary in found:
        anchor = name.replace(" ", "-")
        lines.append(f"| [`{name}`](#{anchor}) | {_cell(summary)} |")
    for name, sub, summary in found:
        lines += ["", f"## {name}", "", _cell(sub.description or summary), "", "```", sub.format_usage().strip(), "```"]
        for group in sub._action_groups:
            actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
            if not actions:
                continue
            title = group.title if group.title not in ("options", "optional arguments") else "options"
            lines += ["", f"**{_cell(title)}**", "", "| option | meaning |", "|---|---|"]
            for action in actions:
                lines.append(f"| `{_invocation(action)}` | {_cell(_expanded_help(action, sub.prog))} |")
        if sub.epilog:
            lines += ["", "```", sub.epilog.strip(), "```"]
    return "\n".join(lines) + "\n"


# --- the experiments gallery --------------------------------------------------------------------------------------
def _results(docs_dir: Path, name: str) -> dict | None:
    path = docs_dir / "experiments" / name / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return "" if value is None else str(value)


def _table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    columns = list(rows[0])
    out = ["| " + " | ".join(_cell(str(c)) for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(_value(row.get(c))) for c in columns) + " |" for row in rows]
    return out


def experiment_names() -> list[str]:
    from attnkit.experiments import REGISTRY

    return [n for n in EXPERIMENT_ORDER if n in REGISTRY] + sorted(set(REGISTRY) - set(EXPERIMENT_ORDER))


def _courses_of(name: str) -> str:
    """The courses whose slides the course index sends to experiment `name`."""
    from attnkit.lectures import LECTURES

    found = [lecture.course.split(" (")[0] for lecture in LECTURES if any(t.experiment == name for t in lecture.topics)]
    return ", ".join(found)


def experiments_gallery(docs_dir: Path) -> str:
    from attnkit.experiments import REGISTRY
    from attnkit.experiments.base import Stored

    names = experiment_names()
    summary = ["| experiment | lecture | verdict | key number | budget |", "|---|---|---|---|---|"]
    sections: list[str] = []
    for name in names:
        spec, result = REGISTRY[name], _results(docs_dir, name)
        verdict = result["verdict"] if result else "not run into docs/experiments yet"
        key = result.get("key_number", "") if result else ""
        budget = result.get("budget", "") if result else ""
        summary.append(f"| [`{name}`](#{name}) | {_cell(spec.lecture)} | **{_cell(verdict)}** | {_cell(key)} | "
                       f"{_cell(budget)} |")
        sections += ["", f"## {name}", "", f"**Claim** ({_cell(spec.lecture)}): {_cell(spec.claim)}", ""]
        if _courses_of(name):
            sections += [f"Taught in: {_courses_of(name)} ([course index](course-index.md)).", ""]
        seeds = Stored.read(result, spec.default_seeds(budget)).seeds if result else 0
        asked = f" --seeds {seeds}" if result and seeds != spec.default_seeds(budget) else ""  # as the run was made
        command = f"attnkit experiment {name} --budget {budget or 'full'}{asked} --out docs/experiments/{name}"
        if result is None:
            sections += ["No run of it has been written into `docs/experiments/` yet; this command writes one:", "",
                         "```", command, "```"]
            continue
        sections += [f"**Verdict: {_cell(result['verdict'])}.** {_cell(result.get('reason', ''))}", "",
                     f"Key number: {_cell(key)}. Budget `{budget}`, {result.get('seconds', 0):,.0f} s on "
                     f"{_cell(result.get('machine', ''))}; "
                     f"{_cell(result.get('version') or 'run before the code version was recorded')}.", ""]
        if result.get("decision"):
            sections += [f"**How the checks decide it** (and, where they do not, what would): "
                         f"{_cell(result['decision'])}", ""]
        checks = [c for c in result.get("checks") or [] if isinstance(c, dict)]
        if checks:
            shown = [{k: c.get(k) for k in ("what", "difference", "noise", "basis") if k in c} for c in checks]
            sections += ["The checks the verdict is drawn from (a check decides when its difference is larger "
                         "than its noise):", "", *_table(shown), ""]
        for extra in sorted((docs_dir / "experiments" / name).glob("*.md")):
            if extra.name != "table.md":  # a page of its own about this experiment, e.g. what was checked
                title = extra.read_text().split("\n", 1)[0].lstrip("# ").strip()
                sections += [f"More: [{_cell(title)}](experiments/{name}/{extra.name}).", ""]
        sections += ["Redraw it (writes results.json, table.md and the plots below):", "", "```", command, "```", ""]
        for plot in result.get("plots", []):
            if (docs_dir / "experiments" / name / plot).is_file():
                sections += [f"![{name}: {plot}](experiments/{name}/{plot})", ""]
        if result.get("rows"):
            sections += ["??? note \"The numbers\"", ""] + ["    " + line for line in _table(result["rows"])]
    return "\n".join(summary + sections) + "\n"


def reference_modules(docs_dir: Path) -> set[str]:
    """The modules the API reference documents (its pages' `::: attnkit.x` lines)."""
    return {m for page in (docs_dir / "reference" / "api").glob("*.md")
            for m in re.findall(r"^::: (\S+)$", page.read_text(), re.M)}


def reference_identifier(ref: str, documented: set[str]) -> str | None:
    """The API reference's identifier for a course index code name (`layers.attention:Attention` ->
    `attnkit.layers.attention.Attention`), where the reference shows it: its module is documented and the name is
    public and defined there. None otherwise."""
    module, _, name = ref.partition(":")
    module = f"attnkit.{module}"
    if module not in documented:
        return None
    if not name:
        return module
    defined = getattr(importlib.import_module(module), name, None)
    if name.startswith("_") or getattr(defined, "__module__", None) != module:
        return None
    return f"{module}.{name}"


def _lectures(docs_dir: Path) -> str:
    from attnkit.lectures import course_index_markdown

    documented = reference_modules(docs_dir)
    return course_index_markdown(link_prefix="", code_link=lambda ref: reference_identifier(ref, documented))


def _hf_architectures(docs_dir: Path) -> str:
    from attnkit.interop.keymaps import supported_table

    return supported_table()


# `<!-- generated: NAME -->` -> the function that writes that part (given the docs folder).
GENERATORS = {
    "cli": lambda docs_dir: cli_reference(),
    "experiments": experiments_gallery,
    "lectures": _lectures,
    "hf_architectures": _hf_architectures,
}


# --- MkDocs events ------------------------------------------------------------------------------------------------
def _listed(nav) -> set[str]:
    """Every page path the nav names, at any depth."""
    found: set[str] = set()
    for entry in nav or []:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        found |= _listed(value) if isinstance(value, list) else {value}
    return found


def _section(nav, title: str) -> list | None:
    for entry in nav or []:
        if isinstance(entry, dict) and isinstance(entry.get(title), list):
            return entry[title]
    return None


def on_config(config):
    """Pages that others add join the nav by themselves: the tutorials (docs/tutorials/NN_*.py) under "Tutorials"
    in their numbered order, any guide (docs/guides/*.md) the nav does not name under "How-to guides"."""
    docs = Path(config.docs_dir)
    listed = _listed(config.nav)
    tutorials = sorted(p.name for p in (docs / "tutorials").glob("*.py") if TUTORIAL.match(p.name))
    guides = sorted(p.name for p in (docs / "guides").glob("*.md"))
    experiments = sorted(p.name for p in (docs / "experiments").glob("*.md"))
    for title, folder, names in (("Tutorials", "tutorials", tutorials), ("How-to guides", "guides", guides),
                                 ("Results", "experiments", experiments)):
        section = _section(config.nav, title)
        if section is not None:
            section += [f"{folder}/{name}" for name in names if f"{folder}/{name}" not in listed]
    jupyter = config.plugins.get("mkdocs-jupyter")
    if jupyter is not None and jupyter.config.get("cache"):  # one cache per budget and per state of attnkit's code
        jupyter.config["cache_dir"] = str(Path(jupyter.config["cache_dir"]) / tutorial_cache_key())
    return config


def tutorial_cache_key() -> str:
    """What a tutorial's outputs depend on besides its own text (which mkdocs-jupyter's cache key holds): the
    budget it runs at and attnkit's source. A cached rendering is reused only while both are unchanged."""
    digest = hashlib.sha256(os.environ.get("ATTNKIT_TUTORIAL_BUDGET", "full").encode())
    for path in sorted((ROOT / "src" / "attnkit").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".json", ".html"):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


# --- the in-browser explorer's runtime ----------------------------------------------------------------------------
# onnxruntime-web, from the npm package `npm install` puts in node_modules/ (package.json pins its version): the ES
# module with its glue code bundled, and the WebAssembly it loads (14 MB, so it is copied at build time, never kept
# in the repository). The explorer page (docs/explorer/) imports them from explorer/vendor/.
ORT_DIST = ROOT / "node_modules" / "onnxruntime-web" / "dist"
ORT_FILES = ("ort.wasm.bundle.min.mjs", "ort-wasm-simd-threaded.wasm")
EXPLORER_VENDOR = "explorer/vendor"
COLOUR_BAR = ROOT / "src" / "attnkit" / "serve" / "static" / "colour_bar.js"


def vendor_onnxruntime(site_dir: Path) -> bool:
    """Copy onnxruntime-web's files into the built site; False (and the page says why) where npm put none here."""
    if not all((ORT_DIST / name).is_file() for name in ORT_FILES):
        log.info("onnxruntime-web is not in node_modules/ (run `npm install`): the in-browser explorer will say so")
        return False
    vendor = site_dir / EXPLORER_VENDOR
    vendor.mkdir(parents=True, exist_ok=True)
    for name in ORT_FILES:
        shutil.copyfile(ORT_DIST / name, vendor / name)
    return True


def on_post_build(config):
    vendor_onnxruntime(Path(config.site_dir))


def on_files(files, config):
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        files.append(File.generated(config, f"{FIGURES}/{png.name}", abs_src_path=str(png)))
    # the explorer's colour bar, one script for the served explorer, the attention page and this site's explorer
    files.append(File.generated(config, "explorer/colour_bar.js", abs_src_path=str(COLOUR_BAR)))
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config.docs_dir)

    def expand(match: re.Match) -> str:
        kind = match.group(1)
        if kind not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown generated part {kind!r} ({', '.join(GENERATORS)})")
        return GENERATORS[kind](docs_dir)

    return MARKER.sub(expand, markdown)


# --- math in the tutorials, without a script from a CDN -------------------------------------------------------------
VERBATIM = re.compile(r"(<(pre|code|script|style|textarea)\b.*?</\2>)", re.S | re.I)
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
INLINE_MATH = re.compile(r"(?<![\\$\w])\$(?!\s)([^$<>]+?)(?<![\s\\])\$(?![\w$])")


def _mathml(latex: str, display: str) -> str | None:
    from latex2mathml.converter import convert

    try:
        return convert(html.unescape(latex).strip(), display=display)
    except Exception:  # noqa: BLE001  (latex2mathml raises many kinds; such math stays as TeX text)
        return None


def tex_to_mathml(page_html: str) -> str:
    """$...$ and $$...$$ outside code, turned into MathML, which browsers draw without any script."""

    def convert(match: re.Match, display: str) -> str:
        return _mathml(match.group(1), display) or match.group(0)

    parts = VERBATIM.split(page_html)
    out = []
    for i, part in enumerate(parts):
        kind = i % 3  # split with two groups: text, the verbatim element, its tag name
        if kind == 0:
            part = DISPLAY_MATH.sub(lambda m: convert(m, "block"), part)
            part = INLINE_MATH.sub(lambda m: convert(m, "inline"), part)
            out.append(part)
        elif kind == 1:
            out.append(part)
    return "".join(out)


def on_post_page(output, page, config):
    output = REMOTE_SCRIPT.sub("", output)
    if page.file.src_uri.endswith(".py"):  # a tutorial: its markdown cells hold TeX for MathJax
        output = tex_to_mathml(output)
    return output
