"""The model families (decoder, encoder, encoder-decoder, recurrent LM, recurrent seq2seq, convolutional LM,
feed-forward LM), each registered once in `families.py`, and `build_model`, which makes any of them from its
config."""

from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderClassifier, EncoderMaskedLM, EncoderModel
from attnkit.models.families import Family, build_model, count_parameters, families, family_of
from attnkit.models.output import ModelOutput
from attnkit.models.seq2seq import EncoderDecoder

__all__ = [
    "DecoderLM",
    "EncoderClassifier",
    "EncoderDecoder",
    "EncoderMaskedLM",
    "EncoderModel",
    "Family",
    "ModelOutput",
    "build_model",
    "count_parameters",
    "families",
    "family_of",
]
