"""The run's tokenizer as an export carries it: a tokenizer.json that, read alone by Hugging Face `tokenizers` (or by
`transformers`, which reads the same file), gives the ids attnkit feeds the model.

    runtime_tokenizer(tokenizer, config)   -> (tokenizers.Tokenizer, Framing)

attnkit's own tokenizer adds no special tokens; its tasks frame the ids. An encoder reads `[CLS] text [SEP]` (BOS and
EOS without CLS: `attnkit.data.labelled.frame_ids`), cut to `max_seq_len`; fed the bare ids of the text, a classifier
answers otherwise (it never saw a text without them). The exported file therefore carries the
framing as its post-processor (a `TemplateProcessing`, BERT's own), the cut as its truncation (which counts the two
added tokens) and the pad token as its padding, so `Tokenizer.from_file("tokenizer.json").encode_batch(texts)` gives
ids, attention masks and token types ready for the graph. A decoder that labels positions (a tagger) reads its
text framed as an encoder's (BOS and EOS: `attnkit.tasks.tag.align`). A next-token decoder's file is left as it is:
`attnkit generate` feeds the prompt's tokens, after BOS where the tokenizer begins every text with it (a Llama
tokenizer's post-processor, which the file keeps), and its Framing says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.config import DecoderConfig, ModelConfig, head_output
from attnkit.data.labelled import frame_ids
from attnkit.errors import ConfigError
from attnkit.tokenize import Tokenizer


@dataclass(frozen=True)
class Framing:
    """What the exported tokenizer.json adds to a text: the tokens before and after it (none for a decoder), the most
    ids it keeps (None: no cut) and the id rows are padded with."""

    first: str | None
    last: str | None
    max_length: int | None
    pad_id: int | None

    def as_json(self) -> dict[str, object]:
        """For an export's description of its files (what a runtime does with the text)."""
        added = [token for token in (self.first, self.last) if token is not None]
        return {"adds": added, "template": " ".join([*added[:1], "$TEXT", *added[1:]]), "max_length": self.max_length,
                "pad_id": self.pad_id}


def runtime_tokenizer(tokenizer: Tokenizer, config: ModelConfig):
    """(a `tokenizers.Tokenizer` a runtime reads alone, its Framing); see the module docstring. Raises ConfigError for a
    tokenizer with no tokenizer.json form (attnkit's `char` kind) and InputError for an encoder's tokenizer without the
    tokens that frame its inputs."""
    from tokenizers import processors

    if tokenizer.kind not in ("bpe", "hf"):
        raise ConfigError(f"a {tokenizer.kind!r} tokenizer has no tokenizer.json form; train the run with "
                          "--tokenizer bpe, or bring a Hugging Face tokenizer")
    hf = _copy(tokenizer)
    if isinstance(config, DecoderConfig) and head_output(config.family, config.decoder_head) == "token":
        bos = tokenizer.pieces([tokenizer.bos_id])[0] if tokenizer.starts_with_bos else None
        return hf, Framing(first=bos, last=None, max_length=None, pad_id=tokenizer.pad_id)
    first_id, last_id = frame_ids(tokenizer)
    first, last = tokenizer.pieces([first_id, last_id])
    hf.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", pair=f"{first} $A {last} $B:1 {last}:1",
        special_tokens=[(first, first_id), (last, last_id)])
    hf.enable_truncation(max_length=config.max_seq_len)  # the two added tokens count, as attnkit's cut counts them
    pad_id = tokenizer.pad_id
    if pad_id is not None:
        hf.enable_padding(pad_id=pad_id, pad_token=tokenizer.pieces([pad_id])[0])
    return hf, Framing(first=first, last=last, max_length=config.max_seq_len, pad_id=pad_id)


def _copy(tokenizer: Tokenizer):
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_str(tokenizer.to_str())
    hf.no_truncation()
    hf.no_padding()
    return hf
