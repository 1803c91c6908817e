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
from attnkit.errors import InputError
from attnkit.tokenize import Tokenizer

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
        bos = tokenizer.bos_id
        framed = self.source is None and getattr(tokenizer, "starts_with_bos", False) and bos is not None
        return [bos, *ids] if framed else ids


def _shown(message: dict) -> str:
    """A message's text in the default format: its content, then each of its calls as the reply wrote it."""
    calls = [TOOL_CALL + json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                                    ensure_ascii=False) for call in message.get("tool_calls") or ()]
    return " ".join(part for part in (message["content"], *calls) if part)


def chat_template(tokenizer_dir: Path, specials: dict[str, str] | None = None) -> ChatTemplate:
    """The run's own template (its tokenizer_config.json's `chat_template`), else the default. Its `bos_token` and
    `eos_token` are the file's, else the tokenizer's `specials` (role -> token), as an export writes them; each
    renders as its text, which `ChatTemplate.prompt_ids` reads as the token."""
    source, settings = config_template(tokenizer_dir)
    if source is None:
        return ChatTemplate()
    specials = specials or {}
    return ChatTemplate(source, _token(settings.get("bos_token")) or specials.get("bos", ""),
                        _token(settings.get("eos_token")) or specials.get("eos", ""))


def _token(value) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    return value.get("content", "") if isinstance(value, dict) else (value or "")
