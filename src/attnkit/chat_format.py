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

The template writes newlines as `{{ '\\n' }}` and strips the whitespace around its tags, so it renders the same with
and without Jinja's `trim_blocks` / `lstrip_blocks` (transformers sets both, llama.cpp's engine neither). JSON is
written by `tojson` as transformers defines it (`json.dumps`, keys in order, non-ASCII kept), which `render` uses for
every template.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from attnkit.errors import InputError

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
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if messages or tools %}{{ '\\n' }}{% endif %}Assistant:"
    "{%- endif -%}"
)
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
