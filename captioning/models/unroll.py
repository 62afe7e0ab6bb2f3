"""The teacher-forced passes: a cell's step (cells.py) unrolled over a batch of captions.

A batch is features a (B, L, D), captions (B, T + 1) as [BOS, w_1, ..., EOS, PAD...] and lengths
(B,), the tokens of each caption including BOS and EOS; step t reads captions[:, t] and predicts
captions[:, t + 1]. Four unrollings, chosen by ``decoder.forward``'s arguments:

- :func:`packed` (the default of the Bahdanau cell): the captions sorted by length, only the ones
  still running take part in a step; the output layer runs once, after the loop, over the real
  (non-padded) steps only. One host read per batch (the running counts).
- :func:`whole_sequence` (the default of the Luong cell, whose attention does not feed the
  recurrence): nn.LSTM over all steps in one call, then attention for all steps in batched
  products, the images in groups of about :data:`LUONG_GROUP` sorted by length.
- :func:`static` (``static=True``): every row at every one of the T steps, the steps past a
  caption's end computed and masked; nothing read back to the host (no sorting, no counts, no
  boolean indexing), and hard attention samples with random numbers a CUDA graph replays, so that
  the pass, its backward and the optimiser step can be captured as one CUDA graph per (B, T).
- :func:`scheduled` (``sample_prob`` > 0, scheduled sampling): every row at every step like the
  static pass, the output layer inside the loop, so that the next step can read a word sampled
  from this step's distribution.

Each gives a :class:`DecoderOutput`; the static and scheduled passes' logits are (B, T, V), every
step's, for the losses to mask. A caption's real steps come first, so the padded steps after them change nothing
before them: the static pass's loss and gradients equal the others' (tests/training/test_static_shapes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from captioning.models.cells import DecoderState, StepOutput
from captioning.models.deferred import FirstRows

#: Luong's teacher-forced pass attends for the images in groups of about this many, sorted by
#: length, each group over its own longest caption's steps (fewer padded steps than B x T).
LUONG_GROUP = 8


@dataclass
class DecoderOutput:
    """A teacher-forced pass over a batch of captions of T + 1 tokens (T decoding steps)."""

    logits: Tensor  # (N, V): one row per real step, in the order of mask.nonzero(); (B, T, V) from the static pass
    mask: Tensor  # (B, T) bool: real (non-padded) steps
    alphas: Tensor  # (B, T, L): attention weights, zero at padded steps
    betas: Tensor  # (B, T): the gate scalar beta_t
    locations: Tensor  # (B, T): chosen (hard) or argmax (soft) location; (B, T, heads) for hard multi-head
    location_log_probs: Tensor | None = None  # (B, T): log p(s_t | a), hard attention with sampling
    entropies: Tensor | None = None  # (B, T): H[alpha_t], hard attention with sampling
    head_alphas: Tensor | None = None  # (B, T, heads, L) with several heads (alphas is their mean)


def _output(logits: Tensor, mask: Tensor, place: Callable[[Tensor], Tensor], out: StepOutput) -> DecoderOutput:
    """The :class:`DecoderOutput` of a pass: the steps' outputs put in their (B, T, ...) place by
    ``place``, zero at padded steps."""
    return DecoderOutput(
        logits=logits,
        mask=mask,
        alphas=place(out.alpha),
        betas=place(out.beta),
        locations=place(out.location),
        location_log_probs=None if out.log_prob is None else place(out.log_prob),
        entropies=None if out.entropy is None else place(out.entropy),
        head_alphas=None if out.head_alpha is None else place(out.head_alpha),
    )


def _masked(mask: Tensor) -> Callable[[Tensor], Tensor]:
    """For the passes that compute every row at every step: (B, T, ...) values -> zero at the padded
    steps of ``mask`` (B, T), as the other passes leave them."""

    def place(values: Tensor) -> Tensor:
        m = mask.view(mask.shape + (1,) * (values.dim() - 2))
        return values * m if values.is_floating_point() else values.masked_fill(~m, 0)

    return place


def _real_steps(captions: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Decoding steps per caption (B,) and the (B, T) mask of the real ones."""
    T = captions.size(1) - 1
    steps = (lengths - 1).clamp(min=0, max=T)
    return steps, torch.arange(T, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)


def packed(
    decoder,
    features: Tensor,
    captions: Tensor,
    lengths: Tensor,
    mode: str,
    use_expected: Tensor | None,
    locations: Tensor | None,
    temperature: float,
) -> DecoderOutput:
    """The shrinking batch: the captions sorted by length, so that the n_t still running at step t
    are the first n_t rows. ``locations`` (B, T[, heads]) replaces the samples of mode "sample"."""
    cell = decoder.cell
    B, T = features.size(0), captions.size(1) - 1
    steps, mask = _real_steps(captions, lengths)
    steps_sorted, order = steps.sort(descending=True)
    running = (steps_sorted.unsqueeze(0) > torch.arange(T, device=steps.device).unsqueeze(1)).sum(1)
    active = [n for n in running.tolist() if n > 0]  # n_t: one host read per batch
    features, captions = features[order], captions[order]
    if use_expected is not None:
        use_expected = use_expected[order]
    forced = None if locations is None else locations[order]

    embedded = decoder.embedding(captions[:, :-1])  # (B, T, M), all steps at once
    x_steps = cell.inputs(embedded).unbind(1)  # T x (B, .): one backward op, not one per step
    state = decoder.initial_state(features)
    layers = cell.layers()  # the products repeated at every step, one weight-gradient product each
    # Each step's outputs for its n_t running rows are kept as they come and put in place once
    # after the loop (writing them into (B, T, .) tensors step by step would, in the backward
    # pass, copy the whole tensor's gradient once per step).
    features_rows, projected_rows = FirstRows(state.features), FirstRows(state.projected)  # one gradient each
    per_step = []
    for t, n in enumerate(active):
        h, c = (state.h, state.c) if n == state.h.size(0) else (state.h[:n], state.c[:n])
        state = DecoderState(h, c, features_rows(n), projected_rows(n))  # the image rows read anew by every step
        out = decoder.cell_step(
            x_steps[t][:n],
            state,
            mode,
            None if use_expected is None else use_expected[:n],
            None if forced is None else forced[:n, t],
            temperature,
            layers=layers,
        )
        state = state.with_recurrent(out.h, out.c)
        per_step.append(out)
    out = StepOutput.join(per_step)  # step-major rows, (N, .) each

    # Where each packed row belongs: (sorted row i, step t) -> the caller's row order[i], step t.
    device = steps.device
    step_of = torch.repeat_interleave(torch.arange(len(active), device=device), torch.tensor(active, device=device))
    row_of = torch.cat([torch.arange(n, device=device) for n in active])  # sorted row
    flat = order[row_of] * T + step_of  # (N,): index into the caller's (B, T) grid
    in_mask_order = flat.argsort()  # mask.nonzero() is row-major over the caller's (B, T)

    def grid(values: Tensor) -> Tensor:  # (N, ...) packed -> (B, T, ...), zero at padded steps
        grid_ = values.new_zeros((B * T,) + values.shape[1:])
        return grid_.index_copy(0, flat, values).view((B, T) + values.shape[1:])

    # The output layer once, over the real steps, in mask.nonzero() order.
    sorted_flat = (row_of * T + step_of)[in_mask_order]  # the same rows in the (sorted) embedded grid
    h, z = out.h[in_mask_order], out.z[in_mask_order]
    logits = decoder.deep_output(embedded.reshape(B * T, -1)[sorted_flat], cell.readout(h, z), z)  # (N, V)
    return _output(logits, mask, grid, out)


def whole_sequence(
    decoder,
    features: Tensor,
    captions: Tensor,
    lengths: Tensor,
    mode: str,
    use_expected: Tensor | None,
    locations: Tensor | None,
    temperature: float,
) -> DecoderOutput:
    """The Luong cell's pass: the LSTM over all T steps in one call, then attention, contexts and
    attentional states for all steps in batched products: the images sorted by length and taken in
    groups of :data:`LUONG_GROUP`, the T_g steps of a group's image being T_g "beams" over its
    features (one product per group, not per step). Steps past a caption's end are computed within
    a group and dropped: nothing reaches the outputs or the loss from them."""
    cell = decoder.cell
    B, T = features.size(0), captions.size(1) - 1
    device = captions.device
    steps, mask = _real_steps(captions, lengths)
    embedded = decoder.embedding(captions[:, :-1])  # (B, T, M)
    state = decoder.initial_state(features)
    hs = cell.sequence(embedded, state)  # (B, T, H)
    steps_sorted, order = steps.sort(descending=True)
    longest = steps_sorted.tolist()  # one host read per batch
    from_h = cell.from_output(hs)  # (B, T, width): all steps in one product
    parts, flats = [], []
    for start in range(0, B, LUONG_GROUP):
        Tg = longest[start]
        if Tg == 0:
            break
        rows = order[start : start + LUONG_GROUP]
        group = DecoderState(None, None, state.features[rows], state.projected[rows])
        parts.append(
            cell.attend_steps(
                hs[rows, :Tg],
                group,
                mode,
                None if use_expected is None else use_expected[rows],
                None if locations is None else locations[rows, :Tg],
                temperature,
                from_h=from_h[rows, :Tg],
            )
        )
        flats.append((rows.unsqueeze(1) * T + torch.arange(Tg, device=device)).reshape(-1))
    flat = torch.cat(flats)  # where each computed row belongs in the caller's (B, T) grid
    out = StepOutput.join(parts)
    keep = mask.reshape(-1)[flat]
    real = flat[keep]
    in_mask_order = real.argsort()  # mask.nonzero() is row-major over the caller's (B, T)
    pick = keep.nonzero().squeeze(1)[in_mask_order]
    h, z = out.h[pick], out.z[pick]
    logits = decoder.deep_output(embedded.reshape(B * T, -1)[real[in_mask_order]], cell.readout(h, z), z)

    def grid(values: Tensor) -> Tensor:  # computed rows -> (B, T, ...), zero at padded steps
        grid_ = values.new_zeros((B * T,) + values.shape[1:])
        return grid_.index_copy(0, real, values[keep]).view((B, T) + values.shape[1:])

    return _output(logits, mask, grid, out)


def static(
    decoder,
    features: Tensor,
    captions: Tensor,
    lengths: Tensor,
    mode: str,
    use_expected: Tensor | None,
    locations: Tensor | None,
    temperature: float,
) -> DecoderOutput:
    """Static shapes: every row at every one of the T steps (the captions padded to T + 1 tokens),
    nothing read back to the host; hard attention samples graph-safely. The Luong cell's LSTM runs
    over all steps and it attends for all B x T steps in one batched product."""
    cell = decoder.cell
    B, T = features.size(0), captions.size(1) - 1
    _, mask = _real_steps(captions, lengths)
    embedded = decoder.embedding(captions[:, :-1])  # (B, T, M)
    state = decoder.initial_state(features)
    if cell.whole_sequence:
        out = cell.attend_steps(
            cell.sequence(embedded, state), state, mode, use_expected, locations, temperature, graph_safe=True
        ).map(lambda x: x.reshape((B, T) + x.shape[1:]))
    else:
        x_steps = cell.inputs(embedded).unbind(1)  # T x (B, .)
        layers = cell.layers()
        per_step = []
        for t in range(T):
            out = decoder.cell_step(
                x_steps[t],
                state,
                mode,
                use_expected,
                None if locations is None else locations[:, t],
                temperature,
                graph_safe=True,
                layers=layers,
            )
            state = state.with_recurrent(out.h, out.c)
            per_step.append(out)
        out = StepOutput.join(per_step, lambda column: torch.stack(column, 1))  # (B, T, .) each
    logits = decoder.deep_output(embedded, cell.readout(out.h, out.z), out.z)  # (B, T, V)

    return _output(logits, mask, _masked(mask), out)


def scheduled(decoder, features: Tensor, captions: Tensor, lengths: Tensor, sample_prob: float) -> DecoderOutput:
    """Scheduled sampling (Bengio et al. 2015, as ruotianluo/ImageCaptioning.pytorch): step t >= 1
    reads, for each caption with probability ``sample_prob``, a word drawn from softmax of step
    t - 1's logits (detached: no gradient through the draw) instead of captions[:, t]; step 0 reads
    BOS. Every row runs every one of the T steps (padded steps masked, as in :func:`static`), with
    the output layer inside the loop (the Luong cell steps too, without its whole-sequence LSTM).
    Soft attention; logits (B, T, V)."""
    cell = decoder.cell
    B, T = features.size(0), captions.size(1) - 1
    _, mask = _real_steps(captions, lengths)
    state = decoder.initial_state(features)
    layers = cell.layers()
    tokens = captions[:, 0]
    per_step, logits = [], []
    for t in range(T):
        if t > 0:
            use_sample = torch.rand(B, device=captions.device) < sample_prob  # (B,)
            sampled = torch.multinomial(torch.softmax(logits[-1].detach().float(), -1), 1).squeeze(1)
            tokens = torch.where(use_sample, sampled, captions[:, t])
        embedded = decoder.embedding(tokens)  # (B, M)
        out = decoder.cell_step(cell.inputs(embedded), state, "expected", None, None, 1.0, layers=layers)
        state = state.with_recurrent(out.h, out.c)
        logits.append(decoder.deep_output(embedded, cell.readout(out.h, out.z), out.z))  # (B, V)
        per_step.append(out)
    out = StepOutput.join(per_step, lambda column: torch.stack(column, 1))  # (B, T, .) each

    return _output(torch.stack(logits, 1), mask, _masked(mask), out)
