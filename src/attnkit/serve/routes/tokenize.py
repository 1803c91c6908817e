"""POST /tokenize and /detokenize, in vLLM's shapes (`serving_tokenization.py`): a prompt's or a chat's token ids as
the generation endpoints feed them, with the model's context (`max_model_len`), and token ids back to text.

    /tokenize    {"prompt": "..."} or {"messages": [...], "tools": [...]}  ->  {"count", "max_model_len", "tokens",
                                                                               "token_strs"}
    /detokenize  {"tokens": [...]}                                        ->  {"prompt"}

Tokenizing, rendering the template and writing the answer run on a worker thread, as the generation endpoints'
do.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from attnkit.errors import AttnkitError
from attnkit.serve.errors import APIError
from attnkit.serve.schemas import DetokenizeRequest, TokenizeRequest
from attnkit.serve.state import ServerState


def router(state: ServerState) -> APIRouter:
    routes = APIRouter()
    pipeline = state.pipeline

    @routes.post("/tokenize")
    async def tokenize(request: Request):
        body = await state.body(request, TokenizeRequest)
        state.check_model(body.model)
        return await run_in_threadpool(lambda: _answer(pipeline, token_ids(state, body), body.return_token_strs))

    @routes.post("/detokenize")
    async def detokenize(request: Request):
        body = await state.body(request, DetokenizeRequest)
        state.check_model(body.model)
        vocab = pipeline.config.vocab_size
        beyond = [token for token in body.tokens if token >= vocab]
        if beyond:
            raise APIError(400, f"tokens: token id {beyond[0]} is beyond the vocabulary of {vocab} tokens; give ids "
                           f"from 0 to {vocab - 1}", param="tokens")
        return {"prompt": await run_in_threadpool(pipeline.tokenizer.decode, body.tokens)}

    return routes


def token_ids(state: ServerState, body: TokenizeRequest) -> list[int]:
    """The request's token ids (see `TokenizeRequest`); 400 naming the field that fails: both or neither of a prompt
    and messages, tools without messages, a prompt or chat that cannot be read."""
    pipeline = state.pipeline
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give either prompt (a text) or messages (a chat), not both or neither",
                       param="prompt" if body.prompt is not None else "messages")
    if body.tools and body.messages is None:
        raise APIError(400, "tools go with messages: give the chat they are offered in", param="tools")
    if body.prompt is not None:
        if not body.prompt and body.add_special_tokens is False:
            return []
        try:
            if body.add_special_tokens is False:
                return pipeline.tokenizer.encode(body.prompt)
            return pipeline.prompt_ids(body.prompt, index=0)
        except AttnkitError as error:
            raise APIError(400, str(error), param="prompt") from None
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
    try:  # as the chat endpoint reads them
        ids = pipeline.chat_template.chat_ids(pipeline.tokenizer, [m.rendered() for m in body.messages], tools,
                                              add_generation_prompt=body.add_generation_prompt)
    except AttnkitError as error:
        raise APIError(400, str(error), param="messages") from None
    except Exception as error:  # a template that fails on these messages (e.g. roles it does not allow)
        raise APIError(400, f"the chat template cannot render these messages: {error}", param="messages") from None
    bos = pipeline.tokenizer.bos_id
    return [bos, *ids] if body.add_special_tokens and bos is not None else ids  # vLLM's: BOS on top of the template's


def _answer(pipeline, tokens: list[int], pieces: bool) -> JSONResponse:
    """/tokenize's answer, written here (on a worker thread): a megabyte's ids take FastAPI's encoder a quarter
    second, which on the event loop would hold every other request."""
    return JSONResponse({"count": len(tokens), "max_model_len": pipeline.config.max_seq_len, "tokens": tokens,
                         "token_strs": pipeline.tokenizer.pieces(tokens) if pieces else None})
