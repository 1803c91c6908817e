"""The three families (encoder, decoder, encoder-decoder) and the builder that makes them from a config."""

from attnkit.models.build import build_model, count_parameters
from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderClassifier, EncoderMaskedLM, EncoderModel
from attnkit.models.output import ModelOutput
from attnkit.models.seq2seq import EncoderDecoder

__all__ = [
    "DecoderLM",
    "EncoderClassifier",
    "EncoderDecoder",
    "EncoderMaskedLM",
    "EncoderModel",
    "ModelOutput",
    "build_model",
    "count_parameters",
]
