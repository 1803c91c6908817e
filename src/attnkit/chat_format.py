"""attnkit's own chat format, as a Jinja chat template for the files that carry one (a GGUF's
`tokenizer.chat_template`, read by llama.cpp, Ollama and LM Studio; a Hugging Face directory's `tokenizer_config.json`,
read by `transformers`' `apply_chat_template` and the servers built on it), and how chat templates are read, checked
and rendered.

A run without a template of its own chats in plain text, the form `attnkit serve` renders (`attnkit.serve.chat`),
which a model trained on plain text can continue:

    System: Tools you may call, replying <tool_call>{"name": ..., "arguments": {...}}: [{"name": "get_weather", ...}]
    System: You are terse.
    User: Weather in Paris?
    Assistant: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}
    Tool: 18 C, sunny
    Assistant:

The tools line comes only when tools are offered; `developer` turns are written as `System`; an assistant's calls
follow its text (none when its content is empty or null). The last line (`Assistant:`) is the generation prompt,
added when the renderer asks for it (`add_generation_prompt`, as every chat runtime does for a reply). The reply ends
at the next line that starts a turn: give the runtime the stop strings `STOP_STRINGS` (llama.cpp:
`-r "\\nUser:" -r "\\nSystem:"`), as the server does.
As text the format marks no turn's end, so chat fine-tuning learns EOS after each reply (`conversation_ids`), and a
chat is read for a reply with that EOS after each earlier one (`ChatTemplate.chat_ids`): the served prompt begins as
the training text does. The Jinja form writes `eos_token` after each assistant turn for the same reason (the server's
text leaves it out: there it is a token, not text).

The template writes newlines as `{{ '\\n' }}` and strips the whitespace around its tags, so it renders the same with
and without Jinja's `trim_blocks` / `lstrip_blocks` (transformers sets both, llama.cpp's engine neither). JSON is
written by `tojson` as transformers defines it (`json.dumps`, keys in order, non-ASCII kept), which `render` uses for
every template.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnkit.data.lm import bos_first
from attnkit.errors import InputError
from attnkit.tokenize import Tokenizer

DEFAULT_CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "System: Tools you may call, replying <tool_call>{\"name\": ..., \"arguments\": {...}}: ["
    "{%- for tool in tools %}{% if not loop.first %}{{ ', ' }}{% endif %}{{ tool['function'] | tojson }}{% endfor -%}"
    "]"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools or not loop.first %}{{ '\\n' }}{% endif -%}"
    "{%- if message['role'] == 'system' or message['role'] == 'developer' %}System"
    "{%- elif message['role'] == 'user' %}User"
    "{%- elif message['role'] == 'assistant' %}Assistant"
    "{%- elif message['role'] == 'tool' %}Tool"
    "{%- else %}{{ message['role'] }}{% endif -%}"
    "{{ ': ' }}"
    "{%- if message['content'] %}{{ message['content'] }}{% endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- if message['content'] or not loop.first %}{{ ' ' }}{% endif -%}"
    "<tool_call>{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{%- endfor -%}"
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{% endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if messages or tools %}{{ '\\n' }}{% endif %}Assistant:"
    "{%- endif -%}"
)
EARLIER_DEFAULT_TEMPLATE = DEFAULT_CHAT_TEMPLATE.replace(
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{% endif -%}", "")  # exports before EOS ended a reply
STOP_STRINGS = ("\nUser:", "\nSystem:")  # where a reply in the default format ends: the next turn's start
TEMPLATE_CONFIG = "tokenizer_config.json"  # where a Hugging Face tokenizer keeps its chat template
SAMPLE_CHAT = (  # what a template is tried on before it is written into an export
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "18 C, sunny"},
    {"role": "user", "content": "Thanks!"},
)
PLAIN_CHAT = ({"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."},
              {"role": "user", "content": "Who are you?"})  # for templates that refuse system or tool turns
SAMPLE_TOOLS = ({"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}},)


def render(source: str, messages: Sequence[dict], tools: Sequence[dict] = (), *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "") -> str:
    """The Jinja chat template `source` over `messages` and the `tools` offered, as `transformers`'
    `apply_chat_template` renders it (a sandbox, trim_blocks and lstrip_blocks, its `tojson` and
    `raise_exception`)."""
    return _compiled(source).render(messages=list(messages), tools=list(tools) or None,
                                    add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                                    eos_token=eos_token)


def check_template(source: str, where: str) -> None:
    """Compile `source` and render a sample conversation with it; InputError naming `where` and Jinja's complaint
    when it fails. A template may refuse some conversations on purpose (`raise_exception`: tools, a system or tool
    turn), so it passes when it renders any of `SAMPLE_CHAT` with tools, without, or `PLAIN_CHAT`."""
    import jinja2

    try:
        template = _compiled(source)
    except jinja2.TemplateError as error:
        raise InputError(f"{where} is not a valid Jinja template ({_said(error)}); fix it or leave it out to use "
                         "attnkit's own format") from None
    failure = None
    for messages, tools in ((SAMPLE_CHAT, SAMPLE_TOOLS), (SAMPLE_CHAT, ()), (PLAIN_CHAT, ())):
        try:
            template.render(messages=list(messages), tools=list(tools) or None, add_generation_prompt=True,
                            bos_token="", eos_token="")
            return
        except Exception as error:  # a template's own refusal, or a mistake that only shows when it runs
            failure = error
    raise InputError(f"{where} fails on a sample conversation ({_said(failure)}); fix the template or leave it out "
                     "to use attnkit's own format")


def read_template_file(path: Path, flag: str) -> str:
    """A template file's text; InputError when it is not a UTF-8 text file."""
    if not path.is_file():
        raise InputError(f"{flag} {path} is not a file; give a Jinja template file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise InputError(f"{flag} {path} is not a text file (a Jinja template is UTF-8 text); give the template's "
                         "file")
    return text


def config_template(tokenizer_dir: Path) -> tuple[str | None, dict]:
    """(the chat template of `tokenizer_dir`'s tokenizer_config.json, or None where it has none; the file's settings).
    Of several named templates, the `default` one. InputError for a file that is not a JSON object."""
    path = Path(tokenizer_dir) / TEMPLATE_CONFIG
    if not path.is_file():
        return None, {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path} is not JSON ({error}); restore the tokenizer's tokenizer_config.json or remove "
                         "it") from None
    if not isinstance(settings, dict):
        raise InputError(f"{path} holds {type(settings).__name__}, not a JSON object; restore the tokenizer's "
                         "tokenizer_config.json or remove it")
    source = settings.get("chat_template")
    if isinstance(source, list):
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    return (source if isinstance(source, str) else None), settings


DEFAULT_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
TOOL_CALL = "<tool_call>"  # what starts a call in a reply (the marker of Hermes' and Qwen's chat formats)
_SAMPLE_REPLY = "Hello."  # the reply `ChatTemplate.turn_end_ids` renders to find the token after it


@dataclass(frozen=True)
class ChatTemplate:
    """Renders messages ({"role", "content"}, an assistant's `tool_calls`) and the tools offered into a prompt;
    `stops` end the reply."""

    source: str | None = None  # the run's Jinja template; None: the default above
    bos_token: str = ""
    eos_token: str = ""

    @property
    def stops(self) -> tuple[str, ...]:
        return STOP_STRINGS if self.source is None else ()

    def render(self, messages: Sequence[dict], tools: Sequence[dict] = (), *, add_generation_prompt: bool = True
               ) -> str:
        """The prompt; `tools`: the functions offered, as the request gives them ({"type": "function", ...});
        `add_generation_prompt`: end with the assistant's turn begun, as a reply needs."""
        if self.source is None:
            offered = [tool["function"] for tool in tools]
            turns = [f"System: Tools you may call, replying {TOOL_CALL}{{\"name\": ..., \"arguments\": {{...}}}}: "
                     f"{json.dumps(offered, ensure_ascii=False)}"] if offered else []
            turns += [f"{DEFAULT_ROLES[m['role']]}: {_shown(m)}{self.eos_token if m['role'] == 'assistant' else ''}"
                      for m in messages]
            return "\n".join([*turns, "Assistant:"] if add_generation_prompt else turns)
        return render(self.source, messages, tools, add_generation_prompt=add_generation_prompt,
                      bos_token=self.bos_token, eos_token=self.eos_token)

    def reply_content(self, text: str) -> str:
        """A reply's content, from the text the model wrote after the generation prompt: the default format writes the
        space after `Assistant:` itself (a turn reads `Assistant: {content}`, a reply is learnt as ' Hello.'), so the
        text's first space is the format's; a template of one's own writes the reply as it is. The chat with the reply
        as its content then renders as the model read it."""
        return text.removeprefix(" ") if self.source is None else text

    def content_stream(self, on_content: Callable[[str], None]) -> Callable[[int, str], None]:
        """An `on_text(i, piece)` for `Pipeline.generate` that hands `on_content` the reply's content
        (`reply_content`) as the text settles, piece by piece: the first piece read as the reply's start, the others
        passed on as they are (the text is never joined up, per piece)."""
        begun = False

        def heard(_: int, piece: str) -> None:
            nonlocal begun
            if piece and not begun:
                piece, begun = self.reply_content(piece), True
            if piece:
                on_content(piece)

        return heard

    def turn_end_ids(self, tokenizer: Tokenizer) -> frozenset[int]:
        """The special token that closes an assistant's turn in this template (ChatML's <|im_end|>, Llama 3's
        <|eot_id|>, Gemma's <end_of_turn>), which ends a chat's reply as vLLM and transformers end it (a chat model's
        generation_config.json lists it; a tokenizer whose EOS is another, Qwen's <|endoftext|>, does not). Found, not
        named: a one-turn conversation is rendered and the token read that follows the reply, where it is one of the
        tokenizer's special tokens. Empty for the default format (its replies end at EOS and the next turn), a
        template that refuses the sample turn, or one whose reply is followed by text rather than a special token."""
        encode = getattr(tokenizer, "encode_with_specials", None)
        if self.source is None or encode is None:
            return frozenset()
        try:
            whole = self.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SAMPLE_REPLY}],
                                add_generation_prompt=False)
        except Exception:  # a template that takes no such turn names no end of it
            return frozenset()
        _, found, after = whole.partition(_SAMPLE_REPLY)
        first = encode(after.lstrip())[:1] if found and after.strip() else []
        return frozenset(first) if first and first[0] in getattr(tokenizer, "special_ids", ()) else frozenset()

    def prompt_ids(self, tokenizer: Tokenizer, prompt: str) -> list[int]:
        """The token ids of a `prompt` this template rendered, as transformers' `apply_chat_template(tokenize=True)`
        gives them (and its `TextGenerationPipeline`, which passes chats through it and ignores add_special_tokens):
        the special tokens the template writes ("<s>", "</s>", "<|im_start|>") are those tokens, and none is added,
        so BOS comes first where the template writes `bos_token`, and nowhere else, whatever the tokenizer puts
        before a plain text (`starts_with_bos`). The default format writes no special token: its texts are read as
        text and framed as a completion's prompt is (`Pipeline.prompt_ids`), BOS first where the tokenizer begins its
        texts with it, as the run saw its plain texts. Raises InputError for a prompt of no token."""
        encode = getattr(tokenizer, "encode_with_specials", None) if self.source is not None else None
        ids = (encode or tokenizer.encode)(prompt)  # a tokenizer of one's own without the method: as text
        if not ids:
            raise InputError("the chat template renders these messages as no token: give messages with content")
        framed = self.source is None and bos_first(tokenizer)
        return [tokenizer.bos_id, *ids] if framed else ids

    def conversation_ids(self, tokenizer: Tokenizer, messages: Sequence[dict], tools: Sequence[dict] = ()
                         ) -> tuple[list[int], list[bool]]:
        """A conversation's token ids, and for each whether it is the assistant's: what chat fine-tuning trains on
        (the loss on the replies alone, as TRL's `assistant_only_loss`). Each reply is the text the conversation up
        to it renders past its prompt (`render(messages[:i])`, what the server gives the model to answer), so the
        tokens before a reply are its prompt as `prompt_ids` reads it. The reply's tokens are the whole text's past
        the prompt's, where the prompt's tokens begin the whole's (they do at a template's marks): as
        transformers' `return_assistant_tokens_mask` marks them, and as the model writes them after that prompt. A
        SentencePiece tokenizer (Llama 2's, Mistral's) puts a word mark before every text it reads alone, so a reply
        tokenized on its own would begin with a token the model never writes there. Where a token of the whole
        straddles the prompt's end, the reply is tokenized on its own. A template of one's own ends a reply itself
        (Llama 2's `</s>`, ChatML's `<|im_end|>`, which belong to the reply); the default format has no such mark, so
        EOS follows each reply there, which generation stops at. Turns after the last reply are left out: nothing is
        learnt from them. A reply of `"weight": 0` (axolotl's per-turn weight) is read but not marked. `tools`: the
        functions the conversation offered ({"type": "function", "function": {...}}), rendered as `chat_ids` renders
        a served chat's, so a call is learnt after the tools it calls.

            User: Hi!          prompt   (not trained)
            Assistant: Hello.  reply    ' Hello.' EOS (trained)

        Raises InputError for a conversation without a reply, one the template refuses or fails on, or a template
        that renders a conversation's start otherwise than the whole (one that rewrites earlier turns, so no reply
        has one prompt)."""
        if not any(message["role"] == "assistant" for message in messages):
            raise InputError("a conversation holds no assistant turn: chat fine-tuning learns the assistant's replies")
        return self._turns(tokenizer, messages, tools, None)

    def chat_ids(self, tokenizer: Tokenizer, messages: Sequence[dict], tools: Sequence[dict] = (), *,
                 add_generation_prompt: bool = True) -> list[int]:
        """A chat's token ids as the run reads it to reply (`attnkit serve`, `attnkit generate --chat`), read as chat
        fine-tuning reads a conversation (`conversation_ids`), so that a served chat's prompt begins as its training
        text does: a template of one's own writes each turn's end itself, and its text is read whole
        (`render`, `prompt_ids`); the default format has no such mark, so EOS follows each earlier reply here as in
        training. Raises InputError as `conversation_ids` and `prompt_ids` do, and for no tokenizer (a run without
        its tokenizer/ directory)."""
        if tokenizer is None:
            raise InputError("there is no tokenizer to read the chat as tokens: save the one the model was trained "
                             "with into the run directory's tokenizer/")
        if self.source is None:
            return self._turns(tokenizer, messages, tools, add_generation_prompt)[0]
        try:
            text = self.render(messages, tools, add_generation_prompt=add_generation_prompt)
        except Exception as error:  # the template's own refusal (`raise_exception`), or a fault it shows here
            raise InputError(f"the chat template cannot render this chat ({_said(error)}): give turns it takes (some "
                             "take no system turn, or only user and assistant turns in turn)") from None
        return self.prompt_ids(tokenizer, text)

    def _turns(self, tokenizer: Tokenizer, messages: Sequence[dict], tools: Sequence[dict],
               add_generation_prompt: bool | None) -> tuple[list[int], list[bool]]:
        """`conversation_ids`'s reading, turn by turn; then, unless `add_generation_prompt` is None, the text after the
        last reply (with the generation prompt where it is True), as the prompt of a reply to come."""
        ids: list[int] = []
        trained: list[bool] = []
        done, done_ids = "", []  # the text tokenized so far, and its tokens as `prompt_ids` reads the text whole
        encode = getattr(tokenizer, "encode_with_specials", None) if self.source is not None else None
        encode = encode or tokenizer.encode
        end = [tokenizer.eos_id] if self.source is None and tokenizer.eos_id is not None else []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            try:
                prompt = self.render(messages[:i], tools)
                whole = self.render(messages[: i + 1], tools, add_generation_prompt=False)
            except Exception as error:  # the template's own refusal (`raise_exception`), or a fault it shows here
                raise InputError(f"the chat template cannot render this conversation ({_said(error)}): give turns "
                                 "it takes (some take no system turn, or only user and assistant turns in turn)"
                                 ) from None
            if not prompt.startswith(done) or not whole.startswith(prompt):
                raise InputError(f"the chat template renders turn {i} of a conversation otherwise than the "
                                 "conversation before it: a reply has no one prompt to learn it after; use a template "
                                 "that renders earlier turns as they were")
            prompt_ids, whole_ids = self.prompt_ids(tokenizer, prompt), self.prompt_ids(tokenizer, whole)
            asked = _after(done_ids, prompt_ids) or encode(prompt[len(done):])
            reply = _after(prompt_ids, whole_ids) or encode(whole[len(prompt):])
            ids += asked + reply + end
            learnt = message.get("weight", 1) != 0  # axolotl's per-turn weight: a reply of weight 0 is read, not learnt
            trained += [False] * len(asked) + [learnt] * (len(reply) + len(end))
            done, done_ids = whole, whole_ids
        if add_generation_prompt is not None:
            rest = self.render(messages, tools, add_generation_prompt=add_generation_prompt)
            if len(rest) > len(done):
                ids += _after(done_ids, self.prompt_ids(tokenizer, rest)) or encode(rest[len(done):])
            trained += [False] * (len(ids) - len(trained))
        return ids, trained

    def settings(self) -> dict[str, str]:
        """What a tokenizer_config.json keeps of this template (`chat_template` reads it back); {} for the default."""
        if self.source is None:
            return {}
        return {"chat_template": self.source, "bos_token": self.bos_token, "eos_token": self.eos_token}


DEFAULT_FORMAT = ChatTemplate()  # plain-text turns (module docstring): a run without a template of its own


def _after(head: list[int], ids: list[int]) -> list[int]:
    """`ids` past `head` where `head` begins them; [] where it does not (a token straddles its end) or nothing
    follows it."""
    return ids[len(head):] if ids[: len(head)] == head else []


def _shown(message: dict) -> str:
    """A message's text in the default format: its content, then each of its calls as the reply wrote it."""
    calls = [TOOL_CALL + json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                                    ensure_ascii=False) for call in message.get("tool_calls") or ()]
    return " ".join(part for part in (message["content"], *calls) if part)


def chat_template(tokenizer_dir: Path, specials: dict[str, str] | None = None) -> ChatTemplate:
    """The run's own template (its tokenizer_config.json's `chat_template`), else the default, which is also what
    `DEFAULT_CHAT_TEMPLATE` (the default as `convert --to-hf` writes it) reads as: its replies end at EOS and at the
    stop strings. Its `bos_token` and `eos_token` are the file's, else the tokenizer's `specials` (role -> token), as
    an export writes them; each renders as its text, which `ChatTemplate.prompt_ids` reads as the token."""
    source, settings = config_template(tokenizer_dir)
    if source is None or is_default_template(source):
        return ChatTemplate()
    specials = specials or {}
    return ChatTemplate(source, _token(settings.get("bos_token")) or specials.get("bos", ""),
                        _token(settings.get("eos_token")) or specials.get("eos", ""))


def is_default_template(source: str) -> bool:
    """Whether `source` is attnkit's own format in Jinja as an export writes it (`DEFAULT_CHAT_TEMPLATE`, or the
    earlier form without EOS after each reply)."""
    return source in (DEFAULT_CHAT_TEMPLATE, EARLIER_DEFAULT_TEMPLATE)


def _token(value) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    return value.get("content", "") if isinstance(value, dict) else (value or "")


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    """`source` compiled in transformers' environment (see `render`); cached, since a server renders it per request."""
    return _environment().from_string(source)


@functools.cache
def _environment():
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise InputError("chat templates need Jinja: pip install jinja2") from None

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        from jinja2.exceptions import TemplateError

        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    return environment


def _said(error: BaseException | None) -> str:
    line = getattr(error, "lineno", None)
    return f"{type(error).__name__}{f' at line {line}' if line else ''}: {error}"
