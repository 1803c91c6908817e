"""attnkit's own chat format, as a Jinja chat template for the files that carry one (a GGUF's
`tokenizer.chat_template`, read by llama.cpp, Ollama, LM Studio and `transformers`' `apply_chat_template`).

A run without a template of its own chats in plain text, the form `attnkit serve` renders (`attnkit.serve.chat`),
which a model trained on plain text can continue:

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: Who are you?
    Assistant:

`developer` turns are written as `System`. The last line (`Assistant:`) is the generation prompt, added when the
renderer asks for it (`add_generation_prompt`, as every chat runtime does for a reply). The reply ends at the next
line that starts a turn: give the runtime the stop string `"\\nUser:"` (llama.cpp: `-r "\\nUser:"`), as the server does.

The template writes newlines as `{{ '\\n' }}` and strips the whitespace around its tags, so it renders the same with
and without Jinja's `trim_blocks` / `lstrip_blocks` (transformers sets both, llama.cpp's engine neither).
"""

from __future__ import annotations

DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if not loop.first %}{{ '\\n' }}{% endif -%}"
    "{%- if message['role'] == 'system' or message['role'] == 'developer' %}System"
    "{%- elif message['role'] == 'user' %}User"
    "{%- elif message['role'] == 'assistant' %}Assistant"
    "{%- else %}{{ message['role'] }}{% endif -%}"
    "{{ ': ' }}{{ message['content'] }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if messages %}{{ '\\n' }}{% endif %}Assistant:"
    "{%- endif -%}"
)
