"""The paper in one file: the Show, Attend and Tell decoder written as its equations.

Xu et al., "Show, Attend and Tell: Neural Image Caption Generation with Visual Attention", ICML 2015
(arXiv 1502.03044), Sections 3.1.2 and 4. Where the paper leaves a choice open, the authors' code
settles it (the tanh inside the deep output). One image and one step at a time, no batching and no
speed tricks: this is the function the fast decoder (decoder.py, cells.py, unroll.py, attention.py)
computes, and the tests hold the two equal in float64, values and gradients. It reads the fast
decoder's own parameters (:meth:`Weights.of`), so both run on the same weights; dropout is left
out (compare a decoder in eval mode).

Notation: a_1..a_L the annotation vectors (L, D); E the word embedding (V, M); h_t, c_t the LSTM
state (H,); alpha_t the attention weights (L,); z_t the context (D,); y_t the words.

    h_0 = tanh(W_init,h mean_i a_i + b),   c_0 = tanh(W_init,c mean_i a_i + b)     Section 3.1.2
    e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b) + b_w                               Eq. 4 (f_att)
    alpha_t = softmax(e_t)                                                          Eq. 5
    beta_t = sigmoid(f_beta(h_{t-1}))                                               Section 4.2.1
    soft:  z_t = beta_t sum_i alpha_ti a_i                                          Eq. 6, 13
    hard:  s_t ~ Categorical(alpha_t),   z_t = beta_t a_{s_t}                       Eq. 8-9
    i, f, g, o = T [E y_{t-1}; h_{t-1}; z_t] + b_T                                  Eq. 1
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g),  h_t = sigmoid(o) * tanh(c_t)  Eq. 2-3
    p(y_t | a, y_<t) = softmax(L_o tanh(E y_{t-1} + L_h h_t + L_z z_t))             Eq. 7

Training (objectives/ combines the pieces :func:`caption` returns): soft attention minimises
-log p(y | a) + lambda sum_i (1 - sum_t alpha_ti)^2 (Eq. 14, :attr:`Caption.penalty`); hard
attention maximises the bound L_s of Eq. 10, whose gradient (Eq. 11-12) is estimated from sampled
locations with log p(y | s, a) (:attr:`Caption.log_likelihood`), log p(s | a)
(:attr:`Caption.location_log_probs`) and the entropy H[alpha_t] (:attr:`Caption.entropies`).
At test time a hard-attention model takes the expected context or the argmax location.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from captioning.vocab import Vocabulary


@dataclass
class Weights:
    """The decoder's parameters under the paper's names (views of the decoder's tensors: gradients reach it)."""

    E: Tensor  # (V, M): word embedding
    W_init: Tensor  # (2H, D): f_init,h and f_init,c stacked
    b_init: Tensor  # (2H,)
    W_a: Tensor  # (A, D): the image side of f_att
    b_a: Tensor  # (A,)
    W_h: Tensor  # (A, H): the hidden side of f_att
    b_h: Tensor  # (A,)
    w: Tensor  # (A,): f_att's output vector
    b_w: Tensor  # (): and its bias
    w_beta: Tensor  # (H,): f_beta
    b_beta: Tensor  # ()
    T: Tensor  # (4H, M + H + D): the LSTM's affine map of [E y_{t-1}; h_{t-1}; z_t], gates i, f, g, o
    b_T: Tensor  # (4H,)
    L_h: Tensor  # (M, H)
    b_Lh: Tensor  # (M,)
    L_z: Tensor | None  # (M, D); None without ctx2out
    b_Lz: Tensor | None  # (M,)
    L_o: Tensor  # (V, M)
    b_Lo: Tensor  # (V,)
    prev2out: bool  # E y_{t-1} inside Eq. 7

    @classmethod
    def of(cls, decoder) -> Weights:
        """The weights of a :class:`~captioning.models.decoder.ShowAttendTellDecoder` of the paper's
        model (additive score, one head, Bahdanau placement, global window, no refiner)."""
        config = decoder.config
        if config.variant != "additive":
            raise ValueError(f"the reference is the paper's model; this decoder is the {config.variant!r} variant")
        A, H = decoder.attention_dim, decoder.hidden_dim
        # from_hidden stacks every product of h_{t-1}: [W_h (A) | f_beta (1) | the LSTM's recurrent weights (4H)]
        W_h, w_beta, U = decoder.from_hidden.weight.split([A, 1, 4 * H])
        b_h, b_beta, b_U = decoder.from_hidden.bias.split([A, 1, 4 * H])
        out_context = decoder.out_context
        return cls(
            E=decoder.embedding.weight,
            W_init=decoder.init_state.weight,
            b_init=decoder.init_state.bias,
            W_a=decoder.f_att.feature_proj.weight,
            b_a=decoder.f_att.feature_proj.bias,
            W_h=W_h,
            b_h=b_h,
            w=decoder.f_att.score.weight[0],
            b_w=decoder.f_att.score.bias[0],
            w_beta=w_beta[0],
            b_beta=b_beta[0],
            T=torch.cat([decoder.embed_gates.weight, U, decoder.context_gates.weight], dim=1),
            b_T=b_U,
            L_h=decoder.out_hidden.weight,
            b_Lh=decoder.out_hidden.bias,
            L_z=None if out_context is None else out_context.weight,
            b_Lz=None if out_context is None else out_context.bias,
            L_o=decoder.out_logits.weight,
            b_Lo=decoder.out_logits.bias,
            prev2out=decoder.prev2out,
        )


# ---------------------------------------------------------------------- the equations
def initial_state(p: Weights, a: Tensor) -> tuple[Tensor, Tensor]:
    """h_0, c_0 (H,) from the mean annotation vector (Section 3.1.2): a (L, D)."""
    h0, c0 = torch.tanh(p.W_init @ a.mean(0) + p.b_init).chunk(2)
    return h0, c0


def attention(p: Weights, a: Tensor, h: Tensor) -> Tensor:
    """alpha_t (L,): Eq. 4-5 from a (L, D) and h_{t-1} (H,)."""
    e = torch.tanh(a @ p.W_a.T + p.b_a + p.W_h @ h + p.b_h) @ p.w + p.b_w  # (L,)
    return torch.softmax(e, dim=0)


def gate(p: Weights, h: Tensor) -> Tensor:
    """beta_t = sigmoid(f_beta(h_{t-1})), one scalar per step (Section 4.2.1)."""
    return torch.sigmoid(p.w_beta @ h + p.b_beta)


def lstm(p: Weights, Ey: Tensor, h: Tensor, c: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """h_t, c_t (H,): Eq. 1-3 from E y_{t-1} (M,), h_{t-1}, c_{t-1} (H,) and z_t (D,)."""
    i, f, g, o = (p.T @ torch.cat([Ey, h, z]) + p.b_T).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def word_log_probs(p: Weights, Ey: Tensor, h: Tensor, z: Tensor) -> Tensor:
    """log p(y_t | a, y_<t) (V,): the deep output layer, Eq. 7, from E y_{t-1} (M,), h_t (H,), z_t (D,)."""
    x = p.L_h @ h + p.b_Lh
    if p.prev2out:
        x = x + Ey
    if p.L_z is not None:
        x = x + p.L_z @ z + p.b_Lz
    return torch.log_softmax(p.L_o @ torch.tanh(x) + p.b_Lo, dim=0)


# ---------------------------------------------------------------------- a caption
@dataclass
class Caption:
    """One caption's T steps under the model."""

    log_likelihood: Tensor  # (): sum_t log p(y_t | a, y_<t) (under the used locations, for hard attention)
    alphas: Tensor  # (T, L)
    betas: Tensor  # (T,)
    location_log_probs: Tensor  # (T,): log p(s_t | a) = log alpha_t[s_t]; 0 where the expected context was used
    entropies: Tensor  # (T,): H[alpha_t]

    @property
    def penalty(self) -> Tensor:
        """The doubly stochastic regulariser of Eq. 14 without lambda: sum_i (1 - sum_t alpha_ti)^2."""
        return ((1 - self.alphas.sum(0)) ** 2).sum()


def caption(p: Weights, a: Tensor, words: Tensor, locations: Tensor | None = None) -> Caption:
    """Teacher forcing: the model reads y_0 = BOS, ..., y_{T-1} and scores y_1 .. y_T of ``words``
    (T + 1,). Soft attention (``locations`` None) takes the expected context at every step; hard
    attention takes a_{s_t} at the given locations (T,), where s_t < 0 means the expected context
    (the paper's variance reduction, Section 4.1)."""
    h, c = initial_state(p, a)
    ll, alphas, betas, log_ps, entropies = 0.0, [], [], [], []
    for t in range(len(words) - 1):
        alpha = attention(p, a, h)  # (L,)
        beta = gate(p, h)
        if locations is None or int(locations[t]) < 0:
            z = beta * (alpha @ a)  # Eq. 13
            log_ps.append(torch.zeros((), dtype=a.dtype))
        else:
            s = int(locations[t])
            z = beta * a[s]  # Eq. 9
            log_ps.append(torch.log(alpha[s]))  # Eq. 8
        Ey = p.E[words[t]]
        h, c = lstm(p, Ey, h, c, z)
        ll = ll + word_log_probs(p, Ey, h, z)[words[t + 1]]
        alphas.append(alpha)
        betas.append(beta)
        entropies.append(-(alpha * torch.log(alpha)).sum())
    return Caption(
        torch.as_tensor(ll, dtype=a.dtype),
        torch.stack(alphas),
        torch.stack(betas),
        torch.stack(log_ps),
        torch.stack(entropies),
    )


def greedy(p: Weights, a: Tensor, max_new_tokens: int, hard: str = "expected") -> list[int]:
    """The likeliest word at every step, from BOS until EOS (included) or ``max_new_tokens`` words.
    ``hard``: how a hard-attention model makes its context at test time, "expected" (Eq. 13) or
    "argmax" (a_i at the likeliest location)."""
    h, c = initial_state(p, a)
    word, words = Vocabulary.bos_id, []
    while len(words) < max_new_tokens and word != Vocabulary.eos_id:
        alpha = attention(p, a, h)
        z = gate(p, h) * (a[alpha.argmax()] if hard == "argmax" else alpha @ a)
        Ey = p.E[word]
        h, c = lstm(p, Ey, h, c, z)
        word = int(word_log_probs(p, Ey, h, z).argmax())
        words.append(word)
    return words
