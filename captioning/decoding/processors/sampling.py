"""Sampling a word from the processed log-probabilities (GenerationConfig's do_sample, temperature,
top_k, top_p): what the search does after the processors when it samples. Tensor methods only, so
that this package imports without torch."""

from __future__ import annotations


def top_p_filter(logits, top_p: float):
    """Nucleus filtering (Holtzman et al. 2020): logits (N, V) with -inf outside the smallest set
    of likeliest tokens whose probability under softmax(logits) reaches ``top_p``; the likeliest
    token is always kept. A token is kept when the mass of the tokens ranked before it is below
    top_p (ties among equal probabilities are ranked by sort order)."""
    if top_p >= 1.0:
        return logits
    ordered, order = logits.sort(dim=-1, descending=True)  # (N, V)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the tokens ranked before each
    drop_sorted = before >= top_p
    drop_sorted[:, 0] = False
    drop = drop_sorted.new_zeros(drop_sorted.shape).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_token(logp, temperature: float, top_k: int, generator, top_p: float = 1.0):
    """Draw one token per row from softmax(log p / temperature), restricted to the top k if k > 0
    and to the nucleus of mass top_p if top_p < 1 (:func:`top_p_filter`). generator: a
    torch.Generator or None."""
    logits = logp / max(temperature, 1e-6)
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logits = top_p_filter(logits, top_p)
    return logits.softmax(dim=-1).multinomial(1, generator=generator).squeeze(1)
