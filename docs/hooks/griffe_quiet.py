"""A griffe extension for the API reference: a class's undocumented instance attributes (`self.self_attn =
self_attn` in `__init__`) are left out, so a class page shows its signature, its docstring and its methods, not
a box per assignment. Dataclass fields and documented attributes stay."""

from __future__ import annotations

from typing import Any

import griffe


class QuietAttributes(griffe.Extension):
    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for name, member in list(cls.members.items()):
            if member.is_attribute and "instance-attribute" in member.labels and not member.docstring:
                cls.del_member(name)
