"""Looking inside a model (lecture: "what do these heads actually do?"): named hook points over the modules that
exist, read and changed through one small API, and the analyses built on it.

    hook_points(model)                 every point's name (`blocks.3.attn.pattern`, `decoder.blocks.0.cross_attn.z`)
    trace(model, *inputs, names=...)   one run's output and activations
    hooked(model, capture=, edits=)    the same as a context manager, with edits (ablations, patches)

    the analyses, one module each: importance (head_importance), head_types, logit_lens, patching (patch_stream,
    patch_heads), probes (probe, probe_layers), residual (residual_stream: what each sublayer writes), steering
    (activation addition: contrast_vector, steering)
"""

from attnkit.inspect.edits import ablate, mean_ablate, patch, resample_ablate, zero_ablate
from attnkit.inspect.inputs import Batch, lm_batch, seq2seq_batch
from attnkit.inspect.points import HookPoint, head_sites, hook_points
from attnkit.inspect.tracing import Edit, Trace, hooked, trace

__all__ = [
    "Batch",
    "Edit",
    "HookPoint",
    "Trace",
    "ablate",
    "head_sites",
    "hook_points",
    "hooked",
    "lm_batch",
    "mean_ablate",
    "patch",
    "resample_ablate",
    "seq2seq_batch",
    "trace",
    "zero_ablate",
]
