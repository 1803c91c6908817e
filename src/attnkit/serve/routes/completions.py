"""POST /v1/completions and /v1/chat/completions: text completion and chat, whole or streamed, on the batching
scheduler (chat's messages rendered by the run's chat template, `serve/chat.py`; its response_format and tools, and
either endpoint's vLLM guided_* field, held as a grammar, `serve/structured.py`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from attnkit.errors import AttnkitError
from attnkit.generate.pipeline import Pipeline
from attnkit.serve.answer import Answer, ClientGone
from attnkit.serve.batching import Closed, Unfit
from attnkit.serve.errors import APIError
from attnkit.serve.generation import Generation, refuse_long_text
from attnkit.serve.logprobs import prompt_scores
from attnkit.serve.schemas import ChatRequest, CompletionRequest, Sampling
from attnkit.serve.state import ServerState
from attnkit.serve.structured import Structured, check_tool_turns
from attnkit.serve.waiting import QueueFull

DEFAULT_COMPLETION_TOKENS = 16  # max_tokens of a completion that names none (as OpenAI)
RETRY_AFTER_SECONDS = 1


def router(state: ServerState) -> APIRouter:
    routes = APIRouter()
    pipeline, settings = state.pipeline, state.settings

    @routes.post("/v1/completions")
    async def completions(request: Request):
        body = await state.body(request, CompletionRequest)
        state.check_model(body.model)
        structured = await run_in_threadpool(Structured.of, body)  # vLLM's guided fields, checked by llguidance
        return await generate(request, body, body.prompts, "text_completion", stops=(),
                              max_tokens=body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS,
                              logprobs=body.logprobs, echo=body.echo, structured=structured)

    @routes.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await state.body(request, ChatRequest)
        state.check_model(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true as well", param="top_logprobs")
        chat = await run_in_threadpool(ChatPrompt.of, pipeline, body)
        newer = body.max_completion_tokens is not None  # OpenAI's newer name, read first
        limit = body.max_completion_tokens if newer else body.max_tokens
        return await generate(request, body, [chat.ids], "chat.completion", stops=chat.stops,
                              end_ids=chat.end_ids, max_tokens=limit,
                              limit_field="max_completion_tokens" if newer else "max_tokens",
                              logprobs=(body.top_logprobs or 0) if body.logprobs else None, structured=chat.structured)

    async def generate(request: Request, body: Sampling, prompts: list[str] | list[list[int]], kind: str, *,
                       stops: tuple[str, ...], max_tokens: int | None, limit_field: str = "max_tokens",
                       end_ids: frozenset[int] = frozenset(), logprobs: int | None = None,
                       echo: bool = False, structured: Structured | None = None):
        scheduler = state.scheduler
        if scheduler is None:
            raise APIError(404, f"this run ({pipeline.family}) does not generate text; its endpoints are "
                           f"{', '.join(state.endpoints()) or 'none'}", code="endpoint_not_served")
        if body.stream_options is not None and not body.stream:  # as OpenAI and vLLM refuse it
            raise APIError(400, "stream_options is read only when the answer is streamed: send stream: true, or "
                           "leave stream_options out", param="stream_options")
        # at most --max-queue prompts a request, so that what waits stays bounded (half of them hold places in the
        # queue, the rest wait behind them without one, `serve/waiting.py`): 400, as the same request retried fails
        if len(prompts) > settings.max_queue:
            raise APIError(400, f"this request has {len(prompts)} prompts; this server queues at most "
                           f"{settings.max_queue} (--max-queue): send at most that many per request", param="prompt")
        loop = asyncio.get_running_loop()
        jobs = await run_in_threadpool(lambda: [
            Generation(pipeline, p, body, index, loop=loop, stops=stops, end_ids=end_ids, max_tokens=max_tokens,
                       limit_field=limit_field, settings=settings,
                       chat=kind == "chat.completion", logprobs=logprobs, echo=echo, structured=structured)
            for index, p in enumerate(prompts)])
        if echo and logprobs is not None:  # the prompt's own tokens, scored by one forward pass each
            for job in jobs:
                job.prompt_scores = (await state.held(lambda job=job: prompt_scores(
                    pipeline.model, job.prompt_ids, logprobs, pipeline.tokenizer))).entries
        for job in jobs:
            try:
                scheduler.submit(job.job)
            except QueueFull:
                _cancel(jobs)
                raise APIError(429, "the server is busy (its queue is full); try again shortly",
                               headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
            except Closed as error:  # shutting down, or generation has stopped
                _cancel(jobs)
                raise APIError(503, str(error)) from None
            except Unfit as error:
                _cancel(jobs)
                raise APIError(400, str(error), param=error.param) from None
        options = body.stream_options
        usage = bool(options and options.include_usage)
        answer = Answer(kind, state.model_id, jobs, include_usage=usage, tokenizer=pipeline.tokenizer,
                        timeout=settings.timeout, continuous_usage=usage and options.continuous_usage_stats)
        if body.stream:
            return StreamingResponse(answer.stream(request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            # written on a worker thread: thousands of log-probabilities take tenths of a second to write, which on
            # the event loop would hold every other request (plain JSON already: FastAPI's encoder is not needed)
            return await run_in_threadpool(JSONResponse, await answer.whole(request))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client has gone (nginx's code for this)

    return routes


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request read through the chat template the pipeline holds when the request arrives: the prompt, the
    stop strings and the end of turn alike (an application serving a `Pipeline` may replace its template between
    requests; read once at start-up, the end of turn stayed the first template's while the rest followed)."""

    ids: list[int]  # the messages rendered by the template and tokenized (`ChatTemplate.chat_ids`)
    stops: tuple[str, ...]  # the template's stop strings
    end_ids: frozenset[int]  # its end-of-turn tokens (`Pipeline.chat_end_ids`): a reply ends there, as at EOS
    structured: Structured | None  # response_format and tools: a grammar the reply is held to

    @classmethod
    def of(cls, pipeline: Pipeline, body: ChatRequest) -> ChatPrompt:
        """400 naming the field that fails (a tool message that answers no call, `check_tool_turns`), and for a
        rendered text whose head alone fills the context, before it is tokenized whole (`refuse_long_text`)."""
        template, tokenizer = pipeline.chat_template, pipeline.tokenizer
        check_tool_turns(body.messages)
        structured = Structured.of(body)
        messages, tools = [m.rendered() for m in body.messages], structured.tools if structured else ()
        try:
            prompt = template.render(messages, tools)
        except Exception as error:  # a template that fails on these messages (e.g. roles it does not allow)
            raise APIError(400, f"the chat template cannot render these messages: {error}", param="messages") from None
        try:
            refuse_long_text(tokenizer, prompt, pipeline.config.max_seq_len,
                             what="the messages, as the chat template renders them, hold", param="messages")
            ids = template.chat_ids(tokenizer, messages, tools)  # read as the run was trained on it
        except AttnkitError as error:
            raise APIError(400, str(error), param="messages") from None
        return cls(ids=ids, stops=template.stops, end_ids=frozenset(pipeline.chat_end_ids()), structured=structured)


def _cancel(generations: list[Generation]) -> None:
    for generation in generations:
        generation.job.cancel()
