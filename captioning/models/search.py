"""Batched caption generation: greedy (or sampled) decoding and beam search over a whole batch.

All images of a batch, and all K beams of each image, advance together as rows of one tensor:
one decoder step per time step for the whole batch. The loop keeps no per-image Python state and
asks the device nothing per step; it checks whether every row has finished only every
``check_every`` steps, so that a GPU is not made to wait at each step.

A finished row keeps its score: its only continuation is PAD at no cost. Scores are the summed
token log-probabilities divided by ``length ** length_penalty`` (length counts EOS), as in Hugging
Face's generation; with one beam, beam search is greedy decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from captioning.models.decoder import ShowAttendTellDecoder


@dataclass
class GenerationOutput:
    sequences: Tensor  # (B, T) token ids without BOS: the words, EOS, then PAD
    attention: Tensor  # (B, T, L) alpha_t of each generated token, zero after EOS
    locations: Tensor  # (B, T) the location each token looked at (argmax for soft attention)
    scores: Tensor  # (B,) length-normalised log-probability
    lengths: Tensor  # (B,) tokens generated, EOS included


def _normalise(scores: Tensor, lengths: Tensor, length_penalty: float) -> Tensor:
    return scores / lengths.clamp(min=1).to(scores.dtype).pow(length_penalty)


def _sample_token(logp: Tensor, temperature: float, top_k: int, generator: Optional[torch.Generator]) -> Tensor:
    """Draw one token per row from softmax(log p / temperature), restricted to the top k if k > 0."""
    logits = logp / max(temperature, 1e-6)
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)


@torch.no_grad()
def greedy_search(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int = 30,
    mode: Optional[str] = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    length_penalty: float = 1.0,
    generator: Optional[torch.Generator] = None,
    check_every: int = 4,
) -> GenerationOutput:
    """Greedy (or, with ``do_sample``, sampled) decoding of a batch. features: (B, L, D)."""
    B = features.size(0)
    state = decoder.initial_state(features)
    tokens = features.new_full((B,), bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool, device=features.device)
    scores = features.new_zeros(B, dtype=torch.float)
    lengths = torch.zeros(B, dtype=torch.long, device=features.device)
    out_tokens, out_alpha, out_loc = [], [], []
    for t in range(max_new_tokens):
        logp, state, g = decoder.step(tokens, state, mode)  # (B, V)
        nxt = _sample_token(logp, temperature, top_k, generator) if do_sample else logp.argmax(-1)
        running = ~finished
        scores += logp.gather(1, nxt.unsqueeze(1)).squeeze(1) * running
        lengths += running.long()
        nxt = nxt.masked_fill(finished, pad_id)
        out_tokens.append(nxt)
        out_alpha.append(g.alpha * running.unsqueeze(1))
        out_loc.append(g.location)
        finished = finished | (nxt == eos_id)
        tokens = nxt
        if (t + 1) % check_every == 0 and bool(finished.all()):
            break
    return GenerationOutput(
        sequences=torch.stack(out_tokens, 1),
        attention=torch.stack(out_alpha, 1).float(),
        locations=torch.stack(out_loc, 1),
        scores=_normalise(scores, lengths, length_penalty),
        lengths=lengths,
    )


@torch.no_grad()
def beam_search(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    num_beams: int = 3,
    max_new_tokens: int = 30,
    mode: Optional[str] = None,
    length_penalty: float = 1.0,
    check_every: int = 4,
) -> GenerationOutput:
    """Beam search with K = num_beams beams per image, all images at once. features: (B, L, D).

    Beams are kept by their summed log-probability; at the end each image returns the beam with
    the best length-normalised score. The words and attention maps of the returned beam are read
    back through the parent pointers kept at each step.
    """
    B, K = features.size(0), num_beams
    device = features.device
    # h_0, c_0 and W_a a once per image; the state is copied to the K beams, the features are not:
    # the K rows of an image attend over one copy (as a (K, L) x (L, D) product).
    state = decoder.initial_state(features).expand_beams(K)
    beam_scores = features.new_zeros(B, K, dtype=torch.float)
    beam_scores[:, 1:] = float("-inf")  # at the start only one beam per image is alive
    tokens = torch.full((B * K,), bos_id, dtype=torch.long, device=device)
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    lengths = torch.zeros(B * K, dtype=torch.long, device=device)
    base = (torch.arange(B, device=device) * K).unsqueeze(1)  # (B, 1): first row of each image
    history = []  # per step: (parent rows (B*K,), tokens (B*K,), alpha (B*K, L), location (B*K,))
    for t in range(max_new_tokens):
        logp, state, g = decoder.step(tokens, state, mode)  # (B*K, V)
        V = logp.size(-1)
        # A finished beam may only continue with PAD, at no cost.
        logp = logp.masked_fill(finished.unsqueeze(1), float("-inf"))
        logp[:, pad_id] = torch.where(finished, 0.0, logp[:, pad_id])
        candidates = (beam_scores.view(-1, 1) + logp).view(B, K * V)  # (B, K*V)
        beam_scores, flat = candidates.topk(K, dim=1)  # (B, K)
        parent = (base + flat // V).view(-1)  # (B*K,) rows the new beams come from
        tokens = (flat % V).view(-1)
        # A beam's parent is one of the same image's K beams: only the recurrent state moves.
        state = state.with_recurrent(state.h[parent], state.c[parent])
        was_finished = finished[parent]
        lengths = lengths[parent] + (~was_finished).long()
        finished = was_finished | (tokens == eos_id)
        history.append((parent, tokens, g.alpha[parent] * (~was_finished).unsqueeze(1), g.location[parent]))
        if (t + 1) % check_every == 0 and bool(finished.all()):
            break

    normalised = _normalise(beam_scores.view(-1), lengths, length_penalty).view(B, K)
    best = normalised.argmax(1)  # (B,)
    row = base.squeeze(1) + best  # (B,) rows of the returned beams
    out_lengths, out_scores = lengths[row], normalised.gather(1, best.unsqueeze(1)).squeeze(1)
    seq, alpha, loc = [], [], []
    for parent, tok, a, l in reversed(history):  # follow the parent pointers back to the start
        seq.append(tok[row])
        alpha.append(a[row])
        loc.append(l[row])
        row = parent[row]
    return GenerationOutput(
        sequences=torch.stack(seq[::-1], 1),
        attention=torch.stack(alpha[::-1], 1).float(),
        locations=torch.stack(loc[::-1], 1),
        scores=out_scores,
        lengths=out_lengths,
    )


def generate(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    num_beams: int = 1,
    max_new_tokens: int = 30,
    mode: Optional[str] = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    length_penalty: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> GenerationOutput:
    """Greedy or sampled decoding for ``num_beams == 1``, beam search otherwise."""
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if do_sample or num_beams == 1:
        if do_sample and num_beams > 1:
            raise ValueError("do_sample with num_beams > 1 is not supported; use one or the other")
        return greedy_search(
            decoder, features, bos_id, eos_id, pad_id, max_new_tokens, mode,
            do_sample, temperature, top_k, length_penalty, generator,
        )
    return beam_search(decoder, features, bos_id, eos_id, pad_id, num_beams, max_new_tokens, mode, length_penalty)
