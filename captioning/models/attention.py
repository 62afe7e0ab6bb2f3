"""Soft and hard attention over the L annotation vectors (paper Section 4).

Both kinds share the scoring network of Eq. 4-5,

    e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b),    alpha_t = softmax(e_t),

and differ in how the context z_t is made from alpha_t (Section 4.1 and 4.2):

- soft (deterministic): the expected context  z_t = sum_i alpha_ti a_i            (Eq. 13)
- hard (stochastic):    a sampled location    s_t ~ Categorical(alpha_t),  z_t = a_{s_t}  (Eq. 8-9)

models/reference.py writes the paper's model plainly; this module is its fast form and its variants.

**Score functions** (``DecoderConfig.score``) are :class:`Score` subclasses registered in
:data:`SCORES` by name, beside their class::

    @SCORES.register("cosine")
    class CosineScore(Score):
        def __init__(self, feature_dim, hidden_dim, attention_dim, heads=1): ...
        def project(self, features): ...          # (B, L, D) -> (B, L, K), once per batch
        def scores(self, projected, query, beams=1): ...   # -> e (B * beams, L) or (B * beams, heads, L)

The built-in ones: ``additive`` (the above, the paper's, Bahdanau's), ``dot`` h^T a_i, ``general``
h^T W a_i, ``scaled_dot`` (W_q h)^T (W_k a_i) / sqrt(d) (Luong et al. 2015, Vaswani et al. 2017).
A score defined in another module registers when that module is imported.

The other variants researchers compare live here too:

- multi-head attention: the query and key widths split into ``heads`` parts, one alpha per head
  (alpha: (N, heads, L)); :func:`glimpse` makes one context per head, the decoder joins and
  projects them back to D (with one head, nothing is split or projected: the single-head model);
- local attention on the grid (Luong's local-p in two dimensions): a predicted centre
  p_t = (gh - 1, gw - 1) * sigmoid(v_p^T tanh(W_p h)) and the alignment multiplied by the Gaussian
  window exp(-|cell - p_t|^2 / 2 sigma^2) and renormalised, i.e. softmax(e_t - |cell - p_t|^2 / 2 sigma^2).

**Speed-only code** is grouped at the end of the module (section "Speed"), apart from the
equations: the additive score through tanh(y) = 2 sigmoid(2y) - 1, and its chunked in-place form
for decoding on the CPU. Each computes the same numbers as the equation it replaces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models import ATTENTION_MODES
from captioning.registry import Registry

#: The score functions e_ti = score(h, a_i), by the name ``DecoderConfig.score`` gives.
SCORES: Registry[type[Score]] = Registry("attention score", field="model.decoder.score")


def list_scores() -> list[str]:
    """The names of the registered score functions (``DecoderConfig.score``'s choices)."""
    return SCORES.names()


class Score(nn.Module):
    """A score function f_att (Eq. 4-5): what the decoder relies on.

    A registered subclass is built as ``cls(feature_dim, hidden_dim, attention_dim, heads)`` (D, H,
    A and the number of heads) and sets :attr:`query_dim` and :attr:`heads`. The decoder calls
    :meth:`project` once per batch and :meth:`forward` at every step, with ``query`` the first
    ``query_dim`` columns of its fused product of h (0: the query is h itself, (N, H)).
    """

    #: the width of the query the decoder computes from h (its share of the fused product); 0: h itself
    query_dim: int = 0
    #: attention heads: alpha is (N, L) with one head, (N, heads, L) with more
    heads: int = 1

    def project(self, features: Tensor) -> Tensor:
        """What depends on the image only, once per batch: (B, L, D) -> (B, L, K)."""
        raise NotImplementedError

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        """The scores e_t before the softmax: (B * beams, L), or (B * beams, heads, L).

        projected: (B, L, K) from :meth:`project`; query: (B * beams, Q), where rows
        k * beams ... (k + 1) * beams - 1 belong to image k."""
        raise NotImplementedError

    def forward(self, projected: Tensor, query: Tensor, beams: int = 1, bias: Tensor | None = None) -> Tensor:
        """alpha_t = softmax(e_t) (Eq. 5): (B * beams, L), or (B * beams, heads, L), rows summing to one.
        ``bias`` (B * beams, L), if given, is added to the scores before the softmax (the local window's log)."""
        e = self.scores(projected, query, beams)
        return torch.softmax(e if bias is None else add_bias(e, bias), dim=-1)


@SCORES.register("additive")
class AdditiveAttention(Score):
    """The attention model f_att of Eq. 4: e_ti = w^T tanh(W_a a_i + b + W_h h_{t-1}) + b_w.

    The hidden-side projection W_h h_{t-1} is not done here: the decoder fuses it with its other
    matrix products of h_{t-1} into one (see :class:`~captioning.models.decoder.ShowAttendTellDecoder`),
    and passes the result in as the query. With several heads, head k scores with its own A / heads
    columns of W_a a + W_h h and its own w_k.
    """

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        if attention_dim % heads:
            raise ConfigError(
                f"model.decoder.heads: attention_dim ({attention_dim}) must be a multiple of heads ({heads})"
            )
        self.heads = heads
        self.query_dim = attention_dim  # the width of W_h h_{t-1}
        self.feature_proj = nn.Linear(feature_dim, attention_dim)  # W_a (and b)
        # w: one vector per head over its A / heads columns (one head: nn.Linear(A, 1))
        self.score = nn.Linear(attention_dim, 1) if heads == 1 else HeadScores(attention_dim, heads)

    def project(self, features: Tensor) -> Tensor:
        """W_a a_i + b for every location, once per batch: (B, L, D) -> (B, L, A)."""
        return self.feature_proj(features)

    def scores(self, projected: Tensor, h_att: Tensor, beams: int = 1) -> Tensor:
        """e_t from projected (B, L, A) and h_att = W_h h_{t-1} (B * beams, A): (B * beams, L), or
        (B * beams, heads, L). Computed in the sigmoid form (see "Speed" below)."""
        if self.heads > 1:
            return multihead_additive_scores(projected, h_att, self.score.weight, self.score.bias, beams, self.heads)
        return additive_scores(projected, h_att, self.score.weight, self.score.bias, beams)


class HeadScores(nn.Module):
    """The additive score vectors w_k of several heads: weight (heads, A / heads), bias (heads,),
    each initialised as nn.Linear(A / heads, 1) would be."""

    def __init__(self, attention_dim: int, heads: int):
        super().__init__()
        a = attention_dim // heads
        bound = 1.0 / math.sqrt(a)
        self.weight = nn.Parameter(torch.empty(heads, a).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(heads).uniform_(-bound, bound))


@SCORES.register("dot")
class DotAttention(Score):
    """Multiplicative scores (Luong et al. 2015; Vaswani et al. 2017), per head; ``kind`` says which:

    - ``dot``:        e_ti = h^T a_i                 (needs hidden_dim == feature_dim)
    - ``general``:    e_ti = h^T (W a_i)             (W: D -> H, applied once per batch)
    - ``scaled_dot``: e_ti = (W_q h)^T (W_k a_i + b_k) / sqrt(A / heads)   (W_q h comes from the decoder's fused product)

    With several heads the query and key are split into ``heads`` equal parts and head k scores
    with its part. ``project`` gives the keys (B, L, K) once per batch.
    """

    kind = "dot"

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        score = self.kind
        if score == "dot" and hidden_dim != feature_dim:
            raise ConfigError(
                f"model.decoder.score: 'dot' needs hidden_dim == the encoder's feature width "
                f"({hidden_dim} != {feature_dim}); use 'general' or 'scaled_dot'"
            )
        key_dim = attention_dim if score == "scaled_dot" else hidden_dim
        if key_dim % heads:
            raise ConfigError(
                f"model.decoder.heads: the {score} score's key width ({key_dim}) must be a multiple of heads ({heads})"
            )
        self.score, self.heads = score, heads
        self.query_dim = attention_dim if score == "scaled_dot" else 0
        self.key_proj = (
            None if score == "dot" else nn.Linear(feature_dim, key_dim, bias=(score == "scaled_dot"))
        )  # W or W_k
        self.scale = 1.0 / math.sqrt(key_dim // heads) if score == "scaled_dot" else 1.0

    def project(self, features: Tensor) -> Tensor:
        """The keys, once per batch: (B, L, D) -> (B, L, K)."""
        return features if self.key_proj is None else self.key_proj(features)

    def scores(self, keys: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        """keys (B, L, K), query (B * beams, K) -> e: (B * beams, L), or (B * beams, heads, L)."""
        B, L, K = keys.shape
        h = self.heads
        q = query.view(B, beams, h, K // h).transpose(1, 2)  # (B, heads, beams, d)
        k = keys.view(B, L, h, K // h).permute(0, 2, 3, 1)  # (B, heads, d, L)
        e = torch.matmul(q, k).transpose(1, 2)  # (B, beams, heads, L)
        if self.scale != 1.0:
            e = e * self.scale
        return e.reshape(B * beams, L) if h == 1 else e.reshape(B * beams, h, L)


@SCORES.register("general")
class GeneralAttention(DotAttention):
    """e_ti = h^T (W a_i) (Luong's general)."""

    kind = "general"


@SCORES.register("scaled_dot")
class ScaledDotAttention(DotAttention):
    """e_ti = (W_q h)^T (W_k a_i + b_k) / sqrt(d) (Vaswani et al.'s scaled dot product)."""

    kind = "scaled_dot"


def build_attention(score: str, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1) -> Score:
    """The f_att of the score function registered as ``score`` (a one-line error naming the choices otherwise)."""
    return SCORES.get(score)(feature_dim, hidden_dim, attention_dim, heads)


def add_bias(e: Tensor, bias: Tensor) -> Tensor:
    """Scores (N, L) or (N, heads, L) plus a per-row bias (N, L) (the same for every head)."""
    return e + (bias.unsqueeze(1) if e.dim() == 3 else bias)


def grid_cells(gh: int, gw: int, device=None, dtype=torch.float32) -> Tensor:
    """(L, 2): the (row, column) of every location, row-major as the encoders flatten them."""
    rows = torch.arange(gh, device=device, dtype=dtype).repeat_interleave(gw)
    cols = torch.arange(gw, device=device, dtype=dtype).repeat(gh)
    return torch.stack([rows, cols], 1)


def window_log(centre: Tensor, gh: int, gw: int, sigma: float) -> Tensor:
    """log of the local-p window, -|cell - p|^2 / (2 sigma^2): centre (N, 2) in cells -> (N, L)."""
    cells = grid_cells(gh, gw, centre.device, centre.dtype)  # (L, 2)
    d2 = ((centre.unsqueeze(1) - cells) ** 2).sum(-1)  # (N, L)
    return d2 * (-0.5 / sigma**2)


def gaussian_window(centre: Tensor, gh: int, gw: int, sigma: float) -> Tensor:
    """The 2-D Gaussian window around ``centre`` (N, 2) over the grid, normalised to sum to one: (N, L).

    Local attention's alpha is the global alpha times this window, renormalised (Luong's local-p)."""
    return torch.softmax(window_log(centre, gh, gw, sigma), dim=-1)


class LocalCentre(nn.Module):
    """Luong's predictive alignment in two dimensions: p_t = (gh - 1, gw - 1) * sigmoid(v_p^T tanh(W_p h)).

    W_p h (width A) comes from the decoder's fused product of h; this module holds v_p (A -> 2)."""

    def __init__(self, attention_dim: int):
        super().__init__()
        self.v_p = nn.Linear(attention_dim, 2)

    def forward(self, w_p_h: Tensor, gh: int, gw: int) -> Tensor:
        """(N, A) -> the centre (N, 2) as (row, column) in cells, in [0, gh - 1] x [0, gw - 1]."""
        span = w_p_h.new_tensor([gh - 1, gw - 1])
        return torch.sigmoid(self.v_p(torch.tanh(w_p_h))) * span


@dataclass
class Glimpse:
    """What one attention step gives the decoder."""

    context: Tensor  # (B, D): z_t before the gate beta_t
    alpha: Tensor  # (B, L): the attention weights
    location: Tensor  # (B,): the chosen location (argmax of alpha where nothing was sampled)
    log_prob: Tensor | None = None  # (B,): log p(s_t | a) of a sampled location, 0 where the expected context was used
    entropy: Tensor | None = None  # (B,): H[alpha_t]
    # Several heads: context is (B, heads * D) (the heads' contexts side by side), alpha the mean
    # over heads, head_alpha (B, heads, L); location (B,) the mean's argmax (expected mode) or
    # (B, heads) the heads' locations (hard modes); log_prob and entropy are summed over heads.
    head_alpha: Tensor | None = None


def tempered(alpha: Tensor, temperature: float) -> Tensor:
    """softmax(log alpha / temperature) over the last dimension: alpha sharpened (temperature < 1) or flattened."""
    return torch.softmax(torch.log(alpha.clamp_min(1e-12)) / temperature, dim=-1)


def expected_context(alpha: Tensor, features: Tensor, beams: int = 1) -> Tensor:
    """sum_i alpha_ti a_i (Eq. 13): (B * beams, L), (B, L, D) -> (B * beams, D).

    The ``beams`` rows of an image share its features: one (beams, L) x (L, D) product per image.
    """
    B, L, D = features.shape
    return torch.bmm(alpha.view(B, beams, L), features).view(B * beams, D)


def location_context(location: Tensor, features: Tensor, beams: int = 1) -> Tensor:
    """a_{s_t}: the annotation vector at each row's location, (B * beams,), (B, L, D) -> (B * beams, D)."""
    image = torch.arange(location.size(0), device=location.device) // beams
    return features[image, location]


def sample_location(alpha: Tensor, generator: torch.Generator | None = None, graph_safe: bool = False) -> Tensor:
    """One location per row drawn from alpha (B, L) -> (B,).

    ``graph_safe``: draw s_t ~ Cat(alpha_t) as argmax_i alpha_ti / E_i with E_i ~ Exp(1) (the same
    distribution), from random numbers a captured CUDA graph replays, instead of torch.multinomial
    (the static-shape training pass asks for it)."""
    if graph_safe:
        e = torch.empty(alpha.shape, device=alpha.device, dtype=torch.float32).exponential_(generator=generator)
        return (alpha.float() / e).argmax(-1)
    return torch.multinomial(alpha.float(), 1, generator=generator).squeeze(-1)


def glimpse(
    alpha: Tensor,
    features: Tensor,
    mode: str = "expected",
    use_expected: Tensor | None = None,
    generator: torch.Generator | None = None,
    location: Tensor | None = None,
    beams: int = 1,
    temperature: float = 1.0,
    graph_safe: bool = False,
) -> Glimpse:
    """Turn alpha_t into a context vector.

    mode "expected" is soft attention; "argmax" and "sample" are hard attention. In "sample"
    mode, rows where ``use_expected`` (B,) is true take the expected context instead of a
    sample: the paper's variance reduction (Section 4.1), whose draw the caller makes. A given
    ``location`` (B,) replaces the sample (to score a chosen location sequence exactly).
    With ``beams`` > 1, alpha has ``beams`` rows per image of ``features`` (beam search).

    alpha (B, heads, L) is multi-head attention: each head makes its own context (and, in the hard
    modes, its own location, sampled independently; ``location`` is then (B, heads)), and the
    contexts are returned side by side, (B, heads * D).

    In mode "expected", ``temperature`` tau != 1 takes the expected context under the tempered
    distribution softmax(log alpha / tau) (a decoding choice for hard-attention models: tau < 1
    sharpens the context towards the likeliest location's, tau -> 0 is "argmax"); the returned alpha
    is the model's, as in "argmax" mode.

    mode "gumbel" (training only; NOT the paper's estimator) draws the location by straight-through
    Gumbel-softmax at ``temperature``: the forward pass reads the one sampled location (a one-hot
    weight vector), the backward pass differentiates softmax((log alpha + g) / temperature).

    ``graph_safe``: mode "sample" draws with random numbers a CUDA graph replays (see :func:`sample_location`).
    """
    if alpha.dim() == 3:
        return _multihead_glimpse(
            alpha, features, mode, use_expected, generator, location, beams, temperature, graph_safe
        )
    if mode == "expected":
        location = alpha.argmax(dim=-1)
        weights = alpha if temperature == 1.0 else tempered(alpha, temperature)
        return Glimpse(expected_context(weights, features, beams), alpha, location)
    if mode == "argmax":
        location = alpha.argmax(dim=-1)
        return Glimpse(location_context(location, features, beams), alpha, location)
    if mode == "gumbel":
        return _gumbel_glimpse(alpha, features, use_expected, generator, beams, temperature)
    if mode != "sample":
        raise ValueError(f"unknown attention mode {mode!r}; expected one of {ATTENTION_MODES}")
    if location is None:
        location = sample_location(alpha.detach(), generator, graph_safe)  # s_t ~ Cat(alpha_t), (B,)
    log_alpha = torch.log(alpha.clamp_min(1e-12))
    log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)  # log p(s_t | a), (B,)
    entropy = -(alpha * log_alpha).sum(-1)  # H[alpha_t], (B,)
    if use_expected is None:
        context = location_context(location, features, beams)
    else:  # one product for both kinds of rows: weights alpha (expected context) or onehot(s_t) (a_{s_t})
        onehot = torch.zeros_like(alpha).scatter_(1, location.unsqueeze(1), 1.0)
        context = expected_context(torch.where(use_expected.unsqueeze(1), alpha, onehot), features, beams)
        log_prob = log_prob.masked_fill(use_expected, 0.0)
    return Glimpse(context, alpha, location, log_prob, entropy)


def _multihead_glimpse(
    alpha: Tensor,
    features: Tensor,
    mode: str,
    use_expected: Tensor | None,
    generator: torch.Generator | None,
    location: Tensor | None,
    beams: int,
    temperature: float = 1.0,
    graph_safe: bool = False,
) -> Glimpse:
    """:func:`glimpse` of every head at once: the heads are more rows of the same image
    (rows image, beam, head), so each is one more "beam" over the image's features."""
    N, K, L = alpha.shape
    D = features.size(-1)
    g = glimpse(
        alpha.reshape(N * K, L),
        features,
        mode,
        None if use_expected is None else use_expected.repeat_interleave(K),
        generator,
        None if location is None else location.reshape(N * K),
        beams * K,
        temperature,
        graph_safe,
    )
    mean = alpha.mean(1)
    where = mean.argmax(dim=-1) if mode == "expected" else g.location.view(N, K)
    return Glimpse(
        g.context.view(N, K * D),
        mean,
        where,
        None if g.log_prob is None else g.log_prob.view(N, K).sum(1),
        None if g.entropy is None else g.entropy.view(N, K).sum(1),
        head_alpha=alpha,
    )


def _gumbel_glimpse(
    alpha: Tensor,
    features: Tensor,
    use_expected: Tensor | None,
    generator: torch.Generator | None,
    beams: int,
    temperature: float,
) -> Glimpse:
    """Straight-through Gumbel-softmax (Jang et al. 2017): one location forward, a relaxed gradient backward."""
    log_alpha = torch.log(alpha.clamp_min(1e-12))  # (B, L)
    u = torch.rand(alpha.shape, device=alpha.device, dtype=torch.float32, generator=generator)
    gumbel = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))  # (B, L)
    soft = torch.softmax((log_alpha + gumbel.to(log_alpha.dtype)) / temperature, dim=-1)  # (B, L)
    location = soft.detach().argmax(dim=-1)  # (B,): s_t ~ Cat(alpha_t)
    hard = torch.zeros_like(soft).scatter_(1, location.unsqueeze(1), 1.0)
    weights = hard + (soft - soft.detach())  # forward: the one-hot; backward: d soft
    context = expected_context(weights, features, beams)  # = a_{s_t} forward
    log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)
    entropy = -(alpha * log_alpha).sum(-1)
    if use_expected is not None:
        context = torch.where(use_expected.unsqueeze(1), expected_context(alpha, features, beams), context)
        log_prob = log_prob.masked_fill(use_expected, 0.0)
    return Glimpse(context, alpha, location, log_prob, entropy)


# ---------------------------------------------------------------------- Speed
# The additive score of Eq. 4 through the identity tanh(y) = 2 sigmoid(2y) - 1:
#
#     e_ti = (2w)^T sigmoid(2 W_a a_i + 2 W_h h_{t-1} + 2b) + (b_w - sum(w)),
#
# the same number and the same gradient as w^T tanh(y) + b_w. Reason: PyTorch's CPU sigmoid kernel
# is cheaper than its tanh kernel, and this elementwise pass over (B, K, L, A) is the largest of a step.

#: Decoding on the CPU computes the attention scores a few images at a time, about this many
#: values of the (images, K, L, A) tensor at once (4 MB in float32).
CPU_CHUNK_ELEMENTS = 1024 * 1024


def additive_scores(projected: Tensor, h_att: Tensor, weight: Tensor, bias: Tensor, beams: int = 1) -> Tensor:
    """Eq. 4 with one head, in the sigmoid form: projected (B, L, A), h_att (B * beams, A), w = weight
    (1, A), b_w = bias (1,) -> e (B * beams, L)."""
    B, L, A = projected.shape
    hidden = (2 * h_att).view(B, beams, 1, A)
    w2 = 2 * weight.view(A)  # (A,)
    shift = bias - weight.sum()  # b_w - sum(w)
    if torch.is_grad_enabled() or torch.jit.is_tracing():  # a traced (ONNX) graph: one form for every batch size
        y2 = torch.add(hidden, projected.unsqueeze(1), alpha=2)  # 2y: (B, K, L, A)
        e = torch.matmul(torch.sigmoid(y2), w2)  # (B, K, L)
    else:
        e = _additive_scores_no_grad(projected, hidden, w2)
    return (e + shift).view(B * beams, L)


def multihead_additive_scores(
    projected: Tensor, h_att: Tensor, weight: Tensor, bias: Tensor, beams: int, heads: int
) -> Tensor:
    """Eq. 4 per head in the sigmoid form, e_tki = w_k^T tanh(y_ti[k]) + b_k: projected (B, L, A),
    h_att (B * beams, A), weight (heads, A / heads), bias (heads,) -> (B * beams, heads, L). Every
    head in one product (with heads = 1 it is :func:`additive_scores`' number, which the tests check)."""
    B, L, A = projected.shape
    a = A // heads
    w2 = 2 * weight.view(heads, a)  # (heads, a)
    shift = bias - weight.view(heads, a).sum(1)  # (heads,)
    y2 = torch.add((2 * h_att).view(B, beams, 1, A), projected.unsqueeze(1), alpha=2)  # (B, K, L, A)
    blocks = torch.block_diag(*w2.unsqueeze(-1))  # (A, heads): head k's w_k in rows k*a..(k+1)*a of column k
    e = torch.matmul(torch.sigmoid(y2), blocks) + shift  # (B, K, L, heads)
    return e.transpose(2, 3).reshape(B * beams, heads, L)


def _additive_scores_no_grad(projected: Tensor, hidden: Tensor, w2: Tensor) -> Tensor:
    """(2w)^T sigmoid(2y) without autograd, in place, and on the CPU a few images at a time.
    Reason: each chunk's (images, K, L, A) tensor stays small enough for the allocator to reuse it
    (and for the cache to hold it) instead of being mapped afresh from the system at every step."""
    B, L, A = projected.shape
    beams = hidden.size(1)
    w2 = w2.to(torch.promote_types(projected.dtype, hidden.dtype))  # bf16 under autocast
    chunk = max(1, CPU_CHUNK_ELEMENTS // (beams * L * A)) if projected.device.type == "cpu" else B
    e = projected.new_empty(B, beams, L)
    for i in range(0, B, chunk):
        y2 = torch.add(hidden[i : i + chunk], projected[i : i + chunk].unsqueeze(1), alpha=2)
        torch.matmul(y2.sigmoid_(), w2, out=e[i : i + chunk])
    return e
