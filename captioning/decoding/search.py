"""Caption search: greedy (or sampled) decoding and beam search over a whole batch at once.

All images, and the K beams of each, advance together as rows of one tensor: one decoder step per
time step. Each step (:func:`greedy_step`, :func:`beam_step`) is the decoder's step, the registered
logits processors the config asks for (processors/), the choice of words (diverse beam search: group
after group) and finished rows masked (they continue with PAD at no cost), all on the device. The loop
asks whether every row has finished only every ``check_every`` steps, through a non-blocking copy
read one check later, and cuts the outputs at the first check at which every row had finished;
``GenerationConfig.cuda_graphs`` captures the step per (batch, beams) shape on a GPU (sampling is
never captured) with the same captions. Scores are the summed log-probabilities divided by
``length ** length_penalty`` (EOS counted), as in Hugging Face's generation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from captioning.cuda_graphs import ShapeGraphs, graphs_available
from captioning.decoding.generation import BAD_ENDINGS, GenerationConfig, bad_ending_ids  # noqa: F401 (their home is torch-free)
from captioning.decoding.processors import Context, LogitsProcessor, extend_prefix, sample_token
from captioning.vocab import Vocabulary

BOS, EOS, PAD = Vocabulary.bos_id, Vocabulary.eos_id, Vocabulary.pad_id


@dataclass
class GenerationOutput:
    sequences: Tensor  # (B, T) token ids without BOS: the words, EOS, then PAD
    alphas: Tensor  # (B, T, L) alpha_t of each generated token, zero after EOS
    locations: Tensor  # (B, T) the location each token looked at (argmax for soft attention); (B, T, heads) for hard multi-head
    scores: Tensor  # (B,) length-normalised log-probability
    lengths: Tensor  # (B,) tokens generated, EOS included
    # With num_return_sequences N > 1: the N best beams of each image, best first (the first is the above).
    beam_sequences: Tensor | None = None  # (B, N, T)
    beam_scores: Tensor | None = None  # (B, N)
    beam_lengths: Tensor | None = None  # (B, N)
    # Each returned beam's row among its image's K beams: with diverse beam search (G groups of
    # K / G rows) its group is beam_indices // (K / G).
    beam_indices: Tensor | None = None  # (B, N)
    head_alphas: Tensor | None = None  # (B, T, heads, L) with multi-head attention (alphas is their mean)
    #: what the decoder's steps showed beside alpha (Glimpse.views), (B, T, ...) each, zero after EOS:
    #: "gate" (beta_t), a window's "window", a transformer's "self" (its words' self-attention), ...
    views: dict[str, Tensor] = field(default_factory=dict)


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of scores and returned attention maps: the model's, at least float32 (bf16 under
    autocast gives float32; a float64 model keeps float64)."""
    return torch.promote_types(dtype, torch.float32)


def _normalise(scores: Tensor, lengths: Tensor, length_penalty: float) -> Tensor:
    return scores / lengths.clamp(min=1).to(scores.dtype).pow(length_penalty)


def state_layout(decoder):
    """How the loops take ``decoder``'s state apart and put it back together (``decoder.state_layout``:
    models/decoder.py's DecoderStates, models/transformer.py's, decoding/ensemble.py's): the tensors
    carried from step to step, one row per caption, reordered with the beams (``carried``,
    ``reorder``), the per-image tensors every step reads (``constants``), their counts (``n_carried``,
    ``n_constants``) and the state rebuilt from them (``state``)."""
    return decoder.state_layout


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


def step_columns(g, rows: Tensor | None, running: Tensor, names: list[str]) -> tuple[Tensor, ...]:
    """A step's outputs besides the words, as the loops keep them: alpha, the location, the heads'
    alphas and every view of the glimpse ``g`` (their rows ``rows`` of the beams' parents, None:
    all), zero where a row had finished before the step (``running`` (N,) false). ``names`` (empty
    at the first step) is filled with the columns' names; later steps give the same columns."""
    columns = {
        "alphas": g.alpha,
        "locations": g.location,
        **({"head_alphas": g.head_alpha} if g.head_alpha is not None else {}),
    }
    columns.update({f"view:{k}": v for k, v in sorted(g.views.items())})
    if not names:
        names.extend(columns)
    out = []
    for name in names:
        x = columns[name] if rows is None else columns[name][rows]
        out.append(x if name == "locations" else x * running.view(-1, *[1] * (x.dim() - 1)).to(x.dtype))
    return tuple(out)


def gathered(columns: dict[str, list[Tensor]], B: int, shape: tuple = ()) -> dict:
    """GenerationOutput's fields of the steps' named columns (lists of tensors, one per step):
    stacked along the steps (B, *shape, T, ...), maps in the scores' dtype."""

    def stack(values: list[Tensor]) -> Tensor:
        x = torch.stack(values, 1)
        x = x.to(_score_dtype(x.dtype)) if x.is_floating_point() else x
        return x.view((B, *shape, len(values)) + values[0].shape[1:])

    return {
        "alphas": stack(columns["alphas"]),
        "locations": stack(columns["locations"]),
        "head_alphas": stack(columns["head_alphas"]) if "head_alphas" in columns else None,
        "views": {k[len("view:") :]: stack(v) for k, v in columns.items() if k.startswith("view:")},
    }


def greedy_step(
    decoder,
    config: GenerationConfig,
    process: LogitsProcessor,
    generator: torch.Generator | None = None,
    names: list[str] | None = None,
):
    """One greedy step as a function of tensors (what is captured); ``names`` gets the names of its
    outputs after the words (:func:`step_columns`)."""
    layout, n_prefix = state_layout(decoder), int(process.needs_prefix)
    n_state = n_prefix + layout.n_carried
    names = [] if names is None else names

    def step(tokens, finished, scores, lengths, *rest):
        prefix = rest[0] if n_prefix else None
        state = layout.state(list(rest[n_prefix:n_state]), list(rest[n_state:]))
        logp, state, g = decoder.step(tokens, state, config.attention_mode, config.attention_temperature)
        logp = process(logp, tokens, lengths, prefix)
        if config.do_sample:
            nxt = sample_token(logp, config.temperature, config.top_k, generator, config.top_p)
        else:
            nxt = logp.argmax(-1)
        running = ~finished
        scores = scores + logp.gather(1, nxt.unsqueeze(1)).squeeze(1) * running
        nxt = nxt.masked_fill(finished, PAD)
        carried = () if prefix is None else (extend_prefix(prefix, lengths, nxt),)
        lengths = lengths + running.long()
        finished = finished | (nxt == EOS)
        return (
            (nxt, finished, scores, lengths)
            + carried
            + tuple(layout.carried(state))
            + (nxt,)
            + step_columns(g, None, running, names)
        )

    return step


@torch.no_grad()
def greedy(
    decoder,
    features: Tensor,
    config: GenerationConfig,
    generator: torch.Generator | None = None,
    check_every: int = 4,
) -> GenerationOutput:
    """:func:`greedy_search`'s loop. features: what ``decoder.initial_state`` reads ((B, L, D); an
    ensemble's, one tensor per member)."""
    layout = state_layout(decoder)
    state = initial_state(decoder, features, config)
    constants = layout.constants(state)
    B, device, dtype = constants[0].size(0), constants[0].device, constants[0].dtype
    process = LogitsProcessor(config, Context.of(decoder, device))
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
    names: list[str] = []
    step = greedy_step(decoder, config, process, generator, names)
    history = _run(step, carry, constants, config, check_every)
    _, scores, lengths = history[-1][:3]
    tokens, *columns = list(zip(*history))[3:]  # the words, then the named columns
    return GenerationOutput(
        sequences=torch.stack(tokens, 1),
        scores=_normalise(scores, lengths, config.length_penalty),
        lengths=lengths,
        **gathered(dict(zip(names, map(list, columns))), B),
    )


def _choose(candidates: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best of each row of candidates (B, C): (scores (B, k), flat indices (B, k))."""
    return candidates.topk(k, dim=1)


def beam_step(
    decoder, config: GenerationConfig, process: LogitsProcessor, B: int, K: int, names: list[str] | None = None
):
    """One beam-search step as a function of tensors (what is captured). With G =
    ``num_beam_groups`` > 1, diverse beam search: the K beams of an image are G groups of K/G
    rows, chosen group after group; each group's candidates lose ``diversity_penalty`` times the
    count of each word the earlier groups chose at this step (Hugging Face's Hamming diversity)."""
    G = config.num_beam_groups
    Kg, penalty = K // G, float(config.diversity_penalty)
    layout, n_prefix = state_layout(decoder), int(process.needs_prefix)
    n_state = n_prefix + layout.n_carried
    names = [] if names is None else names

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
        return (
            (tokens, finished, beam_scores, lengths)
            + carried
            + tuple(layout.reorder(layout.carried(state), parent))
            + (parent, tokens)
            + step_columns(g, parent, ~was_finished, names)
        )

    return step


@torch.no_grad()
def beam(decoder, features: Tensor, config: GenerationConfig, check_every: int = 4) -> GenerationOutput:
    """:func:`beam_search`'s loop. features: as for :func:`greedy`."""
    K, G = config.num_beams, config.num_beam_groups
    layout = state_layout(decoder)
    state = initial_state(decoder, features, config).expand_beams(K)
    constants = layout.constants(state)
    B, device = constants[0].size(0), constants[0].device
    beam_scores = constants[0].new_zeros(B, G, K // G, dtype=_score_dtype(constants[0].dtype))
    beam_scores[:, :, 1:] = float("-inf")  # at the start one beam of each group is alive
    process = LogitsProcessor(config, Context.of(decoder, device))
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
    names: list[str] = []
    step = beam_step(decoder, config, process, B, K, names)
    history = _run(step, carry, constants, config, check_every)
    _, beam_scores, lengths = history[-1][:3]
    return backtrack([h[3:] for h in history], names, beam_scores, lengths, B, K, config)


def backtrack(
    history: list, names: list[str], beam_scores: Tensor, lengths: Tensor, B: int, K: int, config: GenerationConfig
) -> GenerationOutput:
    """The returned beams of a beam search: the best by length-normalised score, their words, maps
    and views read back through the parent pointers of ``history`` (per step: parent rows, tokens,
    the columns ``names`` names). beam_scores (B, K), lengths (B*K,)."""
    N, device = config.num_return_sequences, beam_scores.device
    base = (torch.arange(B, device=device) * K).unsqueeze(1)
    normalised = _normalise(beam_scores.view(-1), lengths, config.length_penalty).view(B, K)
    top_scores, top = normalised.topk(N, dim=1)  # (B, N): the returned beams, best first
    row = (base + top).view(-1)  # (B*N,) their rows
    out_lengths = lengths[row].view(B, N)
    seq, columns = [], {name: [] for name in names}
    for parent, tok, *values in reversed(history):  # follow the parent pointers back to the start
        seq.append(tok[row])
        for name, x in zip(names, values):
            columns[name].append(x[row])
        row = parent[row]
    sequences = torch.stack(seq[::-1], 1).view(B, N, -1)  # (B, N, T)
    fields = gathered({name: v[::-1] for name, v in columns.items()}, B, (N,))
    first = {k: None if v is None else v[:, 0] for k, v in fields.items() if k != "views"}
    return GenerationOutput(
        sequences=sequences[:, 0],
        scores=top_scores[:, 0],
        lengths=out_lengths[:, 0],
        views={k: v[:, 0] for k, v in fields["views"].items()},
        **first,
        **(
            dict(beam_sequences=sequences, beam_scores=top_scores, beam_lengths=out_lengths, beam_indices=top)
            if N > 1
            else {}
        ),
    )


def greedy_search(
    decoder,
    features: Tensor,
    config: GenerationConfig = GenerationConfig(),
    generator: torch.Generator | None = None,
    check_every: int = 4,
) -> GenerationOutput:
    """Greedy (or, with ``do_sample``, sampled) decoding of a batch. features: (B, L, D).
    The step is :func:`greedy_step`, captured as a CUDA graph with ``config.cuda_graphs``."""
    return greedy(decoder, features, config, generator, check_every)


def beam_search(
    decoder,
    features: Tensor,
    config: GenerationConfig = GenerationConfig(num_beams=3),
    check_every: int = 4,
) -> GenerationOutput:
    """Beam search with K = num_beams beams per image, all images at once. features: (B, L, D).

    Beams are kept by their summed log-probability; at the end each image returns the beam with
    the best length-normalised score (and, with num_return_sequences N > 1, its N best). The words
    and attention maps of the returned beams are read back through the parent pointers kept at
    each step. With ``num_beam_groups`` G > 1 it is diverse beam search (Vijayakumar et al. 2016):
    G groups of K/G beams chosen in turn at each step (:func:`beam_step`).
    """
    return beam(decoder, features, config, check_every)


def generate(
    decoder,
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
    decoder,
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
        views={name: value[row] for name, value in out.views.items()},
    )
