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
    f, config, K = dec.f_att, dec.config, dec.config.heads
    if config.normalize or config.scale:
        f = f.score  # the score it reweights, below
    score = config.score
    if score == "uniform":  # e_ti = 0
        return torch.zeros(K, a.size(0), dtype=a.dtype)
    if score in ("additive", "concat"):  # e_kti = v_k^T tanh(W_a a_i + W_h h + b), concat: W_a [h; a_i] + b
        if score == "additive":
            y = a @ f.W_a.weight.T + f.W_a.bias + f.W_h.weight @ h  # (L, A)
            v = f.w
        else:
            y = torch.stack([f.W_a.weight @ torch.cat([h, a_i]) + f.W_a.bias for a_i in a])
            v = f.v_a
        A = y.size(1) // K
        if config.normalize:  # g v_k / ||v_k||
            v = torch.stack([dec.f_att.g * v[k] / torch.sqrt((v[k] ** 2).sum()) for k in range(K)])
        return torch.stack([torch.tanh(y[:, k * A : (k + 1) * A]) @ v[k] for k in range(K)])
    if score == "dot":
        keys, query, scale = a, h, 1.0
    elif score == "general":
        keys, query, scale = a @ f.W_a.weight.T, h, 1.0
    else:  # scaled dot
        keys, query = a @ f.W_k.weight.T + f.W_k.bias, f.W_q.weight @ h + f.W_q.bias
        scale = 1 / math.sqrt(keys.size(1) // K)
    if config.scale:  # a learned g
        scale = dec.f_att.g * scale
    d = keys.size(1) // K
    return torch.stack([keys[:, k * d : (k + 1) * d] @ query[k * d : (k + 1) * d] * scale for k in range(K)])


def sparsemax(z: Tensor) -> Tensor:
    """Martins and Astudillo 2016, Algorithm 1, for one vector z (n,): sort, k(z), tau, max(z - tau, 0)."""
    zs = sorted(z.tolist(), reverse=True)
    k = max(k for k in range(1, len(zs) + 1) if 1 + k * zs[k - 1] > sum(zs[:k]))
    order = torch.argsort(z, descending=True)[:k]  # the support, as tensors for the gradient
    tau = (z[order].sum() - 1) / k
    return torch.relu(z - tau)


def normalise(dec, z: Tensor) -> Tensor:
    """The decoder's normaliser over the last dimension of z, one vector at a time; -inf entries get 0."""
    if z.dim() > 1:
        return torch.stack([normalise(dec, row) for row in z])
    if dec.config.normalizer == "sparsemax":
        keep = torch.isfinite(z)
        return torch.zeros_like(z).masked_scatter(keep, sparsemax(z[keep]))
    return torch.exp(z) / torch.exp(z).sum()


def grid(L: int) -> tuple[int, int, Tensor]:
    """gh, gw and the (row, column) of every cell, row by row."""
    gh = gw = int(round(L**0.5))
    return gh, gw, torch.tensor([(r, c) for r in range(gh) for c in range(gw)], dtype=torch.float64)


def weights(dec, a: Tensor, h: Tensor, bias: Tensor | None = None, t: int = 0, history=None) -> Tensor:
    """alpha (heads, L): Eq. 5 or its normaliser, a window, or attention over attention (``history``:
    the states so far, h last); ``t`` the steps taken (local_m's centre)."""
    if dec.config.over_attention:
        return over_attention(dec, a, history, bias)
    e = scores(dec, a, h)
    if bias is not None:
        e = e + bias
    window = dec.config.window
    if window == "local":
        alpha = normalise(dec, e)
        w = dec.window
        gh, gw, cells = grid(a.size(0))
        centre = torch.tensor([gh - 1, gw - 1], dtype=a.dtype) * torch.sigmoid(
            w.v_p.weight @ torch.tanh(w.W_p.weight @ h + w.W_p.bias) + w.v_p.bias
        )
        window = torch.exp(-((cells - centre) ** 2).sum(1) / (2 * dec.config.local_sigma**2))
        alpha = alpha * window
        return alpha / alpha.sum(-1, keepdim=True)
    if window in ("local_p", "local_m"):
        return luong_local(dec, e, h, t, a.size(0))
    if window == "hierarchical":
        return hierarchical(dec, a, e, h, bias)
    return normalise(dec, e)


def luong_local(dec, e: Tensor, h: Tensor, t: int, L: int) -> Tensor:
    """Luong's Eq. 9-10 on the grid: align over the cells within D of p_t, times the Gaussian, not renormalised."""
    D, (gh, gw, cells) = dec.config.local_width, grid(L)
    if dec.config.window == "local_p":  # p_t = (gh - 1, gw - 1) sigmoid(v_p^T tanh(W_p h))
        w = dec.window
        centre = torch.tensor([gh - 1, gw - 1], dtype=h.dtype) * torch.sigmoid(
            w.v_p.weight @ torch.tanh(w.W_p.weight @ h)
        )
    else:  # local_m: step t's cell, row by row
        centre = torch.tensor([(t % L) // gw, (t % L) % gw], dtype=h.dtype)
    inside = [i for i in range(L) if abs(cells[i, 0] - centre[0]) <= D and abs(cells[i, 1] - centre[1]) <= D]
    alpha = torch.zeros_like(e)
    for k in range(e.size(0)):
        align = normalise(dec, e[k, inside])
        for j, i in enumerate(inside):
            distance2 = ((cells[i] - centre) ** 2).sum()
            alpha[k, i] = align[j] * torch.exp(-distance2 / (2 * (D / 2) ** 2))
    return alpha


def hierarchical(dec, a: Tensor, e: Tensor, h: Tensor, bias: Tensor | None = None) -> Tensor:
    """Yang et al.'s two levels on the grid: the cells of each region (region_size blocks from the
    top-left, narrower at the far edges), then the regions; a focus prior ``bias`` (L,) (already in
    e) adds log mean_{i in r} exp(b_i) to each region's score."""
    size, cells = dec.config.region_size, grid(a.size(0))[2]
    blocks = {}
    for i, (r, c) in enumerate(cells.long().tolist()):
        blocks.setdefault((r // size, c // size), []).append(i)
    w = dec.window
    alpha = torch.zeros_like(e)
    for k in range(e.size(0)):
        within, u = {}, []
        for key, members in sorted(blocks.items()):
            within[key] = normalise(dec, e[k, members])  # alpha_i|r
            s_r = sum(p * a[i] for p, i in zip(within[key], members))
            u_r = w.v_s @ torch.tanh(w.W_s.weight @ s_r + w.W_s.bias + w.U_s.weight @ h)
            if bias is not None:
                u_r = u_r + torch.log(sum(torch.exp(bias[i]) for i in members) / len(members))
            u.append(u_r)
        beta = normalise(dec, torch.stack(u))
        for b, (key, members) in zip(beta, sorted(blocks.items())):
            for p, i in zip(within[key], members):
                alpha[k, i] = b * p
    return alpha


def over_attention(dec, a: Tensor, history: list[Tensor], bias: Tensor | None = None) -> Tensor:
    """Cui et al.'s s = alpha beta_bar over M (L x t), M_ij = score(a_i, h_j) for the states so far."""
    M = torch.stack([scores(dec, a, h_j) + (0 if bias is None else bias) for h_j in history], -1)  # (heads, L, t)
    alpha = torch.stack([normalise(dec, M[..., j]) for j in range(M.size(-1))], -1)  # over the locations
    beta = normalise(dec, M)  # over the states, for each location
    beta_bar = beta.mean(-2)  # (heads, t)
    return (alpha * beta_bar.unsqueeze(-2)).sum(-1)


def attend(dec, a: Tensor, h: Tensor, location: Tensor | None = None, bias: Tensor | None = None, t=0, history=None):
    """(alpha (heads, L), beta, z (D,)) for one row: the context of every head (expected, or a_{s}
    at ``location`` (heads,) where it is >= 0), joined by W_o, AoA, then the gate beta."""
    alpha = weights(dec, a, h, bias, t, history)
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
    """The refined a (the refiner's layers run as they are), h_0 and c_0 from the mean annotation
    vector or its attention pooling (u_i = tanh(W a_i + b), alpha = softmax(u_i^T u_w))."""
    if dec.refiner is not None:
        a = dec.refiner(a.unsqueeze(0))[0]
    pooled = a.mean(0)
    if dec.config.init == "attention_pool":
        p = dec.pool
        u = torch.stack([torch.tanh(p.W.weight @ a_i + p.W.bias) @ p.u_w for a_i in a])
        pooled = (torch.exp(u) / torch.exp(u).sum()) @ a
    h, c = torch.tanh(dec.W_init.weight @ pooled + dec.W_init.bias).chunk(2)
    return a, h, c


def step(dec, a: Tensor, word: int, h: Tensor, c: Tensor, location=None, bias=None, t=0, history=None):
    """One step (the t-th, from 0; ``history``: the states so far, h last): (log p (V,), alpha
    (heads, L), beta, h, c)."""
    Ey = dec.E.weight[word]
    if dec.config.placement == "luong":  # the LSTM on [E y; h], then attention from h_t
        h, c = lstm(dec, torch.cat([Ey, h]), h, c)
        alpha, beta, z = attend(dec, a, h, location, bias, t, history)
    else:  # attention from h_{t-1}, then the LSTM on [E y; h; z]
        alpha, beta, z = attend(dec, a, h, location, bias, t, history)
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
    ll, alphas, betas, log_ps, history = 0.0, [], [], [], [h]
    for t in range(len(words) - 1):
        where = None if locations is None else locations[t].reshape(-1)
        logp, alpha, beta, h, c = step(dec, a, int(words[t]), h, c, where, t=t, history=history)
        history = history + [h]
        ll = ll + logp[words[t + 1]]
        alphas.append(alpha)
        betas.append(beta)
        # log alpha[s]; a location of zero weight (a sparse normaliser's, a truncated window's), which
        # sampling never draws, has the package's floor log(1e-12) rather than -inf
        picked = [
            torch.log(alpha[k, s].clamp_min(1e-12))
            for k, s in enumerate([] if where is None else where.tolist())
            if s >= 0
        ]
        log_ps.append(sum(picked) if picked else torch.zeros((), dtype=a.dtype))
    return Caption(torch.as_tensor(ll, dtype=a.dtype), torch.stack(alphas), torch.stack(betas), torch.stack(log_ps))


def greedy(dec, a: Tensor, max_new_tokens: int, hard: str = "expected") -> list[int]:
    """The likeliest word at each step from BOS until EOS (included) or ``max_new_tokens`` words;
    ``hard`` "argmax": the context at alpha's likeliest location (one head)."""
    a, h, c = initial(dec, a)
    word, words, history = Vocabulary.bos_id, [], [h]
    while len(words) < max_new_tokens and word != Vocabulary.eos_id:
        t = len(words)
        where = weights(dec, a, h, None, t, history)[0].argmax().reshape(1) if hard == "argmax" else None
        logp, _, _, h, c = step(dec, a, word, h, c, where, t=t, history=history)
        history = history + [h]
        word = int(logp.argmax())
        words.append(word)
    return words
