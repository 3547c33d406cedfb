"""Pieces shared by the sequence models: masks, the last-valid gather, the encoder stack."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.base import RecommenderConfig
from models.ids import N_SPECIAL, PAD
from models.sequence_filters import FilterSpec, SequenceFilter

# Masks: True = hidden, everywhere in the project. The (B, L) and (L, L) forms are the building
# blocks; the 4-D forms broadcast against attention scores (B, H, Lq, Lk).


def padding_mask(seq: torch.Tensor) -> torch.Tensor:
    """True where `seq` is padding. seq: (B, L) long -> (B, L) bool."""
    return seq == PAD


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """(L, L) bool attention mask, True above the diagonal: position i never sees j > i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


def key_padding_mask(seq: torch.Tensor) -> torch.Tensor:
    """Padded keys hidden from every query: (B, L) -> (B, 1, 1, L) bool."""
    return padding_mask(seq)[:, None, None, :]


def causal_attention_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """Later keys hidden from each query: -> (1, 1, L, L) bool."""
    return causal_mask(length, device)[None, None]


def decoder_mask(seq: torch.Tensor) -> torch.Tensor:
    """A decoder's self-attention mask: padding OR causal. (B, L) -> (B, 1, L, L) bool."""
    return key_padding_mask(seq) | causal_attention_mask(seq.size(1), seq.device)


def rope_tables(
    length: int, dim: int, device: torch.device | None = None, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position tables (cos, sin), each (L, dim / 2) (Su et al., RoFormer)."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    angles = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of features by their position's angle. x: (B, H, L, Dh), cos/sin: (L, Dh / 2)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Multi-head attention with a bool mask (True = hidden), optional rotary positions, and the
    attention maps returned when asked (through scaled_dot_product_attention otherwise).

    One (3D, D) input projection, as torch's own attention lays it out: a query of its own keys
    (`kv` is `x`) is one product; other queries (cross-attention, or the rows a read asks for) take
    the query rows of the weight and the key/value rows apart. A query whose every key is hidden
    attends to nothing and gets a zero output, not NaN.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError("d_model must be a multiple of n_heads")
        self.h, self.dh, self.d = n_heads, d_model // n_heads, d_model
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def init_as_torch(self) -> None:
        """torch's MultiheadAttention initialisation of the input projection (Xavier over the whole
        (3D, D) weight, zero bias): what the recommenders and MHSA were tuned with."""
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.h, self.dh).transpose(1, 2)  # (B, H, L, Dh)

    def forward(
        self,
        x: torch.Tensor,
        kv: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, Lq, D) queries, kv: (B, Lk, D), mask broadcastable to (B, H, Lq, Lk), or `causal`
        (each query sees the keys up to its own position; Lq == Lk) -> (output (B, Lq, D), weights
        (B, H, Lq, Lk) or None)."""
        w, bias = self.in_proj.weight, self.in_proj.bias
        if x is kv:
            q, k, v = F.linear(x, w, bias).chunk(3, dim=-1)
        else:
            q = F.linear(x, w[: self.d], bias[: self.d])
            k, v = F.linear(kv, w[self.d :], bias[self.d :]).chunk(2, dim=-1)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos[: q.size(2)], sin[: q.size(2)]), apply_rope(k, cos[: k.size(2)], sin[: k.size(2)])
        if causal and mask is None and not need_weights:
            mask_or_causal: torch.Tensor | None = None
        elif causal:
            hidden = causal_attention_mask(k.size(2), k.device)
            mask_or_causal = hidden if mask is None else mask | hidden
            causal = False
        else:
            mask_or_causal = mask
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.dh)  # (B, H, Lq, Lk)
            if mask_or_causal is not None:
                scores = scores.masked_fill(mask_or_causal, float("-inf"))
            weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
            y = nn.functional.dropout(weights, p, self.training) @ v
        else:
            allowed = None if mask_or_causal is None else ~mask_or_causal
            y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, is_causal=causal)
            if allowed is not None:
                y = y.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # fully hidden rows: 0, not NaN
        b, _, lq, _ = y.shape
        return self.out(y.transpose(1, 2).reshape(b, lq, self.h * self.dh)), weights


class Dropout(nn.Dropout):
    """nn.Dropout, its mask drawn with torch.rand on the CPU: torch's dropout draws with bernoulli_,
    which runs on one thread there at a quarter of rand's speed (docs/decisions/training-throughput.md).
    Elsewhere, torch's own kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x  # what torch's dropout returns in eval, without its call (serving runs this path)
        if x.device.type != "cpu" or not 0.0 < self.p < 1.0:
            return super().forward(x)
        return x * torch.rand_like(x).ge_(self.p).div_(1.0 - self.p)  # kept: 1 / (1 - p), dropped: 0


class FeedForward(nn.Sequential):
    def __init__(self, d: int, d_ff: int, dropout: float) -> None:
        super().__init__(nn.Linear(d, d_ff), nn.GELU(), Dropout(dropout), nn.Linear(d_ff, d))


class EncoderLayer(nn.Module):
    """The one transformer encoder layer of every model. Pre-norm (x + SelfAttention(LN(x)), then
    x + FF(LN(x))) or, with `norm_first=False`, post-norm (LN(x + SelfAttention(x)), then
    LN(x + FF(x))). Dropout where torch's encoder layer has it: attention weights, after attention,
    inside and after the feed-forward; `attn_out_dropout=False` leaves the attention output undropped,
    as the published SASRec does (docs/decisions/attention-output-dropout.md). `filter`: a filter along
    the positions mixed with attention (FilterSpec), the token mixing then mix * filter + (1 - mix) *
    attention."""

    def __init__(
        self,
        d: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        *,
        norm_first: bool = True,
        attn_out_dropout: bool = True,
        filter: FilterSpec | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mix = 0.0 if filter is None else filter.mix
        # The filter alone (mix 1) has no attention: no weights that never train.
        self.attn = Attention(d, n_heads, dropout) if self.mix < 1.0 else None
        self.filter = None if filter is None else SequenceFilter(filter, d)
        self.ff = FeedForward(d, d_ff, dropout)
        self.drop = Dropout(dropout)
        self.attn_drop = self.drop if attn_out_dropout else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        need_weights: bool = False,
        *,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        causal: bool = False,
        read: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, L, D), mask broadcastable to (B, H, L, L) (True = hidden) -> (B, L, D) and the map if
        asked. `read` = (batch rows, positions): only those positions are queries -> (B, 1, D), for a
        last layer whose other positions nobody reads (mask then broadcastable to (B, H, 1, L))."""
        h = self.norm1(x) if self.norm_first else x
        a: torch.Tensor | float = 0.0
        w = None
        if self.attn is not None:
            if read is None:
                a, w = self.attn(h, h, mask, rope=rope, need_weights=need_weights, causal=causal)
            else:
                a, w = self.attn(h[read][:, None], h, mask, rope=rope, need_weights=need_weights)
        if read is not None:
            x = x[read][:, None]  # (B, 1, D): the residual stream of the read rows only
        if self.filter is not None:
            # Keys hidden from every query (padding, or what follows a read position) take no part.
            keep = None if mask is None else ~mask[:, 0].all(dim=-2)  # (B, L)
            f = self.filter(h, keep, rows=None if read is None else read[1])
            a = self.mix * f + (1.0 - self.mix) * a
        if self.norm_first:
            x = x + self.attn_drop(a)
            return x + self.drop(self.ff(self.norm2(x))), w
        x = self.norm1(x + self.attn_drop(a))
        return self.norm2(x + self.drop(self.ff(x))), w


class EncoderStack(nn.Module):
    """`n_layers` encoder layers, and a final LayerNorm when asked (torch's nn.TransformerEncoder
    layout: `layers.<i>`, `norm`)."""

    def __init__(
        self,
        n_layers: int,
        d: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        *,
        norm_first: bool = True,
        final_norm: bool = False,
        attn_out_dropout: bool = True,
        filter: FilterSpec | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(
                d, n_heads, d_ff, dropout, norm_first=norm_first, attn_out_dropout=attn_out_dropout, filter=filter
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d) if final_norm else None

    def init_as_torch(self) -> None:
        for layer in self.layers:
            assert isinstance(layer, EncoderLayer)
            if layer.attn is not None:
                layer.attn.init_as_torch()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, *, causal: bool = False) -> torch.Tensor:
        """x: (B, L, D), mask broadcastable to (B, H, L, L) (True = hidden) -> (B, L, D)."""
        for layer in self.layers:
            x, _ = layer(x, mask, causal=causal)
        return x if self.norm is None else self.norm(x)

    def read(
        self,
        x: torch.Tensor,
        at: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        last_mask: torch.Tensor | None,
        causal: bool = False,
    ) -> torch.Tensor:
        """forward(x)[b, at[b]] computing only those queries in the last layer. x: (B, L, D), at: (B,)
        -> (B, D). `last_mask`: the keys each read position may see, broadcastable to (B, 1, 1, L)."""
        rows = torch.arange(x.size(0), device=x.device)
        for layer in self.layers[:-1]:
            x, _ = layer(x, mask, causal=causal)
        x, _ = self.layers[-1](x, last_mask, read=(rows, at))  # (B, 1, D)
        x = x[:, 0]
        return x if self.norm is None else self.norm(x)


def last_valid_index(seq: torch.Tensor) -> torch.Tensor:
    """Index of the last non-padding position of each right-padded row. (B, L) -> (B,)."""
    lengths = (seq != PAD).sum(dim=1)
    return (lengths - 1).clamp(min=0)


def gather_last(hidden: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """Hidden state at each row's last valid position. hidden: (B, L, D), seq: (B, L) -> (B, D)."""
    idx = last_valid_index(seq)
    return hidden[torch.arange(hidden.size(0), device=hidden.device), idx]


class SequenceEncoder(nn.Module):
    """Token embedding + learned position embedding -> LayerNorm -> Dropout -> transformer layers.

    Sequences are right-padded with 0 and positions count from the start of the window, so a
    prefix is encoded the same whatever padding follows it (the causal case) or whatever
    padding the batch adds (both cases, thanks to the key padding mask).
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int,
        dropout: float,
        causal: bool,
        attn_out_dropout: bool = True,
        filter_kind: str = "none",
        filter_mix: float = 0.0,
        filter_cutoff: int = 0,
        filter_bases: int = 32,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.max_len = max_len
        self.token_emb = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.emb_norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        spec = None
        if filter_kind != "none":
            spec = FilterSpec(filter_kind, filter_mix, filter_cutoff, max_len, causal, bases=filter_bases)
        self.layers = EncoderStack(
            n_layers, d_model, n_heads, d_ff, dropout, attn_out_dropout=attn_out_dropout, filter=spec
        )
        self.out_norm = nn.LayerNorm(d_model)
        self.apply(init_weights)
        self.layers.init_as_torch()

    @classmethod
    def from_config(cls, config: RecommenderConfig, *, vocab_size: int, causal: bool) -> SequenceEncoder:
        """The encoder a recommender's config describes, over `vocab_size` token ids."""
        return cls(
            vocab_size,
            config.max_len,
            d_model=config.d_model,
            n_heads=config.n_heads,
            n_layers=config.n_layers,
            d_ff=config.d_ff,
            dropout=config.dropout,
            causal=causal,
            attn_out_dropout=config.attn_out_dropout,
            filter_kind=config.filter_kind,
            filter_mix=config.filter_mix,
            filter_cutoff=config.filter_cutoff,
            filter_bases=config.filter_bases,
        )

    def _embed(self, seq: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Embedded input (B, L, D): token (`tokens` when the caller gathered them) + position,
        LayerNorm, dropout."""
        length = seq.size(1)
        # A trace (models/traced.py) keeps no Python check: it would fix the comparison's outcome as a
        # constant. Its callers clip histories to max_len first (pack_histories).
        if not torch.jit.is_tracing() and length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {self.max_len}")
        x = (self.token_emb(seq) if tokens is None else tokens) + self.pos_emb.weight[:length]  # (B, L, D)
        return self.dropout(self.emb_norm(x))

    def _key_padding(self, seq: torch.Tensor) -> torch.Tensor:
        """Keys each row may not attend to: (B, L) bool, True = padding."""
        pad = padding_mask(seq)
        if not self.causal:
            # A row of only padding would make softmax NaN; let it attend to itself harmlessly.
            pad = pad & ~pad.all(dim=1, keepdim=True)
        return pad

    def forward(self, seq: torch.Tensor, *, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """seq: (B, L) long, right-padded, L <= max_len -> hidden (B, L, D). `tokens`: seq's token
        embeddings (B, L, D), when a loss gathers every row of the table it needs at once
        (`gather_rows`)."""
        x = self._embed(seq, tokens)
        hidden = self._key_padding(seq)[:, None, None, :]  # (B, 1, 1, L) True = hidden
        if self.causal:
            hidden = hidden | causal_attention_mask(seq.size(1), seq.device)
        return self.out_norm(self.layers(x, hidden))  # (B, L, D)

    def read(self, seq: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """Hidden state at one position per row: forward(seq)[b, at[b]]. seq: (B, L), at: (B,) -> (B, D).

        Serving's path, in eval mode: the last layer computes only the read row's query. Causal rows
        are right-padded, so no position at or before `at` ever sees padding: the causal stack needs
        no padding mask at all, only the causal flag (one fused attention kernel).
        """
        if self.training:  # dropout: the module path, so training keeps one definition
            return self(seq)[torch.arange(seq.size(0), device=seq.device), at]
        x = self._embed(seq)
        if self.causal:
            later = torch.arange(seq.size(1), device=seq.device)[None, :] > at[:, None]  # (B, L)
            return self.out_norm(self.layers.read(x, at, mask=None, last_mask=later[:, None, None, :], causal=True))
        hidden = self._key_padding(seq)[:, None, None, :]
        return self.out_norm(self.layers.read(x, at, mask=hidden, last_mask=hidden))


# Sub-batches of similar length a training batch is computed in (`length_groups`).
LENGTH_GROUPS = 8


def length_groups(lengths: torch.Tensor, groups: int, *, min_rows: int = 32) -> list[tuple[torch.Tensor, int]]:
    """The rows of a right-padded batch in up to `groups` sub-batches of similar length, each of at
    least `min_rows` rows (a small batch stays whole: each sub-batch costs a pass of small kernels):
    lengths (B,) -> [(row indices, longest length among them)], to cut each sub-batch to.

    A shuffled batch is padded to its longest row (Beauty: about 9 items a row against 51 columns),
    so most of a training step was spent on padding. Rows are independent in every sequence model
    here and a loss averages over all valid positions of all groups, so the loss is the one the
    whole batch gives (docs/decisions/training-throughput.md).
    """
    groups = max(1, min(groups, len(lengths) // max(min_rows, 1)))
    return [(rows, int(lengths[rows].max())) for rows in torch.argsort(lengths).tensor_split(groups) if len(rows)]


def gather_rows(table: torch.Tensor, *ids: torch.Tensor) -> list[torch.Tensor]:
    """table[ids] for each id tensor, through one lookup: the (V, D) table's gradient is then built
    once a step (one zeroed (V, D) buffer), not once per lookup. PAD rows get no gradient, as in
    the embedding. -> one (*ids_i.shape, D) tensor per argument."""
    rows = F.embedding(torch.cat([i.flatten() for i in ids]), table, padding_idx=PAD)  # (sum n_i, D)
    return [r.view(*i.shape, -1) for r, i in zip(rows.split([i.numel() for i in ids]), ids, strict=True)]


def init_weights(module: nn.Module) -> None:
    """normal(0, 0.02) for linear and embedding weights, as in the SASRec/BERT4Rec seeds."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """Fixed sinusoidal position table. -> (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    return table


def shared_negatives_loss(
    pos_logit: torch.Tensor, neg_logit: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, *, smoothing: float = 0.0
) -> torch.Tensor:
    """Mean sampled-softmax cross-entropy, each row's class 0 its target: pos_logit (N,), neg_logit
    (N, K) against negatives `neg` (K,) shared by the rows, targets `pos` (N,). A negative that is
    the row's own target is not a class; `smoothing` of the target spreads evenly over the classes.

    The same value as the cross-entropy of cat([pos_logit, neg_logit masked with -inf]), computed
    without the (N, 1 + K) copy, the (N, K) comparison and the masked copies: collisions are few
    (a sorted search), and the sum and log-sum-exp are taken over the (N, K) logits in place. Under
    bf16 autocast the (N, K) product arrives in bfloat16 and the row sums in float32: both are taken
    in float32 here, as autocast itself takes a cross-entropy.
    """
    pos_logit, neg_logit = pos_logit.float(), neg_logit.float()
    order = torch.argsort(neg)
    lo = torch.searchsorted(neg[order], pos)  # (N,)
    hits = torch.searchsorted(neg[order], pos, right=True) - lo  # (N,) copies of each target among neg
    rows = torch.repeat_interleave(torch.arange(len(pos), device=pos.device), hits)
    first = torch.repeat_interleave(lo - (torch.cumsum(hits, 0) - hits), hits)
    cols = order[first + torch.arange(len(rows), device=pos.device)]  # (rows[i], cols[i]): a collision
    hit_values = torch.zeros_like(pos_logit).index_add(0, rows, neg_logit[rows, cols])
    neg_sum = neg_logit.sum(-1) - hit_values  # (N,) over the negatives that are classes
    neg_logit = neg_logit.index_put((rows, cols), torch.tensor(float("-inf"), device=neg_logit.device))
    lse = torch.logaddexp(pos_logit, torch.logsumexp(neg_logit, -1))  # (N,)
    nll = lse - pos_logit
    if smoothing == 0.0:
        return nll.mean()
    classes = 1 + neg_logit.size(1) - hits  # (N,)
    uniform = lse - (pos_logit + neg_sum) / classes  # minus the mean log-probability over the classes
    return ((1.0 - smoothing) * nll + smoothing * uniform).mean()


class NegativeSampler(nn.Module):
    """Negatives shared by a batch for a sampled softmax, with the log-Q correction.

    A `pop_share` of the negatives is drawn in proportion to item frequency (hard negatives), the
    rest uniformly; every negative logit is corrected by -log(K * Q(item)) so that the sampled
    softmax estimates the full softmax over all items (Bengio & Senecal; Yi et al., RecSys 2019).
    Without the correction, frequency-drawn negatives teach scores near log p(item | history) -
    log Q(item): less popularity, which is what a popularity-sampled evaluation rewards.
    """

    freq: torch.Tensor  # (V,) sampling distribution, a non-persistent buffer

    def __init__(
        self, vocab_size: int, n_negatives: int, pop_share: float, correct: bool = True, n_special: int = N_SPECIAL
    ) -> None:
        super().__init__()
        if not 0.0 <= pop_share <= 1.0:
            raise ValueError("pop_share must be in [0, 1]")
        self.vocab_size, self.k, self.pop_share, self.n_special = vocab_size, n_negatives, pop_share, n_special
        self.correct = correct
        freq = torch.zeros(vocab_size)
        freq[n_special:] = 1.0
        # Not saved with the model: only training samples, and it sets the frequencies itself.
        self.register_buffer("freq", freq / freq.sum(), persistent=False)

    def set_frequencies(self, counts: torch.Tensor) -> None:
        """Item counts (V,) from the training data; items never seen keep a small floor."""
        c = counts.double().clamp(min=0.5)
        c[: self.n_special] = 0
        self.freq = (c / c.sum()).float().to(self.freq.device)

    def forward(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (negatives (K,), correction (K,) to subtract from their logits)."""
        n_pop = round(self.k * self.pop_share)
        uni = torch.randint(self.n_special, self.vocab_size, (self.k - n_pop,), device=device)
        pop = torch.multinomial(self.freq, n_pop, replacement=True) if n_pop else uni[:0]
        neg = torch.cat([uni, pop])
        if not self.correct:
            return neg, torch.zeros(len(neg), device=device)
        q = self.pop_share * self.freq[neg] + (1.0 - self.pop_share) / (self.vocab_size - self.n_special)
        return neg, torch.log(self.k * q)
