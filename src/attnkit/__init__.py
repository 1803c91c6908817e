"""attnkit: the Transformer as it is taught, from the attention score to Llama 2."""

from attnkit import presets
from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError, CheckpointError, ConfigError, InputError
from attnkit.generate import load
from attnkit.models import build_model, count_parameters

__all__ = [
    "AttnkitError",
    "CheckpointError",
    "ConfigError",
    "InputError",
    "ModelConfig",
    "build_model",
    "count_parameters",
    "load",
    "presets",
]
