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

import torch
from torch import Tensor

from captioning.decoding import loops
from captioning.decoding.generation import BAD_ENDINGS, GenerationConfig, bad_ending_ids  # noqa: F401 (their home is torch-free)
from captioning.decoding.parts import GenerationOutput
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.vocab import Vocabulary

BOS, EOS, PAD = Vocabulary.bos_id, Vocabulary.eos_id, Vocabulary.pad_id


def greedy_search(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig = GenerationConfig(),
    generator: torch.Generator | None = None,
    check_every: int = 4,
) -> GenerationOutput:
    """Greedy (or, with ``do_sample``, sampled) decoding of a batch. features: (B, L, D).
    The step is decoding/loops.py's, captured as a CUDA graph with ``config.cuda_graphs``."""
    return loops.greedy(decoder, features, config, generator, check_every)


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
    each step. With ``num_beam_groups`` G > 1 it is diverse beam search (Vijayakumar et al. 2016):
    G groups of K/G beams chosen in turn at each step (decoding/loops.py's beam_step).
    """
    return loops.beam(decoder, features, config, check_every)


def generate(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig = GenerationConfig(),
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """Greedy or sampled decoding for one beam, beam search otherwise. features: (B, L, D)."""
    if config.location_samples > 1 and decoder.attention_kind == "hard":
        return best_of_k(decoder, features, config, generator)
    if config.num_beams == 1:
        return greedy_search(decoder, features, config, generator)
    return beam_search(decoder, features, config)


@torch.no_grad()
def best_of_k(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig,
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """Sampled-then-best-of-K for hard attention: K = ``config.location_samples`` decodings of each
    image, each with its own sampled locations (attention_mode "sample"; greedy or beam search as
    the config says), and the one of the best (length-normalised) score log p(y | s, a) kept.
    features: (B, L, D) (an ensemble's: one tensor per member)."""
    K = config.location_samples
    single = config.replace(attention_mode="sample", location_samples=1)
    if single.num_return_sequences > 1:
        single = dataclasses.replace(single, num_return_sequences=1)
    repeated = (
        [f.repeat_interleave(K, 0) for f in features]
        if isinstance(features, (list, tuple))
        else features.repeat_interleave(K, 0)
    )
    out = generate(decoder, repeated, single, generator)  # B * K rows, image-major
    B = out.scores.size(0) // K
    best = out.scores.view(B, K).argmax(1)  # (B,)
    row = torch.arange(B, device=best.device) * K + best
    return GenerationOutput(
        sequences=out.sequences[row],
        alphas=out.alphas[row],
        locations=out.locations[row],
        scores=out.scores[row],
        lengths=out.lengths[row],
    )
