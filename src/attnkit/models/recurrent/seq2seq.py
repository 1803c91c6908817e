"""Recurrent encoder-decoders: the models the Transformer replaced (lecture: "Encoder-Decoder Networks").

    src (B, S) -> embedding -> RNN/GRU/LSTM (optionally bidirectional) -> memory hbar (B, S, M)
                                                  |
                      final states [->h_S; <-h_1] -> bridge: s_0 = tanh(W [->h_S; <-h_1]), one per decoder layer
                                                  v
    tgt (B, T) -> embedding -> decoder RNN from s_0 -> (attention over hbar) -> readout -> lm_head -> (B, T, V)

Three decoders, one per row of the lectures' story:

    PlainDecoder      no attention: s_0 is all the decoder ever sees of the source, the bottleneck (Sutskever et
                      al. 2014, Cho et al. 2014). Teacher forcing: one call of torch's layer over the target.
    LuongDecoder      global attention after the recurrence (Luong et al. 2015, dot or general score, without
                      input feeding): h_t = RNN(y_{t-1}, h_{t-1}); c_t = attend(h_t); h~_t = tanh(W_c [c_t; h_t]).
                      The recurrence never reads c_t, so teacher forcing is still one call of torch's layer and
                      the attention of every step is computed at once.
    BahdanauDecoder   additive attention before the recurrence (Bahdanau et al. 2015): c_t = attend(s_{t-1});
                      s_t = RNN([y_{t-1}; c_t], s_{t-1}); h~_t = tanh(W [c_t; s_t; y_{t-1}]) (their deep output
                      reads the previous word too). The context feeds the next state, so even teacher forcing is
                      a loop of single steps through torch's layer; the output layer runs once after the loop.

The context is concatenated with the decoder state before the output layer, as the lectures draw it. Embedding
tables start as `stateful_lm.init_embedding` says (N(0, 1) unless tied to the output layer). The decoding state is a
`RecurrentState`: empty until the first `decode` call, which fills it from the bridge.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.errors import InputError
from attnkit.layers.embedding import check_token_ids
from attnkit.layers.output_loss import LossPath
from attnkit.models.decoder import lm_logits_and_loss
from attnkit.models.output import ModelOutput
from attnkit.models.recurrent.attention import AttentionKind, SourceAttention
from attnkit.models.recurrent.rnn import Cell, RecurrentState, make_rnn, run_rnn
from attnkit.models.seq2seq import check_paired
from attnkit.models.stateful_lm import check_mask, check_state_rows, init_embedding, output_projection


class RecurrentEncoder(nn.Module):
    """src (B, S) -> memory (B, S, M), M = directions x hidden, zero at padding: one call of torch's layer over
    the packed source (so a backward direction starts at each row's own last token)."""

    def __init__(
        self, *, vocab_size: int, embedding_dim: int, hidden: int, n_layers: int, cell: Cell,
        bidirectional: bool = False, dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.rnn = make_rnn(
            cell, embedding_dim, hidden, n_layers=n_layers, dropout=dropout, bidirectional=bidirectional
        )
        self.dropout = nn.Dropout(dropout)

    @property
    def output_dim(self) -> int:
        return self.rnn.hidden_size * (2 if self.rnn.bidirectional else 1)

    def forward(self, src_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """attention_mask: (B, S) bool from `check_mask`, True at real tokens; None without padding."""
        out, _ = run_rnn(self.rnn, self.dropout(self.embedding(src_ids)), None, attention_mask)  # (B, S, M)
        return out


class StateBridge(nn.Module):
    """The decoder's initial state from the encoder's last layer: s_0 = tanh(W [->h_S; <-h_1]) for every decoder
    layer (an LSTM's cells likewise, through their own W). The forward direction ends at the last real token,
    the backward one at the first, so both are read from the memory (Bahdanau et al. 2015 use <-h_1 alone)."""

    def __init__(self, *, memory_dim: int, hidden: int, n_layers: int, bidirectional: bool, lstm: bool) -> None:
        super().__init__()
        self.n_layers, self.hidden, self.bidirectional = n_layers, hidden, bidirectional
        self.hidden_proj = nn.Linear(memory_dim, n_layers * hidden)
        self.cell_proj = nn.Linear(memory_dim, n_layers * hidden) if lstm else None

    def forward(self, memory: Tensor, src_mask: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        """memory (B, S, M), src_mask (B, S) bool or None -> torch's state, (L, B, H) or a pair of them."""
        batch, length, width = memory.shape
        rows = torch.arange(batch, device=memory.device)
        if src_mask is None:
            first, last = torch.zeros_like(rows), torch.full_like(rows, length - 1)
        else:
            first = src_mask.int().argmax(dim=1)  # (B,)
            last = first + src_mask.sum(dim=1) - 1
        summary = memory[rows, last]  # (B, M): the forward direction after the last real token
        if self.bidirectional:
            half = width // 2
            summary = torch.cat((summary[:, :half], memory[rows, first, half:]), dim=-1)  # [->h_S; <-h_1]
        hidden = self._layers(torch.tanh(self.hidden_proj(summary)))
        if self.cell_proj is None:
            return hidden
        return hidden, self._layers(torch.tanh(self.cell_proj(summary)))

    def _layers(self, x: Tensor) -> Tensor:
        return x.view(-1, self.n_layers, self.hidden).transpose(0, 1).contiguous()  # (B, L*H) -> (L, B, H)


class _Decoder(nn.Module):
    """What the decoders share: the target embedding, torch's recurrent layer, dropout."""

    def __init__(self, *, vocab_size: int, embedding_dim: int, input_size: int, hidden: int, n_layers: int,
                 cell: Cell, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.rnn = make_rnn(cell, input_size, hidden, n_layers=n_layers, dropout=dropout)
        self.dropout = nn.Dropout(dropout)

    def embed(self, tgt_ids: Tensor) -> Tensor:
        return self.dropout(self.embedding(tgt_ids))  # (B, T, E)


class PlainDecoder(_Decoder):
    """No attention: teacher forcing is one call of torch's layer; features are its outputs (B, T, F)."""

    def __init__(self, *, embedding_dim: int, hidden: int, tie_embeddings: bool, **sizes) -> None:
        super().__init__(embedding_dim=embedding_dim, input_size=embedding_dim, hidden=hidden, **sizes)
        self.proj = output_projection(hidden, embedding_dim, tie_embeddings)

    def forward(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None, state: RecurrentState):
        out, new_state = self.rnn(self.embed(tgt_ids), state.get())  # (B, T, H)
        state.set(new_state, tgt_ids.shape[1])
        return self.proj(self.dropout(out)), None


class LuongDecoder(_Decoder):
    """Recurrence first (one call of torch's layer), then every step's attention at once;
    h~_t = tanh(W_c [c_t; h_t])."""

    def __init__(self, *, embedding_dim: int, hidden: int, memory_dim: int, out_dim: int, attention: AttentionKind,
                 **sizes) -> None:
        super().__init__(embedding_dim=embedding_dim, input_size=embedding_dim, hidden=hidden, **sizes)
        self.attention = SourceAttention(attention, query_dim=hidden, memory_dim=memory_dim)
        self.readout = nn.Linear(memory_dim + hidden, out_dim, bias=False)

    def forward(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None, state: RecurrentState):
        out, new_state = self.rnn(self.embed(tgt_ids), state.get())  # (B, T, H)
        state.set(new_state, tgt_ids.shape[1])
        if state.keys is None:
            state.keys = self.attention.keys(memory)  # (B, 1, S, K): once per source
        context, weights = self.attention(out, memory, src_mask, state.keys)  # (B, T, M), (B, 1, T, S)
        features = torch.tanh(self.readout(torch.cat((context, out), dim=-1)))  # (B, T, M + H) -> (B, T, F)
        return self.dropout(features), weights


class BahdanauDecoder(_Decoder):
    """Attention from the previous state, whose context enters the next: a loop of single steps through torch's
    layer, for teacher forcing as for generation; h~_t = tanh(W [c_t; s_t; E y_{t-1}]), Bahdanau et al.'s deep
    output, which reads the previous word beside the state and the context: their eq. 4, g(y_{t-1}, s_t, c_t), as one
    tanh layer where their appendix A.2.2 uses a maxout layer (and s_{t-1} in place of s_t)."""

    def __init__(self, *, embedding_dim: int, hidden: int, memory_dim: int, out_dim: int,
                 additive_dim: int | None = None, **sizes) -> None:
        super().__init__(embedding_dim=embedding_dim, input_size=embedding_dim + memory_dim, hidden=hidden, **sizes)
        self.attention = SourceAttention("bahdanau", query_dim=hidden, memory_dim=memory_dim, additive_dim=additive_dim)
        self.readout = nn.Linear(memory_dim + hidden + embedding_dim, out_dim, bias=False)

    def forward(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None, state: RecurrentState):
        x = self.embed(tgt_ids)  # (B, T, E)
        if state.keys is None:
            state.keys = self.attention.keys(memory)  # (B, 1, S, K): U hbar once per source, not at every step
        outputs, weights = [], []
        for t in range(tgt_ids.shape[1]):
            # (B, 1, H) -> context (B, 1, M), weights (B, 1, 1, S)
            context, step_weights = self.attention(state.top[:, None], memory, src_mask, state.keys)
            out, new_state = self.rnn(torch.cat((x[:, t : t + 1], context), dim=-1), state.get())  # (B, 1, H)
            state.set(new_state, 1)
            outputs.append(torch.cat((context, out), dim=-1))  # (B, 1, M + H)
            weights.append(step_weights)
        readin = torch.cat((torch.cat(outputs, dim=1), x), dim=-1)  # (B, T, M + H + E): [c_t; s_t; E y_{t-1}]
        features = torch.tanh(self.readout(readin))  # (B, T, F)
        return self.dropout(features), torch.cat(weights, dim=2)  # (B, 1, T, S)


class RecurrentSeq2Seq(nn.Module):
    """Recurrent encoder-decoder with separate `encode()` and `decode()`, called as `EncoderDecoder` is."""

    def __init__(self, *, encoder: RecurrentEncoder, bridge: StateBridge, decoder: _Decoder, lm_head: nn.Linear,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.encoder, self.bridge, self.decoder, self.lm_head = encoder, bridge, decoder, lm_head
        self.label_smoothing = label_smoothing
        self.loss_path = LossPath()  # without logits: how the loss is computed (the training plan's choice)

    def encode(self, src_ids: Tensor, *, src_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S) -> memory (B, S, M), zero at padding. Raises InputError for bad ids or a bad mask."""
        check_token_ids(src_ids, self.encoder.embedding.num_embeddings, name="src_ids")
        return self.encoder(src_ids, check_mask(src_mask, src_ids, "src_mask"))

    @renamed_keywords(targets="labels")
    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        labels: Tensor | None = None,
        cache: RecurrentState | None = None,
        need_weights: bool = False,
        return_logits: bool = True,
    ) -> ModelOutput:
        """tgt_ids (B, T), memory (B, S, M) -> logits (B, T, V_tgt).

        tgt_mask: (B, T), padding on the right only: the decoder reads left to right, so padding after a
            row's last real token changes none of its outputs.
        labels: (B, T) next-token ids aligned with tgt_ids, -100 at padding.
        cache: a `RecurrentState` (from `allocate_cache`); empty, it starts from the bridge; updated in place. One
            that holds another number of rows than tgt_ids is an InputError (`check_state_rows`).
        need_weights: attentions = [{"cross": (B, 1, T, S)}], row t the weights of decoding step t.
        """
        check_token_ids(tgt_ids, self.decoder.embedding.num_embeddings, name="tgt_ids")
        check_paired(tgt_ids.shape[0], memory.shape[0])
        check_state_rows(cache, tgt_ids, "tgt_ids")
        tgt_mask = check_mask(tgt_mask, tgt_ids, "tgt_mask")
        if tgt_mask is not None and not bool(tgt_mask[:, 0].all()):
            raise InputError("tgt_mask pads on the left; targets start with BOS in column 0 and pad on the right")
        src_mask = src_mask.bool() if src_mask is not None else None
        state = cache if cache is not None else RecurrentState()
        if not state.started:
            state.set(self.bridge(memory, src_mask))
        features, weights = self.decoder(tgt_ids, memory, src_mask, state)  # (B, T, F), (B, 1, T, S) or None
        logits, loss = lm_logits_and_loss(self.lm_head, features, labels, self.label_smoothing, return_logits,
                                          self.loss_path)
        attentions = [{"cross": weights}] if need_weights and weights is not None else None
        return ModelOutput(logits=logits, loss=loss, attentions=attentions, cache=cache)

    @renamed_keywords(targets="labels")
    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        labels: Tensor | None = None,
        need_weights: bool = False,
        return_logits: bool = True,
    ) -> ModelOutput:
        """Teacher-forced pass: src (B, S), tgt (B, T) -> logits (B, T, V) (see `decode` for the arguments)."""
        memory = self.encode(src_ids, src_mask=src_mask)
        return self.decode(tgt_ids, memory, src_mask=src_mask, tgt_mask=tgt_mask, labels=labels,
                           need_weights=need_weights, return_logits=return_logits)

    def allocate_cache(self, batch_size: int, max_len: int | None = None) -> RecurrentState:
        """An empty decoding state for `batch_size` rows; the first `decode` call fills it from the bridge."""
        return RecurrentState()


def recurrent_seq2seq(
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    embedding_dim: int,
    hidden: int,
    encoder_hidden: int,
    n_layers: int,
    cell: Cell,
    attention: AttentionKind,
    bidirectional: bool = False,
    dropout: float = 0.0,
    tie_embeddings: bool = True,
    share_vocabulary: bool = False,
    additive_dim: int | None = None,
    label_smoothing: float = 0.0,
) -> RecurrentSeq2Seq:
    """Assemble a recurrent encoder-decoder from explicit sizes. `tie_embeddings` ties the output layer to the
    target embedding and, when source and target share one vocabulary (`share_vocabulary`), the two embeddings
    too, as the Transformer's builder does."""
    encoder = RecurrentEncoder(vocab_size=src_vocab_size, embedding_dim=embedding_dim, hidden=encoder_hidden,
                               n_layers=n_layers, cell=cell, bidirectional=bidirectional, dropout=dropout)
    memory_dim = encoder.output_dim
    bridge = StateBridge(memory_dim=memory_dim, hidden=hidden, n_layers=n_layers, bidirectional=bidirectional,
                         lstm=cell == "lstm")
    sizes = dict(vocab_size=tgt_vocab_size, embedding_dim=embedding_dim, hidden=hidden, n_layers=n_layers,
                 cell=cell, dropout=dropout)
    out_dim = embedding_dim if tie_embeddings else hidden
    decoder: _Decoder
    if attention == "none":
        decoder = PlainDecoder(tie_embeddings=tie_embeddings, **sizes)
    elif attention == "bahdanau":
        decoder = BahdanauDecoder(memory_dim=memory_dim, out_dim=out_dim, additive_dim=additive_dim, **sizes)
    else:
        decoder = LuongDecoder(memory_dim=memory_dim, out_dim=out_dim, attention=attention, **sizes)
    lm_head = nn.Linear(out_dim, tgt_vocab_size, bias=False)
    if tie_embeddings:
        if share_vocabulary:
            decoder.embedding.weight = encoder.embedding.weight
        init_embedding(decoder.embedding)  # the output layer's table (and the encoder's, when shared)
        lm_head.weight = decoder.embedding.weight
    return RecurrentSeq2Seq(encoder=encoder, bridge=bridge, decoder=decoder, lm_head=lm_head,
                            label_smoothing=label_smoothing)
