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
`apply_chat_template` passes them. The renderer, `ChatTemplate`, lives in `attnkit.chat_format`, where chat
fine-tuning (`--task chat`) renders its conversations with it too; the default is written there in Python, and
`DEFAULT_CHAT_TEMPLATE` is the same format in Jinja, which exports carry (a test holds the two equal).
"""

from __future__ import annotations

from attnkit.chat_format import DEFAULT_ROLES, TOOL_CALL, ChatTemplate, chat_template

__all__ = ["DEFAULT_ROLES", "TOOL_CALL", "ChatTemplate", "chat_template"]
