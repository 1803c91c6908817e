"""nanoGPT, the peer every training benchmark is measured against: its `model.py` (karpathy/nanoGPT at 3adf61e)
written out as its users run it, and its `train.py` iteration as a step function.

One copy serves the speed suite's nanoGPT rows (`peers.nanogpt_train_step`), `python -m benchmarks gpu`'s train part
(`bench_gpu.nanogpt_step`), `python -m benchmarks train nanogpt` and `train recipes` (`bench_train.nanogpt_train`)
and the operation-count test of the training plan. Kept from model.py: LayerNorm with an optional bias (eps 1e-5),
one `c_attn` product to q, k, v, SDPA with `is_causal`, exact GELU, the Dropout modules (p = 0 for pretraining),
`lm_head` tied to `wte`, N(0, 0.02) weights with zero biases and the residual projections (`c_proj`) at
0.02 / sqrt(2 L), drawn in model.py's order (so a seed gives nanoGPT's own initial weights), `forward(idx, targets)`
returning (logits, loss) with the cross-entropy inside the module (inside `torch.compile(model)` too), and
`configure_optimizers`' two decay groups, fused AdamW on CUDA only. Left out: the hand-written attention for torch
before 2.0, `from_pretrained`, `crop_block_size`, `estimate_mfu`, `generate`, and the prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class GPTConfig:
    """model.py's GPTConfig, its field names and defaults (GPT-2 124M, the vocabulary padded to 50,304)."""

    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")


class LayerNorm(nn.Module):
    """F.layer_norm with an optional bias, eps 1e-5."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """One c_attn product to q, k, v; SDPA with is_causal; c_proj, then the residual dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)  # used by model.py's attention for torch < 2.0 alone
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, T, C) -> (B, nh, T, hs)
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """c_fc to 4C, exact GELU, c_proj back to C, dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """wte + wpe, the blocks, ln_f, lm_head tied to wte. forward(idx, targets) -> (logits, loss): with targets the
    logits at every position (B, T, V) and the mean cross-entropy (targets of -1 ignored); without, the last
    position's logits (B, 1, V) and None."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd), wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout), h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying (Press & Wolf, 2017)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted as model.py counts them: the tied wte once, wpe left out unless `non_embedding` is
        False (the count its MFU estimate uses)."""
        n_params = sum(p.numel() for p in self.parameters())
        return n_params - self.transformer.wpe.weight.numel() if non_embedding else n_params

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        t = idx.size(1)
        if t > self.config.block_size:
            raise ValueError(f"a sequence of {t} tokens is longer than block_size {self.config.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:  # inference: the last position's logits only
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)  # (B, T, V)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                             device_type: str) -> torch.optim.AdamW:
        """AdamW with two groups: every tensor of two or more dimensions (matrices, embeddings) decays, biases and
        norms do not; fused on CUDA, torch's default implementation elsewhere."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        extra = dict(fused=True) if device_type == "cuda" else {}
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)


def get_lr(it: int, *, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """train.py's schedule: linear warmup over `warmup_iters`, cosine down to `min_lr` at `lr_decay_iters`, then
    `min_lr`."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup_iters) / (lr_decay_iters - warmup_iters)))
    return min_lr + coeff * (learning_rate - min_lr)


GRADIENT_ACCUMULATION_STEPS = 1  # one micro-step: each benchmark's batch is its whole batch


def train_step(model: GPT, optimizer: torch.optim.Optimizer, get_batch: Callable[[], tuple[Tensor, Tensor]], *,
               forward: Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]], ctx: AbstractContextManager,
               lr: Callable[[int], float] | None = None, grad_clip: float = 0.0) -> Callable[[], Tensor]:
    """train.py's loop body as a step function: the first batch fetched now, then each call sets the learning rate
    `lr(iter_num)` (None: left as the optimizer has it), runs `logits, loss = forward(X, Y)` under `ctx` (autocast,
    or a null context on the CPU) and divides the loss by the accumulation steps, fetches the next batch before
    backward (its copy overlaps the backward on a GPU), clips the gradient norm at `grad_clip` (0: not at all),
    steps and zeroes the gradients (set to None). train.py's GradScaler is left out: it is enabled for float16 alone.
    `forward` is `model` or `torch.compile(model)`. Each call returns the step's loss (not read: no host sync)."""
    X, Y = get_batch()
    iter_num = 0

    def step() -> Tensor:
        nonlocal X, Y, iter_num
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr(iter_num)
        with ctx:
            _, loss = forward(X, Y)
            loss = loss / GRADIENT_ACCUMULATION_STEPS
        X, Y = get_batch()
        loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        return loss

    return step


def attnkit_state_dict(model: GPT) -> dict[str, Tensor]:
    """The model's weights under the names of attnkit's GPT-2 DecoderLM (c_attn split into q, k and v; biases where
    the model has them); lm_head is left out, tied to the token embedding on both sides."""
    width = model.config.n_embd
    kinds = ("weight", "bias") if model.config.bias else ("weight",)
    mapped = {"stack.embeddings.token.weight": model.transformer.wte.weight,
              "stack.embeddings.positions.weight": model.transformer.wpe.weight}
    for kind in kinds:
        mapped[f"stack.final_norm.{kind}"] = getattr(model.transformer.ln_f, kind)
    for i, block in enumerate(model.transformer.h):
        ours = f"stack.blocks.{i}."
        for kind in kinds:
            for name, part in zip("qkv", getattr(block.attn.c_attn, kind).split(width), strict=True):
                mapped[f"{ours}self_attn.{name}_proj.{kind}"] = part
            mapped.update({f"{ours}self_attn.o_proj.{kind}": getattr(block.attn.c_proj, kind),
                           f"{ours}attn_norm.{kind}": getattr(block.ln_1, kind),
                           f"{ours}mlp_norm.{kind}": getattr(block.ln_2, kind),
                           f"{ours}mlp.up_proj.{kind}": getattr(block.mlp.c_fc, kind),
                           f"{ours}mlp.down_proj.{kind}": getattr(block.mlp.c_proj, kind)})
    return mapped
