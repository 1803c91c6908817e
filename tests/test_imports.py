"""Imports point down the layers of DESIGN.md, every module has a layer, and no modules import each other in a
circle. Imports inside functions count as much as those at the top of a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attnkit"

# DESIGN.md's picture, bottom up: lower number = lower layer; a module may import its own layer or any below.
# A module takes the layer of the longest entry that is its name or a package holding it ("models" covers
# models/recurrent/lm.py), so a new module in a listed package needs no edit here. "__init__" is attnkit itself.
LAYERS = {
    "errors": 0, "deprecation": 0,  # old names accepted with a warning (any layer uses)
    "version": 0,  # attnkit's installed version (the command line and stored experiments name it)
    "textfiles": 1, "options": 1,  # reading text files; dataclass fields -> command-line options (any layer uses)
    "outputs": 1,  # files and directories written whole or not at all (any layer that writes uses)
    "readback": 1,  # files written earlier, read back field by field with each refusal naming file and field
    "machine": 1,  # the CPU's capabilities and the measured kernel profile (any layer reads them)
    "plans": 1,  # a plan's choices with their reasons (the inference and training plans print them)
    "grammars": 1,  # llguidance's grammars built and checked with no tokenizer (generate's constrained decoding, and
    # the generate command's check of --regex and --grammar before its model loads)
    "exercises": 1,  # the tutorials' exercise checks: right, wrong with a hint, not answered yet
    "tokenize": 2, "data": 2,
    "chat_format": 2,  # attnkit's own chat format as a Jinja template (exports carry it; the server chats in it)
    "config": 3, "presets": 3, "recipes": 3,  # recipes: shipped training setups as data
    "lectures": 3,  # the course index: the lectures' topics and what covers each, as data
    "layers": 4,
    "blocks": 5,
    "models": 6,
    "checkpoint": 7,
    "run_settings": 7,  # what a command that runs a model takes (load options, texts): the tasks' commands build on it
    "tasks": 8,  # the task registry: what each task reads, its head, loss, metrics, evaluation, pipeline method
    "train": 9, "generate": 9, "interop": 9, "viz": 9,
    "inspect": 9,  # hook points, edits and the analyses over them (probing, mechanistic interpretability)
    "experiments": 10,
    "serve": 10,  # attnkit serve: the HTTP app over generate's pipeline, the tasks and viz's attention extraction
    "cli": 11, "__main__": 11, "__init__": 11,
}
SIBLINGS = {"train", "generate", "interop", "viz", "inspect"}  # never import each other: shared code moves down a layer


def _modules(package: Path) -> dict[str, Path]:
    """Dotted name below the package ("data.lm", "data" for data/__init__.py, "" for the package) -> file."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _layer_key(name: str) -> str | None:
    if name == "":
        return "__init__"
    keys = [k for k in LAYERS if name == k or name.startswith(k + ".")]
    return max(keys, key=len, default=None)


def _inside(name: str, package: str) -> bool:
    return package == "" or name == package or name.startswith(package + ".")


def _imported(path: Path, name: str, root: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that importing `path` runs, named below the package: each module named, a name
    imported from a package when that name is a module of it, and the `__init__` of each package entered from
    outside (a module's own packages are already running)."""
    is_package = path.name == "__init__.py"
    named, entered = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([root, *[p for p in here if p], *([base] if base else [])])
            below = base.removeprefix(root).removeprefix(".")
            submodules = [f"{below}.{a.name}".lstrip(".") for a in node.names]
            named.update(f"{root}.{m}" for m in submodules if m in modules)
            (entered if all(m in modules for m in submodules) else named).add(base)
    out = set()
    for target in (t for t in named | entered if t == root or t.startswith(root + ".")):
        relative = target.removeprefix(root).removeprefix(".")
        if target in named or not _inside(name, relative):
            out.add(relative)
        parts = relative.split(".")
        out.update(p for p in (".".join(parts[:n]) for n in range(1, len(parts))) if not _inside(name, p))
    return out - {name}


def import_graph(package_dir: Path) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> modules it imports, and the imports of modules that do not exist."""
    modules = _modules(package_dir)
    graph, missing = {}, []
    for name, path in modules.items():
        graph[name] = _imported(path, name, package_dir.name, modules)
        missing += [f"{path.relative_to(package_dir)} imports {package_dir.name}.{m}, which does not exist"
                    for m in sorted(graph[name] - modules.keys())]
        graph[name] &= modules.keys()
    return graph, missing


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _show(name: str) -> str:
    return f"attnkit.{name}" if name else "attnkit"


def test_every_module_has_a_layer_and_every_layer_a_module():
    modules = _modules(PACKAGE)
    unplaced = [
        f"{_show(name)} ({modules[name].relative_to(PACKAGE)}) is in no layer: add {name.split('.')[0]!r} to "
        f"LAYERS in tests/test_imports.py at its place in DESIGN.md's picture"
        for name in modules if _layer_key(name) is None
    ]
    assert not unplaced, "\n".join(unplaced)
    stale = [
        f"LAYERS in tests/test_imports.py lists {key!r}, but src/attnkit has no such module or package: "
        f"remove it or correct its name"
        for key in LAYERS if key != "__init__" and not any(m == key or m.startswith(key + ".") for m in modules)
    ]
    assert not stale, "\n".join(stale)


def test_imports_point_down():
    graph, missing = import_graph(PACKAGE)
    violations = list(missing)
    for name, imported in sorted(graph.items()):
        own = _layer_key(name)
        for target in sorted(imported):
            other = _layer_key(target)
            if own is None or other is None or own == other:
                continue
            if LAYERS[other] > LAYERS[own] or (own in SIBLINGS and other in SIBLINGS):
                violations.append(f"{_show(name)} imports {_show(target)}")
    assert not violations, "imports pointing up the layers or across siblings:\n" + "\n".join(violations)


def test_no_import_cycles():
    graph, _ = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "modules importing each other in a circle (move the shared code down a layer):\n" + "\n".join(
        " <-> ".join(_show(n) for n in component) for component in found
    )


def test_the_checks_see_cycles_upward_and_function_level_imports(tmp_path):
    package = tmp_path / "attnkit"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "__init__.py").write_text("from attnkit.data.lm import LM\n")
    (package / "data" / "lm.py").write_text("from attnkit.tokenize import Tokenizer\n")
    (package / "tokenize.py").write_text("def train():\n    from attnkit.data.corpus import read_text\n")
    (package / "data" / "corpus.py").write_text("from . import lm\nfrom attnkit import errors\n")
    graph, missing = import_graph(package)
    assert graph["tokenize"] == {"data", "data.corpus"}  # the inline import, and data/__init__.py it runs first
    assert graph["data.corpus"] == {"data.lm", ""}  # relative import; `errors` is no module, so attnkit's own
    assert missing == []
    assert cycles(graph) == [["data", "data.corpus", "data.lm", "tokenize"]]
    (package / "tokenize.py").write_text("import attnkit.models.stack\n")
    graph, missing = import_graph(package)
    assert missing == [f"tokenize.py imports attnkit.{m}, which does not exist" for m in ("models", "models.stack")]
    assert cycles(graph) == []


def test_starting_the_command_line_imports_no_plotting():
    """`attnkit` loads matplotlib only for a command that draws (a confusion matrix, a run's curves, a picture):
    importing it costs every other command, generate and serve among them, a good part of a second."""
    import subprocess
    import sys

    code = "import sys, attnkit.cli, attnkit.generate.pipeline; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
