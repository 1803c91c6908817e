"""The documentation site builds (mkdocs --strict: no broken link or anchor, no missing reference), its references
cover the public API and every command-line option, its pages load nothing from another host, and the course
index names only things that exist.

The site is built once, with the tutorials rendered but not executed (ATTNKIT_DOCS_EXECUTE=false): their own test
(tests/test_tutorials.py) executes each of them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from attnkit import cli, lectures
from attnkit.experiments import REGISTRY

pytest.importorskip("mkdocs", reason="the docs test needs mkdocs (dev extra)")
pytest.importorskip("material", reason="the docs test needs mkdocs-material (dev extra)")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs test needs mkdocstrings[python] (dev extra)")
pytest.importorskip("mkdocs_jupyter", reason="the docs test needs mkdocs-jupyter (dev extra)")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "hooks"))
import generated  # noqa: E402  (docs/hooks/generated.py: the hooks that write the generated pages)

REMOTE_LOAD = re.compile(
    r"<(script|img|iframe|source)\b[^>]*\bsrc=[\"']?(https?:)?//"  # a script, image or frame from another host
    r"|<link\b[^>]*\bhref=[\"']?(https?:)?//[^>]*>"  # a stylesheet, font or preload from another host
    r"|@import\s+(url\()?[\"']?(https?:)?//"
    r"|url\([\"']?(https?:)?//",
    re.I,
)
# The API the reference must cover: module -> why (the issue's list).
REQUIRED_MODULES = {
    "attnkit.generate.pipeline": "attnkit.load",
    "attnkit.config": "configs",
    "attnkit.presets": "presets",
    "attnkit.blocks": "blocks",
    "attnkit.models.families": "models",
    "attnkit.tasks": "tasks",
    "attnkit.tokenize": "tokenizers",
    "attnkit.train.trainer": "the trainer",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "ATTNKIT_DOCS_EXECUTE": "false", "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    problems = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems or [done.stderr[-3000:]])
    return out


def _inventory(site: Path) -> set[str]:
    """The identifiers mkdocstrings documented (its objects.inv)."""
    header, _, body = (site / "objects.inv").read_bytes().partition(b"compressed using zlib.\n")
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


def _reference_modules() -> list[str]:
    return [m for page in sorted((DOCS / "reference" / "api").glob("*.md"))
            for m in re.findall(r"^::: (\S+)$", page.read_text(), re.M)]


def _public_names(module_name: str) -> list[str]:
    """A module's public API: its __all__, else the functions and classes it defines without a leading _."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
            and getattr(obj, "__module__", None) == module_name]


def test_the_site_builds_strict_and_the_reference_covers_the_required_api(site):
    documented = set(_reference_modules())
    missing = [f"{module} ({why})" for module, why in REQUIRED_MODULES.items() if module not in documented]
    assert not missing, f"no page of docs/reference/api/ documents {missing}"
    assert (site / "index.html").is_file() and (site / "reference" / "cli" / "index.html").is_file()


def test_every_public_name_is_in_the_api_reference(site):
    inventory = _inventory(site)
    absent = [f"{module}.{name}" for module in _reference_modules() for name in _public_names(module)
              if f"{module}.{name}" not in inventory]
    assert not absent, f"public names the API reference does not show (docstring-less or filtered?): {absent}"


def test_the_top_level_names_are_documented_where_they_are_defined(site):
    import attnkit

    inventory = _inventory(site)
    absent = []
    for name in attnkit.__all__:
        obj = getattr(attnkit, name)
        where = obj.__name__ if inspect.ismodule(obj) else f"{obj.__module__}.{obj.__qualname__}"
        if where not in inventory:
            absent.append(f"attnkit.{name} ({where})")
    assert not absent, f"attnkit's own names missing from the API reference: {absent}"


def test_every_command_and_option_is_in_the_cli_reference(site):
    page = (site / "reference" / "cli" / "index.html").read_text()
    sections = re.split(r'<h2 id="', page)[1:]  # one per command: its id, then its tables
    shown = {s.split('"', 1)[0]: {w.rstrip(",") for code in re.findall(r"<code>([^<]*)</code>", s)
                                  for w in code.split() if w.startswith("-")} for s in sections}
    missing = []
    for name, sub, _ in generated.commands(cli.build_parser()):
        flags = shown.get(name.replace(" ", "-"))
        if flags is None:
            missing.append(name)
            continue
        missing += [f"{name} {flag}" for action in sub._actions if action.help != argparse.SUPPRESS
                    for flag in action.option_strings if flag not in flags]  # hidden aliases stay hidden
    assert len(list(generated.commands(cli.build_parser()))) >= 10
    assert not missing, f"absent from the command-line reference: {missing}"


def test_the_cli_reference_walks_nested_commands():
    names = [name for name, _, _ in generated.commands(cli.build_parser())]
    assert "attnkit tokenizer train" in names and "attnkit train" in names and "attnkit lectures" in names
    assert "attnkit tokenizer" not in names  # a group is not a command of its own


def test_built_pages_load_nothing_from_another_host(site):
    offending = {}
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css") and path.is_file():
            found = REMOTE_LOAD.search(path.read_text(errors="replace"))
            if found:
                offending[str(path.relative_to(site))] = found.group(0)[:120]
    assert not offending, f"pages that would fetch from another host: {offending}"


def test_the_gallery_shows_each_experiment_with_its_recorded_verdict(site):
    page = (site / "experiments" / "index.html").read_text()
    for name in REGISTRY:
        assert f'id="{name}"' in page, f"the gallery has no section for {name}"
        results = DOCS / "experiments" / name / "results.json"
        if results.is_file():
            verdict = json.loads(results.read_text())["verdict"]
            assert verdict in page, f"{name}'s verdict {verdict!r} is not on the gallery page"


def test_every_picture_in_docs_is_shown_or_drawn_by_a_documented_command():
    pictures = (DOCS / "pictures.md").read_text()
    undocumented = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.png")
                    if "experiments" not in p.parts and str(p.relative_to(DOCS)) not in pictures]
    assert not undocumented, f"pictures with no command in docs/pictures.md: {undocumented}"
    stray = [p.name for p in (DOCS / "experiments").iterdir() if p.is_dir() and p.name not in REGISTRY]
    assert not stray, f"docs/experiments/ holds runs of no registered experiment: {stray}"


def _check_reference(topic: lectures.Topic) -> list[str]:
    problems = []
    tutorial = DOCS / "tutorials" / f"{topic.tutorial}.py"
    if topic.tutorial and not tutorial.is_file():
        problems.append(f"tutorial {topic.tutorial}")
    elif topic.section and not re.search(rf"\n# ###? {re.escape(topic.section)}\n", tutorial.read_text()):
        problems.append(f"tutorial {topic.tutorial} has no section {topic.section!r}")
    if topic.section and not topic.tutorial:
        problems.append("a section without its tutorial")
    for ref in topic.modules:
        module, _, name = ref.partition(":")
        try:
            loaded = importlib.import_module(f"attnkit.{module}")
        except ImportError:
            problems.append(f"module attnkit.{module}")
            continue
        if name and not hasattr(loaded, name):
            problems.append(f"attnkit.{module} has no {name}")
    if topic.experiment and topic.experiment not in REGISTRY:
        problems.append(f"experiment {topic.experiment}")
    for path in (topic.picture, topic.page and topic.page.partition("#")[0]):  # mkdocs --strict checks the anchor
        if path and not (DOCS / path).is_file():
            problems.append(f"docs/{path}")
    if not (topic.tutorial or topic.modules or topic.experiment or topic.picture or topic.gap):
        problems.append("nothing covers it and no gap is stated")
    if not (topic.modules or topic.gap):  # each concept is a piece of attnkit: the index names where it lives
        problems.append("no module of attnkit named, and no gap says why")
    for test in topic.tests:
        file, _, name = test.partition("::")
        path = ROOT / "tests" / file
        if not (path.is_file() and re.search(rf"^def {re.escape(name)}\(", path.read_text(), re.MULTILINE)):
            problems.append(f"no test {test} in tests/")
    if not (topic.tests or topic.gap):  # what the lecture says is held by a test, or the gap says why not
        problems.append("no test named, and no gap says why")
    return problems


def test_everything_the_course_index_names_exists():
    problems = [f"{lecture.key} {topic.slide[:50]!r}: {problem}" for lecture in lectures.LECTURES
                for topic in lecture.topics for problem in _check_reference(topic)]
    assert not problems, "\n".join(problems)


def test_every_tutorial_is_reached_from_the_course_index():
    """A learner who walks the lectures meets every tutorial: each is the tutorial of some slide topic."""
    named = {topic.tutorial for lecture in lectures.LECTURES for topic in lecture.topics}
    tutorials = {path.stem for path in (DOCS / "tutorials").glob("[0-9][0-9]_*.py")}
    assert not tutorials - named, f"tutorials no topic of the course index leads to: {sorted(tutorials - named)}"


def test_the_course_index_covers_the_five_lectures_in_their_files():
    assert [lecture.key for lecture in lectures.LECTURES] == ["000", "001", "002", "003", "004"]
    assert all(len(lecture.topics) >= 10 for lecture in lectures.LECTURES)
    shared = ROOT.parent / "shared" / "lectures"
    if not shared.is_dir():
        pytest.skip("../shared/lectures is absent: the lecture files cannot be matched")
    files = sorted(p.name[:3] for p in shared.glob("*.txt"))
    assert files == [lecture.key for lecture in lectures.LECTURES]


def test_attnkit_lectures_prints_a_course_its_gaps_and_refuses_an_unknown_one(capsys):
    assert cli.main(["lectures", "cmu"]) == 0
    out = capsys.readouterr().out
    assert "CMU" in out and "USC" not in out and "attnkit experiment gqa-memory" in out
    named = {f"tests/{test}" for topic in lectures.find("cmu").topics for test in topic.tests}
    assert named and all(f" {test}\n" in out for test in named), "a test the index names is not printed whole"
    assert cli.main(["lectures", "--gaps"]) == 0
    out = capsys.readouterr().out
    assert out.count("GAP:") == len(lectures.gaps()) > 0
    complete = [lec for lec in lectures.LECTURES if not any(topic.gap for topic in lec.topics)]
    assert out.count("no gaps: attnkit covers every topic") == len(complete)  # not a heading with nothing under it
    assert cli.main(["lectures", "mit"]) == 2
    assert "usc (000)" in capsys.readouterr().err


def test_the_readme_is_short_starts_with_the_setup_commands_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 360
    first_block = text.split("```")[1]
    assert "make run" in first_block and "make test" in first_block
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    broken = [link for link in links if not link.startswith(("http://", "https://")) and not (ROOT / link).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"


def test_the_readme_command_table_names_every_command():
    table = (ROOT / "README.md").read_text().split("## The commands", 1)[1].split("\n## ", 1)[0]
    missing = [name for name, _, _ in generated.commands(cli.build_parser()) if f"`{name}`" not in table]
    assert not missing, f"commands missing from the README's command table: {missing}"


def test_the_course_index_links_land_on_the_tutorials_sections(site):
    missing = []
    for lecture in lectures.LECTURES:
        for topic in lecture.topics:
            if topic.section:
                page = site / "tutorials" / topic.tutorial / "index.html"
                if f'id="{topic.tutorial_anchor[1:]}"' not in page.read_text():
                    missing.append(f"{topic.tutorial}{topic.tutorial_anchor}")
    assert not missing, f"course-index links to tutorial sections the rendered pages lack: {sorted(set(missing))}"


def _pages() -> list[Path]:
    return [ROOT / "README.md"] + [p for p in DOCS.rglob("*.md") if p.name != "table.md"]


def test_the_code_the_pages_name_exists():
    """Paths (`layers/attention.py`, `tests/test_train.py`) and dotted names (`attnkit.train.state`) in the pages'
    code spans still name something, so a page cannot keep pointing at code that moved."""
    src = ROOT / "src" / "attnkit"
    stale = []
    for page in _pages():
        text, where = page.read_text(), page.relative_to(ROOT)
        for path in re.findall(r"`(?:attnkit/)?((?:layers|train|generate|models|interop|viz|data|tasks|experiments)"
                               r"/[\w/]*(?:\.py|/))`", text):
            if not (src / path).exists():
                stale.append(f"{where}: {path}")
        for path in re.findall(r"`((?:tests|benchmarks)/[\w/.-]+\.(?:py|json|md))`", text):
            if not (ROOT / path).exists():
                stale.append(f"{where}: {path}")
        for dotted in re.findall(r"`(attnkit(?:\.\w+)+)`", text):
            parts = dotted.split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    continue
            try:
                for attribute in parts[i:]:
                    obj = getattr(obj, attribute)
            except AttributeError:
                stale.append(f"{where}: {dotted}")
    assert not stale, f"pages name code that does not exist: {stale}"


def test_every_link_of_a_rendered_tutorial_leads_to_a_page_and_its_anchor(site):
    """mkdocs-jupyter renders a tutorial's markdown as it is, without turning `page.md` links into the site's URLs
    (nor checking them, as --strict does for .md pages): each link is followed here in the built site."""
    broken = []
    for page in sorted((site / "tutorials").glob("*/index.html")):
        html = page.read_text()
        for href in sorted(set(re.findall(r'href="([^"]+)"', html))):
            if re.match(r"[a-z]+:|#|//", href):  # another host, mailto:, data:, or an anchor of this page
                continue
            path, _, anchor = href.partition("#")
            target = (page.parent / path).resolve()
            target = target / "index.html" if target.is_dir() else target
            if not target.is_file():
                broken.append(f"{page.parent.name}: {href} (no such page)")
            elif anchor and f'id="{anchor}"' not in target.read_text(errors="replace"):
                broken.append(f"{page.parent.name}: {href} (no such anchor)")
    assert not broken, broken


@contextlib.contextmanager
def _static_server(directory: Path):
    """The built site over HTTP on 127.0.0.1 (a free port), as any static host serves it; yields its origin."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_explorer_page_states_its_models_measured_figures():
    """docs/explorer/index.md gives the shipped model's steps, size, validation loss and share of exact reversals as
    model.json records them (make explorer-model measures them), and the page's first text completes reversed."""
    meta = json.loads((DOCS / "explorer" / "model.json").read_text())
    page = " ".join((DOCS / "explorer" / "index.md").read_text().split())
    held, example = meta["held_out"], meta["example"]
    steps = int(re.search(r"--max-steps (\d+)", meta["trained_by"]).group(1))
    figures = [f"{steps:,} steps", f"{meta['parameters']:,} parameters", f"validation loss {meta['val_loss']:.3f}",
               f"{round(held['exact_share'] * held['strings'])} of {held['strings']} strings",
               f"`{example['text']}` with `{example['greedy']}`"]
    assert [f for f in figures if f not in page] == [], "the explorer page does not state model.json's figures"
    assert example["greedy"] == example["text"].removesuffix("=")[::-1]


def test_the_explorer_model_json_describes_the_model_the_hook_trains():
    """model.json's sizes and architecture (what the page's whole-model view draws) are those of the config that
    docs/hooks/explorer_model.py's training command builds, and its exposed outputs are one per layer."""
    from explorer_model import architecture, trained_config

    meta = json.loads((DOCS / "explorer" / "model.json").read_text())
    config = trained_config(len(meta["pieces"]))
    want = {**architecture(config), "d_model": config.d_model, "n_heads": config.n_heads,
            "n_layers": config.n_layers, "max_seq_len": config.max_seq_len,
            "head_dim": config.resolved.head_dim, "n_kv_heads": config.resolved.n_kv_heads}
    assert {key: meta.get(key) for key in want} == want
    for kind in ("attention", "query", "scores", "hidden", "residual"):
        assert meta[f"{kind}_outputs"] == [f"{kind}.{layer}" for layer in range(config.n_layers)]
    for kind in ("key", "value"):
        assert meta[f"{kind}_outputs"] == [f"present.{layer}.{kind}" for layer in range(config.n_layers)]


@pytest.mark.slow  # torch.onnx's exporter traces the model: 13 s on an idle machine, 37 s on a busy one
def test_the_explorer_hook_exposes_tensors_equal_to_attnkits(tmp_path):
    """docs/hooks/explorer_model.py finds, in a fresh export of the explorer's architecture (untrained), the tensors the
    page shows and its check holds them equal to attnkit.inspect's; a graph output named for the wrong tensor fails
    that check."""
    onnxruntime = pytest.importorskip("onnxruntime", reason="the hook's check runs the graph in onnxruntime")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")
    import torch
    from explorer_model import check, expose, trained_config

    from attnkit.interop.onnx import export_onnx
    from attnkit.models import build_model

    torch.manual_seed(0)
    config = trained_config(47)
    model = build_model(config).eval()
    graph = tmp_path / "model.onnx"
    export_onnx(model, config, graph)
    exposed = expose(graph, n_layers=config.n_layers, n_heads=config.n_heads, d_model=config.d_model,
                     d_ff=config.resolved.d_ff)
    assert exposed["key"] == [f"present.{layer}.key" for layer in range(config.n_layers)]
    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    ids = [14, 15, 16, 11, 16, 15]
    check(session, model, config, ids, exposed)
    for kind, other in (("query", "key"), ("scores", "attention"), ("hidden", "residual")):
        with pytest.raises(AssertionError, match=re.escape(exposed[other][0])):
            check(session, model, config, ids, {**exposed, kind: exposed[other]})


@pytest.mark.slow  # Chromium compiles onnxruntime-web's 14 MB of WebAssembly: about 5 s
def test_the_in_browser_explorer_runs_the_shipped_model_offline(site):
    """docs/explorer/: onnxruntime-web, copied into the site from node_modules, runs the shipped model in Chromium
    with every host but the site's unreachable; the page's attention, next-token and residual-stream numbers are
    onnxruntime's, its whole-model view gives each stage's shape for the first text, and its numbers at a chosen
    token (a head's q, k, v, the dot products and scores, the softmax before and after the causal mask, the FFN's
    hidden activations, the logits at a temperature) are onnxruntime's outputs, or computed from them as the
    lecture does."""
    missing = [name for name in generated.ORT_FILES if not (site / generated.EXPLORER_VENDOR / name).is_file()]
    if missing:
        pytest.skip(f"onnxruntime-web is not installed (`npm install` in the repository root): no {', '.join(missing)}")
    onnxruntime = pytest.importorskip("onnxruntime", reason="the check against the page needs onnxruntime (dev extra)")
    from explorer_model import feeds  # docs/hooks/explorer_model.py: the graph's inputs, as the page builds them
    from viz_browser import Browser, chromium_or_reason

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    meta = json.loads((site / "explorer" / "model.json").read_text())
    text = "cab="
    ids = [meta["pieces"].index(c) for c in text]
    with _static_server(site) as origin:
        browser = Browser(executable, flags=("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",))
        try:
            browser.call("Network.enable")
            browser.call("Page.navigate", {"url": f"{origin}/explorer/"})
            deadline = time.monotonic() + 60
            while not browser.evaluate("!!window.attnkitExplorer") and time.monotonic() < deadline:
                time.sleep(0.1)
            ready = browser.call("Runtime.evaluate", {
                "expression": "window.attnkitExplorer.loaded.then(() => window.attnkitExplorer.error)",
                "awaitPromise": True, "returnByValue": True})
            assert "exceptionDetails" not in ready and ready["result"].get("value") is None, ready
            flow = browser.evaluate("[...document.querySelectorAll('#explorer-flow .explorer-stage')].map((row) => "
                                    "[row.dataset.stage, row.querySelector('code').textContent])")
            browser.call("Runtime.evaluate", {"expression": f"window.attnkitExplorer.analyze({json.dumps(text)})",
                                              "awaitPromise": True})
            page = browser.evaluate("(() => { const s = window.attnkitExplorer; return "
                                    "{ids: s.ids, attention: s.attention, probabilities: s.probabilities, "
                                    "residualNorms: s.residualNorms, flow: s.flow.map((f) => [f.name, f.shape])}; })()")
            layer, head, token, temperature = 1, 2, 1, 0.5  # a query with keys on both sides of the mask
            choice = json.dumps({"layer": layer, "head": head, "token": token, "temperature": temperature})
            inside = browser.evaluate(f"(() => {{ const n = window.attnkitExplorer.show({choice}); return {{...n, "
                                      "masked: n.masked.map((x) => (x === -Infinity ? null : x))}; })()")
            masks = browser.evaluate("[...document.querySelectorAll('table.explorer-steps tr')].slice(1)"
                                     ".map((row) => row.children[4].textContent)")
            notes = browser.evaluate("[...document.querySelectorAll('#explorer-flow .explorer-stage-note')]"
                                     ".map((note) => note.textContent).filter((note) => note.includes('‖x‖'))")
            requested = [e["params"]["request"]["url"] for e in browser.events
                         if e.get("method") == "Network.requestWillBeSent"]
        finally:
            browser.close()
    assert page["ids"] == ids
    session = onnxruntime.InferenceSession(str(site / "explorer" / "model.onnx"), providers=["CPUExecutionProvider"])
    n_layers, attention_outputs = meta["n_layers"], meta["attention_outputs"]
    logits, *rest = session.run(["logits", *attention_outputs, *meta["residual_outputs"]], feeds(
        ids, n_layers=n_layers, n_kv_heads=meta["n_kv_heads"], head_dim=meta["head_dim"]))
    attention, residual = rest[:len(attention_outputs)], rest[len(attention_outputs):]
    np.testing.assert_allclose(np.array(page["attention"]), np.concatenate(attention), atol=1e-5)
    kinds = ("query", "key", "value", "scores", "hidden")
    graph = dict(zip(kinds, session.run([meta[f"{kind}_outputs"][layer] for kind in kinds], feeds(
        ids, n_layers=n_layers, n_kv_heads=meta["n_kv_heads"], head_dim=meta["head_dim"])), strict=True))
    assert (inside["layer"], inside["head"], inside["token"]) == (layer, head, token)
    for kind, want in (("query", graph["query"][0, head, token]), ("keys", graph["key"][0, head]),
                       ("values", graph["value"][0, head]), ("scores", graph["scores"][0, head, token]),
                       ("weights", attention[layer][0, head, token]), ("hidden", graph["hidden"][0, token]),
                       ("logits", logits[0, token])):
        np.testing.assert_allclose(np.array(inside[kind]), want, atol=1e-5, err_msg=kind)
    scores = graph["scores"][0, head, token]  # (S,): q . k / sqrt(D), before the mask
    np.testing.assert_allclose(np.array(inside["dots"]) / np.sqrt(meta["head_dim"]), scores, rtol=1e-4, atol=1e-4)
    hidden_keys = len(ids) - token - 1  # the keys after the query, which the causal mask hides
    assert inside["masked"][token + 1:] == [None] * hidden_keys and masks[token + 1:] == ["−∞"] * hidden_keys
    np.testing.assert_allclose(inside["masked"][:token + 1], scores[:token + 1], atol=1e-6)
    unmasked = np.exp(scores - scores.max())
    np.testing.assert_allclose(inside["unmasked"], unmasked / unmasked.sum(), atol=1e-5)
    sharpened = np.exp((logits[0, token] - logits[0, token].max()) / temperature)
    np.testing.assert_allclose(inside["probabilities"], sharpened / sharpened.sum(), atol=1e-5)
    norms = [np.linalg.norm(r[0], axis=-1) for r in residual]  # per block, (T,): every token's stream
    np.testing.assert_allclose(page["residualNorms"], norms, rtol=1e-5)
    assert len(notes) == n_layers, notes  # the flow reads the stream at the chosen token, not the last one
    for block, note in enumerate(notes):
        assert f"‖x‖ = {norms[block][token]:.2f} at token {token} \"{text[token]}\"" in note, note
    T, C, V = len(meta["example"]["text"]), meta["d_model"], len(meta["pieces"])  # the first text's stages
    shapes = dict(flow)
    assert (shapes["tokens"], shapes["token embedding"], shapes["output layer"], shapes["softmax: next token"]) == (
        f"({T})", f"({T}, {C})", f"({T}, {V})", f"({V})"), flow
    assert dict(page["flow"])["token embedding"] == f"({len(text)}, {C})"  # recomputed for the new text
    stages = [name for name, _ in flow]
    assert stages.count("self-attention") == stages.count("feed-forward") == stages.count("+ residual") / 2 == n_layers
    expected = np.exp(logits[0, -1] - logits[0, -1].max())
    np.testing.assert_allclose(page["probabilities"], expected / expected.sum(), atol=1e-5)
    assert any(url.endswith("ort-wasm-simd-threaded.wasm") for url in requested), requested
    assert all(url.startswith(origin) for url in requested), [u for u in requested if not u.startswith(origin)]


def _bare_explorer(root: Path, model: Path) -> None:
    """docs/explorer/ under root/explorer/ as the site serves it, without a site build: the page's HTML block, its
    script, the build's colour scale and onnxruntime-web, with model.onnx and model.json from the folder `model`."""
    page = (DOCS / "explorer" / "index.md").read_text()
    block = page[page.index('<div id="explorer"'):page.index("</script>", page.index('<script type="module"')) + 9]
    explorer = root / "explorer"
    (explorer / "vendor").mkdir(parents=True)
    (explorer / "index.html").write_text(f'<!doctype html><html><head><meta charset="utf-8"></head><body>{block}'
                                         "</body></html>")
    (explorer / "explorer.js").symlink_to(DOCS / "explorer" / "explorer.js")
    for name in ("model.json", "model.onnx"):
        (explorer / name).symlink_to(model / name)
    (explorer / "colour_bar.js").symlink_to(generated.COLOUR_BAR)  # the build's copy
    for name in generated.ORT_FILES:
        (explorer / "vendor" / name).symlink_to(generated.ORT_DIST / name)


def _explore(browser, url: str, text: str) -> None:
    """Open the explorer at url, wait for its model, and have it read text."""
    browser.call("Page.navigate", {"url": url})
    browser.wait("!!window.attnkitExplorer")
    ready = browser.call("Runtime.evaluate", {
        "expression": "window.attnkitExplorer.loaded.then(() => window.attnkitExplorer.error)",
        "awaitPromise": True, "returnByValue": True})
    assert ready["result"].get("value") is None, ready
    browser.call("Runtime.evaluate", {"expression": f"window.attnkitExplorer.analyze({json.dumps(text)})",
                                      "awaitPromise": True})


@pytest.mark.parametrize("text", ["a", "cab=dcb"])
def test_the_in_browser_explorers_colour_scale_is_legible_and_true_for_any_text(tmp_path, text):
    """docs/explorer/ (its HTML block, script, model and onnxruntime-web, served as the site serves them, without a
    site build): one token drew a colour scale one cell tall, five labels one on another; and the labels were quarters
    of the largest weight printed rounded (0.13 for 0.125). The scale is at least 120 px tall, its labels round
    weights, each printed as it is at its own height."""
    missing = [name for name in generated.ORT_FILES if not (generated.ORT_DIST / name).is_file()]
    if missing:
        pytest.skip(f"onnxruntime-web is not installed (`npm install` in the repository root): no {', '.join(missing)}")
    from viz_browser import Browser, check_colour_bar, chromium_or_reason

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    _bare_explorer(tmp_path, DOCS / "explorer")
    with _static_server(tmp_path) as origin:
        browser = Browser(executable)
        try:
            _explore(browser, f"{origin}/explorer/", text)
            scale = browser.evaluate("window.attnkitExplorer.scale")
            shown = browser.evaluate("window.attnkitExplorer.attention[0]")  # layer 0: (H, T, T), drawn as the mean
        finally:
            browser.close()
    largest = float(np.mean(np.array(shown), axis=0).max())
    assert scale["height"] >= 120
    check_colour_bar(scale["ticks"], scale["top"], scale["height"], largest)  # each label the weight at its height


@pytest.mark.slow  # a few training steps, the ONNX export (13-37 s) and Chromium compiling onnxruntime-web
def test_the_in_browser_explorer_draws_what_attnkit_viz_draws_for_the_same_text(tmp_path):
    """A run of the explorer's own training command (three steps), exported as `make explorer-model` exports it and
    opened in the page: for the same text the page reads the same tokens as `attnkit viz` (attnkit.viz.attention_maps:
    no mark added, as the run learned) and draws the same weights, every layer and head."""
    missing = [name for name in generated.ORT_FILES if not (generated.ORT_DIST / name).is_file()]
    if missing:
        pytest.skip(f"onnxruntime-web is not installed (`npm install` in the repository root): no {', '.join(missing)}")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")
    from explorer_model import TRAIN, expose
    from viz_browser import Browser, chromium_or_reason

    from attnkit.checkpoint import TOKENIZER_DIR, load_model
    from attnkit.interop.onnx import export_onnx
    from attnkit.tokenize import load_tokenizer
    from attnkit.viz import attention_maps

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(f"no headless browser: {reason}")
    train = [*TRAIN, "--out", str(tmp_path / "run"), "--eval-every", "3", "--eval-batches", "1", "--sample-tokens", "0"]
    train[train.index("--max-steps") + 1] = "3"
    assert cli.main(train) == 0
    model, config = load_model(tmp_path / "run")
    tokenizer = load_tokenizer(tmp_path / "run" / TOKENIZER_DIR)
    graph = tmp_path / "graph"
    graph.mkdir()
    export_onnx(model.eval(), config, graph / "model.onnx")
    expose(graph / "model.onnx", n_layers=config.n_layers, n_heads=config.n_heads, d_model=config.d_model,
           d_ff=config.resolved.d_ff)
    meta = json.loads((DOCS / "explorer" / "model.json").read_text())  # the same command: sizes and vocabulary
    assert meta["pieces"] == tokenizer.pieces(range(tokenizer.vocab_size))
    (graph / "model.json").write_text(json.dumps(meta))
    _bare_explorer(tmp_path / "site", graph)
    text = "cab=ba"
    with _static_server(tmp_path / "site") as origin:
        browser = Browser(executable)
        try:
            _explore(browser, f"{origin}/explorer/", text)
            tokens = browser.evaluate("window.attnkitExplorer.tokens")
            drawn = np.array(browser.evaluate("window.attnkitExplorer.attention"))  # (L, H, T, T)
        finally:
            browser.close()
    (maps,) = attention_maps(model, tokenizer, text)
    assert tokens == list(maps.query_tokens) == list(maps.key_tokens)
    np.testing.assert_allclose(drawn.reshape(maps.weights.shape), maps.weights, atol=1e-5)
