"""The loops of greedy and beam search (decoding/search.py: greedy_search, beam_search): the decoding
step as a function of fixed-shape tensors, run as it is, or captured as a CUDA graph per (batch,
beams) shape and replayed (``GenerationConfig.cuda_graphs``).

Each step is :func:`greedy_step` / :func:`beam_step`: the decoder step, the processing of its
log-probabilities (parts.LogitsProcessor: banned endings, n-gram blocking, repetition penalty,
min_new_tokens, suppressed tokens; the tokens generated so far are carried when it reads them),
the choice of words (diverse beam search: group after group), finished rows masked (they
continue with PAD at no cost), all on the device. The loop runs up to ``max_new_tokens`` steps; every ``check_every`` steps it asks whether every row
has finished through a non-blocking copy to the host, read one check later (so the device is never
waited for), and the step at which every row first finished is kept on the device, so that the
outputs are cut at the first check at which every row had finished: the same captions, scores and
attention maps captured or not (tests/decoding/test_graphed_search.py). On a CPU nothing is captured.
Sampling (``do_sample``, hard attention's "sample" mode) is never captured.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captioning.cuda_graphs import ShapeGraphs, graphs_available
from captioning.decoding.generation import GenerationConfig
from captioning.decoding.parts import (
    GenerationOutput,
    LogitsProcessor,
    _normalise,
    _sample_token,
    _score_dtype,
    backtrack,
    extend_prefix,
)
from captioning.models.decoder import DecoderState, ShowAttendTellDecoder
from captioning.vocab import Vocabulary

BOS, EOS, PAD = Vocabulary.bos_id, Vocabulary.eos_id, Vocabulary.pad_id


class PlainStates:
    """How the loops take a decoder's state apart and put it back together: the tensors carried
    from step to step, one row per caption (the LSTM's h, c), reordered with the beams, and the
    per-image tensors every step reads (features, projected). A decoder kind with another state
    names its own layout as ``decoder.state_layout`` (models/transformer.py's: the position and the
    key/value cache; decoding/ensemble.py's: the members' side by side), with the same members."""

    #: how many tensors :meth:`carried` and :meth:`constants` give
    n_carried, n_constants = 2, 2

    @staticmethod
    def carried(state: DecoderState) -> list[Tensor]:
        return [state.h, state.c]

    @staticmethod
    def constants(state: DecoderState) -> list[Tensor]:
        return [state.features, state.projected]

    @staticmethod
    def state(carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> DecoderState:
        return DecoderState(*carried, *constants, beams)

    @staticmethod
    def reorder(carried: list[Tensor], rows: Tensor) -> list[Tensor]:
        """The carried tensors of the beams' parents: rows (N,) indices."""
        return [x[rows] for x in carried]


def state_layout(decoder):
    """The decoder's :class:`PlainStates` (or its own ``state_layout``)."""
    return getattr(decoder, "state_layout", PlainStates)


def initial_state(decoder, features, config: GenerationConfig):
    """The decoder's initial state for a search of ``config.max_new_tokens`` steps (a decoder with
    a cache of fixed length sizes it so)."""
    return decoder.initial_state(features, max_steps=config.max_new_tokens)


def capturable(config: GenerationConfig) -> bool:
    """Whether the graphed search applies: deterministic greedy or beam search of one caption each."""
    return not config.do_sample and config.attention_mode != "sample" and config.location_samples == 1


class _AllFinished:
    """Has every row finished? Asked every few steps without waiting for the device: the answer
    is copied to pinned host memory behind an event and read at the next check."""

    def __init__(self, device: torch.device):
        self.cuda = graphs_available(device)
        self.flag = torch.zeros((), dtype=torch.bool, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None
        self.pending = False

    def __call__(self, finished: Tensor) -> bool:
        if not self.cuda:
            return bool(finished.all())
        done = self.pending and self.event.query() and bool(self.flag)
        self.flag.copy_(finished.all(), non_blocking=True)
        self.event.record()
        self.pending = True
        return done


def _run(
    step, carry: list[Tensor], constants: list[Tensor], config: GenerationConfig, check_every: int
) -> list[tuple[Tensor, ...]]:
    """Run ``step(*carry, *constants)`` (carry: tokens, finished, scores, lengths[, prefix], the
    decoder's carried state)
    up to max_new_tokens times, then cut where the plain search stops (the first multiple of
    ``check_every`` steps at which every row had finished). Returns, per kept step, (finished,
    scores, lengths, *the step's other outputs), cloned where a replay would overwrite them."""
    device, n_carry = carry[0].device, len(carry)
    graphs = ShapeGraphs(step, enabled=config.cuda_graphs and capturable(config) and graphs_available(device))
    limit = config.max_new_tokens
    finished_at = torch.full((), limit, dtype=torch.long, device=device)
    check = _AllFinished(device)
    history = []
    for t in range(limit):
        out = graphs(*carry, *constants)
        if graphs.last is not None:  # replayed: the outputs are the graph's, overwritten by the next replay
            out = [x.clone() for x in out]
        carry = list(out[:n_carry])
        history.append(tuple(out[1:4]) + tuple(out[n_carry:]))
        finished = carry[1]
        if (t + 1) % check_every == 0:
            finished_at = torch.where(
                (finished_at == limit) & finished.all(), torch.full_like(finished_at, t + 1), finished_at
            )
            if check(finished):
                break
    return history[: int(finished_at)]  # one read, after the loop


def _prefix(process: LogitsProcessor, rows: int, config: GenerationConfig, device) -> list[Tensor]:
    """The carried tokens so far, (rows, max_new_tokens) of PAD, when the processor reads them."""
    return (
        [torch.full((rows, config.max_new_tokens), PAD, dtype=torch.long, device=device)]
        if process.needs_prefix
        else []
    )


def greedy_step(
    decoder: ShowAttendTellDecoder,
    config: GenerationConfig,
    process: LogitsProcessor,
    generator: torch.Generator | None = None,
):
    """One greedy step as a function of tensors (what is captured)."""
    layout, n_prefix = state_layout(decoder), int(process.needs_prefix)
    n_state = n_prefix + layout.n_carried

    def step(tokens, finished, scores, lengths, *rest):
        prefix = rest[0] if n_prefix else None
        state = layout.state(list(rest[n_prefix:n_state]), list(rest[n_state:]))
        logp, state, g = decoder.step(tokens, state, config.attention_mode, config.attention_temperature)
        logp = process(logp, tokens, lengths, prefix)
        if config.do_sample:
            nxt = _sample_token(logp, config.temperature, config.top_k, generator, config.top_p)
        else:
            nxt = logp.argmax(-1)
        running = ~finished
        scores = scores + logp.gather(1, nxt.unsqueeze(1)).squeeze(1) * running
        nxt = nxt.masked_fill(finished, PAD)
        carried = () if prefix is None else (extend_prefix(prefix, lengths, nxt),)
        lengths = lengths + running.long()
        finished = finished | (nxt == EOS)
        extra = (g.head_alpha * running.view(-1, 1, 1),) if g.head_alpha is not None else ()
        return (
            (nxt, finished, scores, lengths)
            + carried
            + tuple(layout.carried(state))
            + (nxt, g.alpha * running.unsqueeze(1), g.location)
            + extra
        )

    return step


@torch.no_grad()
def greedy(
    decoder: ShowAttendTellDecoder,
    features: Tensor,
    config: GenerationConfig,
    generator: torch.Generator | None = None,
    check_every: int = 4,
) -> GenerationOutput:
    """:func:`captioning.decoding.search.greedy_search`. features: what ``decoder.initial_state``
    reads ((B, L, D); an ensemble's, one tensor per member)."""
    layout = state_layout(decoder)
    state = initial_state(decoder, features, config)
    constants = layout.constants(state)
    B, device, dtype = constants[0].size(0), constants[0].device, constants[0].dtype
    process = LogitsProcessor(decoder, config, device)
    carry = (
        [
            torch.full((B,), BOS, dtype=torch.long, device=device),
            torch.zeros(B, dtype=torch.bool, device=device),
            constants[0].new_zeros(B, dtype=_score_dtype(dtype)),
            torch.zeros(B, dtype=torch.long, device=device),
        ]
        + _prefix(process, B, config, device)
        + layout.carried(state)
    )
    step = greedy_step(decoder, config, process, generator)
    history = _run(step, carry, constants, config, check_every)
    _, scores, lengths = history[-1][:3]
    columns = list(zip(*history))[3:]  # tokens, alpha, location[, head alphas]
    dtype = _score_dtype(columns[1][0].dtype)
    return GenerationOutput(
        sequences=torch.stack(columns[0], 1),
        alphas=torch.stack(columns[1], 1).to(dtype),
        locations=torch.stack(columns[2], 1),
        scores=_normalise(scores, lengths, config.length_penalty),
        lengths=lengths,
        head_alphas=torch.stack(columns[3], 1).to(dtype) if len(columns) > 3 else None,
    )


def _choose(candidates: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best of each row of candidates (B, C): (scores (B, k), flat indices (B, k))."""
    return candidates.topk(k, dim=1)


def beam_step(decoder: ShowAttendTellDecoder, config: GenerationConfig, process: LogitsProcessor, B: int, K: int):
    """One beam-search step as a function of tensors (what is captured). With G =
    ``num_beam_groups`` > 1, diverse beam search: the K beams of an image are G groups of K/G
    rows, chosen group after group; each group's candidates lose ``diversity_penalty`` times the
    count of each word the earlier groups chose at this step (Hugging Face's Hamming diversity)."""
    G = config.num_beam_groups
    Kg, penalty = K // G, float(config.diversity_penalty)
    layout, n_prefix = state_layout(decoder), int(process.needs_prefix)
    n_state = n_prefix + layout.n_carried

    def step(tokens, finished, beam_scores, lengths, *rest):
        prefix = rest[0] if n_prefix else None
        state = layout.state(list(rest[n_prefix:n_state]), list(rest[n_state:]), K)
        logp, state, g = decoder.step(tokens, state, config.attention_mode, config.attention_temperature)  # (B*K, V)
        logp = process(logp, tokens, lengths, prefix)
        V = logp.size(-1)
        # In place: logp is this step's own (N, V), and each pass over it costs as much as the
        # output layer at a COCO-sized vocabulary (docs/PERFORMANCE.md, COCO-sized data).
        logp = logp.masked_fill_(finished.unsqueeze(1), float("-inf"))
        logp[:, PAD] = torch.where(finished, 0.0, logp[:, PAD])
        if G == 1:
            if logp.dtype == beam_scores.dtype:  # the same sums as beam_scores + logp
                candidates = logp.add_(beam_scores.view(-1, 1))
            else:
                candidates = beam_scores.view(-1, 1) + logp
            beam_scores, flat = _choose(candidates.view(B, K * V), K)
            beam = flat // V  # (B, K) the parent beam within the image
            tokens = (flat % V).view(-1)
        else:
            logp, group_scores = logp.view(B, G, Kg, V), beam_scores.view(B, G, Kg)
            chosen = logp.new_zeros(B, V)  # how often each word was chosen at this step by the earlier groups
            scores, beams, words = [], [], []
            for k in range(G):
                candidates = group_scores[:, k].unsqueeze(-1) + logp[:, k] - penalty * chosen.unsqueeze(1)  # (B, Kg, V)
                s, flat = _choose(candidates.view(B, Kg * V), Kg)
                scores.append(s)
                beams.append(k * Kg + flat // V)
                words.append(flat % V)
                chosen = chosen.scatter_add(1, words[-1], torch.ones_like(s))
                chosen[:, PAD] = 0  # finished beams continue with PAD: no penalty on it
            beam_scores, beam, tokens = torch.cat(scores, 1), torch.cat(beams, 1), torch.cat(words, 1).view(-1)
        parent = ((torch.arange(B, device=beam.device) * K).unsqueeze(1) + beam).view(-1)
        was_finished = finished[parent]
        carried = () if prefix is None else (extend_prefix(prefix[parent], lengths[parent], tokens),)
        lengths = lengths[parent] + (~was_finished).long()
        finished = was_finished | (tokens == EOS)
        extra = () if g.head_alpha is None else (g.head_alpha[parent] * (~was_finished).view(-1, 1, 1),)
        return (
            (tokens, finished, beam_scores, lengths)
            + carried
            + tuple(layout.reorder(layout.carried(state), parent))
            + (parent, tokens, g.alpha[parent] * (~was_finished).unsqueeze(1), g.location[parent])
            + extra
        )

    return step


@torch.no_grad()
def beam(
    decoder: ShowAttendTellDecoder, features: Tensor, config: GenerationConfig, check_every: int = 4
) -> GenerationOutput:
    """:func:`captioning.decoding.search.beam_search`. features: as for :func:`greedy`."""
    K, G = config.num_beams, config.num_beam_groups
    layout = state_layout(decoder)
    state = initial_state(decoder, features, config).expand_beams(K)
    constants = layout.constants(state)
    B, device = constants[0].size(0), constants[0].device
    beam_scores = constants[0].new_zeros(B, G, K // G, dtype=_score_dtype(constants[0].dtype))
    beam_scores[:, :, 1:] = float("-inf")  # at the start one beam of each group is alive
    process = LogitsProcessor(decoder, config, device)
    carry = (
        [
            torch.full((B * K,), BOS, dtype=torch.long, device=device),
            torch.zeros(B * K, dtype=torch.bool, device=device),
            beam_scores.view(B, K),
            torch.zeros(B * K, dtype=torch.long, device=device),
        ]
        + _prefix(process, B * K, config, device)
        + layout.carried(state)
    )
    step = beam_step(decoder, config, process, B, K)
    history = _run(step, carry, constants, config, check_every)
    _, beam_scores, lengths = history[-1][:3]
    return backtrack([h[3:] for h in history], beam_scores, lengths, B, K, config)
