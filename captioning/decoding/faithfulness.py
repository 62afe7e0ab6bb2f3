"""Does a word depend on where its attention map looks? Deletion and insertion of annotation vectors.

For every word of the model's own caption, the caption is teacher-forced again with some of the
image's L annotation vectors removed, and the word's log-probability read at its step (the rest
of the caption fixed). Which vectors: the k most attended at that word's step (alpha_t of the
unperturbed pass; for hard attention the expected attention), k random ones, or the k least
attended. Removal replaces a vector by the image's mean vector ("mean") or by zeros ("zero"),
for the whole pass (the initial state, which reads the mean of the vectors, sees the removal too).
Removing every vector with "zero" leaves the image-free language model. Deletion curves (remove
the top fraction f) and insertion curves (keep only the top fraction f) and their areas follow
Petsiuk et al. 2018; attention that explains the word should fall faster than random removal.

Efficiency: every word of a batch of captions is one row of one teacher-forced pass per
(removal, order, k): rows are copies of their image's vectors with their own word's vectors
removed, cut after their word's step (the shrinking batch then drops them), so a batch costs one
pass per k, not one per word.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

#: the default fractions of the grid removed (symmetric: insertion at f reads removal at 1 - f)
FRACTIONS = (0.0, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 7 / 8, 15 / 16, 1.0)
REMOVALS = ("mean", "zero")
ORDERS = ("top", "random", "least")


@dataclass
class WordRows:
    """The words of a batch of captions, one row each: image row ``image`` (N,), step ``step`` (N,),
    token id ``token`` (N,), the unperturbed log-probability ``log_prob`` (N,) and the ranking of
    the L locations by the word's attention, most attended first, ``ranking`` (N, L)."""

    image: Tensor
    step: Tensor
    token: Tensor
    log_prob: Tensor
    ranking: Tensor


def teacher_inputs(sequences: Tensor, lengths: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
    """Generated ``sequences`` (B, T) without BOS and their ``lengths`` (B,) with EOS ->
    captions (B, T + 1) [BOS, w_1, ..., EOS, PAD...] and lengths (B,) with BOS and EOS."""
    bos = sequences.new_full((sequences.size(0), 1), bos_id)
    return torch.cat([bos, sequences], 1), lengths + 1


def _last_step_log_probs(decoder, features: Tensor, captions: Tensor, lengths: Tensor, tokens: Tensor) -> Tensor:
    """log p of ``tokens`` (N,) at the last step of each row's teacher-forced pass: (N,)."""
    out = decoder(features, captions, lengths)
    steps = (lengths - 1).clamp(min=1)  # real steps per row; logits come row-major over (N, T)
    last = torch.cumsum(steps, 0) - 1
    logits = out.step_logits[last]
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1).gather(
        1, tokens.unsqueeze(1)
    )[:, 0]


def word_rows(decoder, features: Tensor, captions: Tensor, lengths: Tensor) -> WordRows:
    """The unperturbed pass: every word's (not EOS's) log-probability and attention ranking."""
    out = decoder(features, captions, lengths)
    B, T = out.mask.shape
    logits = out.step_logits
    log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    targets = captions[:, 1:][out.mask]  # (M,) in mask.nonzero() order, as the logits
    token_lp = log_probs.gather(1, targets.unsqueeze(1))[:, 0]
    rows, steps = out.mask.nonzero(as_tuple=True)
    words = steps < (lengths[rows] - 2)  # the step that predicts EOS is not a word
    ranking = torch.sort(out.alphas[rows[words], steps[words]], dim=-1, descending=True, stable=True).indices
    return WordRows(rows[words], steps[words], targets[words], token_lp[words], ranking)


def removed_features(features: Tensor, rows: WordRows, remove: Tensor, removal: str) -> Tensor:
    """The words' copies of their images' vectors (N, L, D) with ``remove`` (N, L) bool replaced by the
    image's mean vector ("mean") or zeros ("zero")."""
    own = features[rows.image]  # (N, L, D)
    fill = own.mean(1, keepdim=True).expand_as(own) if removal == "mean" else torch.zeros_like(own)
    return torch.where(remove.unsqueeze(-1), fill, own)


def removal_mask(rows: WordRows, k: int, order: str, generator: torch.Generator | None = None) -> Tensor:
    """(N, L) bool: the k locations each word loses: its k most attended ("top"), least attended
    ("least") or k drawn at random ("random")."""
    N, L = rows.ranking.shape
    if order == "top":
        picked = rows.ranking[:, :k]
    elif order == "least":
        picked = rows.ranking[:, L - k :]
    elif order == "random":
        noise = torch.rand((N, L), generator=generator, device="cpu").to(rows.ranking.device)
        picked = noise.argsort(-1)[:, :k]
    else:
        raise ValueError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")
    return torch.zeros((N, L), dtype=torch.bool, device=rows.ranking.device).scatter_(1, picked, True)


def perturbed_log_probs(
    decoder, features: Tensor, captions: Tensor, rows: WordRows, remove: Tensor, removal: str, chunk: int = 1024
) -> Tensor:
    """Each word's log-probability (N,) with its ``remove`` (N, L) vectors removed: one batched pass
    (in chunks of ``chunk`` words), each row cut after its word's step."""
    out = []
    for s in range(0, rows.image.numel(), chunk):
        part = WordRows(*(getattr(rows, f)[s : s + chunk] for f in ("image", "step", "token", "log_prob", "ranking")))
        feats = removed_features(features, part, remove[s : s + chunk], removal)
        out.append(_last_step_log_probs(decoder, feats, captions[part.image], part.step + 2, part.token))
    return torch.cat(out) if out else features.new_zeros(0)


def grid_counts(fractions: Sequence[float], L: int) -> list[int]:
    """k = round(f L) for each fraction f of the grid."""
    return [int(round(f * L)) for f in fractions]


@torch.no_grad()
def batch_faithfulness(
    decoder,
    features: Tensor,
    sequences: Tensor,
    lengths: Tensor,
    bos_id: int,
    fractions: Sequence[float] = FRACTIONS,
    removals: Sequence[str] = REMOVALS,
    generator: torch.Generator | None = None,
) -> dict:
    """One batch: {"rows": WordRows, (removal, order, k): log-probs (N,)} for every k of the
    fractions and every L - k (insertion), "top", "random" and "least"."""
    captions, lengths = teacher_inputs(sequences, lengths, bos_id)
    rows = word_rows(decoder, features, captions, lengths)
    L = features.size(1)
    ks = sorted(set(grid_counts(fractions, L)) | {L - k for k in grid_counts(fractions, L)})
    result: dict = {"rows": rows}
    for removal in removals:
        for k in ks:
            for order in ORDERS:
                if k in (0, L) and order != "top":  # removing none or all: the order does not matter
                    result[removal, order, k] = result[removal, "top", k]
                    continue
                if k == 0:
                    result[removal, order, k] = rows.log_prob
                    continue
                remove = removal_mask(rows, k, order, generator)
                result[removal, order, k] = perturbed_log_probs(decoder, features, captions, rows, remove, removal)
    return result


def _area(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The trapezoid area under ys over xs."""
    return float(sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])))


def summarise(
    batches: Sequence[dict],
    L: int,
    fractions: Sequence[float] = FRACTIONS,
    removals: Sequence[str] = REMOVALS,
    word_class: Callable[[int], str] | None = None,
) -> dict:
    """Curves and areas over the words of ``batches`` (batch_faithfulness's), per word class.

    ``word_class``: token id -> class name ("object", "function", ...); every word is also in "all".
    Per removal and class: "words", "log_prob" (the unperturbed mean), "deletion" {order: mean p
    after removing the fraction f of the grid, per f}, "insertion" {"top", "random": mean p keeping
    only the fraction f}, "log_prob_drop" {order: mean drop of log p per f} and "area" (deletion
    areas: lower is more faithful; insertion areas: higher is).
    """
    ks = grid_counts(fractions, L)
    tokens = torch.cat([b["rows"].token for b in batches]).tolist() if batches else []
    classes = {"all": list(range(len(tokens)))}
    if word_class is not None:
        for i, tok in enumerate(tokens):
            classes.setdefault(word_class(tok), []).append(i)
    report: dict = {"locations": L, "fractions": [float(f) for f in fractions], "words": len(tokens), "removal": {}}
    base = torch.cat([b["rows"].log_prob for b in batches]).double().cpu() if batches else torch.zeros(0)
    for removal in removals:
        lp = {
            (order, k): torch.cat([b[removal, order, k] for b in batches]).double().cpu()
            for order in ORDERS
            for k in set(ks) | {L - k for k in ks}
        }
        per_class = {}
        for name, idx in classes.items():
            if not idx:
                continue
            ix = torch.tensor(idx)
            prob = {key: float(v[ix].exp().mean()) for key, v in lp.items()}
            deletion = {o: [prob[o, k] for k in ks] for o in ORDERS}
            insertion = {o: [prob[o if o == "random" else "least", L - k] for k in ks] for o in ("top", "random")}
            per_class[name] = {
                "words": len(idx),
                "log_prob": float(base[ix].mean()),
                "deletion": deletion,
                "insertion": insertion,
                "log_prob_drop": {o: [float((base[ix] - lp[o, k][ix]).mean()) for k in ks] for o in ORDERS},
                "area": {
                    **{f"deletion_{o}": _area(fractions, deletion[o]) for o in ORDERS},
                    **{f"insertion_{o}": _area(fractions, insertion[o]) for o in insertion},
                },
            }
        report["removal"][removal] = per_class
    return report


def shapes_word_class(vocab) -> Callable[[int], str]:
    """Token id -> "object" (a size, colour or shape word of the shapes data) or "function"."""
    from captioning.data.shapes import ALL_COLOURS, ALL_SHAPES, ALL_SIZES

    objects = ALL_SIZES | ALL_COLOURS | ALL_SHAPES
    return lambda tok: "object" if vocab.itos[tok] in objects else "function"


@torch.no_grad()
def attention_faithfulness(
    model,
    batches,
    generation=None,
    fractions: Sequence[float] = FRACTIONS,
    removals: Sequence[str] = REMOVALS,
    seed: int = 0,
    word_class: Callable[[int], str] | None = None,
    progress: bool = True,
) -> dict:
    """Faithfulness curves of ``model`` (a ShowAttendTell) over ``batches`` (dicts with ``images``
    or ``features``, on the model's device): each image's caption decoded with ``generation``
    (default the spec's), then :func:`batch_faithfulness` and :func:`summarise` over all of them.
    ``word_class`` defaults to :func:`shapes_word_class` (object words vs function words)."""
    from tqdm.auto import tqdm

    for f in fractions:
        if not (isinstance(f, (int, float)) and math.isfinite(f) and 0 <= f <= 1):
            raise ValueError(f"faithfulness fractions must lie in [0, 1], got {f!r}")
    model = model.eval()
    generation = generation or model.spec.generation
    generator = torch.Generator().manual_seed(seed)
    results, L = [], 0
    for batch in tqdm(batches, desc="faithfulness", unit="batch", disable=None if progress else True):
        features = model.features(batch)
        L = features.size(1)
        out = model.generate(features=features, config=generation)
        results.append(
            batch_faithfulness(
                model.decoder, features, out.sequences, out.lengths, model.vocab.bos_id, fractions, removals, generator
            )
        )
    report = summarise(results, L, fractions, removals, word_class or shapes_word_class(model.vocab))
    report["attention_kind"] = model.attention_kind
    return report
