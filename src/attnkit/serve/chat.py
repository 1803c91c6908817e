"""Chat messages -> one prompt, through a chat template.

A run converted from Hugging Face keeps its tokenizer's `tokenizer_config.json`; when that file holds a
`chat_template` (Jinja), it renders the messages, as `transformers`' `apply_chat_template` does (in a sandboxed
Jinja environment, with `add_generation_prompt=True`). Any other run uses the default, plain text that a model
trained on plain text can continue:

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: Who are you?
    Assistant:

The generated reply then ends at the next line that starts a turn ("\\nUser:"), a stop string the server adds.

Tools offered (`serve/structured.py`) come first in the default format, as a system line naming each function and the
form of a call; an assistant's earlier calls are shown in that form, and a tool's answer as a "Tool:" turn:

    System: Tools you may call, replying <tool_call>{"name": ..., "arguments": {...}}: [{"name": "get_weather", ...}]
    User: Weather in Paris?
    Assistant: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}
    Tool: 18 C, sunny
    Assistant:

A run's own Jinja template gets the tools as `tools` (and the calls as each message's `tool_calls`), as transformers'
`apply_chat_template` passes them. The default is written here in Python; `attnkit.chat_format.DEFAULT_CHAT_TEMPLATE`
is the same format in Jinja, which exports carry (a test holds the two equal).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnkit.chat_format import STOP_STRINGS, config_template, render

DEFAULT_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
TOOL_CALL = "<tool_call>"  # what starts a call in a reply (the marker of Hermes' and Qwen's chat formats)


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
            turns += [f"{DEFAULT_ROLES[m['role']]}: {_shown(m)}" for m in messages]
            return "\n".join([*turns, "Assistant:"] if add_generation_prompt else turns)
        return render(self.source, messages, tools, add_generation_prompt=add_generation_prompt,
                      bos_token=self.bos_token, eos_token=self.eos_token)


def _shown(message: dict) -> str:
    """A message's text in the default format: its content, then each of its calls as the reply wrote it."""
    calls = [TOOL_CALL + json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                                    ensure_ascii=False) for call in message.get("tool_calls") or ()]
    return " ".join(part for part in (message["content"], *calls) if part)


def chat_template(tokenizer_dir: Path, specials: dict[str, str] | None = None, *, starts_with_bos: bool = False
                  ) -> ChatTemplate:
    """The run's own template (its tokenizer_config.json's `chat_template`), else the default. Its `bos_token` and
    `eos_token` are the file's, else the tokenizer's `specials` (role -> token), as an export writes them. For a
    tokenizer that `starts_with_bos` the template's `bos_token` renders as nothing: the prompt's BOS is the token
    itself, put first as `Pipeline.prompt_ids` does, where its text would be read as characters."""
    source, settings = config_template(tokenizer_dir)
    if source is None:
        return ChatTemplate()
    specials = specials or {}
    bos = "" if starts_with_bos else _token(settings.get("bos_token")) or specials.get("bos", "")
    return ChatTemplate(source, bos, _token(settings.get("eos_token")) or specials.get("eos", ""))


def _token(value) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    return value.get("content", "") if isinstance(value, dict) else (value or "")
