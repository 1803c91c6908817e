"""A decoding step with fixed shapes, compiled once into one graph (gpt-fast's design).

An eager decoding step of a small model at batch 1 spends more time launching its few hundred small operations
(Python, dispatch, allocation) than computing them. Compiling the step as one graph removes that overhead, but
only pays when the graph stays the same from token to token, and an eager step's shapes grow with the cache. So
the step runs over a `StaticKVCache`:

    prefill (eager)   the prompt's keys/values fill the first L positions; `filled` marks the real ones
    each step         advance()       slot <- the next position, filled[:, slot] <- True
                      compiled step   write k/v at slot; attend over all max_len positions, unfilled ones masked;
                                      the token's position = its row's filled count - 1

Weights are frozen into the graph (inductor's `freezing`), which lets it prepare them for its matrix kernels
(packed layouts for bf16 and int8 on CPU); so the compiled step is for inference, and a model whose weights change
needs a new `StaticDecoding`. Weights already transposed for fp32 decoding on CPU (`decode_layout.py`) are not
frozen: inductor would pack a second copy of them (the memory of the weights held twice). The inference plan
(`plan.py`) says which layout a model has and so whether its weights are frozen. Cache lengths are rounded up to a
power of two, so prompts and lengths of different sizes share a few compiled graphs (one per batch size and length
bucket).

Before running a graph, torch.compile checks its guards: about a thousand facts about the model and the inputs,
a cost that shows in small models' steps. The weights are frozen
into the graph and the step's inputs are built the same way each time, so a call can differ from an earlier one only
in its batch size and cache length, in the global modes torch traces under (grad, inference, autocast) and in the
model's train/eval mode. A call that matches an earlier one in all of these runs with only the guards that tell the
compiled graphs apart (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`); any other runs every guard.

On a GPU the compiled step still launches each of its kernels from the host, and at batch 1 the launches, not the
GPU, set the pace. So once a step has run for a cache, its kernels are captured into a CUDA graph (`GraphedStep`)
and each later step of that cache is one replay: the token is copied into the graph's input, and the cache, which the
graph reads and writes in place, is the cache's own tensors (their addresses do not change). A step whose capture
fails runs compiled as before, and a step torch cannot compile runs eagerly; each says so once, and decoding goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnkit.blocks import torch_compile_mode
from attnkit.errors import InputError
from attnkit.generate.decode_layout import TransposedLinear
from attnkit.generate.decoder import EagerDecoding, Window, prefill
from attnkit.layers.kv_cache import StaticKVCache
from attnkit.models.decoder import DecoderLM

log = logging.getLogger(__name__)

SMALLEST_CACHE = 64  # positions; lengths are rounded up to a power of two from here
MAX_GRAPHS = 64  # compiled graphs kept per step function (torch's default of 8 is soon reached with batch sizes)


def static_step(model: nn.Module, token: Tensor, cache: StaticKVCache) -> Tensor:
    """One decoding step of a DecoderLM over a static cache already advanced: token (B, 1) -> logits (B, V)."""
    position = cache.filled.sum(dim=-1, keepdim=True) - 1  # (B, 1): the row's real tokens before this one
    mask = model.stack.self_mask(1, start=cache.slot, attention_mask=cache.filled)  # the query sits at the slot
    hidden, _ = model.stack.run(token, position, mask=mask, cache=cache)  # (B, 1, C)
    return model.lm_head(hidden[:, -1])  # (B, V)


class GraphedStep:
    """A decoding step over one cache replayed from a CUDA graph: `step(token, cache)` captured once, after a warm-up
    run on a side stream (as CUDA graphs require), with a token buffer of its own as the graph's input."""

    def __init__(self, step: Callable[[Tensor, StaticKVCache], Tensor], token: Tensor, cache: StaticKVCache) -> None:
        self.cache = cache
        self.token = token.clone()  # (B, 1): the graph reads this buffer
        side = torch.cuda.Stream(device=token.device)
        side.wait_stream(torch.cuda.current_stream(token.device))
        with torch.cuda.stream(side):
            step(self.token, cache)  # a step writes only its own slot: running it again changes nothing
        torch.cuda.current_stream(token.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = step(self.token, cache)  # (B, V): the graph writes its output here at each replay

    def __call__(self, token: Tensor) -> Tensor:
        self.token.copy_(token)
        self.graph.replay()
        return self.logits.clone()  # the next replay overwrites the buffer


class StaticDecoding(EagerDecoding):
    """Decoding `model` with fixed shapes: eager prefill, then `static_step`, through torch.compile in the mode
    `compile` names (True or "default"; "max-autotune": see `blocks.COMPILE_MODES`), or eagerly for `compile=False`
    (the readable reference that tests hold the compiled step to)."""

    def __init__(self, model: nn.Module, *, compile: bool | str = True) -> None:
        if not self.supports(model):
            raise InputError(
                f"static decoding steps a decoder-only language model; this is a {type(model).__name__}: decode it "
                f"with EagerDecoding"
            )
        super().__init__(model)

        def step(token: Tensor, cache: StaticKVCache) -> Tensor:
            return static_step(model, token, cache)

        mode = torch_compile_mode(compile)
        self._step = step if mode is None else torch.compile(step, fullgraph=True, dynamic=False, mode=mode)
        self.freezes_weights = not any(isinstance(m, TransposedLinear) for m in model.modules())
        self._compiled = mode is not None
        self._calls_seen: set[tuple] = set()  # `_call_key`s of the calls the step has run
        self._graphed: GraphedStep | None = None  # the current cache's step in a CUDA graph (compiled, on a GPU)
        self._graphs_fail: str | None = None  # why capturing failed here once (then steps run compiled)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """A decoder-only model (every position scheme locates a step's query by the cache slot it writes) without
        sliding-window layers (their rolling cache has no fixed-shape form)."""
        windowed = any(getattr(m, "window", None) is not None for m in model.modules())
        return isinstance(model, DecoderLM) and not windowed

    def allocate(self, batch_size: int, needed: int, context_len: int) -> StaticKVCache:
        bucket = max(SMALLEST_CACHE, 1 << (needed - 1).bit_length())
        return self.model.allocate_cache(batch_size, min(bucket, context_len), static=True)

    def prefill(self, window: Window, cache: StaticKVCache) -> Tensor:
        logits = prefill(self.model, window, cache)
        cache.mark_prefilled(window.attention_mask)
        return logits

    def step(self, window: Window, cache: StaticKVCache) -> Tensor:
        cache.advance()
        token = window.ids[:, -1:].clone(memory_format=torch.contiguous_format)  # (B, 1), strides fixed as well
        if not self._compiled:  # the eager reference
            return self._step(token, cache)
        key = self._call_key(token, cache)
        if key in self._calls_seen and token.device.type == "cuda" and self._graphs_fail is None:
            return self._replay(token, cache)
        if key in self._calls_seen:  # nothing to trace: check only what tells the compiled graphs apart
            try:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return self._step(token, cache)
            except RuntimeError as err:
                # Under this stance torch refuses to compile and raises a plain RuntimeError naming the stance; that
                # means the graphs are gone (torch._dynamo.reset()): run every guard and compile again. A step only
                # writes its own slot, so running it twice changes nothing. Any other error is the step's own.
                if "skip_guard_eval_unsafe" not in str(err):
                    raise
                self._calls_seen.clear()
        # Both settings are read while a step is traced (at its first call for a new batch size or cache length);
        # freezing applies to weights the graph does not take as arguments: hence the model in the step's closure.
        # They are private because torch has no public switch for either: `torch.compile(options=...)` cannot be
        # combined with `mode=`, and dynamo's recompile limit is configured only through `torch._dynamo.config`.
        try:
            with (
                torch._inductor.config.patch(freezing=self.freezes_weights),
                torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS),
            ):
                logits = self._step(token, cache)
        except torch._dynamo.exc.TorchDynamoException as err:  # tracing or compiling failed (no public class names it)
            return self._decode_eagerly(err, token, cache)
        self._calls_seen.add(key)
        return logits

    def _decode_eagerly(self, err: Exception, token: Tensor, cache: StaticKVCache) -> Tensor:
        """A step torch could not compile: this and every later step run the eager reference, said once; decoding
        goes on with the same tokens (the step writes only its own slot, so running it again changes nothing)."""
        log.warning("the decoding step runs eagerly: torch.compile failed on it (%s: %s)", type(err).__name__,
                    str(err).splitlines()[0] if str(err) else "")
        self._step, self._compiled = functools.partial(static_step, self.model), False
        return self._step(token, cache)

    def _replay(self, token: Tensor, cache: StaticKVCache) -> Tensor:
        """The step for `cache` from its CUDA graph, captured at its first call here (one graph, the latest cache's)."""
        if self._graphed is None or self._graphed.cache is not cache:
            self._graphed = None  # the previous cache's graph and memory pool go first
            try:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    self._graphed = GraphedStep(self._step, token, cache)
            except RuntimeError as err:
                self._graphs_fail = f"{type(err).__name__}: {err}"
                log.warning("decoding steps run compiled without a CUDA graph: capturing one failed (%s)",
                            self._graphs_fail)
                return self._step(token, cache)
        return self._graphed(token)

    def _call_key(self, token: Tensor, cache: StaticKVCache) -> tuple:
        """What may differ between two calls of the step (see the module docstring)."""
        device = token.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        return (token.shape[0], cache.max_len, torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast,
                self.model.training)
