"""`attnkit.load(run_dir)`: a trained (or converted) model with its tokenizer, ready for text in, text out.

    lm (decoder, recurrent-lm)                   .generate(prompts)   continue each prompt
    translate (encoder-decoder, recurrent ...)   .translate(texts)    greedy or beam search
    classify (encoder, classifier head)          .classify(texts)     a label and probabilities per text
    tag (encoder, tagger head)                   .tag(texts)          a label per word (attnkit.tasks.tag)
    mlm (encoder, masked-LM head)                .fill_mask(texts)    the likeliest tokens at each mask

A pipeline has only the method of its run's task (`attnkit.tasks`: task.json's task, else the one its model's head
is built for); the others are absent (`hasattr` is False, a call says which method fits). A task's registration
may bring the method's implementation (`TaskSpec.pipeline`), which the pipeline then serves as its own.

A run directory holds `config.json` + `model.safetensors`, `tokenizer/` and, for classifiers, `labels.json`
(`{"labels": [...]}` or a plain list: the label names, index = class id).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnkit import chat_format
from attnkit.blocks import torch_compile_mode
from attnkit.checkpoint import (
    LABELS_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    load_run_model,
    read_end_ids,
    read_labels,
    stored_dtype,
)
from attnkit.config import DecoderConfig, ModelConfig
from attnkit.data.batching import pad
from attnkit.data.chat import check_messages
from attnkit.data.labelled import frame_ids
from attnkit.data.lm import bos_first
from attnkit.errors import CheckpointError, InputError
from attnkit.generate.beam import beam_generate, translate_batched
from attnkit.generate.captured_step import CapturedDecoding
from attnkit.generate.constrained import Grammar, GrammarMask
from attnkit.generate.decoder import EagerDecoding, check_prompts, generate_tokens
from attnkit.generate.plan import InferencePlan, check_quantization, plan_inference
from attnkit.generate.quantize import QUANTIZE_FORMS
from attnkit.generate.sampling import SamplingConfig, check_sampling, choice_seed, make_generator
from attnkit.generate.seq2seq import check_max_length
from attnkit.generate.speculative import speculative_generate
from attnkit.generate.static_decode import StaticDecoding
from attnkit.layers.kv_cache import kv_bytes_per_position
from attnkit.machine import free_bytes, gib, pick_device
from attnkit.run_settings import (
    CLI_ONLY_BESIDE_BEAMS,
    CLI_ONLY_BESIDE_DRAFT,
    DRAFT_TOKENS,
    NOT_BESIDE_BEAMS,
    NOT_BESIDE_DRAFT,
    SAMPLED_BEAMS_TAKE,
    beams_asked,
    check_draft_tokens,
    check_search,
    refuse_beside_beams,
    refuse_beside_draft,
    text_list,
)
from attnkit.tasks import TaskSpec, task_of_config, task_of_run, task_record, tasks, tasks_of_family
from attnkit.tasks.common import check_outputs
from attnkit.tasks.registry import METHODS  # the task methods the pipeline defines itself
from attnkit.tokenize import encode_head, encode_some, load_tokenizer

log = logging.getLogger(__name__)

DTYPES = {  # the weight types' names, and torch's long names for them
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


@dataclass(frozen=True)
class Classification:
    """One text's prediction: the most likely label, its probability, and every label's probability; `truncated`:
    the text was longer than the model reads, and only its first tokens were classified."""

    label: str
    probability: float
    probabilities: dict[str, float]
    truncated: bool = False


class MethodNotServed(InputError, AttributeError):
    """A pipeline method the run's task does not serve (an AttributeError too, so `hasattr` says False)."""




class Pipeline:
    """A model, its config and its tokenizer; the method of the run's task (module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        config: ModelConfig,
        tokenizer=None,
        *,
        labels: Sequence[str] | None = None,
        decoding: EagerDecoding | None = None,
        plan: InferencePlan | None = None,
        task: TaskSpec | None = None,
        record: Mapping[str, Any] | None = None,
        end_ids: Sequence[int] = (),
        chat_template: chat_format.ChatTemplate = chat_format.DEFAULT_FORMAT,
    ) -> None:
        """decoding: how `generate` runs prefill and steps (`generate/decoder.py`); eager by default. plan: how
        `load` prepared the model (`generate/plan.py`; `plan.explain()` says why). task: the run's task, which
        decides the pipeline's method; default: the one the config's head is built for. record: the run's task.json
        (`task_record`: what its task saved, such as how a tagger's words become pieces); default: none. end_ids: the
        tokens besides the tokenizer's EOS that end a text (a Llama 3's <|eot_id|>: `read_end_ids`). chat_template:
        how `chat` renders messages (`attnkit.chat_format.chat_template`: the run's own, else the default format)."""
        self.model = model.eval()
        self.config = config
        self.tokenizer = tokenizer
        self.task = task if task is not None else task_of_config(config)
        self.labels = list(labels) if labels is not None else _default_labels(config, self.task)
        self.record = dict(record or {})
        self._end_ids = tuple(end_ids)
        self._same_vocabulary: tuple = ()  # the tokenizers `check_draft` last found alike, and their sizes
        self._turn_ends: tuple = ()  # the template and tokenizer `chat_end_ids` last read, and their end-of-turn ids
        self.chat_template = chat_template
        self.decoding = decoding or EagerDecoding(self.model)
        # beam search's: eager, built once (a compiled step's fixed buffers cannot follow the beams' rows)
        self.eager = self.decoding if type(self.decoding) is EagerDecoding else EagerDecoding(self.model)
        self.plan = plan

    @property
    def family(self) -> str:
        return self.config.family

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 100,
        min_new_tokens: int = 0,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        min_p: float = 0.0,
        no_repeat_ngram_size: int = 0,
        logit_bias: dict[int, float] | None = None,
        num_samples: int = 1,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stop_tokens: Sequence[int] = (),
        stop_at_eos: bool = True,
        add_bos: bool | None = None,
        on_text: Callable[[int, str], None] | None = None,
        json_schema: Mapping[str, Any] | str | None = None,
        regex: str | None = None,
        lark: str | None = None,
        grammar: Grammar | None = None,
        num_beams: int = 1,
        length_penalty: float = 1.0,
        early_stopping: bool = False,
        num_return_sequences: int = 1,
        draft: Pipeline | str | Path | None = None,
        draft_tokens: int = DRAFT_TOKENS,
        do_sample: bool = False,
    ) -> list[str]:
        """Continue each prompt (a text, or its token ids as given: a chat's rendered by its template,
        `attnkit.chat_format.ChatTemplate.prompt_ids`); returns the new text only, `num_samples` per prompt, prompt by
        prompt.

        temperature 0 is greedy; `presence_penalty` and `frequency_penalty` (-2 to 2, OpenAI's) lower the logits of
        tokens the reply already holds, `min_p` (0 to 1) drops tokens less likely than min_p times the likeliest
        (`generate/sampling.py`), `no_repeat_ngram_size` n > 0 never repeats n tokens in a row that the prompt or the
        reply already holds (transformers' setting); `logit_bias` ({token id: -100 to 100}) is added to those tokens'
        logits before sampling (OpenAI's field: -100 bans a token, 100 forces it). A prompt is used as the tokenizer
        encodes it (the language-model data places no BOS), BOS first where the run's tokenizer begins every text with
        it (a Llama converted from Hugging Face: `starts_with_bos`); `add_bos` True or False decides it, and an empty
        prompt starts from BOS alone. Generation ends at `max_new_tokens`, at EOS or another of the model's end
        tokens (`end_ids`, unless `stop_at_eos=False`), at a token of `stop_tokens`, or at a stop string, which is cut
        off with everything after it; the end and stop tokens are never chosen among the first `min_new_tokens`
        (transformers' min_new_tokens, vLLM's min_tokens). `on_text(i, piece)` receives sequence i's text as it
        settles. With a seed, sample i of each prompt draws from its own generator seeded seed + i (as vLLM seeds a
        request's n samples, and `attnkit serve` its n choices), so a prompt gives the same text alone or batched
        with others.
        `json_schema` (a dict or its JSON text; {"type": "object"} for any JSON object) holds every text to JSON valid
        under it, `regex` to text the regular expression matches whole, `lark` to a grammar in llguidance's Lark
        syntax, and `grammar` to any `Grammar` (`generate/constrained.py`; one of the four at most): the tokens that
        cannot continue it are never chosen, and a text ends where its grammar is complete (cut short only by
        `max_new_tokens`).
        `num_beams` K > 1 (or `num_return_sequences` > 1) is beam search (`generate/beam.py`), transformers'
        generate(num_beams=K, do_sample=False): each prompt's `num_return_sequences` best continuations, best first,
        scored by their summed log-probabilities over their count of new tokens ** `length_penalty`, the end tokens,
        `stop_tokens`, `min_new_tokens`, `max_new_tokens`, `repetition_penalty` and `no_repeat_ngram_size` as above
        (as transformers' beam search takes them); `early_stopping` (False, transformers' default) ends a prompt's
        search at K finished texts (without beams, both are ignored, with a warning). It is deterministic, decodes
        eagerly (not through a compiled step) and keeps whole texts in the cache (the prompt and max_new_tokens
        within max_seq_len); sampling, the presence and frequency penalties, logit_bias, stop strings, streaming and
        constraints are refused beside it (`refuse_beside_beams`). `do_sample=True` beside beams samples them
        (transformers' generate(num_beams=K, do_sample=True)): `temperature`, `top_k`, `top_p` and `min_p` warp each
        beam's log-probabilities, each step's candidates are drawn from the softmax of their summed scores, and `seed`
        seeds the one generator of the search (the same seed, the texts transformers writes after
        torch.manual_seed(seed)).
        `draft` (a Pipeline, or a run directory loaded in this pipeline's device and dtype) is speculative decoding
        (`generate/speculative.py`, transformers' assistant_model): a smaller decoder of the same tokenizer proposes
        `draft_tokens` tokens a round and this model checks them in one forward pass; greedy, the text is the one this
        model writes alone; sampled, it is drawn from the same distribution (Leviathan et al. 2023), and with a seed
        each row decodes alone, so that a prompt's text is the same alone or batched (for the same draft and
        draft_tokens; not the text this model samples alone under that seed). The acceptance rate is logged. The
        caches keep the whole text (the prompt and max_new_tokens within both max_seq_len); beams, the repetition,
        presence and frequency penalties, n-gram blocking and constraints are refused beside it
        (`refuse_beside_draft`).
        Raises SamplingError (a ConfigError) for bad sampling settings or seed (`check_sampling`), InputError for an
        empty prompt with no BOS to start from, for a schema, expression or grammar that cannot be followed, or for
        more than one of them, for bad beam settings or options beam search does not take, or for beams that do
        not fit in the memory; ConfigError without the structured extra; BrokenOutputs for logits that give no
        distribution to draw from (nan: fp16 activations that overflow, or broken weights).
        """
        arguments = locals()  # by name, as NOT_BESIDE_BEAMS and NOT_BESIDE_DRAFT name them (before any other is bound)
        self._require("generate")
        if draft is not None:
            refuse_beside_draft({  # strictly, as beside beams
                name: arguments[name] for name in NOT_BESIDE_DRAFT if name not in CLI_ONLY_BESIDE_DRAFT})
            check_draft_tokens(draft_tokens)
            draft = self.check_draft(draft)
        if beams_asked(num_beams, num_return_sequences):
            taken = CLI_ONLY_BESIDE_BEAMS | (SAMPLED_BEAMS_TAKE if do_sample else frozenset())
            refuse_beside_beams(f"num_beams={num_beams!r}", {  # strictly: a name of the table not taken is a KeyError
                name: arguments[name] for name in NOT_BESIDE_BEAMS if name not in taken})
            sample = None
            if do_sample:
                sample, seed = check_sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
                if sample.greedy:
                    raise InputError("do_sample=True samples the beams, but temperature=0 is greedy: give a "
                                     "temperature > 0 (1 samples as the model says), or leave do_sample out")
            return self._beam_search(prompts, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                                     stop_tokens=stop_tokens, stop_at_eos=stop_at_eos, add_bos=add_bos,
                                     num_beams=num_beams, length_penalty=length_penalty,
                                     early_stopping=early_stopping, num_return_sequences=num_return_sequences,
                                     repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                                     sample=sample, generator=make_generator(seed, self.device) if sample else None)
        unused = [f"{name}={value!r} (--{name.replace('_', '-')})" for name, value, default in (
            ("length_penalty", length_penalty, 1.0), ("early_stopping", early_stopping, False),
            ("do_sample", do_sample, False)) if value != default]
        if unused:  # as transformers warns: without beams, nothing reads them
            log.warning("ignored, as num_beams=1 (--num-beams) runs no beam search: %s; give num_beams=K > 1 "
                        "(--num-beams K) to search, or leave beam search's settings out", ", ".join(unused))
        given = {name: value for name, value in (("json_schema", json_schema), ("regex", regex), ("lark", lark),
                                                 ("grammar", grammar)) if value is not None}
        if len(given) > 1:
            names = list(given)
            raise InputError(f"give one of json_schema, regex, lark and grammar, not {', '.join(names[:-1])} and "
                             f"{names[-1]} together")
        if json_schema is not None:
            grammar = Grammar.json_schema(json_schema)
        elif regex is not None:
            grammar = Grammar.regex(regex)
        elif lark is not None:
            grammar = Grammar.lark(lark)
        sampling, seed = check_sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                                        repetition_penalty=repetition_penalty, logit_bias=logit_bias,
                                        vocab_size=self.config.vocab_size, seed=seed, min_p=min_p,
                                        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                        no_repeat_ngram_size=no_repeat_ngram_size)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise InputError(f"num_samples={num_samples!r} must be a positive integer")
        prompts = prompt_list(prompts)
        stops = text_list(stop, what="stop strings", required=False) if stop is not None else []
        if any(not s for s in stops):
            raise InputError("a stop string is empty; give non-empty stop strings")
        prompt_ids = [self.prompt_ids(p, index=i, add_bos=add_bos) for i, p in enumerate(prompts)]
        rows = [ids for ids in prompt_ids for _ in range(num_samples)]
        generator = None if seed is None else [  # sample i of each prompt: seed + i, whatever else is in the batch
            make_generator(choice_seed(seed, i), self.device) for _ in prompt_ids for i in range(num_samples)]
        stop_ids = self._stop_ids(stop_tokens)
        if stop_at_eos:
            stop_ids |= self.end_ids
        texts = TextTracker(self.tokenizer, len(rows), stops, on_text)
        mask = GrammarMask.of(grammar, self.tokenizer, len(rows))
        if draft is not None:
            # seeded samples decode one row at a time: a batch's rows advance together, by the drafts every row
            # keeps, which would tie a row's draws to the others' and break "the same text alone or batched"
            apart = generator is not None and not sampling.greedy
            for group in [[row] for row in range(len(rows))] if apart else [list(range(len(rows)))]:
                _, speculation = speculative_generate(
                    self.model, draft.model, [rows[row] for row in group], max_new_tokens=max_new_tokens,
                    min_new_tokens=min_new_tokens, draft_tokens=draft_tokens, sampling=sampling,
                    context_len=min(self.config.max_seq_len, draft.config.max_seq_len), pad_id=self.pad_id,
                    generator=[generator[row] for row in group] if generator is not None else None,
                    stop_ids=stop_ids, on_token=lambda row, token, group=group: texts.push(group[row], token),
                    writable=self.tokenizer.vocab_size)
                log.info("%s", speculation.describe())
            return texts.finish()
        generate_tokens(  # BrokenOutputs for logits that give no distribution (`check_drawn`)
            self.model,
            rows,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            context_len=self.config.max_seq_len,
            sampling=sampling,
            generator=generator,
            pad_id=self.pad_id,
            stop_ids=stop_ids,
            on_token=texts.push,
            decoding=self.decoding,
            grammar=mask,
            writable=self.tokenizer.vocab_size,  # a padded vocabulary's ids past the tokenizer's name no text
        )
        unfinished = mask.unfinished() if mask is not None else []
        if unfinished:
            log.warning("text(s) %s ended before their %s was complete (max_new_tokens=%d reached, or a stop string "
                        "or token met), so they do not parse: give a larger max_new_tokens (--max-new-tokens)",
                        unfinished, grammar.name, max_new_tokens)
        return texts.finish()

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] = (),
             stop: str | Sequence[str] | None = None, stop_tokens: Sequence[int] = (), **options: Any) -> str:
        """The assistant's reply to a chat, as transformers' pipeline("text-generation") answers a list of messages:
        `messages` ({"role": "system" | "user" | "assistant" | "tool", "content": ...}, an assistant's `tool_calls`)
        and the `tools` offered are rendered by the run's chat template with its special tokens
        (`ChatTemplate.chat_ids`, as chat fine-tuning read its conversations, `attnkit serve` a chat and `attnkit
        generate --chat` a prompt), and the reply ends at the template's end of turn (its stop strings, its turn-end
        token, EOS) as well as at `stop` and `stop_tokens`. Returned is the reply's content, which the chat takes
        back as the assistant's turn (`ChatTemplate.reply_content`: in the default format, the text without the
        space after `Assistant:`, which is the format's; `on_text` receives the text as written). `options` are
        `generate`'s (max_new_tokens, temperature, top_p, seed, on_text, ...) for one reply: num_samples and
        num_return_sequences are refused. A reply that outgrows the window slides it as `generate`'s texts do (`attnkit
        chat` leaves whole turns out instead). Raises InputError for messages not laid out so, a chat the template
        refuses or that is longer than the window, or several replies asked; otherwise as `generate`."""
        self._one_reply(options)
        messages = list(messages) if isinstance(messages, tuple) else messages  # a tuple as a list; a str refused whole
        ids = self.chat_template.chat_ids(self.tokenizer, check_messages(messages, "messages"), tools)
        return self.chat_reply(ids, stop=stop, stop_tokens=stop_tokens, **options)

    def chat_reply(self, ids: Sequence[int], *, stop: str | Sequence[str] | None = None,
                   stop_tokens: Sequence[int] = (), **options: Any) -> str:
        """`chat`'s reply to a chat already read as tokens (`ChatTemplate.chat_ids` of its messages), for a caller
        that has them (`attnkit chat` reads its history once, to fit it in the window, and replies to those ids).
        Raises InputError for ids longer than the window, or several replies asked; otherwise as `generate`."""
        self._one_reply(options)
        return self.chat_replies(ids, stop=stop, stop_tokens=stop_tokens, **options)[0]

    def chat_replies(self, ids: Sequence[int], *, stop: str | Sequence[str] | None = None,
                     stop_tokens: Sequence[int] = (), **options: Any) -> list[str]:
        """`chat_reply`'s replies, as many as `options`' num_samples asks, sample i seeded seed + i as `generate`'s
        are (best-of-N's candidates, `attnkit.tasks.best_of`). Raises InputError for ids longer than the window;
        otherwise as `generate`."""
        self._require("generate")
        if len(ids) > self.config.max_seq_len:
            raise InputError(f"the chat renders as {len(ids)} tokens; the model reads at most "
                             f"{self.config.max_seq_len} (max_seq_len): leave out its oldest turns, as attnkit chat "
                             "does, or shorten them")
        stops = [*(text_list(stop, what="stop strings", required=False) if stop is not None else []),
                 *self.chat_template.stops]
        ends = self.chat_end_ids()
        texts = self.generate(list(ids), stop=stops, stop_tokens=[*self._stop_ids(stop_tokens), *ends], **options)
        return [self.chat_template.reply_content(text) for text in texts]

    def chat_end_ids(self) -> list[int]:
        """The chat template's end-of-turn tokens (`ChatTemplate.turn_end_ids`, which renders and tokenizes a sample
        turn), found once for a template and tokenizer and kept until either is replaced. The kept entry is read and
        replaced whole, so threads that share the pipeline each get the ids of the template they saw."""
        template, tokenizer = self.chat_template, self.tokenizer
        kept = self._turn_ends
        if not kept or kept[0] != template or kept[1] is not tokenizer:
            kept = self._turn_ends = (template, tokenizer, tuple(sorted(template.turn_end_ids(tokenizer))))
        return list(kept[2])  # a copy: a caller's change never reaches the kept ids

    def _one_reply(self, options: Mapping[str, Any]) -> None:
        """InputError where a chat's `options` ask for several replies, or the run does not generate."""
        for name in ("num_samples", "num_return_sequences"):
            if options.get(name, 1) != 1:
                raise InputError(f"chat gives one reply; {name}={options[name]!r} asks for more: call generate on "
                                 "pipeline.chat_template.chat_ids(pipeline.tokenizer, messages) for several")
        self._require("generate")

    def _beam_search(self, prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], *,
                     max_new_tokens: int, min_new_tokens: int,
                     stop_tokens: Sequence[int], stop_at_eos: bool, add_bos: bool | None, num_beams: int,
                     length_penalty: float, early_stopping: bool, num_return_sequences: int,
                     repetition_penalty: float, no_repeat_ngram_size: int, sample: SamplingConfig | None,
                     generator: torch.Generator | None) -> list[str]:
        """`generate`'s beam search (its docstring), once the options it refuses beside beams are known absent."""
        check_search(num_beams, length_penalty, early_stopping=early_stopping, vocab_size=self.config.vocab_size,
                     num_return_sequences=num_return_sequences, beam="num_beams", what="prompt")
        prompt_ids = [self.prompt_ids(p, index=i, add_bos=add_bos)
                      for i, p in enumerate(prompt_list(prompts))]
        stop_ids = self._stop_ids(stop_tokens) | (self.end_ids if stop_at_eos else set())
        check_prompts(prompt_ids, max_new_tokens=max_new_tokens, context_len=self.config.max_seq_len,
                      min_new_tokens=min_new_tokens)
        longest = min(max(map(len, prompt_ids)) + max_new_tokens, self.config.max_seq_len)  # beyond: refused
        self._check_search_fits(num_beams * len(prompt_ids), longest, what="--num-beams x the prompts",
                                fix="choose a smaller --num-beams (4 to 10 is usual) or give fewer prompts")
        outputs = beam_generate(
            self.model, prompt_ids, max_new_tokens=max_new_tokens, context_len=self.config.max_seq_len,
            num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
            num_return_sequences=num_return_sequences, pad_id=self.pad_id, stop_ids=stop_ids,
            writable=self.tokenizer.vocab_size, min_new_tokens=min_new_tokens, repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size, decoding=self.eager, sample=sample, generator=generator,
        )
        return [self.tokenizer.decode(ids) for ids in outputs]

    @property
    def end_ids(self) -> frozenset[int]:
        """The tokens that end a text: the tokenizer's EOS and the model's others (those transformers' generate stops
        at: config.json's or generation_config.json's eos_token_id list)."""
        eos = self.tokenizer.eos_id if self.tokenizer is not None else None
        return frozenset([*self._end_ids, *([eos] if eos is not None else [])])

    def _stop_ids(self, stop_tokens: Sequence[int]) -> set[int]:
        """`stop_tokens` as a set. Raises InputError for something else than token ids within the vocabulary (a
        string's characters, say, which would never match and so never stop)."""
        last = self.config.vocab_size - 1
        if isinstance(stop_tokens, str | bytes) or not isinstance(stop_tokens, Iterable):
            raise InputError(f"stop_tokens are token ids (integers from 0 to {last}); got {stop_tokens!r}")
        tokens = list(stop_tokens)  # read once: a generator is used up by the check
        for token in tokens:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= last:
                raise InputError(f"stop_tokens: {token!r} is no token id (integers from 0 to {last}); give stop "
                                 "strings as stop=")
        return set(tokens)

    def translate(
        self,
        texts: str | Sequence[str],
        *,
        beam_size: int = 1,
        length_penalty: float = 1.0,
        early_stopping: bool = True,
        max_length: int | None = None,
        batch_size: int = 32,
        progress: bool = False,
        num_return_sequences: int = 1,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
    ) -> list[str]:
        """Translate each text: greedy for `beam_size=1`, else beam search. The target starts with BOS, ends at EOS.
        `num_return_sequences` (at most `beam_size`): each text's that many best translations, best first, text by
        text (transformers' setting). `repetition_penalty` (> 1 makes a token the target holds less likely, CTRL's
        rule) and `no_repeat_ngram_size` n (no n tokens in a row twice) act on the target so far, BOS included, as
        transformers' generate applies them to a Marian model's decoder input (greedy: the logits; beams: the
        log-probabilities). Raises SamplingError (a ConfigError) for a bad repetition_penalty or
        no_repeat_ngram_size.

        max_length: target tokens at most (EOS counted); by default twice the longest source plus 10, within
        the model's max_seq_len. Texts are batched by length, `batch_size` at a time; a blank text gives "".
        Sources are `tokens EOS`, as the pair data lays them out.
        """
        self._require("translate")
        _check_batch_size(batch_size)
        check_sampling(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        texts = text_list(texts)
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        if bos is None or eos is None:
            raise InputError("translation needs a tokenizer with BOS and EOS tokens (the target starts and ends there)")
        check_search(beam_size, length_penalty, early_stopping=early_stopping,
                     vocab_size=getattr(self.config, "target_vocab_size", self.config.vocab_size),
                     num_return_sequences=num_return_sequences)
        if max_length is not None:  # 0 is no request for the default
            check_max_length(max_length)
            if max_length > self.config.max_seq_len:
                raise InputError(f"max_length={max_length} is beyond the model's max_seq_len={self.config.max_seq_len}")
        sources = [self._source_ids(t, index=i) if t.strip() else None for i, t in enumerate(texts)]
        self._check_search_fits(beam_size * min(batch_size, len(texts)), max_length or self.config.max_seq_len,
                                what="--beam-size x the texts of a batch, --batch-size",
                                fix="choose a smaller --beam-size (4 to 10 is usual) or --batch-size")
        outputs = translate_batched(
            self.model, sources, bos_id=bos, eos_id=eos, pad_id=self.pad_id, context_len=self.config.max_seq_len,
            beam_size=beam_size, length_penalty=length_penalty, early_stopping=early_stopping, max_length=max_length,
            batch_size=batch_size, progress=progress, num_return_sequences=num_return_sequences,
            writable=self.tokenizer.vocab_size,  # a padded vocabulary's ids past the tokenizer's name no text
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
        )
        return [self.tokenizer.decode(ids) for ids in outputs]

    def _check_search_fits(self, rows: int, max_length: int, *, what: str, fix: str) -> None:
        """InputError when `rows` hypotheses (`what`: texts in a batch x beam size) of up to `max_length` tokens
        cannot fit in the memory free: at least their caches and a row of fp32 scores over the target vocabulary each
        (the log-probabilities, their sum with the beam's score, the top-k's copy); its message ends with `fix`.

        A decoder-only model's cache is counted as it is allocated (`kv_bytes_per_position`: its key/value heads,
        its dtype; a sliding window's layers as if they kept every position, an upper bound). Any other family's
        (encoder-decoder, recurrent, convolutional, feed-forward) is estimated from the config: keys and values of
        width d_model (hidden_size) in fp32 at every decoder layer and position, an upper bound for the states of
        fixed size."""
        config = self.config
        vocab = getattr(config, "target_vocab_size", config.vocab_size)
        if isinstance(config, DecoderConfig):
            cache = kv_bytes_per_position(self.model, rows) * max_length
        else:
            width = getattr(config, "d_model", None) or getattr(config, "hidden_size", 0)
            layers = getattr(config.resolved, "n_decoder_layers", None) or config.n_layers
            cache = rows * 4 * 2 * layers * max_length * width
        need = cache + rows * 4 * 3 * vocab
        free = free_bytes(self.device)
        if free is not None and need > free:
            raise InputError(
                f"{rows:,} hypotheses ({what}) need at least {gib(need)} for their caches and scores but "
                f"{self.device.type} has {gib(free)} free: {fix}"
            )

    @torch.inference_mode()
    def classify(self, texts: str | Sequence[str], *, batch_size: int = 32) -> list[Classification]:
        """The label and the probabilities of every label, for each text (batched, `batch_size` at a time). Raises
        BrokenOutputs for probabilities that are nan (fp16 activations that overflow, broken weights)."""
        self._require("classify")
        _check_batch_size(batch_size)
        texts = text_list(texts)
        results: list[Classification] = []
        for start in range(0, len(texts), batch_size):
            chunk = [self.classifier_ids(t, index=start + i) for i, t in enumerate(texts[start:start + batch_size])]
            ids, mask = pad([row for row, _ in chunk], self.pad_id, device=self.device)  # (B, T)
            probs = self.model(ids, attention_mask=mask).logits.float().softmax(dim=-1)  # (B, n_classes)
            check_outputs(probs, self.model, what=f"texts {start} to {start + len(chunk) - 1}")
            for row, (_, truncated) in zip(probs.tolist(), chunk, strict=True):
                best = max(range(len(row)), key=row.__getitem__)
                results.append(Classification(self.labels[best], row[best], dict(zip(self.labels, row, strict=True)),
                                              truncated))
        return results

    def check_draft(self, draft: Pipeline | str | Path) -> Pipeline:
        """The draft model of speculative decoding (`generate`'s draft=, `attnkit serve --draft`): a decoder on this
        pipeline's device whose tokenizer has this one's vocabulary, token for token (a run directory is loaded in
        this one's dtype). Raises InputError naming what differs and the fix."""
        if not isinstance(draft, Pipeline):
            if not isinstance(draft, str | Path):
                raise InputError(f"draft={draft!r} must be a Pipeline (attnkit.load(RUN)) or a run directory")
            draft = load(draft, device=self.device, dtype=self.dtype)
        if not (isinstance(self.config, DecoderConfig) and isinstance(draft.config, DecoderConfig)):
            raise InputError(f"speculative decoding runs decoder-only Transformers through their KV caches; the target "
                             f"is a {self.family!r} and the draft a {draft.family!r} model: give two decoder runs")
        if "generate" not in draft.methods:  # a decoder with another head (a tagger) has no next-token logits
            trained = f"was trained for {draft.task.name}" if draft.task is not None else "has no task head"
            raise InputError(f"the draft {trained}, not to generate: give a language-model run (task lm or chat) "
                             "trained with the target's tokenizer")
        if draft.device != self.device:
            raise InputError(f"the draft is on {draft.device} and the target on {self.device}: load both on one device")
        if draft.tokenizer is None:
            raise InputError("the draft has no tokenizer to compare with the target's: save the target's tokenizer "
                             "into its run directory (tokenizer/)")
        # Only the ids' meaning matters (the target's tokenizer alone encodes and decodes), so the vocabularies are
        # compared entry by entry: comparing fingerprints serialised a 128k-token tokenizer.json twice a call
        mine, theirs = self.tokenizer, draft.tokenizer
        checked = (mine, theirs, mine.vocab_size, theirs.vocab_size)  # by identity and size: a tokenizer that grew,
        # or another one, is compared again; the same pair is not, entry by entry, at every call (0.1 s at 128k)
        known = self._same_vocabulary
        if known and known[0] is mine and known[1] is theirs and known[2:] == checked[2:]:
            return draft
        if mine.vocab_size != theirs.vocab_size:
            raise InputError(f"the draft's tokenizer has {theirs.vocab_size} tokens and the target's "
                             f"{mine.vocab_size}: speculative decoding needs one vocabulary; train the draft with "
                             "the target's tokenizer (attnkit train --tokenizer TARGET_RUN/tokenizer)")
        ids = range(mine.vocab_size)
        ours, drafts = mine.pieces(ids), theirs.pieces(ids)
        if ours != drafts:
            token = next(i for i, (a, b) in enumerate(zip(ours, drafts, strict=True)) if a != b)
            raise InputError(f"the draft's tokenizer reads token {token} as {drafts[token]!r}, the target's as "
                             f"{ours[token]!r}: speculative decoding needs one vocabulary; train the draft with the "
                             "target's tokenizer")
        self._same_vocabulary = checked
        return draft

    # Text -> token ids, as the training data lays them out ----------------------------------------------------
    def prompt_ids(self, prompt: str | list[int], *, index: int, add_bos: bool | None = None) -> list[int]:
        """A prompt's token ids as `generate` feeds them (BOS first with `add_bos`, where it is None as the run's
        tokenizer frames its texts, and for an empty prompt); ids given are fed as they are.
        Raises InputError for a prompt that is no string, empty with no BOS to start from, or not empty but of no
        token (a tokenizer that skips unknown characters dropped them all: BOS alone would continue nothing given),
        and for ids given that are none or beyond the vocabulary."""
        if isinstance(prompt, list):
            last = self.config.vocab_size - 1
            if not prompt or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= last for i in prompt):
                raise InputError(f"prompt {index}: token ids are integers from 0 to {last}, at least one; got "
                                 f"{prompt!r:.80}")
            return list(prompt)
        if not isinstance(prompt, str):
            raise InputError(f"prompt {index} is a {type(prompt).__name__}; prompts are strings")
        ids = encode_some(self.tokenizer, prompt, f"prompt {index}")
        bos = self.tokenizer.bos_id
        if add_bos is None:  # as the run's training stream began its texts (a tokenizer of one's own: nothing)
            add_bos = bos_first(self.tokenizer)
        if (add_bos or not ids) and bos is not None:
            ids = [bos, *ids]
        if not ids:
            raise InputError(
                f"prompt {index} is empty and the tokenizer has no BOS token to start from; give a non-empty prompt"
            )
        return ids

    def _source_ids(self, text: str, *, index: int) -> list[int]:
        """`tokens EOS`, as the pair data lays out sources; a text far beyond max_seq_len is refused after tokenizing
        only its head (`encode_head`), and a text of no token (EOS alone would be translated)."""
        ids, whole = encode_head(self.tokenizer, text, self.config.max_seq_len, f"text {index}")
        ids = [*ids, self.tokenizer.eos_id]
        if len(ids) > self.config.max_seq_len:
            raise InputError(
                f"text {index} has {'' if whole else 'more than '}{len(ids)} tokens (EOS included) but the model reads "
                f"at most {self.config.max_seq_len} (max_seq_len); split it into shorter pieces"
            )
        return ids

    def classifier_ids(self, text: str | list[int], *, index: int) -> tuple[list[int], bool]:
        """`CLS tokens SEP` (or `BOS tokens EOS`: `frame_ids`), as the labelled data lays them out, for a text or its
        tokens' ids; and whether the tokens were cut to the model's max_seq_len (logged, and said in each result).
        Raises InputError naming a missing mark, or for a text of no token (`encode_some`: its marks alone)."""
        tok = self.tokenizer
        first, last = frame_ids(tok)
        keep = self.config.max_seq_len - len(first) - len(last)
        ids, whole = encode_head(tok, text, keep, f"text {index}") if isinstance(text, str) else (list(text), True)
        if len(ids) > keep:
            log.warning("text %d has %s%d tokens; reading its first %d", index, "" if whole else "more than ",
                        len(ids), keep)
        return [*first, *ids[:keep], *last], len(ids) > keep

    @property
    def pad_id(self) -> int:
        """The id that pads a batch's shorter rows: the tokenizer's padding token, else 0 (masked out either way)."""
        pad = self.tokenizer.pad_id
        return pad if pad is not None else 0

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this pipeline serves: its task's (none for a model without a task head)."""
        return (self.task.method,) if self.task is not None and self.task.method else ()

    def __getattribute__(self, name: str):
        if name in METHODS and name not in object.__getattribute__(self, "methods"):
            raise object.__getattribute__(self, "_not_served")(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str):
        """A method its task's registration implements (`TaskSpec.pipeline`), bound to this pipeline."""
        task = self.__dict__.get("task")
        if task is not None and task.method == name and task.pipeline is not None:
            self._require(name)
            return functools.partial(task.pipeline, self)
        if name in {spec.method for spec in tasks() if spec.method}:
            raise self._not_served(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        hidden = {spec.method for spec in tasks() if spec.method} - set(self.methods)
        return sorted((set(super().__dir__()) | set(self.methods)) - hidden)

    def _not_served(self, method: str) -> MethodNotServed:
        if self.task is None:
            return MethodNotServed(f"{method} does not fit this model: its family is {self.family!r} and it has "
                                   "no task head; fine-tune it first (attnkit train --init-from RUN --task TASK)")
        wanted = [spec for spec in tasks_of_family(self.family) if spec.method == method]
        why = (f"it was trained for {self.task.name}, not {wanted[0].name}" if wanted else
               f"its family is {self.family!r}")  # a head of the family's other tasks, or another family
        return MethodNotServed(f"{method} does not fit this model: {why}; use {' or '.join(self.methods)} instead "
                               f"(a {self.task.name} run serves that alone)")

    def _require(self, method: str) -> None:
        if self.tokenizer is None:
            raise InputError(
                f"this model has no tokenizer, so {method} cannot turn text into tokens; save one into the run "
                f"directory's {TOKENIZER_DIR}/ (or pass tokenizer= to Pipeline)"
            )


class TextTracker:
    """Decodes each sequence's new tokens as they come: ends a sequence at a stop string, and passes on the text
    that has settled (held back: a possible start of a stop string, an incomplete UTF-8 character)."""

    def __init__(self, tokenizer, n_rows: int, stops: list[str], on_text: Callable[[int, str], None] | None) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.on_text = on_text
        self.tokens: list[list[int]] = [[] for _ in range(n_rows)]
        self.sent = [0] * n_rows
        self.hold = max((len(s) for s in stops), default=1) - 1

    def text(self, row: int) -> tuple[str, bool]:
        """The row's text so far, cut before the first stop string, and whether one was found."""
        text = self.tokenizer.decode(self.tokens[row])
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        return (text[:cut], True) if cut >= 0 else (text, False)

    def push(self, row: int, token: int) -> bool:
        """Record a new token of `row`; True when the row has reached a stop string."""
        self.tokens[row].append(token)
        if not self.stops and self.on_text is None:
            return False
        text, stopped = self.text(row)
        if stopped:
            return True
        settled = len(text) - self.hold
        while settled > self.sent[row] and text[settled - 1] == "\ufffd":  # a character still incomplete
            settled -= 1
        self._send(row, text[:settled])
        return False

    def _send(self, row: int, text: str) -> None:
        if self.on_text is not None and len(text) > self.sent[row]:
            self.on_text(row, text[self.sent[row]:])
            self.sent[row] = len(text)

    def finish(self) -> list[str]:
        """Every row's final text; the text not yet passed on goes out now."""
        texts = [self.text(row)[0] for row in range(len(self.tokens))]
        for row, text in enumerate(texts):
            self._send(row, text)
        return texts


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r} must be a positive integer (--batch-size 32 is usual)")


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """The weights' dtype `dtype` names (DTYPES' names, or a floating torch.dtype); None: as stored. Raises InputError
    for anything else, naming the choices."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)} (or a floating torch.dtype, or "
                         "None: as stored)")
    return DTYPES[dtype]


def load(
    run_dir: str | Path,
    *,
    device: torch.device | str | None = None,
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    compile: bool | str = False,
    verify: bool = False,
) -> Pipeline:
    """Load a run directory (see the module docstring) onto `device` (default: CUDA when present, else CPU)
    in `dtype` (default: as stored; "fp32", "bf16", "fp16" or a torch dtype). `quantize="int8"` stores the
    linear layers' weights in int8 (`attnkit.generate.quantize`), for faster decoding; `quantize="int8-dynamic"`
    also quantizes each product's input to int8 as it runs (CPU, eager only), the fastest eager decoding of
    larger models; `quantize="int4"` stores them in 4 bits, in groups of 32 (CPU). Models that decode (not
    encoder classifiers) get fused q/k/v projections and, in fp32 on a CPU, transposed weights
    (`attnkit.generate.decode_layout`).
    `compile=True` compiles a decoder's decoding step for fixed shapes (`attnkit.generate.static_decode`), and
    each block of other models for any length; the first call waits for compilation, and the gain is largest
    where per-operation overhead dominates (small models at batch 1, bf16 and int8 weights). `compile="max-autotune"`
    also times several kernels for each matrix product while compiling (a minute or more the first time, cached
    on disk): the fastest decoding of larger models; in fp32 its packed weights are a second copy of the model's.
    `compile="aot"` captures the decoding step ahead of time into a C++ library (`attnkit.generate.captured_step`):
    no Python runs per layer; the first load takes tens of seconds, later loads of the same model read the library
    kept on disk.
    Its files (the tokenizer's too) are checked against their checksums; a run without them is unverified, a
    warning, or with `verify` a CheckpointError.

    Raises CheckpointError for a missing or mismatched checkpoint, or a labels.json that does not fit.
    """
    if quantize is not None and quantize not in QUANTIZE_FORMS:
        raise InputError(f"quantize={quantize!r} is not supported; use one of {', '.join(QUANTIZE_FORMS)}, or None")
    torch_compile_mode(compile)  # an unknown mode fails before the model is read
    device = pick_device(device)
    check_quantization(quantize, device, compile)  # before the model is read: a refusal costs no load
    # a run whose top level is damaged or incomplete (a save cut short) is read from its newest intact checkpoint
    model, config, run_dir = load_run_model(run_dir, device=device, dtype=parse_dtype(dtype), require_checksums=verify)
    if parse_dtype(dtype) is None:  # as stored: a run converted with --dtype bf16 stays bf16
        model.to(stored_dtype(run_dir / WEIGHTS_FILE))
    plan = plan_inference(model, config.family, quantize=quantize, compile=compile)
    plan.apply(model)
    decoding = decoding_for(model, compile)
    tokenizer = None
    if (run_dir / TOKENIZER_DIR).is_dir():
        tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    else:
        log.warning("%s has no %s/ directory: the model can be used, but not with text", run_dir, TOKENIZER_DIR)
    task = task_of_run(run_dir, config)
    template = chat_format.DEFAULT_FORMAT  # a run's own renders its chats (`chat`, and `attnkit serve`'s /tokenize)
    if tokenizer is not None:
        template = chat_format.chat_template(run_dir / TOKENIZER_DIR, tokenizer.specials)
    return Pipeline(model, config, tokenizer, labels=_read_labels(run_dir, config, task), decoding=decoding,
                    plan=plan, task=task, record=task_record(run_dir), end_ids=read_end_ids(run_dir, config.vocab_size),
                    chat_template=template)


def decoding_for(model: nn.Module, compile: bool | str = False) -> EagerDecoding:
    """How `generate` decodes a prepared model: where `compile` asks for compilation and the model allows a fixed-shape
    step (`StaticDecoding.supports`), that step captured ahead of time (compile="aot") or through torch.compile;
    else eagerly."""
    if compile == "aot" and CapturedDecoding.supports(model):
        return CapturedDecoding(model)
    if torch_compile_mode(compile) is not None and StaticDecoding.supports(model):
        return StaticDecoding(model, compile=compile)
    return EagerDecoding(model)


def _default_labels(config: ModelConfig, task: TaskSpec | None) -> list[str]:
    """The class ids of a task that learns labels as names ("0", "1", ...); no labels for other models."""
    return [str(i) for i in range(config.n_classes)] if task is not None and task.labelled else []


def _read_labels(run_dir: Path, config: ModelConfig, task: TaskSpec | None) -> list[str] | None:
    if task is None or not task.labelled:
        return None
    labels = read_labels(run_dir)
    if labels is not None and len(labels) != config.n_classes:
        raise CheckpointError(f"{run_dir / LABELS_FILE} holds {len(labels)} label names; n_classes in config.json "
                              f"is {config.n_classes}")
    return labels


def sample_after_training(
    run_dir: str | Path, *, prompt: str | list[int] = "", max_new_tokens: int = 200, temperature: float = 0.8,
    seed: int = 0, stop: Sequence[str] = (), stop_tokens: Sequence[int] = (),
) -> str:
    """A short sample from a freshly trained language model: the prompt and its continuation, ended at a `stop`
    string or a token of `stop_tokens` (a chat template's end of turn) as at EOS. A prompt given as token ids (a
    chat's, with its template's special tokens) is shown with them."""
    pipeline = load(run_dir)
    shown = prompt if isinstance(prompt, str) else pipeline.tokenizer.decode(prompt, skip_special=False)
    return shown + pipeline.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                     stop=list(stop) or None, stop_tokens=stop_tokens)[0]


def prompt_list(prompts: object) -> list[str | list[int]]:
    """`generate`'s prompts as a list: a text, one prompt's token ids (a list of integers, as OpenAI's completions
    take them), or a sequence of texts or of such lists. Raises InputError (`text_list`) for anything else."""
    if isinstance(prompts, list | tuple) and prompts and all(isinstance(i, int) for i in prompts):
        return [list(prompts)]
    if isinstance(prompts, list | tuple) and prompts and all(isinstance(p, list | tuple) for p in prompts):
        return [list(p) for p in prompts]
    return text_list(prompts, what="prompts")
