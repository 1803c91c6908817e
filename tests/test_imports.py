"""Imports point down the layers of DESIGN.md: a module never imports from a layer above it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attnkit"

# Lower number = lower layer. A module may import from its own layer or any layer below.
LAYERS = {
    "errors": 0,
    "textfiles": 1, "tokenize": 1, "data": 1, "config": 1, "presets": 1,
    "layers": 2,
    "blocks": 3,
    "models": 4, "checkpoint": 4,
    "train": 5, "generate": 5, "interop": 5, "viz": 5,
    "experiments": 6,
    "cli": 7, "__init__": 7, "__main__": 7,
}
SIDE_BY_SIDE = {"textfiles", "tokenize", "data"}  # beside the model stack: never import it
MODEL_STACK = {"config", "presets", "layers", "blocks", "models", "checkpoint"}
SIBLINGS = {"train", "generate", "interop", "viz"}  # never import each other


def _top(module_path: Path) -> str:
    relative = module_path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def _imported_tops(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnkit."):
            tops.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "attnkit":
            tops.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            tops.update(a.name.split(".")[1] for a in node.names if a.name.startswith("attnkit."))
    return tops


def test_imports_point_down():
    violations = []
    for path in PACKAGE.rglob("*.py"):
        own = _top(path)
        assert own in LAYERS, f"{path} is in no layer of DESIGN.md; add it to LAYERS in this test"
        for imported in _imported_tops(path) - {own}:
            if imported not in LAYERS:
                continue
            upward = LAYERS[imported] > LAYERS[own]
            beside = own in SIDE_BY_SIDE and imported in MODEL_STACK
            sibling = own in SIBLINGS and imported in SIBLINGS
            if upward or beside or sibling:
                violations.append(f"{path.relative_to(PACKAGE)} imports attnkit.{imported}")
    assert not violations, "imports pointing up the layers:\n" + "\n".join(violations)
