"""The errors attnkit raises on bad input: each names the problem and the fix."""


class AttnkitError(Exception):
    """Base class: every error attnkit raises on purpose derives from it."""


class ConfigError(AttnkitError, ValueError):
    """An invalid configuration: raised when the config is constructed, naming the field and the fix."""


class InputError(AttnkitError, ValueError):
    """Bad input at a model's edge (token ids, lengths, batch sizes) or in a data file."""


class CheckpointError(AttnkitError, ValueError):
    """A checkpoint that is missing, corrupted or does not match the model it is loaded into."""
