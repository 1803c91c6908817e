"""`attnkit inspect RUN ANALYSIS`: one analysis of a trained run, written as a table (JSON, markdown) and a picture.

    heads        head importance: the loss change when each head is ablated, on --text / --input
    head-types   each head's previous / first / separator / duplicate / induction score on repeated random tokens,
                 framed as the model reads a text (a translation run: on its sentence pairs, and how monotonic each
                 cross-attention head is)
    logit-lens   each layer's stream read through the output layer, over one text
    tuned-lens   the same through an affine translator per layer trained on --text / --input (Belrose et al. 2023),
                 each layer's KL from the final distribution beside the logit lens's; the lens saved to OUT/tuned-lens
                 (--lens DIR: read a saved one)
    patch        activation patching from --text (clean) into --corrupt (corrupted, as many tokens) of the stream
                 entering each block, each block's attention and FFN output and each head's output, or its queries,
                 keys, values or pattern (--point q|k|v|pattern; --by-position: also each head at each position
                 alone); the answer is read at --position, else a decoder's last, else where the corruption moves it
                 most
    attribute    attribution patching: patch's tables estimated from one forward and backward pass (and per sublayer),
                 with the same --point and --by-position
    dla          direct logit attribution: each head's, FFN's and neuron's direct share of the answer's logit
                 difference against the runner-up, over one text (--position: where it is read)
    probe        linear probes per layer on a CoNLL / CoNLL-U file's word labels, with the control task
    circuits     each head's OV and QK singular values and the Q-, K- and V-composition scores between heads (weights)
    path-patch   path patching from --sender heads through --receiver's --via input (q, k or v) alone, from --text
                 (clean) into --corrupt
    sae          a sparse autoencoder trained on --point's activations over --input's texts, saved to OUT/sae/, with
                 its L0, dead features, normalised MSE, the loss with it spliced in and each feature's top contexts
    steer        activation addition (Turner et al. 2023): --text continued without and with --coeff times the
                 difference of block --layer's input on the --steer pair (POSITIVE NEGATIVE), under one --seed, side by
                 side, and the next tokens the steering raises and lowers most

How a text becomes the model's input follows the run's family: a decoder predicts each next token; an encoder
reads `[CLS] text [SEP]` (a masked LM has every sixth token masked and predicted; other encoders are scored by how
far an ablation moves their output, KL); a translation run reads `SOURCE<TAB>TARGET` lines, or sources alone, then
translated greedily. Files go to --out (default RUN/inspect): ANALYSIS.json, ANALYSIS.md, ANALYSIS.png.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import textwrap
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torch import Tensor, nn

from attnkit.checkpoint import TASK_FILE, TOKENIZER_DIR, load_model, read_labels, require_directory
from attnkit.errors import InputError
from attnkit.inspect.attribution import attribute_heads, attribute_stream, attribute_sublayers
from attnkit.inspect.circuits import composition_scores, head_weights
from attnkit.inspect.edits import Ablation
from attnkit.inspect.head_types import MONOTONIC, HeadTypes, head_types, repeat_periods, repeat_types
from attnkit.inspect.importance import head_importance
from attnkit.inspect.inputs import Batch, divergence, lm_batch, seq2seq_batch
from attnkit.inspect.logit_attribution import logit_attribution
from attnkit.inspect.logit_lens import LogitLens, logit_lens
from attnkit.inspect.patching import HeadPoint, Patching, faint_warning, logit_difference, patch_heads, patch_stream
from attnkit.inspect.path_patching import path_patch
from attnkit.inspect.points import head_sites, hook_points
from attnkit.inspect.probes import probe_layers, reading_piece
from attnkit.inspect.report import heatmap, position_spans, write_report
from attnkit.inspect.sae import (
    SAEConfig,
    evaluate,
    features_in_context,
    point_activations,
    save_features,
    save_sae,
    spliced_loss,
    train_sae,
)
from attnkit.inspect.steering import contrast_vector, steering
from attnkit.inspect.tuned_lens import (
    PAPER_STEPS,
    lens_divergences,
    load_tuned_lens,
    save_tuned_lens,
    train_tuned_lens,
    tuned_lens,
)
from attnkit.machine import pick_device
from attnkit.models.greedy import translation_pair
from attnkit.models.stack import TransformerStack
from attnkit.outputs import refuse_root
from attnkit.tasks.conll import is_conllu, read_tagged
from attnkit.tasks.reading import Frame, frame_of, text_frame, text_layout
from attnkit.tasks.registry import task_record
from attnkit.tasks.tag import WordPieces, word_pieces_of
from attnkit.textfiles import EncodingErrors, read_lines
from attnkit.tokenize import Tokenizer, encode_some, load_tokenizer, readable, require_id

log = logging.getLogger(__name__)

Analysis = Literal["heads", "head-types", "logit-lens", "tuned-lens", "patch", "attribute", "dla", "probe", "circuits",
                   "sae", "path-patch", "steer"]
MASK_EVERY = 6  # a masked LM's text has every sixth token masked (about BERT's 15%)
PLACEHOLDER = re.compile(r"\[unused\d+\]|<unused\d+>")  # a vocabulary's reserved slots (BERT's, Gemma's)
HELD_OUT = 10  # tuned-lens: every tenth text is held out of training and scores the lenses
SAE_STEPS = 500  # sae: training steps unless --steps
GREEDY_TOKENS = 48  # a source alone is translated greedily to this many tokens at most (short texts)
LEGEND_LINES = 16  # circuits: the OV spectra get a legend up to this many heads
CELL_WIDTH = 0.6  # inches per column of a patching table: room for a number such as -0.0044 at 6 points
STEER_SHOWN = 8  # steer: the next tokens the steering raises most, and lowers most, drawn and listed
STEER_COLUMN = 44  # steer: the width of each continuation's column as the two are logged side by side
HEAD_POINTS = {"z": "outputs", "q": "queries", "k": "keys", "v": "values", "pattern": "patterns"}  # --point, in words


@dataclass(frozen=True)
class InspectSettings:
    """What `attnkit inspect` analyses. Every field is a flag of the command."""

    run: str  # run directory: config.json, model.safetensors, tokenizer/
    analysis: Analysis = field(default="heads", metadata={"positional": True})
    """heads: importance by ablation; head-types: what each head attends to; logit-lens: each layer's prediction;
    tuned-lens: the same through a translator per layer trained on the texts (or --lens's); patch: activation
    patching from --text into --corrupt; attribute: its gradient estimate (attribution patching); dla: direct logit
    attribution of the answer; probe: linear probes on --conll's labels; circuits: OV and QK circuits and
    composition scores, from the weights; path-patch: path patching from --sender through --receiver's
    --via input; sae: a sparse autoencoder on --point's activations; steer: --text continued without and with
    activation addition of the --steer pair at --layer"""
    text: tuple[str, ...] = ()  # texts to run on (a translation run: sources, or SOURCE<TAB>TARGET); or --input
    input: str | None = None  # a UTF-8 file, one text per line (a translation run: SOURCE<TAB>TARGET); or --text
    encoding_errors: EncodingErrors = "strict"  # --input, --conll: strict: not UTF-8 is an error; replace: U+FFFD
    corrupt: str | None = None  # patch, attribute: the corrupted text, as many tokens as --text
    path_steps: int = 1  # attribute: 1: the gradient at the corrupted run; more: integrated along the path
    sender: tuple[str, ...] = ()  # path-patch: sender heads of one sublayer, LAYER.HEAD (0.1) or SITE.HEAD
    receiver: str | None = None  # path-patch: the receiver head, LAYER.HEAD (1.0) or SITE.HEAD
    via: Literal["q", "k", "v"] | None = None  # path-patch: the receiver's input the path runs through
    position: int | None = None  # dla, patch, attribute, path-patch: where the answer is read (unset: the last, ...)
    answer: str | None = None  # patch, attribute, path-patch, dla: the answer, one token (a classifier: a label)
    wrong: str | None = None  # the output the answer is measured against (unset: the corrupted run's; dla: runner-up)
    conll: str | None = None  # probe: a CoNLL or CoNLL-U file of tagged words
    column: str = "upos"  # probe: the CoNLL-U column holding the labels (upos, xpos, deprel, a MISC key)
    by_position: bool = False  # patch, attribute: also each head at each position alone (patch: a run per cell)
    ablation: Ablation = "zero"  # heads: replace a head's output by zeros, its mean, or another input's
    out: str | None = None  # directory for ANALYSIS.json, .md and .png (default RUN/inspect)
    device: str = "cpu"  # where the model runs
    seed: int = 0  # random tokens (head-types), resampling (heads), probe splits
    point: str | None = None
    """sae: the hook point whose activations it reads (blocks.1.resid_post); patch, attribute: what of each head is
    patched: z (its output, the default), q, k, v (its queries, keys, values) or pattern"""
    features: int = 0  # sae: its number of features (0: four times the point's width)
    k: int = 0  # sae: 0 trains ReLU with an L1 penalty (--l1); k > 0 a TopK SAE keeping k features per token
    l1: float = 0.3  # sae: the L1 coefficient (scale-free: the loss is relative to the activations' variance)
    steps: int | None = None
    """sae: training steps, one batch of activations each (default 500); tuned-lens: its translators' SGD steps
    (default the paper's 250)"""
    lens: str | None = None  # tuned-lens: read this saved lens (a tuned-lens directory) instead of training one
    steer: tuple[str, ...] = ()  # steer: the contrast pair, POSITIVE NEGATIVE ("Love" "Hate"), as many tokens
    layer: int | None = None  # steer: the block whose input (blocks.L.resid_pre) is steered (if none, the middle one)
    coeff: float = 4.0  # steer: the steering vector's coefficient (negative: toward NEGATIVE)
    tokens: int = 40  # steer: new tokens per continuation
    temperature: float = 1.0  # steer: sampling temperature of both continuations (0: greedy)


@dataclass
class Loaded:
    """The run as an analysis needs it."""

    model: nn.Module
    tokenizer: Tokenizer
    family: str
    max_len: int
    device: torch.device
    labels: list[str] | None = None  # a classifier's or tagger's class names (labels.json), by class index
    frame: Frame = "attnkit"  # how its text is framed: attnkit's marks, or its tokenizer's own (`frame_of`)
    word_pieces: WordPieces = "running"  # how a probe's words become pieces, as a tagger was trained (`word_pieces_of`)

    @property
    def translates(self) -> bool:
        return callable(getattr(self.model, "encode", None)) and callable(getattr(self.model, "decode", None))

    @property
    def stack(self) -> TransformerStack | None:
        """The Transformer stack a one-sequence model reads its text with (None: an encoder-decoder's two, a recurrent
        model's layers; a recurrent LM's `stack` is a method, not a stack)."""
        stack = getattr(self.model, "stack", None)
        return stack if isinstance(stack, TransformerStack) else None

    @property
    def causal(self) -> bool:
        """Whether it reads its text one way, predicting each next token (a decoder)."""
        return self.stack is not None and self.stack.causal

    def tensor(self, ids: list[int]) -> Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)  # token ids, also when there are none


def run_inspect(settings: InspectSettings) -> list[Path]:
    """Run the analysis `settings` name and write its files; returns their paths. Raises InputError for inputs the
    analysis cannot use (naming what it needs), CheckpointError for a run that cannot be read."""
    run_dir = require_directory(settings.run)  # missing, or a file: CheckpointError naming the fix
    device = pick_device(settings.device)  # as train and experiment check it: ConfigError naming the choices
    if not (run_dir / TOKENIZER_DIR).is_dir():
        raise InputError(f"{run_dir} has no {TOKENIZER_DIR}/ directory, so texts cannot become its tokens")
    _check_inputs(settings)
    model, config = load_model(run_dir, device=device)
    record = task_record(run_dir)
    loaded = Loaded(model.eval(), load_tokenizer(run_dir / TOKENIZER_DIR), config.family,
                    getattr(config, "max_seq_len", None) or 512, device, read_labels(run_dir),
                    frame_of(record, run_dir / TASK_FILE), word_pieces_of(record, run_dir / TASK_FILE))
    _check_run(loaded, settings)
    out = _out_dir(settings)
    name = settings.analysis
    title, rows, summary, figure = ANALYSES[name](loaded, settings)
    paths = write_report(out, name, title=f"{title}: {run_dir.name}", rows=rows, summary=summary, figure=figure)
    log.info("wrote %s", ", ".join(map(str, paths)))
    return paths


def _check_inputs(settings: InspectSettings) -> None:
    """What each analysis needs, checked before the model loads."""
    if settings.text and settings.input is not None:
        raise InputError("give the texts as --text TEXT... or as --input FILE, not both")
    needs_text = settings.analysis in ("heads", "logit-lens", "tuned-lens", "patch", "attribute", "dla", "sae",
                                       "path-patch", "steer")
    _check_steer_flags(settings)
    if settings.lens is not None and settings.analysis != "tuned-lens":
        raise InputError(f"--lens names a saved tuned lens, which tuned-lens alone reads; {settings.analysis} reads "
                         "none: drop it")
    if settings.steps is not None and (settings.analysis not in ("sae", "tuned-lens") or settings.lens is not None):
        trains = f"{settings.analysis} trains none" if settings.lens is None else "--lens reads a lens trained before"
        raise InputError(f"--steps counts the training steps of sae and tuned-lens; {trains}: drop it")
    if needs_text and not settings.text and settings.input is None:
        raise InputError(f"{settings.analysis} runs the model on texts: give --text TEXT... or --input FILE")
    if settings.analysis == "path-patch" and not (settings.sender and settings.receiver and settings.via):
        raise InputError("path-patch follows one path: give --sender LAYER.HEAD (one or more, of one sublayer), "
                         "--receiver LAYER.HEAD and --via q, k or v (the receiver's input the path runs through)")
    if settings.analysis in ("patch", "attribute", "path-patch") and settings.corrupt is None:
        raise InputError(f"{settings.analysis} needs a corrupted input beside the clean --text: give --corrupt TEXT "
                         "(as many tokens, a few substituted)")
    if (settings.answer is not None or settings.wrong is not None) and settings.analysis not in (
            "patch", "attribute", "path-patch", "dla"):
        raise InputError(f"--answer and --wrong name the logit difference that patch, attribute, path-patch and dla "
                         f"read; {settings.analysis} reads none: drop them")
    if settings.by_position and settings.analysis not in ("patch", "attribute"):
        raise InputError(f"--by-position patches each head at each position, which patch and attribute do; "
                         f"{settings.analysis} reads none: drop it")
    if settings.point is not None and settings.analysis in ("patch", "attribute") and (
            settings.point not in get_args(HeadPoint)):
        raise InputError(f"--point {settings.point!r}: {settings.analysis} patches each head's z (its output), q, k, v "
                         "(its queries, keys, values) or pattern; give one of those")
    if settings.point is not None and settings.analysis not in ("sae", "patch", "attribute"):
        raise InputError(f"--point names what sae reads, or what patch and attribute patch of each head; "
                         f"{settings.analysis} reads none: drop it")
    if settings.analysis == "sae" and settings.point is None:
        raise InputError("sae reads one hook point's activations: give --point (blocks.1.resid_post, blocks.0.mlp.out; "
                         "attnkit.inspect.hook_points lists a model's)")
    if settings.analysis in ("circuits", "probe") and (settings.text or settings.input is not None):
        reads = "the weights" if settings.analysis == "circuits" else "--conll's sentences"
        raise InputError(f"{settings.analysis} reads {reads}, not --text or --input: drop them")
    if settings.analysis == "probe" and settings.conll is None:
        raise InputError("probe reads word labels from a CoNLL or CoNLL-U file: give --conll FILE")
    if settings.analysis == "probe":  # a file that is not CoNLL, or a column it lacks, refused before the model loads
        if settings.column != "upos" and not is_conllu(settings.conll):
            raise InputError(f"--column picks a CoNLL-U column, but {settings.conll} is read as CoNLL (each line's "
                             "last column is its label): drop --column, or give a .conllu file")
        read_tagged(settings.conll, column=settings.column, encoding_errors=settings.encoding_errors, option="--column")
    out = _out_dir(settings)
    refuse_root(out)  # before the analysis (an SAE's training), and the folders saved inside out (out/sae)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file, where the report's directory goes: give --out a directory (it is made "
                         "where missing)")


def _check_steer_flags(settings: InspectSettings) -> None:
    """steer's flags: a pair, a finite coefficient, tokens to write, a temperature; refused beside another analysis."""
    defaults = {flag.name: flag.default for flag in fields(InspectSettings)}
    given = [f"--{name}" for name in ("steer", "layer", "coeff", "tokens", "temperature")
             if getattr(settings, name) != defaults[name]]
    if settings.analysis != "steer":
        if given:
            raise InputError(f"{', '.join(given)}: steer's flags; {settings.analysis} takes none: drop them")
        return
    if len(settings.steer) != 2:
        raise InputError(f"--steer takes the contrast pair, two texts POSITIVE NEGATIVE (--steer Love Hate); got "
                         f"{len(settings.steer)}")
    if not math.isfinite(settings.coeff):
        raise InputError(f"--coeff {settings.coeff} must be a finite number (0: no steering)")
    if settings.tokens < 1:
        raise InputError(f"--tokens {settings.tokens}: give the number of new tokens to write, 1 or more")
    if not (settings.temperature >= 0 and math.isfinite(settings.temperature)):
        raise InputError(f"--temperature {settings.temperature}: give 0 (greedy) or more")


def _check_run(loaded: Loaded, settings: InspectSettings) -> None:
    """What the loaded run allows, checked before the analysis runs."""
    if not hook_points(loaded.model):
        raise InputError(f"{settings.run} is a {loaded.family} run: it has no attention and no Transformer stack, so "
                         "attnkit inspect has nothing to read in it; inspect reads decoders, encoders, "
                         "encoder-decoders and the recurrent seq2seq with attention (attention=bahdanau or luong-*); "
                         "for this run, attnkit eval measures its loss and attnkit generate samples from it")
    if settings.by_position and loaded.translates:
        function = "attribution.attribute_heads" if settings.analysis == "attribute" else "patching.patch_heads"
        raise InputError("--by-position patches each head at each position of one sequence; a translation's heads "
                         f"read two of different lengths: drop it (attnkit.inspect.{function}(..., by_position=True) "
                         "returns them in Python)")
    if settings.analysis == "head-types" and not loaded.translates and (settings.text or settings.input):
        raise InputError("head-types scores a one-sequence model's heads on repeated random tokens (--seed draws "
                         "them), not on given texts: drop --text / --input (a translation run alone is scored on its "
                         "sentence pairs)")


def _texts(settings: InspectSettings) -> list[str]:
    texts = (list(settings.text) if settings.text else
             read_lines(settings.input, errors=settings.encoding_errors) if settings.input else [])
    texts = [t for t in texts if t.strip()]
    if not texts and (settings.text or settings.input):
        raise InputError("every text given is empty; give at least one non-empty text")
    return texts


def _one_text(settings: InspectSettings) -> str:
    """The one text an analysis that reads one answer runs on; InputError for several (one would be read unsaid)."""
    texts = _texts(settings)
    if len(texts) > 1:
        raise InputError(f"{settings.analysis} reads one text, and {len(texts)} were given: give one --text (or an "
                         "--input of one line), and run once per text")
    return texts[0]


# how a text becomes a batch, per family ---------------------------------------------------------------------------
def text_batch(loaded: Loaded, text: str, *, prompt: bool = False) -> Batch:
    """One text as the run's family reads it and is scored (module docstring). A decoder is scored on each next token
    of the text; as a `prompt` (the analyses that read the model's answer: logit-lens, dla, the patchings) it reads
    the whole text, and its answer is the token after it, as TransformerLens reads a prompt. Each text is framed as
    the model learned to read one (`text_frame`: a converted Llama's after BOS, as it generates; a converted tagger's
    as its own tokenizer frames it). Raises InputError for a text longer than the run reads (nothing is cut off
    unsaid), or of no token (`encode_some`: its marks alone would be read)."""
    tokenizer = loaded.tokenizer
    if loaded.translates:
        source, target = _pair(loaded, text)
        return seq2seq_batch(loaded.tensor(source), loaded.tensor(target))
    if loaded.stack is None:
        raise InputError(f"attnkit inspect reads Transformer runs and the recurrent seq2seq with attention; this run "
                         f"is a {loaded.family} (it has no attention to inspect)")
    ids = encode_some(tokenizer, text, "the text")  # refused before framing: marks alone are no text
    before, after = text_frame(loaded.model, tokenizer, loaded.frame)
    if text_layout(loaded.model) == "stream":
        if not prompt:
            _check_length(loaded, text, len(ids), loaded.max_len + 1 - len(before), "the last token only predicted")
            return lm_batch(loaded.tensor([*before, *ids]))
        if not ids:
            raise InputError(f"the text {_shown(text)} becomes no tokens, and a prompt needs at least 1 token (the "
                             "answer is read after it): give a longer text")
        _check_length(loaded, text, len(ids), loaded.max_len - len(before), "after BOS" if before else "")
        return Batch((loaded.tensor([*before, *ids]),))  # no targets: the analysis reads the answer from the logits
    _check_length(loaded, text, len(ids), loaded.max_len - len(before) - len(after), "with its start and end marks")
    ids = [*before, *ids, *after]
    if not hasattr(loaded.model, "lm_head"):
        return Batch((loaded.tensor(ids),))  # no targets: KL from the model's own output
    masked, labels = list(ids), [-100] * len(ids)
    for position in range(len(before), len(ids) - len(after), MASK_EVERY):  # the text's tokens, not its marks
        labels[position], masked[position] = ids[position], require_id(tokenizer, "mask")
    return Batch((loaded.tensor(masked),), loaded.tensor(labels))


def _pair(loaded: Loaded, text: str, *, written: list[int] | None = None) -> tuple[list[int], list[int]]:
    """A SOURCE<TAB>TARGET line as token ids: source + EOS, BOS + target + EOS (`translation_pair`; the target
    translated greedily when the line has none; `written`: the target's ids, for a source alone); InputError for a
    side longer than the run reads."""
    source_text, _, target_text = text.partition("\t")
    pair = translation_pair(loaded.model, loaded.tokenizer, source_text, written or target_text or None,
                            max_length=GREEDY_TOKENS, instead="give SOURCE<TAB>TARGET lines", context=loaded.max_len)
    return pair.source, pair.target


def _check_length(loaded: Loaded, text: str, tokens: int, room: int, how: str = "") -> None:
    """InputError for a text of more `tokens` than the `room` the run's max_seq_len leaves it (`how`: for what)."""
    if tokens > room:
        raise InputError(f"the text {_shown(text)} is {tokens} tokens, more than the {room} this run reads "
                         f"(max_seq_len {loaded.max_len}{', ' + how if how else ''}): shorten it, or split it in two")


def _shown(text: str) -> str:
    """A text as an error message quotes it: its start."""
    return repr(text if len(text) <= 40 else f"{text[:37]}...")


def _placeholders(tokenizer: Tokenizer) -> set[int]:
    """The vocabulary's placeholder ids, held for later use and never written by text (BERT's `[unused0]`..., Gemma's
    `<unused0>`...), though their tokenizers do not mark them special: no random 'text' token of head-types."""
    pieces = tokenizer.pieces(range(tokenizer.vocab_size))
    return {i for i, piece in enumerate(pieces) if PLACEHOLDER.fullmatch(piece)}


def _labels(tokenizer: Tokenizer, ids) -> list[str]:
    return [piece.replace("\n", "\\n") for piece in tokenizer.pieces([int(i) for i in ids])]


def _output_names(loaded: Loaded, ids) -> list[str]:
    """What the model's outputs `ids` stand for: a classifier's or tagger's class names, else tokens."""
    if not hasattr(loaded.model, "classifier"):
        return _labels(loaded.tokenizer, ids)
    names = loaded.labels or []
    return [names[int(i)] if int(i) < len(names) else f"class {int(i)}" for i in ids]


# the analyses -----------------------------------------------------------------------------------------------------
def _heads(loaded: Loaded, settings: InspectSettings):
    found = head_importance(loaded.model, [text_batch(loaded, t) for t in _texts(settings)],
                            ablation=settings.ablation, seed=settings.seed)
    what = "loss change" if found.metric == "loss" else "KL from the model's output"
    figure = heatmap(found.scores, title=f"head importance ({settings.ablation} ablation)", rows=found.sites,
                     columns=[str(h) for h in range(found.scores.shape[1])], xlabel="head", colorbar=what,
                     centered=True)
    summary = {"metric": what, "ablation": settings.ablation, "baseline": round(found.baseline, 4),
               "texts": len(_texts(settings)),
               "most important": ", ".join(f"{s} head {h} ({v:+.3f})" for s, h, v in found.top(3))}
    return "Head importance", found.rows(), summary, figure


def _head_types(loaded: Loaded, settings: InspectSettings):
    tokenizer = loaded.tokenizer
    separators = [i for i in {tokenizer.eos_id, tokenizer.sep_id, tokenizer.cls_id, tokenizer.bos_id} if i is not None]
    if loaded.translates:
        texts = _texts(settings)
        if not texts:
            raise InputError("a translation run's heads are scored on its sentence pairs: give --text or --input")
        runs = [head_types(loaded.model, *text_batch(loaded, t).args, separators=separators) for t in texts]
        found = HeadTypes.typed(runs[0].sites, {k: torch.stack([r.scores[k] for r in runs]).nanmean(0)
                                                for k in runs[0].scores})
        where = f"{len(texts)} sentence pairs"
    else:
        generator = torch.Generator().manual_seed(settings.seed)
        frame = text_frame(loaded.model, tokenizer, loaded.frame)  # as the model reads a text: CLS ... SEP, BOS
        # the random tokens are text, none of them a mark: every special token left out (a converted tokenizer's too)
        vocabulary = sorted(set(range(tokenizer.vocab_size)) - tokenizer.special_ids - {*frame[0], *frame[1]}
                            - _placeholders(tokenizer))
        periods = repeat_periods(min(20, (loaded.max_len - len(frame[0]) - len(frame[1])) // 2))
        found = repeat_types(loaded.model, vocabulary, periods=periods, batch=16, generator=generator,
                             separators=separators, frame=frame)
        marks = " ".join([*_labels(tokenizer, frame[0]), "...", *_labels(tokenizer, frame[1])])
        where = (f"16 random sequences of {', '.join(map(str, periods))} tokens, each repeated"
                 f"{f' and framed {marks}' if any(frame) else ''} (duplicate and induction: a head's lowest score "
                 "over those periods)")
        if frame[0] and not frame[0][1:] and not frame[1]:
            where += (f"; separator not scored: the only mark, {marks.split()[0]}, is the first token, whose weight "
                      "first scores")
    shown = [k for k, v in found.scores.items() if not bool(v.isnan().all())]
    figure = Figure(figsize=(3.2 * len(shown) + 1, 1.6 + 0.35 * len(found.sites)))
    crossing = f"; a cross-attention head monotonic from {MONOTONIC}" if "monotonic" in shown else ""
    figure.suptitle("each score: the share of a head's attention on that type's keys (1: all of it); a head is "
                    f"typed by its highest score of 0.4 or more{crossing}", fontsize=9)
    for index, kind in enumerate(shown):
        heatmap(found.scores[kind], title=kind, rows=found.sites if index == 0 else [""] * len(found.sites),
                columns=[str(h) for h in range(found.scores[kind].shape[1])], xlabel="head", colorbar="score",
                share=True, ax=figure.add_subplot(1, len(shown), index + 1))
    rows = found.rows()
    return "Head types", rows, {"inputs": where, "types": ", ".join(shown)}, figure


def _logit_lens(loaded: Loaded, settings: InspectSettings):
    batch = text_batch(loaded, _one_text(settings), prompt=True)
    lens = logit_lens(loaded.model, *batch.args)
    rows, figure = _lens_report(loaded, batch, lens, "logit lens")
    final = _labels(loaded.tokenizer, lens.answer[0])
    return "Logit lens", rows, {"text": _one_text(settings), "final predictions": " ".join(final)}, figure


def _lens_report(loaded: Loaded, batch: Batch, lens: LogitLens, name: str, divergences: dict | None = None,
                 scored_on: str = ""):
    """Rows and picture of a lens's reading of one text: each layer's probability of the final prediction and its top
    token per position; `divergences` ({lens name: (L + 1,) KL}) adds a panel of each layer's KL from the final
    distribution above it, its title saying what they were scored on (`scored_on`: "2 held-out texts")."""
    inputs = batch.args[-1][0]  # the stream's own tokens (a translation's target side)
    tokens = _labels(loaded.tokenizer, inputs)
    probabilities, ranks, top = lens.probabilities()[:, 0], lens.ranks()[:, 0], lens.top(1)[:, :, 0]
    layers = [layer.rpartition("blocks.")[2].replace(".resid_pre", " in").replace(".resid_post", " out")
              for layer in lens.layers]
    spans = position_spans(len(tokens))  # a long text: panels of WRAP positions, one under another
    above = 0 if divergences is None else 1
    heights = [3.0] * above + [1.3 + 0.6 * len(layers)] * len(spans)
    figure = Figure(figsize=(max(6.5, 2.7 + 0.55 * len(spans[0])), sum(heights) + 0.7))
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    if divergences is not None:
        ax = figure.add_subplot(grid[0])
        for label, values in divergences.items():
            ax.plot(range(len(layers)), values.tolist(), marker="o", label=label)
        ax.set_xticks(range(len(layers)), layers, fontsize=7)
        ax.set(xlabel="layer (its stream read)", ylabel="KL from the final (nats/token)",
               title=f"each layer's KL from the model's final distribution\non {scored_on}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    for index, span in enumerate(spans):  # rows of two lines: the probability, and under it the layer's top token
        ax = figure.add_subplot(grid[above + index])
        heatmap(probabilities[:, span.start:span.stop], rows=layers, columns=[readable(tokens[t]) for t in span],
                title="" if index else f"{name}: probability of the final prediction\n(below it: the layer's top "
                "token)", xlabel=f"{_span_label(span, len(tokens))} (its token)", colorbar="probability", share=True,
                ax=ax)
        for layer in range(len(layers)):
            for column, token in enumerate(_labels(loaded.tokenizer, top[layer, span.start:span.stop])):
                dark = float(probabilities[layer, span.start + column]) < 0.5  # the heatmap's rule for its numbers
                ax.text(column, layer + 0.3, readable(token), ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    rows = [{"layer": layers[i], "position": t, "token": tokens[t],
             "top": _labels(loaded.tokenizer, [top[i, t]])[0], "rank of final": int(ranks[i, t]),
             "p(final)": round(float(probabilities[i, t]), 4)}
            for i in range(len(layers)) for t in range(len(tokens))]
    return rows, figure


def _tuned_lens(loaded: Loaded, settings: InspectSettings):
    texts = _texts(settings)
    batches = [text_batch(loaded, text, prompt=True) for text in texts]
    held_out = batches[::HELD_OUT] if len(batches) > 1 else batches  # every tenth text, the first among them
    training = [b for i, b in enumerate(batches) if i % HELD_OUT or len(batches) == 1]
    steps = PAPER_STEPS if settings.steps is None else settings.steps
    if settings.lens is not None:
        lens = load_tuned_lens(settings.lens, loaded.model)
        how = f"read from {settings.lens}"
    else:
        lens = train_tuned_lens(loaded.model, training, steps=steps,
                                generator=torch.Generator().manual_seed(settings.seed))
        how = f"trained {steps} steps on {len(training)} texts"
    divergences = {"logit lens": lens_divergences(loaded.model, held_out),
                   "tuned lens": lens_divergences(loaded.model, held_out, lens)}
    # KL >= 0: a rounding error below 0 (or a -0.0, which max(-0.0, 0.0) keeps) reads 0.0
    kl = {name: [round(float(v), 4) if float(v) > 0 else 0.0 for v in values] for name, values in divergences.items()}
    scored_on = (f"{len(held_out)} held-out texts" if len(batches) > 1 else
                 "the one text it was trained on (none held out)")
    saved = None
    if settings.lens is None:
        saved = save_tuned_lens(lens, _out_dir(settings) / "tuned-lens", record={
            "steps": steps, "texts": len(training), "KL": kl, "KL scored on": scored_on})
    rows, figure = _lens_report(loaded, batches[0], tuned_lens(loaded.model, lens, *batches[0].args), "tuned lens",
                                divergences, scored_on)
    scored = (f"{len(held_out)} held-out texts (every {HELD_OUT}th, not trained on)" if len(batches) > 1 else
              "the one text it was trained on (give more texts, --input, for a held-out score)")
    summary = {"text": texts[0], "lens": how, "KL scored on": scored,
               **{f"KL {name} (nats/token, per layer)": ", ".join(map(str, v)) for name, v in kl.items()},
               **({"saved": str(saved)} if saved else {})}
    return "Tuned lens", rows, summary, figure


@dataclass(frozen=True)
class PatchPair:
    """A clean and a corrupted input and what patching reads: the position (-1 for a sequence classifier), the
    clean answer and the wrong one (the corrupted run's, or the clean run's runner-up)."""

    clean: Batch
    corrupted: Batch
    position: int
    answer: int
    wrong: int
    sequence: bool  # a sequence classifier: one label per text, no position

    @property
    def target(self) -> dict:
        return {"answer": self.answer, "wrong": self.wrong, "position": self.position}


def pair_of(loaded: Loaded, settings: InspectSettings) -> PatchPair:
    """The clean text and its corruption (`--corrupt`) as the patching analyses read them, with the answer position
    and the clean and wrong answers."""
    clean = text_batch(loaded, _one_text(settings), prompt=True)
    if loaded.translates and "\t" not in settings.corrupt:  # a corrupted source is read under the clean run's
        # target, given or its own translation: the corruption changes the source alone, not what the decoder reads
        corrupted = seq2seq_batch(*map(loaded.tensor, _pair(loaded, settings.corrupt,
                                                            written=clean.args[1][0, 1:].tolist())))  # BOS dropped
    else:
        corrupted = text_batch(loaded, settings.corrupt, prompt=True)
    if [a.shape for a in clean.args] != [a.shape for a in corrupted.args]:
        sides = " (source + target)" if len(clean.args) > 1 else ""  # a translation: both sides must match
        raise InputError(f"--text and --corrupt become {' + '.join(str(a.shape[1]) for a in clean.args)} and "
                         f"{' + '.join(str(a.shape[1]) for a in corrupted.args)} tokens{sides}; patching needs as "
                         "many: substitute tokens rather than add or drop them")
    with torch.no_grad():
        clean_logits = clean.logits(loaded.model(*clean.args))[0]  # (T, V); a sequence classifier's (C,)
        corrupted_logits = corrupted.logits(loaded.model(*corrupted.args))[0]
    sequence = clean_logits.dim() == 1  # one label per text: no position to choose
    given = _given_outputs(loaded, settings)
    position = -1 if sequence else _patched_position(loaded, settings, given, clean, clean_logits, corrupted_logits)
    clean_at, corrupted_at = (clean_logits, corrupted_logits) if sequence else (clean_logits[position],
                                                                                corrupted_logits[position])
    answer, wrong = _answer_ids(loaded, settings, given, clean_at, corrupted_at)
    return PatchPair(clean, corrupted, position, answer, wrong, sequence)


Given = tuple[int | None, int | None]  # the output ids --answer and --wrong name, None where not given


def _answer_ids(loaded: Loaded, settings: InspectSettings, given: Given, logits: Tensor,
                against: Tensor | None = None) -> tuple[int, int]:
    """(answer, wrong): the output ids whose logit difference is read at `logits` (V,): --answer, else the model's
    top; --wrong, else `against`'s top (the corrupted run's) or, where that is the answer, the runner-up (`given`:
    `_given_outputs`). Raises InputError where --answer and --wrong (or --wrong and the model's top) are one output: a
    difference of 0."""
    answer, wrong = _named_ids(given, logits, against)
    if wrong == answer:
        top = int(logits.argmax())
        which = f"--answer {settings.answer!r}" if settings.answer is not None else "the model's top answer here"
        same, best = _output_names(loaded, [answer, top])
        raise InputError(f"--wrong {settings.wrong!r} is the same output as {which} ({same!r}), so their logit "
                         f"difference is 0: give --wrong another output (the model's top answer here is {best!r})")
    return answer, wrong


def _named_ids(given: Given, logits: Tensor, against: Tensor | None = None) -> tuple[int, int]:
    """`_answer_ids` unchecked: the two may be one output only where --wrong is given."""
    top = logits.topk(2).indices
    answer, wrong = given
    answer = int(top[0]) if answer is None else answer
    if wrong is None:
        wrong = int(against.argmax()) if against is not None else answer
        if wrong == answer:
            wrong = int(top[1] if top[0] == answer else top[0])
    return answer, wrong


def _given_outputs(loaded: Loaded, settings: InspectSettings) -> Given:
    """The output ids --answer and --wrong name (None where not given), read once for every position weighed."""
    return _given_output(loaded, settings.answer, "--answer"), _given_output(loaded, settings.wrong, "--wrong")


def _given_output(loaded: Loaded, text: str | None, option: str) -> int | None:
    """The output id --answer or --wrong names: one token of the text (a classifier's or tagger's label by name);
    None when not given. Raises InputError for a text of more or fewer tokens than one, a text the vocabulary holds
    only as its unknown token, or a label the run has not."""
    if text is None:
        return None
    if hasattr(loaded.model, "classifier"):
        names = loaded.labels or [f"class {i}" for i in range(loaded.model.classifier.out_features)]
        if text not in names:
            raise InputError(f"{option} {text!r} is none of this run's labels: {', '.join(names)}")
        return names.index(text)
    ids = loaded.tokenizer.encode(text)
    if len(ids) != 1:
        pieces = ", ".join(map(repr, _labels(loaded.tokenizer, ids)))
        raise InputError(f"{option} {text!r} becomes {len(ids)} tokens ({pieces}); an answer is one token: give one "
                         "(with its leading space where the tokenizer writes one into a word)")
    unknown = loaded.tokenizer.unk_id
    if ids[0] == unknown and text != (piece := _labels(loaded.tokenizer, ids)[0]):  # the logit read would be <unk>'s
        raise InputError(f"{option} {text!r} is not in this run's vocabulary: its tokenizer reads it as the unknown "
                         f"token {piece!r}; give a token the vocabulary holds")
    return ids[0]


def _patch(loaded: Loaded, settings: InspectSettings):
    pair = pair_of(loaded, settings)
    writers = any(name.endswith(".mlp.out") for name in hook_points(loaded.model))  # a Transformer's blocks
    stream = patch_stream(loaded.model, pair.clean, pair.corrupted, **pair.target,  # per block: input, attention, FFN
                          point=("resid_pre", "attn.out", "mlp.out") if writers else "resid_pre")
    point = settings.point or "z"
    heads = patch_heads(loaded.model, pair.clean, pair.corrupted, **pair.target, point=point)
    by_position = (patch_heads(loaded.model, pair.clean, pair.corrupted, **pair.target, by_position=True, point=point)
                   if settings.by_position else None)
    rows, summary, figure = _patching_report(loaded, settings, pair, stream, heads, "patched", by_position)
    return "Activation patching", rows, summary, figure


def _path_patch(loaded: Loaded, settings: InspectSettings):
    senders = [_head_of(text, "--sender") for text in settings.sender]
    if len({site for site, _ in senders}) > 1:
        raise InputError(f"--sender heads are patched together from one sublayer; these are of "
                         f"{', '.join(dict.fromkeys(site for site, _ in senders))}: run once per sublayer")
    site, heads = senders[0][0], list(dict.fromkeys(head for _, head in senders))
    receiver = _head_of(settings.receiver, "--receiver")
    pair = pair_of(loaded, settings)

    def metric(logits: Tensor) -> float:
        return logit_difference(logits, pair.answer, pair.wrong, pair.position)

    paths = [heads] + ([[head] for head in heads] if len(heads) > 1 else [])  # the senders together, then each alone
    found = [path_patch(loaded.model, pair.clean, pair.corrupted, sender=(site, p), receiver=receiver,
                        via=settings.via, metric=metric) for p in paths]
    rows = [{"path": f"{site} head{'s' * (len(p) > 1)} {', '.join(map(str, p))} -> {receiver[0]} head {receiver[1]} "
                     f"({settings.via})", "restored": round(f.restored, 4),
             "logit difference patched": round(f.patched, 6)} for p, f in zip(paths, found, strict=True)]
    first = found[0]
    figure = Figure(figsize=(10, 1.4 + 0.4 * len(rows)))
    ax = figure.add_subplot(1, 1, 1)
    shares = [r["restored"] for r in rows][::-1]
    bars = ax.barh([r["path"] for r in rows][::-1], shares, color="#1d4ed8")
    ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.axvline(0, color="#6b7385", linewidth=0.8)
    ax.axvline(1, color="#6b7385", linewidth=0.8, linestyle=":")  # the whole logit difference restored
    low, high = min(0.0, *shares), max(1.0, *shares)  # 0 and 1 in view: a share is read against the whole
    ax.set_xlim(low - 0.15 * (high - low), high + 0.15 * (high - low))
    ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.set(xlabel="share of the logit difference restored (1: all of it)", title="path patching (Wang et al. 2022)")
    summary = {**_pair_summary(loaded, settings, pair, first.clean, first.corrupted),
               "notes": "; ".join(first.notes) or "none"}
    warning = faint_warning(first.clean, first.corrupted)
    if warning:
        log.warning("%s", warning)
        summary["warning"] = warning
    return "Path patching", rows, summary, figure


def _head_of(text: str, option: str) -> tuple[str, int]:
    """LAYER.HEAD (a one-stack model's `blocks.LAYER.attn`) or SITE.HEAD -> (site, head)."""
    site, _, head = text.rpartition(".")
    if not site or not head.isdigit():
        raise InputError(f"{option} {text!r} is not a head: give LAYER.HEAD (1.3) or SITE.HEAD "
                         "(decoder.blocks.0.cross_attn.3)")
    return (f"blocks.{site}.attn" if site.isdigit() else site), int(head)


def _attribute(loaded: Loaded, settings: InspectSettings):
    pair = pair_of(loaded, settings)
    steps = {"steps": settings.path_steps}
    point = settings.point or "z"
    stream = attribute_stream(loaded.model, pair.clean, pair.corrupted, **pair.target, **steps)
    heads = attribute_heads(loaded.model, pair.clean, pair.corrupted, **pair.target, **steps, point=point)
    by_position = (attribute_heads(loaded.model, pair.clean, pair.corrupted, **pair.target, **steps, point=point,
                                   by_position=True) if settings.by_position else None)
    sublayers = attribute_sublayers(loaded.model, pair.clean, pair.corrupted, **pair.target, **steps)
    rows, summary, figure = _patching_report(loaded, settings, pair, stream, heads, "estimated", by_position)
    source, target = (_labels(loaded.tokenizer, pair.clean.args[side][0]) for side in (0, -1))  # one, but a translation
    for i, name in enumerate(sublayers.rows):
        tokens = source if name.startswith("encoder.") else target  # the positions of the stack the sublayer is in
        rows += [{"patched": f"{name} position {t} ({token})", "restored": round(float(sublayers.restored[i, t]), 4)}
                 for t, token in enumerate(tokens)]
    summary["method"] = ("attribution patching (Nanda 2023): (clean - corrupted activation) . gradient at the "
                         "corrupted run" if settings.path_steps == 1 else
                         f"attribution patching, the gradient integrated over {settings.path_steps} steps of the "
                         "path from the corrupted to the clean activation (Marks et al. 2024)")
    return "Attribution patching", rows, summary, figure


def _patching_report(loaded: Loaded, settings: InspectSettings, pair: PatchPair, stream, heads, verb: str,
                     by_position: Patching | None = None):
    """Rows, summary and picture of a stream (layer x position) and a head table of shares restored; `by_position`:
    each head at each position alone, (sites, T, H), as a (site head) x position table under the stream's."""
    tokens = _labels(loaded.tokenizer, pair.clean.args[0][0])
    what = "stream, attention and FFN outputs" if any(row.endswith(".mlp") for row in stream.rows) else "stream"
    named = [f"{row} in" if row.rpartition(".")[2].isdigit() else row for row in stream.rows]  # blocks.1: its input
    tables = [(named, stream.restored, f"{what} {verb} (layer x position)")]  # (row names, (rows, T), title)
    point = settings.point or "z"
    sites = [site if point == "z" else f"{site}.{point}" for site in heads.rows]  # blocks.1.attn.q: its queries
    if by_position is not None:
        per_head = by_position.restored.permute(0, 2, 1).flatten(0, 1)  # (sites, T, H) -> (sites * H, T)
        names = [f"{site} head {h}" for site in sites for h in range(by_position.restored.shape[2])]
        kept = [i for i, row in enumerate(per_head) if not bool(row.isnan().all())]  # a site's heads, not padding
        where = "position" if point in ("z", "k", "v") else "query position"
        tables.append(([names[i] for i in kept], per_head[kept],
                       f"each head's {HEAD_POINTS[point]} {verb} at each {where} alone"))
    spans = position_spans(stream.restored.shape[1])  # a long text: panels of WRAP positions, one under another
    panels = [(table, span) for table in tables for span in spans]
    widths = [max(4.0, CELL_WIDTH * len(spans[0]) + 2.5), CELL_WIDTH * heads.restored.shape[1] + 3.5]
    heights = [1.2 + 0.4 * len(table[0]) for table, _ in panels]
    figure = Figure(figsize=(sum(widths), max(sum(heights), 1.5 + 0.4 * len(heads.rows))))
    grid = figure.add_gridspec(len(panels), 2, width_ratios=widths, height_ratios=heights)  # cells fit their numbers
    for index, ((names, values, title), span) in enumerate(panels):
        heatmap(values[:, span.start:span.stop], title=title if span.start == 0 else "", rows=names,
                columns=[readable(tokens[t]) for t in span], xlabel=_span_label(span, len(tokens)),
                colorbar="share restored", centered=True, bound=float(values.nan_to_num(0.0).abs().max()) or 1.0,
                ax=figure.add_subplot(grid[index, 0]))  # one scale over a table's panels
    need = 1.5 + 0.4 * len(heads.rows)  # the head table beside the first panels it needs, not stretched down them all
    beside = next((i + 1 for i in range(len(heights)) if sum(heights[:i + 1]) >= need), len(heights))
    heatmap(heads.restored, title=f"head {HEAD_POINTS[point]} {verb}", rows=sites,
            columns=[str(h) for h in range(heads.restored.shape[1])], xlabel="head", colorbar="share restored",
            centered=True, ax=figure.add_subplot(grid[:beside, 1]))
    rows = [{"patched": f"{name} position {t} ({tokens[t]})", "restored": round(float(values[i, t]), 4)}
            for names, values, _ in tables for i, name in enumerate(names) for t in range(len(tokens))]
    rows += [{"patched": f"{name} head {h}", "restored": round(float(heads.restored[i, h]), 4)}
             for i, name in enumerate(sites) for h in range(heads.restored.shape[1])
             if not math.isnan(float(heads.restored[i, h]))]
    summary = {**_pair_summary(loaded, settings, pair, stream.clean, stream.corrupted),
               "heads": f"{point}: each head's {HEAD_POINTS[point]}"}
    if stream.warning:
        log.warning("%s", stream.warning)
        summary["warning"] = stream.warning
    return rows, summary, figure


def _span_label(span: range, length: int) -> str:
    """A panel's x label: "position", or which positions it shows where a long text is cut into panels."""
    return "position" if len(span) == length else f"positions {span.start}-{span.stop - 1} of {length}"


def _pair_summary(loaded: Loaded, settings: InspectSettings, pair: PatchPair, clean: float, corrupted: float) -> dict:
    """The texts, where the answer is read, the answer and the wrong one, and both runs' logit differences."""
    answer, wrong = _output_names(loaded, [pair.answer, pair.wrong])
    return {"clean": _one_text(settings), "corrupted": settings.corrupt,
            "position": "the pooled sequence" if pair.sequence else pair.position, "answer": answer, "wrong": wrong,
            "logit difference clean": round(clean, 6), "logit difference corrupted": round(corrupted, 6)}


def _dla(loaded: Loaded, settings: InspectSettings):
    text = _one_text(settings)
    batch = text_batch(loaded, text, prompt=True)
    with torch.no_grad():
        logits = batch.logits(loaded.model(*batch.args, **batch.kwargs))[0]  # (T, V); a sequence classifier's (C,)
    sequence = logits.dim() == 1
    position = -1 if sequence else _read_position(loaded, batch, settings.position, logits.shape[0])
    answer, wrong = _answer_ids(loaded, settings, _given_outputs(loaded, settings),
                                logits if sequence else logits[position])  # unless given: the answer and its runner-up
    found = logit_attribution(loaded.model, *batch.args, answer=answer, wrong=wrong, position=position, neurons=True,
                              positions=True, **batch.kwargs)
    sites, table = found.heads()
    others = [(name, float(value)) for name, value in zip(found.names, found.values.mean(1), strict=True)
              if " head " not in name]
    figure = Figure(figsize=(3.0 + 0.6 * table.shape[1] + 5.0, 1.5 + 0.35 * max(len(sites), len(others))))
    heatmap(table, title="heads' direct shares", rows=sites, columns=[str(h) for h in range(table.shape[1])],
            xlabel="head", colorbar="logit difference", centered=True, ax=figure.add_subplot(1, 2, 1))
    ax = figure.add_subplot(1, 2, 2)
    ax.barh(range(len(others)), [v for _, v in others], color=["tab:blue" if v >= 0 else "tab:red" for _, v in others])
    ax.set_yticks(range(len(others)), [n for n, _ in others], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.set(title="other writers' direct shares", xlabel="logit difference")
    neurons = sorted(((f"{layer} neuron {n}", float(v)) for layer, values in found.neurons.items()
                      for n, v in enumerate(values.mean(0))), key=lambda item: -abs(item[1]))[:5]
    answer_name, wrong_name = _output_names(loaded, [answer, wrong])
    tokens = _labels(loaded.tokenizer, batch.args[-1][0])
    summary = {"text": text, "position": "the pooled sequence" if sequence else f"{position % len(tokens)} "
               f"({tokens[position]})", "answer": answer_name,
               "runner-up" if settings.answer is None and settings.wrong is None else "wrong": wrong_name,
               "logit difference": round(float(found.total.mean()), 6),
               "sum of the shares": round(float(found.values.sum(0).mean()), 6),
               "largest shares": ", ".join(f"{n} ({v:+.3f})" for n, v in found.top(3)),
               "largest neurons": ", ".join(f"{n} ({v:+.3f})" for n, v in neurons)}
    return "Direct logit attribution", found.rows(), summary, figure


def _read_position(loaded: Loaded, batch: Batch, position: int | None, length: int) -> int:
    """The position whose answer `dla` attributes: --position; else a decoder's or a translation's last, a masked
    LM's first masked token, another encoder's last text token (before [SEP])."""
    if position is not None:
        if not -length <= position < length:
            raise InputError(f"--position {position} is out of range: the text has {length} positions "
                             f"(0..{length - 1}, or -{length}..-1 from the end)")
        return position
    if loaded.causal or loaded.translates:
        return length - 1
    if batch.labels is not None and bool((batch.labels[0] != -100).any()):
        return int((batch.labels[0] != -100).nonzero()[0, 0])
    return max(length - 2, 0)


def _patched_position(loaded: Loaded, settings: InspectSettings, given: Given, batch: Batch, clean: Tensor,
                      corrupted: Tensor) -> int:
    """Where the answer is read, clean (T, V) and corrupted (T, V) logits: --position (`_read_position`); a
    decoder's last position; otherwise the one where the corruption moves most the logit difference --answer and
    --wrong name (`given`), or with neither given the output distribution (KL)."""
    if settings.position is not None or loaded.causal:
        return _read_position(loaded, batch, settings.position, clean.shape[0])
    if settings.answer is None and settings.wrong is None:
        moved = divergence(corrupted, clean)  # (T,)
    else:
        moved = torch.zeros(clean.shape[0])
        for t in range(clean.shape[0]):
            answer, wrong = _named_ids(given, clean[t], corrupted[t])  # one output: no difference here
            moved[t] = abs(float(clean[t, answer] - clean[t, wrong] - corrupted[t, answer] + corrupted[t, wrong]))
    if float(moved.max()) <= 0:
        what = "none of the model's outputs" if settings.answer is None and settings.wrong is None else (
            "the logit difference --answer and --wrong name at any position")
        raise InputError(f"the corruption changes {what}; substitute the tokens that matter")
    return int(moved.argmax())


def _probe(loaded: Loaded, settings: InspectSettings):
    sentences = read_tagged(settings.conll, column=settings.column, encoding_errors=settings.encoding_errors)
    results = probe_layers(loaded.model, loaded.tokenizer, sentences, max_len=loaded.max_len, seed=settings.seed,
                           word_pieces=loaded.word_pieces, frame=loaded.frame)  # words read as a tagger was trained
    figure = Figure(figsize=(1.5 + 0.7 * len(results), 3.6))
    ax = figure.add_subplot()
    layers = [r.layer.replace(".resid_pre", " in").replace(".resid_post", " out") for r in results]
    for key, label in (("accuracy", "probe"), ("control_accuracy", "control task"), ("selectivity", "selectivity")):
        ax.plot(range(len(results)), [getattr(r, key) for r in results], marker="o", label=label)
    ax.axhline(results[0].majority, color="grey", linestyle=":", label="majority label")
    ax.axhline(results[0].control_majority, color="tab:orange", linestyle=":", label="control task's majority")
    ax.set_xticks(range(len(results)), layers, fontsize=7, rotation=30)
    labels = settings.column if is_conllu(settings.conll) else "labels"  # CoNLL: the last column
    ax.set(title=f"linear probes: {labels} of {Path(settings.conll).name}", ylabel="held-out accuracy",
           ylim=(0, 1))
    ax.legend(fontsize=7)
    summary = {"file": settings.conll, "sentences": len(sentences), "best layer": max(results,
               key=lambda r: r.selectivity).layer,
               "read at": f"each word's {reading_piece(loaded.model)} piece",
               "majority": round(results[0].majority, 4), "control majority": round(results[0].control_majority, 4)}
    if all(r.control_accuracy <= r.control_majority + 0.01 for r in results):
        summary["warning"] = (f"the control probe does no better than always answering the control task's commonest "
                              f"label ({results[0].control_majority:.3f}), so selectivity compares with that baseline, "
                              "not with memorised words; read each accuracy against its majority")
    return "Linear probes", [r.row() for r in results], summary, figure


def _out_dir(settings: InspectSettings) -> Path:
    return Path(settings.out) if settings.out else Path(settings.run) / "inspect"


def _circuits(loaded: Loaded, settings: InspectSettings):
    found = composition_scores(loaded.model)
    senders = list(dict.fromkeys((r["sender"], r["sender head"]) for r in sorted(
        found.rows, key=lambda r: (head_sites(loaded.model).index(r["sender"]), r["sender head"]))))
    receivers = list(dict.fromkeys((r["receiver"], r["receiver head"]) for r in sorted(
        found.rows, key=lambda r: (head_sites(loaded.model).index(r["receiver"]), r["receiver head"]))))

    def names(heads: list[tuple[str, int]]) -> list[str]:
        return [f"{site.replace('blocks.', '')} {h}" for site, h in heads]

    figure = Figure(figsize=(3 * (2 + 0.45 * len(receivers)) + 4, 2 + 0.3 * len(senders)))
    for index, kind in enumerate("qkv"):
        table = torch.full((len(senders), len(receivers)), float("nan"))  # (sender heads, receiver heads)
        for row in found.top(len(found.rows), kind):
            table[senders.index((row["sender"], row["sender head"])),
                  receivers.index((row["receiver"], row["receiver head"]))] = row["score"]
        heatmap(table, title=f"{kind.upper()}-composition", rows=names(senders) if index == 0 else [""] * len(senders),
                columns=names(receivers), xlabel="receiver", colorbar="score", share=True,  # one 0-1 scale: Q, K, V
                ax=figure.add_subplot(1, 4, index + 1))                                     # compare by colour
    ax = figure.add_subplot(1, 4, 4)
    for site in head_sites(loaded.model):
        spectra = head_weights(loaded.model, site).ov().singular_values()  # (H, D)
        for h, values in enumerate(spectra):
            ax.plot((values / values[0]).tolist(), label=f"{site} {h}", linewidth=0.8)
    ax.set(title="OV singular values\n(each head's over its largest)", xlabel="index", yscale="log")
    if len(ax.lines) <= LEGEND_LINES:  # beyond, a legend would cover the plot: the table names the heads
        ax.legend(fontsize=5)
    summary = {"strongest": ", ".join(f"{r['kind'].upper()} {r['sender']} {r['sender head']} -> {r['receiver']} "
                                      f"{r['receiver head']} ({r['score']:.3f})" for r in found.top(3)),
               "notes": "; ".join(found.notes) or "none"}
    rows = [{**row, "score": round(row["score"], 4)} for row in found.rows]
    return "Composition scores", rows, summary, figure


def _sae_batches(loaded: Loaded, texts: list[str]) -> list[Batch]:
    """A decoder's texts as one token stream cut into windows (8 per batch); other families' one text a batch."""
    if not loaded.causal:
        return [text_batch(loaded, t) for t in texts]
    ids = loaded.tokenizer.encode("\n".join(texts))
    length = min(loaded.max_len, 64) + 1
    windows = [ids[i:i + length] for i in range(0, max(1, len(ids) - 1), length)]
    windows = [w for w in windows if len(w) == length] or [ids[: loaded.max_len + 1]]
    return [lm_batch(torch.tensor(windows[i:i + 8], device=loaded.device)) for i in range(0, len(windows), 8)]


def _context(pieces: list[str]) -> str:
    """The tokens up to one, that one in brackets."""
    return "".join(pieces[:-1]) + f"[{pieces[-1]}]"


def _code_span(text: str) -> str:
    """`text` as a markdown code span shows it (a `|` is escaped by the table, `report.markdown`)."""
    return text.replace("`", "'")


def _sae(loaded: Loaded, settings: InspectSettings):
    model, point = loaded.model, settings.point
    batches = _sae_batches(loaded, _texts(settings))
    if batches[0].labels is None:  # refused before training: the SAE is judged by the loss with it spliced in
        raise InputError(f"sae scores the model's loss with the SAE spliced in, and this {loaded.family} run has no "
                         "output layer over tokens to score (a classifier): train it on a decoder, a masked LM or a "
                         "translation run")
    held = max(1, len(batches) // 10)
    train, held_out = batches[:-held] or batches, batches[-held:]
    evaluation = torch.cat(list(point_activations(model, held_out, point)))  # (N, C)
    config = SAEConfig(evaluation.shape[-1], settings.features or 4 * evaluation.shape[-1],
                       "topk" if settings.k else "standard", settings.k or None, settings.l1, point,
                       Path(settings.run).name)
    steps = SAE_STEPS if settings.steps is None else settings.steps
    sae, losses = train_sae(config, lambda: point_activations(model, train, point), steps=steps,
                            seed=settings.seed, log_every=100)
    reference = torch.cat(list(point_activations(model, train[:8], point)))
    metrics = spliced_loss(model, sae, held_out, evaluate(sae, [evaluation]), reference)
    saved = save_sae(sae, _out_dir(settings) / "sae", record={"steps": steps, **metrics.row()})
    read = [b.args[-1] if point.startswith("decoder.") else b.args[0] for b in held_out]  # the ids the point reads
    contexts = [_context(_labels(loaded.tokenizer, ids[row, max(0, t - 12): t + 1]))
                for ids in read for row in range(ids.shape[0]) for t in range(ids.shape[1])]
    found = features_in_context(sae, evaluation, contexts)
    save_features(found, saved)  # the explorer lists them (attnkit serve RUN --sae OUT/sae)
    figure = Figure(figsize=(9, 3.2))
    ax = figure.add_subplot(1, 2, 1)
    ax.plot(losses)
    ax.set(title="training loss", xlabel="step", yscale="log")
    ax = figure.add_subplot(1, 2, 2)
    frequency = (sae.encode(evaluation) > 0).float().mean(0)
    ax.hist(frequency[frequency > 0].log10().tolist(), bins=30)
    ax.set(title=f"feature frequency ({metrics.dead_share:.0%} dead)", xlabel="log10 share of tokens it fires on",
           ylabel="features")
    rows = [{"feature": f.index, "fires on": round(f.frequency, 4),
             "top contexts": " / ".join(f"`{_code_span(c)}` ({v:.2f})" for v, c in f.top)} for f in found]
    summary = {"point": point, "architecture": "TopK" if settings.k else "ReLU + L1", "features": config.d_sae,
               "activations (held out)": evaluation.shape[0], **metrics.row(), "saved": str(saved)}
    return f"Sparse autoencoder at {point}", rows, summary, figure


def _steer(loaded: Loaded, settings: InspectSettings):
    """Each --text continued without and with the steering vector, one seed for both (`inspect/steering.py`)."""
    if not loaded.causal or text_layout(loaded.model) != "stream":
        raise InputError(f"steer continues a text, which a decoder run does; this run is {loaded.family!r}")
    blocks = len(loaded.stack.blocks)
    layer = blocks // 2 if settings.layer is None else settings.layer
    if not 0 <= layer < blocks:
        raise InputError(f"--layer {layer}: the run has {blocks} block{'s' * (blocks != 1)}, so give 0..{blocks - 1} "
                         "(the input of that block is steered)")
    point = f"blocks.{layer}.resid_pre"
    pair = [text_batch(loaded, text, prompt=True).args[0] for text in settings.steer]  # (1, n) each
    if pair[0].shape[1] != pair[1].shape[1]:
        pieces = [" ".join(_labels(loaded.tokenizer, ids[0].tolist())) for ids in pair]
        raise InputError(f"--steer {settings.steer[0]!r} {settings.steer[1]!r} become {pair[0].shape[1]} and "
                         f"{pair[1].shape[1]} tokens ({pieces[0]} / {pieces[1]}); the vector is their difference "
                         "position by position: add spaces to the shorter until both are as long (Turner et al. pad "
                         "with spaces)")
    vector = contrast_vector(loaded.model, point, pair[0], pair[1])  # (n, C)
    writable = loaded.tokenizer.vocab_size  # a vocabulary padded past the tokenizer's: those ids name no text
    rows, shifts = [], []
    for text in _texts(settings):
        prompt = text_batch(loaded, text, prompt=True).args[0]  # (1, T)
        if prompt.shape[1] + settings.tokens > loaded.max_len:
            raise InputError(f"--text {_shown(text)} is {prompt.shape[1]} tokens, and with --tokens {settings.tokens} "
                             f"more than the {loaded.max_len} this run reads: give --tokens "
                             f"{max(loaded.max_len - prompt.shape[1], 1)} or a shorter text")
        written = {}
        for name, coeff in (("unsteered", 0.0), ("steered", settings.coeff)):
            generator = torch.Generator(loaded.device).manual_seed(settings.seed)  # one seed for both
            with steering(loaded.model, point, vector, coeff=coeff), torch.no_grad():
                tokens = _continued(loaded.model, prompt, tokens=settings.tokens, temperature=settings.temperature,
                                    generator=generator, writable=writable)
                last = loaded.model(prompt).logits[0, -1].float().log_softmax(-1)[:writable]  # (V',)
            written[name] = loaded.tokenizer.decode(tokens)
            shifts.append(last)
        rows.append({"prompt": text, **written})
        log.info("%s", _side_by_side(text, written, f"{settings.coeff:+g} x ({settings.steer[0]!r} - "
                                                    f"{settings.steer[1]!r}) at {point}"))
    change = torch.stack(shifts[1::2]).mean(0) - torch.stack(shifts[0::2]).mean(0)  # (V',): log p steered - unsteered
    names = _labels(loaded.tokenizer, range(change.shape[0]))
    order = change.argsort(descending=True).tolist()
    raised, lowered = order[:STEER_SHOWN], order[::-1][:STEER_SHOWN]
    figure = Figure(figsize=(6, 1 + 0.25 * 2 * STEER_SHOWN))
    ax = figure.add_subplot()
    picked = raised + lowered[::-1]
    ax.barh(range(len(picked)), [float(change[i]) for i in picked], color=["tab:green"] * len(raised) +
            ["tab:red"] * len(lowered))
    texts = len(shifts) // 2
    ax.set(yticks=range(len(picked)), yticklabels=[repr(names[i]) for i in picked],
           xlabel="log p steered - log p unsteered" + (f" (mean over the {texts} texts)" if texts > 1 else ""),
           title="\n".join(["next token after the prompt, steered by", *textwrap.wrap(
               f"{settings.coeff:+g} x ({settings.steer[0]!r} - {settings.steer[1]!r}) at {point}", 56)]))
    ax.title.set_fontsize(10)
    ax.invert_yaxis()
    summary = {"point": point, "pair": " / ".join(map(repr, settings.steer)), "coeff": settings.coeff,
               "seed": settings.seed, "temperature": settings.temperature,
               "raised most": ", ".join(f"{names[i]!r} ({float(change[i]):+.2f})" for i in raised),
               "lowered most": ", ".join(f"{names[i]!r} ({float(change[i]):+.2f})" for i in lowered)}
    return "Activation addition", rows, summary, figure


def _continued(model: nn.Module, prompt: Tensor, *, tokens: int, temperature: float, generator: torch.Generator,
               writable: int) -> list[int]:
    """`tokens` new token ids after `prompt` (1, T), decoded through the KV cache (a steered position is steered
    once), each drawn at `temperature` (0: the likeliest) from the first `writable` ids (the tokenizer's). A loop of
    its own: inspect does not import generate, its sibling (tests/test_imports.py); the steer test holds its greedy
    text equal to generate_tokens'."""
    cache = model.allocate_cache(1, prompt.shape[1] + tokens)
    ids, written = prompt, []
    for _ in range(tokens):
        logits = model(ids, cache=cache).logits[0, -1, :writable].float()  # (V',): the ids that name a text
        if temperature == 0:
            chosen = logits.argmax()
        else:  # shifted so the likeliest is 0: however small t, no inf - inf (nan) in the softmax
            scaled = (logits.double() - logits.max()) / temperature  # (V',) <= 0
            chosen = torch.multinomial(scaled.softmax(-1), 1, generator=generator)[0]
        written.append(int(chosen))
        ids = chosen.view(1, 1)  # (1, 1): the next step's input
    return written


def _side_by_side(prompt: str, written: dict[str, str], steered: str) -> str:
    """The two continuations of `prompt` as two wrapped columns, the unsteered left (line breaks written \\n)."""
    columns = [textwrap.wrap(written[name].replace("\n", "\\n"), STEER_COLUMN, drop_whitespace=False) or [""]
               for name in ("unsteered", "steered")]  # a line break shown as \n, so the columns stay side by side
    lines = [f"prompt: {prompt!r}", f"{'unsteered':<{STEER_COLUMN}} | steered: {steered}"]
    lines += [f"{left:<{STEER_COLUMN}} | {right}" for left, right in itertools.zip_longest(*columns, fillvalue="")]
    return "\n".join(lines)


ANALYSES = {"heads": _heads, "head-types": _head_types, "logit-lens": _logit_lens, "tuned-lens": _tuned_lens,
            "patch": _patch,
            "attribute": _attribute, "dla": _dla, "probe": _probe,
            "circuits": _circuits, "sae": _sae, "path-patch": _path_patch, "steer": _steer}
