"""The tests' oracle: the LSTM decoder and its attention variants transcribed from their equations,
one image and one step at a time, reading a decoder's parameters by the paper's names
(models/decoder.py's docstring lists the equations; models/attention/ the variants'). Dropout is
left out (compare a decoder in eval mode). Nothing here is batched, fused or shared with the package."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from captioning.vocab import Vocabulary


def scores(dec, a: Tensor, h: Tensor) -> Tensor:
    """e (heads, L) for one row: a (L, D), h (H,) the state attended from (Eq. 4 and the variants)."""
    f, score, K = dec.f_att, dec.config.score, dec.config.heads
    if score == "additive":  # e_kti = w_k^T tanh(W_a a_i + W_h h + b)[k's columns]
        y = a @ f.W_a.weight.T + f.W_a.bias + f.W_h.weight @ h  # (L, A)
        A = y.size(1) // K
        return torch.stack([torch.tanh(y[:, k * A : (k + 1) * A]) @ f.w[k] for k in range(K)])
    if score == "dot":
        keys, query, scale = a, h, 1.0
    elif score == "general":
        keys, query, scale = a @ f.W_a.weight.T, h, 1.0
    else:  # scaled dot
        keys, query = a @ f.W_k.weight.T + f.W_k.bias, f.W_q.weight @ h + f.W_q.bias
        scale = 1 / math.sqrt(keys.size(1) // K)
    d = keys.size(1) // K
    return torch.stack([keys[:, k * d : (k + 1) * d] @ query[k * d : (k + 1) * d] * scale for k in range(K)])


def weights(dec, a: Tensor, h: Tensor, bias: Tensor | None = None) -> Tensor:
    """alpha (heads, L): Eq. 5, or Luong's local window (the Gaussian multiplied in, renormalised)."""
    e = scores(dec, a, h)
    if bias is not None:
        e = e + bias
    alpha = torch.softmax(e, -1)
    if dec.config.window == "local":
        w = dec.window
        gh = gw = int(round(a.size(0) ** 0.5))
        centre = torch.tensor([gh - 1, gw - 1], dtype=a.dtype) * torch.sigmoid(
            w.v_p.weight @ torch.tanh(w.W_p.weight @ h + w.W_p.bias) + w.v_p.bias
        )
        cells = torch.tensor([(r, c) for r in range(gh) for c in range(gw)], dtype=a.dtype)
        window = torch.exp(-((cells - centre) ** 2).sum(1) / (2 * dec.config.local_sigma**2))
        alpha = alpha * window
        alpha = alpha / alpha.sum(-1, keepdim=True)
    return alpha


def attend(dec, a: Tensor, h: Tensor, location: Tensor | None = None, bias: Tensor | None = None):
    """(alpha (heads, L), beta, z (D,)) for one row: the context of every head (expected, or a_{s}
    at ``location`` (heads,) where it is >= 0), joined by W_o, AoA, then the gate beta."""
    alpha = weights(dec, a, h, bias)
    contexts = []
    for k in range(alpha.size(0)):
        s = None if location is None else int(location[k])
        contexts.append(alpha[k] @ a if s is None or s < 0 else a[s])  # Eq. 13, or Eq. 9
    z = torch.cat(contexts)
    if dec.multi_head is not None:
        z = dec.multi_head.W_o.weight @ z
    if dec.aoa is not None:  # i * sigmoid(g), [i; g] = W_ig [z; h] + b
        info, gate = (dec.aoa.W_ig.weight @ torch.cat([z, h]) + dec.aoa.W_ig.bias).chunk(2)
        z = info * torch.sigmoid(gate)
    beta = torch.sigmoid(dec.f_beta.weight[0] @ h + dec.f_beta.bias[0])  # Section 4.2.1
    return alpha, beta, beta * z


def lstm(dec, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 1-3: i, f, g, o = T x + b; c = sig(f) c + sig(i) tanh(g); h = sig(o) tanh(c)."""
    i, f, g, o = (dec.T.weight @ x + dec.T.bias).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def log_probs(dec, Ey: Tensor, h: Tensor, z: Tensor) -> Tensor:
    """Eq. 7 (with Luong's attentional state in h's place): log p(y_t) (V,)."""
    if dec.config.placement == "luong":
        h = torch.tanh(dec.W_c.weight @ torch.cat([z, h]) + dec.W_c.bias)
    x = dec.L_h.weight @ h + dec.L_h.bias
    if dec.config.prev2out:
        x = x + Ey
    if dec.L_z is not None:
        x = x + dec.L_z.weight @ z + dec.L_z.bias
    return torch.log_softmax(dec.L_o.weight @ torch.tanh(x) + dec.L_o.bias, 0)


def initial(dec, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The refined a (the refiner's layers run as they are), h_0 and c_0."""
    if dec.refiner is not None:
        a = dec.refiner(a.unsqueeze(0))[0]
    h, c = torch.tanh(dec.W_init.weight @ a.mean(0) + dec.W_init.bias).chunk(2)
    return a, h, c


def step(dec, a: Tensor, word: int, h: Tensor, c: Tensor, location=None, bias=None):
    """One step: (log p (V,), alpha (heads, L), beta, h, c)."""
    Ey = dec.E.weight[word]
    if dec.config.placement == "luong":  # the LSTM on [E y; h], then attention from h_t
        h, c = lstm(dec, torch.cat([Ey, h]), h, c)
        alpha, beta, z = attend(dec, a, h, location, bias)
    else:  # attention from h_{t-1}, then the LSTM on [E y; h; z]
        alpha, beta, z = attend(dec, a, h, location, bias)
        h, c = lstm(dec, torch.cat([Ey, h, z]), h, c)
    return log_probs(dec, Ey, h, z), alpha, beta, h, c


@dataclass
class Caption:
    """One caption's T steps under the model."""

    log_likelihood: Tensor  # (): sum_t log p(y_t | a, y_<t)
    alphas: Tensor  # (T, heads, L)
    betas: Tensor  # (T,)
    location_log_probs: Tensor  # (T,): sum over heads of log alpha[s]; 0 where the expected context was used

    @property
    def penalty(self) -> Tensor:
        """Eq. 14's regulariser without lambda: sum_i (1 - sum_t alpha_ti)^2, the mean over heads."""
        return ((1 - self.alphas.sum(0)) ** 2).sum(-1).mean()


def caption(dec, a: Tensor, words: Tensor, locations: Tensor | None = None) -> Caption:
    """Teacher forcing over ``words`` (T + 1,): reads words[t], scores words[t + 1]. ``locations``
    (T,) or (T, heads): hard attention at those locations (< 0: the expected context)."""
    a, h, c = initial(dec, a)
    ll, alphas, betas, log_ps = 0.0, [], [], []
    for t in range(len(words) - 1):
        where = None if locations is None else locations[t].reshape(-1)
        logp, alpha, beta, h, c = step(dec, a, int(words[t]), h, c, where)
        ll = ll + logp[words[t + 1]]
        alphas.append(alpha)
        betas.append(beta)
        picked = [torch.log(alpha[k, s]) for k, s in enumerate([] if where is None else where.tolist()) if s >= 0]
        log_ps.append(sum(picked) if picked else torch.zeros((), dtype=a.dtype))
    return Caption(torch.as_tensor(ll, dtype=a.dtype), torch.stack(alphas), torch.stack(betas), torch.stack(log_ps))


def greedy(dec, a: Tensor, max_new_tokens: int, hard: str = "expected") -> list[int]:
    """The likeliest word at each step from BOS until EOS (included) or ``max_new_tokens`` words;
    ``hard`` "argmax": the context at alpha's likeliest location (one head)."""
    a, h, c = initial(dec, a)
    word, words = Vocabulary.bos_id, []
    while len(words) < max_new_tokens and word != Vocabulary.eos_id:
        where = weights(dec, a, h)[0].argmax().reshape(1) if hard == "argmax" else None
        logp, _, _, h, c = step(dec, a, word, h, c, where)
        word = int(logp.argmax())
        words.append(word)
    return words
