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

import dataclasses
from typing import Optional

import torch
from torch import Tensor

from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.generation import BAD_ENDINGS, GenerationConfig, bad_ending_ids  # noqa: F401 (their home is torch-free)
from captioning.models.search_parts import GenerationOutput, _ban_table, _forbid_eos, _normalise, backtrack
from captioning.vocab import Vocabulary

BOS, EOS, PAD = Vocabulary.bos_id, Vocabulary.eos_id, Vocabulary.pad_id


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
    config: GenerationConfig = GenerationConfig(),
    generator: Optional[torch.Generator] = None,
    check_every: int = 4,
) -> GenerationOutput:
    """Greedy (or, with ``do_sample``, sampled) decoding of a batch. features: (B, L, D)."""
    B = features.size(0)
    state = decoder.initial_state(features)
    tokens = features.new_full((B,), BOS, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool, device=features.device)
    scores = features.new_zeros(B, dtype=torch.float)
    lengths = torch.zeros(B, dtype=torch.long, device=features.device)
    out_tokens, out_alpha, out_loc, out_heads = [], [], [], []
    ban = _ban_table(decoder, config, features.device)
    for t in range(config.max_new_tokens):
        logp, state, g = decoder.step(tokens, state, config.attention_mode)  # (B, V)
        logp = _forbid_eos(logp, tokens, ban)
        nxt = _sample_token(logp, config.temperature, config.top_k, generator) if config.do_sample else logp.argmax(-1)
        running = ~finished
        scores += logp.gather(1, nxt.unsqueeze(1)).squeeze(1) * running
        lengths += running.long()
        nxt = nxt.masked_fill(finished, PAD)
        out_tokens.append(nxt)
        out_alpha.append(g.alpha * running.unsqueeze(1))
        out_loc.append(g.location)
        if g.head_alpha is not None:
            out_heads.append(g.head_alpha * running.view(-1, 1, 1))
        finished = finished | (nxt == EOS)
        tokens = nxt
        if (t + 1) % check_every == 0 and bool(finished.all()):
            break
    return GenerationOutput(
        sequences=torch.stack(out_tokens, 1),
        alphas=torch.stack(out_alpha, 1).float(),
        locations=torch.stack(out_loc, 1),
        scores=_normalise(scores, lengths, config.length_penalty),
        lengths=lengths,
        head_alphas=torch.stack(out_heads, 1).float() if out_heads else None,
    )


@torch.no_grad()
def beam_search(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig = GenerationConfig(num_beams=3),
    check_every: int = 4,
) -> GenerationOutput:
    """Beam search with K = num_beams beams per image, all images at once. features: (B, L, D).

    Beams are kept by their summed log-probability; at the end each image returns the beam with
    the best length-normalised score (and, with num_return_sequences N > 1, its N best). The words
    and attention maps of the returned beams are read back through the parent pointers kept at
    each step.
    """
    B, K = features.size(0), config.num_beams
    device = features.device
    # h_0, c_0 and W_a a once per image; the state is copied to the K beams, the features are not:
    # the K rows of an image attend over one copy (as a (K, L) x (L, D) product).
    state = decoder.initial_state(features).expand_beams(K)
    beam_scores = features.new_zeros(B, K, dtype=torch.float)
    beam_scores[:, 1:] = float("-inf")  # at the start only one beam per image is alive
    tokens = torch.full((B * K,), BOS, dtype=torch.long, device=device)
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    lengths = torch.zeros(B * K, dtype=torch.long, device=device)
    base = (torch.arange(B, device=device) * K).unsqueeze(1)  # (B, 1): first row of each image
    history = []  # per step: (parent rows (B*K,), tokens (B*K,), alpha (B*K, L), location (B*K,)[, head alphas (B*K, heads, L)])
    ban = _ban_table(decoder, config, device)
    for t in range(config.max_new_tokens):
        logp, state, g = decoder.step(tokens, state, config.attention_mode)  # (B*K, V)
        logp = _forbid_eos(logp, tokens, ban)
        V = logp.size(-1)
        # A finished beam may only continue with PAD, at no cost.
        logp = logp.masked_fill(finished.unsqueeze(1), float("-inf"))
        logp[:, PAD] = torch.where(finished, 0.0, logp[:, PAD])
        candidates = (beam_scores.view(-1, 1) + logp).view(B, K * V)  # (B, K*V)
        beam_scores, flat = candidates.topk(K, dim=1)  # (B, K)
        parent = (base + flat // V).view(-1)  # (B*K,) rows the new beams come from
        tokens = (flat % V).view(-1)
        # A beam's parent is one of the same image's K beams: only the recurrent state moves.
        state = state.with_recurrent(state.h[parent], state.c[parent])
        was_finished = finished[parent]
        lengths = lengths[parent] + (~was_finished).long()
        finished = was_finished | (tokens == EOS)
        history.append((parent, tokens, g.alpha[parent] * (~was_finished).unsqueeze(1), g.location[parent])
                       + (() if g.head_alpha is None else (g.head_alpha[parent] * (~was_finished).view(-1, 1, 1),)))
        if (t + 1) % check_every == 0 and bool(finished.all()):
            break

    return backtrack(history, beam_scores, lengths, B, K, config)


def generate(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig = GenerationConfig(),
    generator: Optional[torch.Generator] = None,
) -> GenerationOutput:
    """Greedy or sampled decoding for one beam, beam search otherwise. features: (B, L, D)."""
    if config.location_samples > 1 and decoder.attention_kind == "hard":
        return best_of_k(decoder, features, config, generator)
    if config.cuda_graphs:
        from captioning.models import graphed_search

        if graphed_search.capturable(config):
            if config.num_beams == 1:
                return graphed_search.graphed_greedy_search(decoder, features, config)
            return graphed_search.graphed_beam_search(decoder, features, config)
    if config.num_beams == 1:
        return greedy_search(decoder, features, config, generator)
    return beam_search(decoder, features, config)


@torch.no_grad()
def best_of_k(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig,
    generator: Optional[torch.Generator] = None,
) -> GenerationOutput:
    """Sampled-then-best-of-K for hard attention: K = ``config.location_samples`` decodings of each
    image, each with its own sampled locations (attention_mode "sample"; greedy or beam search as
    the config says), and the one of the best (length-normalised) score log p(y | s, a) kept.
    features: (B, L, D)."""
    B, K = features.size(0), config.location_samples
    single = config.replace(attention_mode="sample", location_samples=1)
    if single.num_return_sequences > 1:
        single = dataclasses.replace(single, num_return_sequences=1)
    out = generate(decoder, features.repeat_interleave(K, 0), single, generator)  # B * K rows, image-major
    best = out.scores.view(B, K).argmax(1)  # (B,)
    row = torch.arange(B, device=features.device) * K + best
    return GenerationOutput(sequences=out.sequences[row], alphas=out.alphas[row], locations=out.locations[row],
                            scores=out.scores[row], lengths=out.lengths[row])
