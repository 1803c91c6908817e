"""The run's tokenizer as an export carries it: a tokenizer.json that, read alone by Hugging Face `tokenizers` (or by
`transformers`, which reads the same file), gives the ids attnkit feeds the model.

    runtime_tokenizer(tokenizer, config, own_frame=False)   -> (tokenizers.Tokenizer, Framing)

attnkit's own tokenizer adds no special tokens; its tasks frame the ids. An encoder reads `[CLS] text [SEP]` (BOS and
EOS without CLS: `attnkit.data.labelled.frame_ids`), cut to `max_seq_len`; fed the bare ids of the text, a classifier
answers otherwise (it never saw a text without them). The exported file therefore carries the
framing as its post-processor (a `TemplateProcessing`, BERT's own), the cut as its truncation (which counts the
added tokens) and the pad token as its padding, so `Tokenizer.from_file("tokenizer.json").encode_batch(texts)` gives
ids, attention masks and token types ready for the graph. A decoder that labels positions (a tagger) reads its
text framed as an encoder's (BOS and EOS: `attnkit.tasks.tag.align`); an encoder-decoder's source is `text EOS`, cut
and padded likewise (the target, BOS first, is the runtime's to write). A tagger converted from Hugging Face learned
its texts as its own tokenizer frames them (`own_frame`: nothing added by GPT-2's, CLS and SEP by BERT's), and its
file frames them so. A next-token decoder's file is left as it is:
`attnkit generate` feeds the prompt's tokens, after BOS where the tokenizer begins every text with it (a Llama
tokenizer's post-processor, which the file keeps), and its Framing says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.config import DecoderConfig, EncoderConfig, EncoderDecoderConfig, ModelConfig, head_output
from attnkit.data.labelled import frame_ids
from attnkit.errors import ConfigError
from attnkit.tokenize import JSON_KINDS, Tokenizer, require_id


@dataclass(frozen=True)
class Framing:
    """What the exported tokenizer.json adds to a text: the tokens before and after it (BOS alone for a decoder whose
    tokenizer begins its texts with it, none for one that does not), the most ids it keeps (None: no cut) and the id
    rows are padded with (None: no padding)."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    max_length: int | None
    pad_id: int | None

    @property
    def adds(self) -> list[str]:
        return [*self.before, *self.after]

    def as_json(self) -> dict[str, object]:
        """For an export's description of its files (what a runtime does with the text)."""
        return {"adds": self.adds, "template": " ".join([*self.before, "$TEXT", *self.after]),
                "max_length": self.max_length, "pad_id": self.pad_id}


def runtime_tokenizer(tokenizer: Tokenizer, config: ModelConfig, *, own_frame: bool = False):
    """(a `tokenizers.Tokenizer` a runtime reads alone, its Framing); see the module docstring. `own_frame`: a
    tagger's text is framed as its tokenizer's own post-processor frames it (a tagger converted from Hugging Face:
    `attnkit.tasks.reading.frame_of`), not as attnkit frames an encoder's. Raises ConfigError for a tokenizer with no
    tokenizer.json form (attnkit's `char` kind) and InputError for an encoder's tokenizer without the tokens that
    frame its inputs."""
    from tokenizers import processors

    if tokenizer.kind not in JSON_KINDS:
        raise ConfigError(f"a {tokenizer.kind!r} tokenizer has no tokenizer.json form; train the run with "
                          "--tokenizer bpe, or bring a Hugging Face tokenizer")
    hf = _copy(tokenizer)
    if isinstance(config, DecoderConfig) and head_output(config.family, config.decoder_head) == "token":
        bos = tokenizer.pieces([tokenizer.bos_id]) if tokenizer.starts_with_bos else []
        return hf, Framing(before=tuple(bos), after=(), max_length=None, pad_id=tokenizer.pad_id)
    if isinstance(config, EncoderDecoderConfig):  # a translation's source: `text EOS`, as data.pairs lays it out
        before, after = [], [require_id(tokenizer, "eos")]
    else:
        before, after = frame_ids(tokenizer, own=own_frame and _labels_positions(config))
    first, last = tokenizer.pieces(before), tokenizer.pieces(after)
    if before or after:
        hf.post_processor = processors.TemplateProcessing(
            single=" ".join([*first, "$A", *last]),
            pair=" ".join([*first, "$A", *last, "$B:1", *(f"{token}:1" for token in last)]),
            special_tokens=list(zip([*first, *last], [*before, *after], strict=True)))
    hf.enable_truncation(max_length=config.max_seq_len)  # the added tokens count, as attnkit's cut counts them
    pad_id = tokenizer.pad_id
    if pad_id is not None:
        hf.enable_padding(pad_id=pad_id, pad_token=tokenizer.pieces([pad_id])[0])
    return hf, Framing(before=tuple(first), after=tuple(last),
                       max_length=config.max_seq_len, pad_id=pad_id)


def _labels_positions(config: ModelConfig) -> bool:
    """A tagger: a label per position (a classifier's framing stays attnkit's, as `attnkit classify` reads it)."""
    head = config.encoder_head if isinstance(config, EncoderConfig) else getattr(config, "decoder_head", None)
    return head is not None and head_output(config.family, head) == "position"


def _copy(tokenizer: Tokenizer):
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_str(tokenizer.to_str())
    hf.no_truncation()
    hf.no_padding()
    return hf
