"""Request bodies read and checked: a size limit before anything is read, then JSON, then the body's schema
(`serve/schemas.py`), so that each malformed or hostile body gets an OpenAI-style 4xx naming the field.

`read_body` runs on the event loop and only counts bytes; `parse_body` costs time in the body's size and runs on a
worker thread (`ServerState.body`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import threading
import time
from dataclasses import dataclass, field

from fastapi import Request
from pydantic import ValidationError

from attnkit.serve.errors import SHUTTING_DOWN, APIError
from attnkit.serve.schemas import Body

RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_long", "too_short",
                "string_too_short", "string_too_long", "literal_error"}  # a value of the right type out of range
CLOSE = {"Connection": "close"}  # with an answer sent while the body is unread: the connection ends (RFC 9110
# 15.5.9), as h11 would otherwise wait on it for the rest of the body the client declared
LINGER_S = 2.0  # how long a body refused as too large is still read, and dropped, before the answer closes the
# connection (nginx's lingering close): closed on bytes unread, the connection is reset, and a client still sending
# loses the answer
POLL_S = 0.1  # how often a body still arriving is checked against the timeout and the server's stop
UNION_MEMBER = re.compile(r"^(str|int|float|bool|constrained-.*|.*\[.*\]|[A-Z][A-Za-z0-9]*)$")  # pydantic's name of
# a union's member: a type, or a model's class (JSON fields here are lower case)


@dataclass
class Arrival:
    """How much of a body has come, and when its last bytes did."""

    size: int = 0
    last: float = field(default_factory=time.monotonic)


def too_large(size: str, limit: int) -> APIError:
    """413 for a body of `size` bytes (a number, or words such as "more than 5 bytes") beyond `limit`."""
    return APIError(413, f"the request body has {size} bytes; this server takes at most {limit:,} (--max-body): "
                    "send a smaller body, or start the server with a larger --max-body",
                    code="request_too_large", headers=CLOSE)


async def read_body(request: Request, limit: int, timeout: float, closing: threading.Event) -> bytes:
    """The body's bytes: 413 beyond `limit` bytes, as its Content-Length declares or as it arrives (chunked); 408
    when nothing of it has come for `timeout` seconds, and 503 once `closing` is set (the server is stopping),
    checked every POLL_S while it arrives. The timeout restarts with each chunk, as nginx's client_body_timeout
    does: a slow but steady upload takes what it needs, and a client gone silent holds its connection, and a stop,
    no longer than `timeout`. Each of these answers closes the connection (`CLOSE`)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await _drop_rest(request)
        raise too_large(f"{int(declared):,}", limit)
    arrival = Arrival()
    reading = asyncio.ensure_future(_chunks(request, limit, arrival))
    try:
        while not reading.done():
            await asyncio.wait({reading}, timeout=POLL_S)
            if reading.done():
                break
            if closing.is_set():
                raise APIError(503, SHUTTING_DOWN, headers=CLOSE)
            if time.monotonic() - arrival.last > timeout:
                raise APIError(408, f"the request body stopped arriving: nothing came for {timeout:g} s (the server's "
                               f"--timeout) after {arrival.size:,} bytes; send the body without pauses that long",
                               code="request_timeout", headers=CLOSE)
        return reading.result()
    except APIError as error:
        if error.status == 413:
            await _drop_rest(request)
        raise
    finally:
        reading.cancel()


async def _drop_rest(request: Request) -> None:
    """Read what is left of the body, and drop it, for LINGER_S at most."""
    async def drop() -> None:
        while True:
            message = await request.receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    try:
        await asyncio.wait_for(drop(), LINGER_S)
    except TimeoutError:
        pass


async def _chunks(request: Request, limit: int, arrival: Arrival) -> bytes:
    """The body as it arrives, each chunk counted in `arrival`; 413 once it passes `limit` bytes."""
    chunks = []
    async for chunk in request.stream():
        arrival.size += len(chunk)
        arrival.last = time.monotonic()
        if arrival.size > limit:
            raise too_large(f"more than {limit:,}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(schema: type[Body], raw: bytes, content_type: str = "application/json"):
    """`raw` as `schema`: 400 for bytes that are not UTF-8 JSON (saying the `content_type` they came as, when not
    JSON's: curl's -d sends a form's unless told), else as `validate`. A JSON body is read whatever its type says."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {error.start}); send JSON in UTF-8") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise APIError(400, "the request body nests too deeply to read; send a flat JSON object") from None
    except json.JSONDecodeError as error:
        sent = "" if "json" in content_type else f" (it came as {content_type or 'no Content-Type'})"
        raise APIError(400, f"the request body is not JSON: {error.msg} at character {error.pos}{sent}; send a JSON "
                       "object, with Content-Type: application/json") from None
    except ValueError:  # an integer beyond Python's limit of digits (sys.get_int_max_str_digits)
        raise APIError(400, f"the request body holds a number of more than {sys.get_int_max_str_digits():,} "
                       "digits; send numbers of ordinary size") from None
    return validate(schema, data)


def validate(schema: type[Body], data):
    """The body as `schema`: 422 for a wrong type or a missing field, 400 for a value out of range, a field the
    server does not take, text that UTF-8 cannot encode, or NaN or Infinity; each naming the field."""
    if not isinstance(data, dict):
        raise APIError(422, f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        _check_values(data)
        return schema.model_validate(data)
    except ValidationError as error:
        first = _reported(error, data)
        loc = [part for part in first["loc"] if not (isinstance(part, str) and UNION_MEMBER.match(part))]
        field = str(loc[0]) if loc else None  # the top-level field, as OpenAI's param names it
        where = ".".join(str(part) for part in loc)
        if first["type"] == "extra_forbidden":
            if len(loc) > 1:
                raise APIError(400, f"{where}: this server takes no such field there", param=field) from None
            known = ", ".join(schema.model_fields)
            raise APIError(400, schema.not_honoured(field) or f"{where}: this server takes no such field (the fields "
                           f"it takes: {known})", param=field) from None
        status = 400 if first["type"] in RANGE_ERRORS else 422
        raise APIError(status, f"{where}: {first['msg']}", param=field) from None
    except RecursionError:
        raise APIError(400, "the request body nests too deeply to read; send a flat JSON object") from None


def _reported(error: ValidationError, data: dict) -> dict:
    """The error to report: the first, unless it lies in a union (a field's, or a nested one's such as a message's
    content) and the value has the type of another member (a list of five stop strings is "at most 4 items", not
    "should be a valid string"); of several such members, the one whose error lies deepest, the member the value
    came closest to (a list of token-id lists with a negative id: that id, not "should be a valid string"; an object
    given for a string or a model: the model's complaint)."""
    errors = error.errors(include_url=False)
    first = errors[0]
    loc = first["loc"]
    at = next((i for i, part in enumerate(loc) if i and isinstance(part, str) and UNION_MEMBER.match(part)), None)
    if at is None:
        return first
    value = data
    for part in loc[:at]:  # the union's value in the body
        fits = isinstance(value, dict) and part in value or isinstance(value, list) and isinstance(part, int)
        value = value[part] if fits and (isinstance(value, dict) or part < len(value)) else None
    kind = "list" if isinstance(value, list) else "str" if isinstance(value, str) else \
        "dict" if isinstance(value, dict) else None
    same = [e for e in errors if e["loc"][:at] == loc[:at] and len(e["loc"]) > at
            and (str(e["loc"][at]).split("[")[0] in (kind, f"constrained-{kind}")
                 or kind == "dict" and str(e["loc"][at])[:1].isupper())]  # an object: a model member's errors
    if same:
        return max(same, key=lambda e: len(e["loc"]))
    members = list(dict.fromkeys(str(e["loc"][at]) for e in errors if e["loc"][:at] == loc[:at] and len(e["loc"]) > at))
    return {"loc": loc[:at], "type": "union_type",  # a value of no member's type: name every member, and the value's
            "msg": f"expected {_or(_member_words(m) for m in members)}, not {_json_kind(value)}"}


def _member_words(member: str) -> str:
    """pydantic's name of a union member in a client's words: "list[constrained-int]" -> "a list of token ids"."""
    words = {"str": "a string", "constrained-str": "a string", "int": "a whole number", "float": "a number",
             "bool": "true or false",
             "list[str]": "a list of strings", "list[constrained-str]": "a list of strings",
             "list[constrained-int]": "a list of token ids", "list[list[constrained-int]]": "a list of token-id lists",
             "list[TextPart]": "a list of content parts"}
    return words.get(member, f"an object ({member})" if member[:1].isupper() else member)


def _json_kind(value) -> str:
    """What a JSON value is, in a client's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return {int: "a number", float: "a number", dict: "an object", list: "a list", str: "a string"}[type(value)]


def _or(words) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _check_values(data) -> None:
    """400 naming the first string (or key) that UTF-8 cannot encode: a lone surrogate such as "\\ud800", which
    JSON's escapes can write but no tokenizer reads; and the first NaN or Infinity, which JSON has no numbers for
    (Python's json writes them, and every range check passes NaN by). Walked without recursion (the body may nest
    deeply)."""
    stack: list[tuple[tuple, object]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [((*path, key), key) for key in value] + [((*path, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [((*path, i), v) for i, v in enumerate(value)]
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                where = ".".join(str(part) for part in path) or "the body"
                raise APIError(400, f"{where}: the text holds a lone surrogate ({value[error.start]!a}) at "
                               f"character {error.start}, which UTF-8 cannot encode; send valid Unicode text",
                               param=str(path[0]) if path else None) from None
        elif isinstance(value, float) and not math.isfinite(value):
            written = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            raise APIError(400, f"{'.'.join(str(part) for part in path)}: {written} is not a JSON number (JSON has "
                           "no NaN or Infinity); send a finite number", param=str(path[0]))
