"""Circuits in the weights (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"): what each head
can do, read from its weights alone, without running the model.

With the residual stream as row vectors x (1, C) and head h's slices of the projections,

    QK circuit   W_QK = W_Q W_K^T     (C, C)   the score of query x_q on key x_k is x_q W_QK x_k^T (before 1/sqrt(D))
    OV circuit   W_OV = W_V W_O       (C, C)   what the head writes for a key it attends to: x_k W_OV
    full OV      W_E W_OV W_U         (V, V)   which output token a source token promotes (embeddings to logits)

Each is kept as a `FactoredMatrix` (two factors of rank D), so a (V, V) matrix is never formed unless `.dense()` is
asked for. Heads of different layers compose (Elhage et al. 2021, section "Composition"): a later head reads what an
earlier one wrote into the stream through its queries (Q-), keys (K-) or values (V-composition), scored by

    ||W_OV^s W_QK^r||_F / (||W_OV^s||_F ||W_QK^r||_F)        Q    (K: W_QK^r transposed; V: W_OV^r in its place)

the share of the product's size that the two matrices' alignment keeps (TransformerLens's `composition_scores`).
An induction head is a K-composition: its keys read the previous-token head's output.

Conventions: a grouped-query head (GQA, MQA) uses its shared key/value head's W_K and W_V; a pre-norm reader's norm is
folded into its reading weights (its gain, and LayerNorm's centring; the 1/std scale is dropped: scores are
scale-free), unless `fold_norms=False`, which compares with TransformerLens's unprocessed weights. RoPE makes W_QK
position-dependent (W_Q R(m - n) W_K^T): it is computed at a relative offset (default 0, a key at the query's own
position), and `notes` says so; ALiBi and Shaw's relative positions add a position bias the weights' W_QK leaves out.
Recurrent models have no such heads and are refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from attnkit.blocks import TransformerBlock
from attnkit.errors import InputError
from attnkit.inspect.points import head_sites, hook_points, module_of
from attnkit.layers.attention import Attention, BilinearScore, DotScore
from attnkit.layers.norms import LayerNorm
from attnkit.models.stack import TransformerStack

Kind = Literal["q", "k", "v"]


@dataclass(frozen=True)
class FactoredMatrix:
    """A matrix kept as the product `left @ right`: left (..., m, r), right (..., r, n); leading axes broadcast (one
    matrix per head). TransformerLens's FactoredMatrix, reduced to what circuits need."""

    left: Tensor
    right: Tensor

    def __post_init__(self) -> None:
        if self.left.shape[-1] != self.right.shape[-2]:
            raise ValueError(f"factors {tuple(self.left.shape)} and {tuple(self.right.shape)} do not chain")

    @property
    def shape(self) -> torch.Size:
        batch = torch.broadcast_shapes(self.left.shape[:-2], self.right.shape[:-2])
        return torch.Size((*batch, self.left.shape[-2], self.right.shape[-1]))

    @property
    def T(self) -> FactoredMatrix:  # noqa: N802 (the matrix convention)
        return FactoredMatrix(self.right.mT, self.left.mT)

    def dense(self) -> Tensor:
        """The product itself, (..., m, n): a (V, V) full circuit is large; ask for it only where it fits."""
        return self.left @ self.right

    def __matmul__(self, other: FactoredMatrix | Tensor) -> FactoredMatrix:
        """(A B) @ (C D) keeps the smaller inner rank; (A B) @ M is A (B M)."""
        if isinstance(other, Tensor):
            return FactoredMatrix(self.left, self.right @ other)
        if self.right.shape[-2] <= other.left.shape[-1]:
            return FactoredMatrix(self.left, (self.right @ other.left) @ other.right)
        return FactoredMatrix(self.left @ (self.right @ other.left), other.right)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix:
        return FactoredMatrix(other @ self.left, self.right)

    def singular_values(self) -> Tensor:
        """(..., min(m, n, r)), largest first, from the QR factors of both sides: never the (m, n) product."""
        r_left = torch.linalg.qr(self.left.double(), mode="r").R  # (..., k, r); Q (..., m, k) is not formed
        r_right = torch.linalg.qr(self.right.mT.double(), mode="r").R  # (..., k', r)
        return torch.linalg.svdvals(r_left @ r_right.mT).to(self.left.dtype)  # the core (..., k, k')

    def norm(self) -> Tensor:
        """The Frobenius norm (...,): ||A B||^2 = sum((A^T A) * (B B^T)), an (r, r) product."""
        left, right = self.left.double(), self.right.double()
        squared = ((left.mT @ left) * (right @ right.mT)).sum((-2, -1))
        return squared.clamp_min(0).sqrt().to(self.left.dtype)


@dataclass(frozen=True)
class HeadWeights:
    """One attention sublayer's per-head weights in the row-vector convention (x @ W): W_Q, W_K, W_V (H, C, D) (W_K
    and W_V: each query head's shared key/value head), W_O (H, D, C); `score` (H, D, D) or None: a bilinear score's
    matrix between queries and keys; `notes`: what the weights leave out (positions, norms)."""

    site: str
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    kv_heads: int
    score: Tensor | None = None
    notes: tuple[str, ...] = ()

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    def qk(self) -> FactoredMatrix:
        """W_QK = W_Q (M) W_K^T, (H, C, C) of rank D."""
        left = self.W_Q if self.score is None else self.W_Q @ self.score
        return FactoredMatrix(left, self.W_K.mT)

    def ov(self) -> FactoredMatrix:
        """W_OV = W_V W_O, (H, C, C) of rank D."""
        return FactoredMatrix(self.W_V, self.W_O)


@dataclass(frozen=True)
class Site:
    """An attention sublayer and where it sits: the stream its queries read, the stream its keys and values read (a
    cross-attention's: the encoder's output), and its order in its own stream."""

    name: str
    attention: Attention
    block: TransformerBlock
    stack: str  # the prefix of the stack it writes into ("", "encoder.", "decoder.")
    order: tuple[int, int]  # (layer, 0 self-attention / 1 cross-attention)

    @property
    def cross(self) -> bool:
        return self.order[1] == 1

    def reads(self, kind: Kind) -> tuple[str, tuple[float, float]]:
        """The stream this site's `kind` side reads and the point there: a sender must write before it."""
        if self.cross and kind != "q":
            return "encoder.", (float("inf"), 0)
        return self.stack, self.order


NO_HEADS = ("weight-space circuits read a Transformer's attention heads (W_Q, W_K, W_V, W_O); {model} has none: a "
            "recurrent model's attention reads states that its recurrent cell mixes nonlinearly, so no head has a QK "
            "or OV matrix (use the activation analyses: patch, heads)")


def sites_in_order(model: nn.Module, *, refusal: str = NO_HEADS) -> list[Site]:
    """Every Transformer attention sublayer, in layer order. Raises InputError for a model without one, saying
    `refusal` (what needs them, with `{model}` for the model's class)."""
    model = module_of(model)
    points = hook_points(model)
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    sites = []
    for name in head_sites(model):
        attention = points[f"{name}.out"].module
        if not isinstance(attention, Attention):
            continue
        block = next(b for b in blocks if attention is b.self_attn or attention is b.cross_attn)
        prefix, _, rest = name.partition("blocks.")
        sites.append(Site(name, attention, block, prefix, (int(rest.split(".")[0]), int(name.endswith("cross_attn")))))
    if not sites:
        raise InputError(refusal.format(model=type(model).__name__))
    return sites


def _find(sites: list[Site], name: str) -> Site:
    for site in sites:
        if site.name == name:
            return site
    raise InputError(f"no attention sublayer {name!r}; the model's are {', '.join(s.name for s in sites)}")


def _stack(model: nn.Module, prefix: str) -> TransformerStack:
    return getattr(model, prefix.rstrip(".") or "stack")


def _reading_fold(norm: nn.Module | None, width: int, device: torch.device) -> Tensor | None:
    """The linear part of a norm a reader sees its input through, (C, C) for rows (x @ P), or None (nothing to
    fold): LayerNorm centres then scales by its gain; RMSNorm scales by its gain. Its 1/std (1/rms) is left out."""
    if norm is None or isinstance(norm, nn.Identity):
        return None
    weight = getattr(norm, "weight", None)
    centres = isinstance(norm, nn.LayerNorm | LayerNorm)
    if weight is None and not centres:
        return None
    eye = torch.eye(width, device=device)
    fold = eye if weight is None else torch.diag(weight.detach().float())
    if centres:
        fold = (eye - 1.0 / width) @ fold  # x - mean(x) = x (I - 11^T / C)
    return fold


def _projections(attention: Attention) -> tuple[Tensor, Tensor, Tensor]:
    """q_proj, k_proj, v_proj weights (out, in), also once fused into qkv_proj."""
    if attention.qkv_proj is None:
        return tuple(getattr(attention, f"{n}_proj").weight.detach().float() for n in "qkv")
    kv = attention.n_kv_heads * attention.head_dim
    return tuple(attention.qkv_proj.weight.detach().float().split([attention.n_heads * attention.head_dim, kv, kv]))


def _head_weights(model: nn.Module, site: Site, *, fold_norms: bool, offset: int) -> HeadWeights:
    attention, block = site.attention, site.block
    if not isinstance(attention.score, DotScore | BilinearScore):
        raise InputError(f"{site.name} scores with {attention.score_kind} attention, a small network over q and k: its "
                         "scores are not a bilinear form x_q W_QK x_k^T, so it has no QK matrix (its OV circuit "
                         "exists; dot, scaled_dot and bilinear scores have both)")
    heads, kv_heads, dim = attention.n_heads, attention.n_kv_heads, attention.head_dim
    q, k, v = _projections(attention)  # (H*D, C), (Hkv*D, C) twice
    shared = torch.arange(heads, device=q.device) // (heads // kv_heads)  # each query head's key/value head

    def per_head(weight: Tensor, n: int) -> Tensor:
        return weight.view(n, dim, -1).mT  # (n*D, C) -> (n, C, D)

    W_Q, W_K, W_V = per_head(q, heads), per_head(k, kv_heads)[shared], per_head(v, kv_heads)[shared]  # noqa: N806
    W_O = attention.o_proj.weight.detach().float().view(-1, heads, dim).permute(1, 2, 0)  # noqa: N806 (C, H*D) -> (H, D, C)
    notes = []
    if fold_norms and block.pre_norm:
        width = W_Q.shape[1]
        query_norm = block.cross_attn_norm if site.cross else block.attn_norm
        key_norm = _stack(model, "encoder.").final_norm if site.cross else block.attn_norm
        for norm, side in ((query_norm, "q"), (key_norm, "kv")):
            fold = _reading_fold(norm, width, W_Q.device)
            if fold is None:
                continue
            if side == "q":
                W_Q = fold @ W_Q  # noqa: N806
            else:
                W_K, W_V = fold @ W_K, fold @ W_V  # noqa: N806
        notes.append("pre-norm: each reader's norm folded in (gain, and LayerNorm's centring; not its 1/std)")
    elif not block.pre_norm:
        notes.append("post-norm: the norm after each sublayer is not folded in")
    relative = None if site.cross else attention.relative
    if relative is not None and relative.rotates:
        prepared = relative.prepare(torch.tensor([[offset]], device=W_Q.device))  # the query `offset` after its key
        W_Q = relative.rotate(W_Q[None], W_Q[None], prepared)[0][0]  # noqa: N806 rows rotated as queries
        notes.append(f"RoPE: QK depends on the query-key offset m - n (W_Q R(m - n) W_K^T); read at offset {offset}")
    elif relative is not None and relative.biases:
        notes.append(f"{type(relative).__name__}: the scores add a position bias that W_QK leaves out")
    if attention.window is not None and not site.cross:
        notes.append(f"sliding window: a query reads only its last {attention.window} keys, which W_QK does not say")
    if kv_heads != heads:
        notes.append(f"{kv_heads} key/value heads for {heads} query heads: W_K and W_V are each head's shared one")
    score = (attention.score.weight.weight.detach().float() if isinstance(attention.score, BilinearScore) else None)
    return HeadWeights(site.name, W_Q, W_K, W_V, W_O, kv_heads, score, tuple(notes))


def head_weights(model: nn.Module, site: str, *, fold_norms: bool = True, offset: int = 0) -> HeadWeights:
    """The per-head weights of the attention sublayer `site` (`blocks.1.attn`, `decoder.blocks.0.cross_attn`): its QK
    and OV circuits are `.qk()` and `.ov()`. `offset`: RoPE's query-key offset the QK is read at. Raises InputError
    for a model without Transformer heads (recurrent) or a site it has not."""
    model = module_of(model)
    sites = sites_in_order(model)
    return _head_weights(model, _find(sites, site), fold_norms=fold_norms, offset=offset)


def full_ov(model: nn.Module, site: str, *, fold_norms: bool = True) -> FactoredMatrix:
    """W_E W_OV W_U, (H, V, V) factored through each head (rank D): the logits a token read at a key adds through the
    head alone (the embedding table, not its positions; the final norm's gain folded in, its scale not). Raises
    InputError for a model without an output layer or a sublayer that does not read the token embeddings' stream."""
    model = module_of(model)
    weights = head_weights(model, site, fold_norms=fold_norms)
    prefix = site.partition("blocks.")[0]
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None or prefix == "encoder." and hasattr(model, "decoder") or site.endswith("cross_attn"):
        raise InputError(f"the full OV circuit maps a token's embedding through {site} to the logits: it needs a head "
                         "reading the stream the output layer reads (a decoder's or a masked LM's self-attention)")
    stack = _stack(model, prefix)
    embed = stack.embeddings.token.weight.detach().float() * stack.embeddings.scale  # (V, C)
    unembed = lm_head.weight.detach().float().mT  # (C, V)
    fold = _reading_fold(stack.final_norm, unembed.shape[0], unembed.device) if fold_norms else None
    if fold is not None:
        unembed = fold @ unembed
    if getattr(model, "transform", None) is not None:
        raise InputError("this masked LM passes the stream through a nonlinear transform before its output layer, so "
                         "its full OV circuit is not a product of matrices; read ov() instead")
    return FactoredMatrix(embed @ weights.W_V, weights.W_O @ unembed)  # (H, V, D) @ (H, D, V)


@dataclass(frozen=True)
class Composition:
    """One score per (sender head, receiver head, kind) where the sender writes before the receiver's side reads."""

    rows: list[dict]  # {"sender", "sender head", "receiver", "receiver head", "kind", "score"}, largest score first
    notes: tuple[str, ...] = field(default=())

    def top(self, n: int = 5, kind: Kind | None = None) -> list[dict]:
        return [r for r in self.rows if kind is None or r["kind"] == kind][:n]

    def table(self, kind: Kind, sender: str, receiver: str) -> Tensor:
        """(sender heads, receiver heads) scores of one kind between two sublayers (NaN where not scored)."""
        found = [r for r in self.rows if (r["kind"], r["sender"], r["receiver"]) == (kind, sender, receiver)]
        if not found:
            raise InputError(f"no {kind}-composition from {sender} to {receiver}: a sender must write into the "
                             "stream the receiver reads, in an earlier sublayer")
        out = torch.full((1 + max(r["sender head"] for r in found), 1 + max(r["receiver head"] for r in found)),
                         float("nan"))
        for r in found:
            out[r["sender head"], r["receiver head"]] = r["score"]
        return out


def composition_score(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """||left right||_F / (||left||_F ||right||_F) (Elhage et al. 2021), broadcast over leading axes."""
    return (left @ right).norm() / (left.norm() * right.norm())


def composition_scores(model: nn.Module, *, fold_norms: bool = True) -> Composition:
    """Q-, K- and V-composition scores between every pair of heads where the sender's sublayer writes into the stream
    the receiver's queries (Q) or keys and values (K, V) read, before it: heads of earlier layers of the same stack,
    a decoder's self-attention before its cross-attention, and an encoder's heads into a cross-attention's keys and
    values. Raises InputError for a model without Transformer heads (module docstring)."""
    model = module_of(model)
    sites = sites_in_order(model)
    weights = {s.name: _head_weights(model, s, fold_norms=fold_norms, offset=0) for s in sites}
    rows = []
    for receiver in sites:
        qk, ov = weights[receiver.name].qk(), weights[receiver.name].ov()
        readers = {"q": qk, "k": qk.T, "v": ov}
        for kind, read in readers.items():
            stream, point = receiver.reads(kind)
            for sender in sites:
                if sender.stack != stream or sender.order >= point:
                    continue
                written = weights[sender.name].ov()
                sender_ov = FactoredMatrix(written.left[:, None], written.right[:, None])  # (Hs, 1, C, C)
                scores = composition_score(sender_ov, FactoredMatrix(read.left[None], read.right[None]))  # (Hs, Hr)
                rows += [{"sender": sender.name, "sender head": i, "receiver": receiver.name, "receiver head": j,
                          "kind": kind, "score": float(scores[i, j])}
                         for i in range(scores.shape[0]) for j in range(scores.shape[1])]
    rows.sort(key=lambda r: -r["score"])
    notes = tuple(dict.fromkeys(n for w in weights.values() for n in w.notes))
    return Composition(rows, notes)
