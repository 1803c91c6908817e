"""Token labels for the axes: the tokenizer's pieces, made readable.

A byte-level BPE piece 'Ġcat' is shown as ' cat' and 'Ċ' as '↵'; SentencePiece's word mark '▁' is a space; a piece
holding part of a character shows its bytes ('\\xf0\\x9f'); a WordPiece piece inside a word keeps its '##' ('##ing',
as BertViz labels BERT's tokens). A token that is only white space is drawn with visible marks (␣ ↵ ⇥), so no label
on an axis is blank.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnkit.tokenize import SENTENCEPIECE_SPACE, Tokenizer, readable, token_texts


def token_labels(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """One readable label per token id, in order."""
    labels = []
    prefix = getattr(tokenizer, "continuing_prefix", None)  # a Tokenizer of one's own may not say
    for piece, text in zip(tokenizer.pieces(ids), token_texts(tokenizer, ids), strict=True):
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="backslashreplace")
        elif piece.startswith(SENTENCEPIECE_SPACE) and not text.startswith(" "):
            text = " " + text  # SentencePiece decoders strip the space a word-initial piece stands for
        elif prefix and piece.startswith(prefix):
            text = piece  # the mark says the piece goes on a word
        labels.append(readable(text or piece))
    return labels
