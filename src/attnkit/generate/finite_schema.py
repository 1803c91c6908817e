"""Whether a JSON schema has any finite value, checked before a grammar is built from it (`constrained.py`).

A grammar is built from the schema as a set of rules, one per subschema, each `$ref` a rule that names another. A
schema whose rules never bottom out has no finite text, and a grammar of it either cannot start or runs until
`max_tokens`; llguidance then reports only that no token fits. This finds the cause first and names it:

    {"$ref": "#"}                                    a $ref cycle with nothing else:  # -> #
    {"properties": {"next": {"$ref": "#"}},
     "required": ["next"], "type": "object"}         requires itself forever:  # -> #/properties/next -> #
    {"enum": []}, false, {"items": false, "minItems": 1, "type": "array"}        allows no value at all

A subschema has a finite value when every one of its requirements does (its `$ref`'s target, each of `allOf`, one
of `anyOf`/`oneOf`, each required property of an object, each required item of an array), computed as a least
fixed point over the subschemas, as a grammar's productive symbols are (Hopcroft & Ullman, "useless symbols").
A recursion that may end (an optional property, `minItems: 0`, an `anyOf` with a branch that ends) is allowed.
Remote `$ref`s and keywords this does not read count as satisfiable: llguidance judges them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from attnkit.errors import InputError

SUBSCHEMA_KEYWORDS = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check_finite(schema: dict) -> None:
    """InputError naming the cause when no finite JSON value satisfies `schema`: a `$ref` cycle, a recursion every
    branch of which requires itself, or a part that allows no value (false, an empty enum)."""
    nodes = _subschemas(schema)
    finite = _finite(schema, nodes)
    if id(schema) in finite:
        return
    path, node = ["#"], schema
    while True:  # follow an unmet requirement until it allows nothing or comes round again
        child = next((group[0] if group else None for group in _requirements(node, schema)
                      if not any(_ok(c, finite) for c in group)), None)
        if not isinstance(child, dict):
            where = path[-1] if child is None else f"a subschema (false) required by {path[-1]}"
            raise InputError(f"no JSON value satisfies the schema: {where} allows no value (false, or an empty enum, "
                             "anyOf or oneOf); remove that part or let it allow a value")
        pointer = nodes[id(child)][0]
        if pointer in path:
            loop = path[path.index(pointer):]
            cycle = " -> ".join([*loop, pointer])
            if all("$ref" in nodes_at for nodes_at in (_node_at(nodes, p) for p in loop)):
                raise InputError(f"the schema has a $ref cycle with nothing else to end it ({cycle}): no JSON value "
                                 "satisfies it; point the $ref at a schema that describes a value")
            raise InputError(f"the schema requires itself forever ({cycle}): no finite JSON value satisfies it; make "
                             "the recursion optional (leave it out of required, or allow minItems 0) or give it an "
                             "anyOf branch that ends")
        path.append(pointer)
        node = child


def _node_at(nodes: dict[int, tuple[str, dict]], pointer: str) -> dict:
    return next(node for at, node in nodes.values() if at == pointer)


def _finite(schema: dict, nodes: dict[int, tuple[str, dict]]) -> set[int]:
    """The ids of the subschemas that have a finite value: the least fixed point, grown until nothing changes."""
    finite: set[int] = set()
    changed = True
    while changed:
        changed = False
        for _, node in nodes.values():
            if id(node) not in finite and all(any(_ok(c, finite) for c in group)
                                              for group in _requirements(node, schema)):
                finite.add(id(node))
                changed = True
    return finite


def _ok(child: Any, finite: set[int]) -> bool:
    """Whether a requirement is met: a schema known finite, true, or anything this does not read."""
    if isinstance(child, dict):
        return id(child) in finite
    return child is not False


def _requirements(node: dict, root: dict) -> Iterator[list]:
    """`node`'s requirements, each a list of subschemas one of which must have a finite value (an empty list: never)."""
    if "$ref" in node:
        target = _resolve(root, node["$ref"])
        if target is not None:
            yield [target]
    if node.get("enum") == []:
        yield []
    for part in node.get("allOf") or ():
        yield [part]
    for keyword in ("anyOf", "oneOf"):
        if isinstance(node.get(keyword), list):
            yield list(node[keyword])
    kind = node.get("type")
    if kind == "object":
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        for name in node.get("required") or ():
            if isinstance(name, str) and name in properties:
                yield [properties[name]]
    elif kind == "array" and isinstance(node.get("minItems"), int):
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        yield from ([item] for item in prefix[:node["minItems"]])
        if node["minItems"] > len(prefix) and "items" in node:
            yield [node["items"]]


def _resolve(root: dict, ref: Any) -> Any:
    """The subschema a local `$ref` ("#", "#/$defs/a") names; None for a remote or broken one (llguidance judges)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _subschemas(schema: dict) -> dict[int, tuple[str, dict]]:
    """Each subschema (each dict under a keyword that holds schemas): its id -> (its JSON pointer, the first path
    that reaches it, such as "#/properties/next"; the subschema)."""
    nodes: dict[int, tuple[str, dict]] = {}
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, pointer = stack.pop()
        if not isinstance(node, dict) or id(node) in nodes:
            continue
        nodes[id(node)] = (pointer, node)
        stack += [(node[k], f"{pointer}/{k}") for k in SUBSCHEMA_KEYWORDS if k in node]
        stack += [(item, f"{pointer}/{k}/{i}") for k in SUBSCHEMA_LISTS if isinstance(node.get(k), list)
                  for i, item in enumerate(node[k])]
        stack += [(item, f"{pointer}/{k}/{name}") for k in SUBSCHEMA_MAPS if isinstance(node.get(k), dict)
                  for name, item in node[k].items()]
    return nodes
