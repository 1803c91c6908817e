"""Which kernel each attention pass actually took: a spy on the calls `Attention.forward` makes (`attend` with or
without a bias, `flex_attend`, the reference path), so plans can be held to what the layers do."""

from __future__ import annotations

import pytest

from attnkit.layers import attention

VARIANTS = {  # ModelConfig fields of each attention variant the plans explain
    "plain causal": {"position": "rope"},
    "Shaw": {"position": "relative"},
    "ALiBi": {"position": "alibi"},
    "window": {"position": "rope", "attention_window": 4},
    "additive score": {"position": "rope", "score": "additive"},
    "soft-cap": {"position": "rope", "attn_softcap": 30.0},
}


def spy_on_attention(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record (kernel, query count) for every attention pass from now on, in the names of `KernelPath.kernel`."""
    taken: list[tuple[str, int]] = []
    attend, flex_attend, reference = attention.attend, attention.flex_attend, attention.Attention._reference

    def spied_attend(q, k, v, bias, **kwargs):
        taken.append(("sdpa" if bias is None else "sdpa+bias", q.shape[2]))
        return attend(q, k, v, bias, **kwargs)

    def spied_flex(q, k, v, **kwargs):
        taken.append(("flex", q.shape[2]))
        return flex_attend(q, k, v, **kwargs)

    def spied_reference(self, q, *args, **kwargs):
        taken.append(("reference", q.shape[2]))
        return reference(self, q, *args, **kwargs)

    monkeypatch.setattr(attention, "attend", spied_attend)
    monkeypatch.setattr(attention, "flex_attend", spied_flex)
    monkeypatch.setattr(attention.Attention, "_reference", spied_reference)
    return taken


def explained_kernels(text: str) -> set[str]:
    """The kernels a plan's attention choice names, as `plans.attention_choice` words them ("SDPA (its fused CPU
    kernel) / the reference path (...)" -> {"sdpa", "reference"})."""
    line = next(line for line in text.splitlines() if line.strip().startswith("attention "))
    choice = line.split("attention", 1)[1].strip().split(": ", 1)[0]
    kernels = set()
    for part in choice.split(" / "):
        if part.startswith("the reference path"):
            kernels.add("reference")
        elif part.startswith("FlexAttention"):
            kernels.add("flex")
        elif part.startswith("SDPA"):
            kernels.add("sdpa+bias" if part.endswith("with a dense (T, S) bias") else "sdpa")
    return kernels
