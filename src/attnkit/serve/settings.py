"""What `attnkit serve` takes: every field is a flag of the command (`attnkit.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.run_settings import DecodeSettings

if TYPE_CHECKING:
    from attnkit.tasks import TaskSpec

API_KEY_ENV = "ATTNKIT_API_KEY"  # the API key, when --api-key is not given
# what only a run that generates reads (its scheduler)
GENERATION_OPTIONS = ("max_batch", "max_queue", "max_tokens", "prefix_cache", "prefix_cache_mib", "draft",
                      "draft_tokens")


@dataclass(frozen=True, kw_only=True)
class ServeSettings(DecodeSettings):
    """How `attnkit serve` serves one run over HTTP, loaded as `attnkit generate` loads it (`DecodeSettings`: the
    device, --dtype, --int8, --int4, --compile, through the same inference plan, which --explain logs)."""

    host: str = "127.0.0.1"  # address to bind; any but a loopback one (127.0.0.1, localhost, ::1) needs an API key
    port: int = 8000  # port to listen on (0: any free one, said when the server starts)
    api_key: str | None = None  # clients send it as "Authorization: Bearer KEY"; default: $ATTNKIT_API_KEY
    max_batch: int = 32
    """sequences decoded together in one forward pass at most (with --draft: in each batch); one request's n choices
    take at most --max-batch - 1 rows (1 with --max-batch 1), so that a row is left for later requests; more: 400"""
    max_queue: int = 64
    """places for prompts (not requests) waiting to join the batch; beyond, 429 with Retry-After. One request's prompts
    hold at most half of them (the rest wait behind without a place), so that other clients find room; more prompts
    than --max-queue in one request: 400"""
    max_tokens: int = 512  # new tokens one request may ask for at most (and the context's room)
    prefix_cache: bool = True  # reuse the keys and values of recent prompts' starts (vLLM's automatic prefix caching)
    prefix_cache_mib: int = 256  # memory the prefix cache takes at most (MiB); beyond, least recently used blocks go
    draft: str | None = None
    """a smaller decoder run with the same tokenizer: speculative decoding of the requests it can serve (greedy, or
    sampled without a seed, no penalties, grammar or logprobs: the others decode as without it); the same text
    (greedy) or distribution (sampled) as this run alone; /metrics shows the acceptance rate"""
    draft_tokens: int | None = None  # --draft: the tokens the draft proposes a round (default 4; 2 to 6 is usual)
    served_model_name: tuple[str, ...] = ()  # names requests may ask for, answers carry the first; none: the run's
    allowed_origins: tuple[str, ...] = ()  # web pages' origins that may call the API from a browser (CORS; * any)
    timeout: float = 120.0
    """seconds a request may run after its body (then 504), the longest pause in a body (408), and the time a request's
    head (request line and headers) has to arrive whole once the connection opens or the last answer ends (then the
    connection is closed)"""
    shutdown_timeout: float = 0.0  # seconds a stop lets requests in flight end, new ones refused (503); 0: ends them
    max_body: int = 1_000_000  # request body size in bytes at most; beyond, 413
    watch: str | None = None  # the training run whose metrics.jsonl the explorer follows; default: RUN
    experiments: str | None = None  # the experiments' results directory the explorer shows; default: docs/experiments
    sae: str | None = None  # an SAE's directory (OUT/sae of attnkit inspect RUN sae): the explorer shows its features


def inapplicable(spec: TaskSpec, run: str | Path) -> dict[str, str]:
    """The options of `attnkit serve` that `run`, a run of `spec`, does not read, each with why: those of the batch
    scheduler that decodes text (`GENERATION_OPTIONS`) unless its task generates. The command hides and refuses them."""
    from attnkit.tasks import unread_options

    return unread_options(spec, GENERATION_OPTIONS,
                          lambda task: GENERATION_OPTIONS if task.method == "generate" else (), run)
