"""The one evaluator: decode a split batch by batch, gather the captions of every rank, score them.

Validation and ``captioning test`` call it from the LightningModule, ``captioning evaluate`` from a
plain loop (cli/evaluate.py); the decoding, the gathering and the scoring are the same code. The
scores are those of every registered metric (captioning/metrics/metric.py: ``METRICS``) that has
something to score: the coco-caption metrics chosen, the captions' diversity, the health of the
attention maps the search returned, CLIPScore when a CLIP model is named, the shapes data's object
F1, grounding and CHAIR, and any metric a plugin registers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from captioning.metrics.attention_health import MOVEMENT_FLOOR, UNIFORM_RATIO, AttentionHealth
from captioning.metrics.diversity import DOMINANT_SHARE, known_captions
from captioning.metrics.metric import Captions, Metric, MetricResult, build_metrics, chosen_metrics
from captioning.vocab import Vocabulary

if TYPE_CHECKING:
    from captioning.decoding.generation import GenerationConfig
    from captioning.metrics.clip_score import ClipScoring

#: (words, alphas (T, L), chosen locations (T,) of hard attention or None) of one decoded
#: caption, for grounding scores
Alignment = tuple

log = logging.getLogger(__name__)


class Evaluator:
    """Collects decoded captions (:meth:`add`), then :meth:`predictions` and :meth:`score`.

    Args:
        metrics: the optional metrics to compute (the coco-caption ones: "BLEU", "METEOR",
            "ROUGE_L", "CIDEr", "SPICE"); None: those chosen by default. Every other registered
            metric is computed wherever it has something to score.
        spice: also try SPICE.
        keep_alignments: keep each caption's attention maps and locations (for grounding scores).
        training_captions: the training split's reference captions: with them, the share of
            novel captions (found in none of them) is scored (:meth:`set_training_captions` later).
        dominant_share: warn when one caption covers more than this share of the images.
        uniform_ratio, movement_floor: warn when the attention maps' mean entropy exceeds
            uniform_ratio * log L, or their mean movement between words is below movement_floor.
        tokenizer: the PTB tokenizer of the coco-caption scores (metrics/coco.py: "auto", "java" or
            "python", the same tokens without a Java process: training's validation uses it).
        clip: CLIPScore and RefCLIPScore with this CLIP model (``score`` then needs the split's images),
            or why not in the notes.
        validation: only the metrics cheap enough for every validation (no METEOR, no JVM).

    :attr:`metrics` is the chosen metrics' names. Their warnings (diversity's, the attention
    maps') are kept in the notes ("diversity_warning", "attention_warning") of every :meth:`score`,
    and logged once per kind for the Evaluator's life (a training run validates many times; a
    repeat goes to the debug log).
    """

    def __init__(
        self,
        metrics: Sequence[str] | None = None,
        spice: bool = False,
        keep_alignments: bool = False,
        training_captions: Iterable[str] | None = None,
        dominant_share: float = DOMINANT_SHARE,
        uniform_ratio: float = UNIFORM_RATIO,
        movement_floor: float = MOVEMENT_FLOOR,
        tokenizer: str = "auto",
        clip: ClipScoring | None = None,
        validation: bool = False,
    ):
        self.metrics = chosen_metrics(metrics, spice=spice, validation=validation)
        self.spice, self.keep_alignments, self.tokenizer, self.clip = spice, keep_alignments, tokenizer, clip
        self.dominant_share = dominant_share
        #: what every metric is built with (captioning/metrics/metric.py: Metric's options)
        self.options = {"tokenizer": tokenizer, "dominant_share": dominant_share, "clip": clip}
        self.set_training_captions(training_captions)
        self.health = AttentionHealth(uniform_ratio, movement_floor)
        self.vocab_size: int | None = None
        self._built: list[Metric] | None = None  # the metric objects, made on first use (close() keeps them)
        self._warned: set[str] = set()  # the kinds of warning already logged (once per Evaluator)
        self.reset()

    def set_training_captions(self, captions: Iterable[str] | None = None, known: Set[str] | None = None) -> None:
        """The training references novel captions are counted against: ``captions``, or ``known``,
        the same through :func:`~captioning.evaluation.split_scores.known_training_captions` (None
        for both: no novelty score)."""
        self._known = known if captions is None else known_captions(captions)  # compared as words, once

    def reset(self) -> None:
        self._ids: list[Tensor] = []
        self._sequences: list[Tensor] = []
        self._health: list[Tensor] = []  # (B, 4) per batch: each caption's attention sums
        self._locations = 0
        self.health.reset()
        self.alignments: dict[int, Alignment] = {}
        self.head_alphas: dict[
            int, object
        ] = {}  # multi-head models: image_id -> (T, heads, L); ensembles: (T, members, L)
        self._parts = "per_head"  # what head_alphas hold: "per_head", or an ensemble's "per_member"

    @torch.no_grad()
    def add(self, model, batch: dict, config: GenerationConfig):
        """Decode one batch (its images or cached features, on the model's device) with ``config``."""
        out = model.generate(features=model.features(batch), config=config.resolve_tokens(model.vocab))
        seq = out.sequences.new_full((out.sequences.size(0), config.max_new_tokens), Vocabulary.pad_id)
        seq[:, : out.sequences.size(1)] = out.sequences  # a fixed width, so that ranks can be gathered
        self._ids.append(batch["image_ids"].to(seq.device))
        self._sequences.append(seq)
        sums = AttentionHealth.caption_sums(out.alphas.float().cpu().numpy(), out.lengths.cpu().numpy())  # (B, 4)
        self._health.append(torch.as_tensor(sums, device=seq.device))
        self._locations = out.alphas.size(-1)
        if self.keep_alignments:
            for i, image_id in enumerate(batch["image_ids"].tolist()):
                n = int(out.lengths[i])
                chosen = (
                    out.locations[i, :n].cpu().numpy()
                    if model.attention_kind == "hard" and out.locations.dim() == 2
                    else None
                )
                self.alignments[image_id] = (
                    model.vocab.decode(out.sequences[i, :n].tolist()),
                    out.alphas[i, :n].cpu().numpy(),
                    chosen,
                )
                if out.head_alphas is not None:
                    self.head_alphas[image_id] = out.head_alphas[i, :n].cpu().numpy()
                    self._parts = "per_member" if len(getattr(model, "members", ())) > 1 else "per_head"
        return out

    def predictions(self, vocab: Vocabulary, all_gather: Callable | None = None) -> dict[int, str]:
        """image_id -> caption over every rank (``all_gather``: the LightningModule's, under DDP);
        each image once (distributed samplers repeat some). Clears what was collected, keeping the
        attention figures of every rank's captions (each image once) for :meth:`score`."""
        self.vocab_size = len(vocab)
        if self._ids:
            ids, seqs, health = torch.cat(self._ids), torch.cat(self._sequences), torch.cat(self._health)
        else:
            ids, seqs = torch.zeros(0, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long)
            health = torch.zeros(0, 4, dtype=torch.float64)
        locations = self._locations
        self._ids, self._sequences, self._health = [], [], []
        if all_gather is not None:  # ranks may hold different counts: pad to the largest with id -1
            count = int(all_gather(torch.tensor(ids.numel(), device=ids.device)).max())
            width = int(all_gather(torch.tensor(seqs.size(1), device=ids.device)).max())
            locations = int(all_gather(torch.tensor(locations, device=ids.device)).max())
            ids = torch.cat([ids, ids.new_full((count - ids.numel(),), -1)])
            padded = seqs.new_full((count, width), Vocabulary.pad_id)
            padded[: seqs.size(0), : seqs.size(1)] = seqs
            health = torch.cat([health, health.new_zeros(count - health.size(0), 4)])
            ids, seqs = all_gather(ids).flatten(0, 1), all_gather(padded).flatten(0, 1)
            health = all_gather(health).flatten(0, 1)
            keep = ids >= 0
            ids, seqs, health = ids[keep], seqs[keep], health[keep]
        rows = list({i: row for row, i in enumerate(ids.tolist())}.values())  # each image once (its last row, as below)
        self.health.reset()
        if rows:
            self.health.merge(health[rows].sum(0).cpu().numpy(), locations)
        return {i: vocab.decode_text(row) for i, row in zip(ids.tolist(), seqs.tolist())}

    def score(
        self,
        predictions: dict[int, str],
        references: dict[int, list[str]],
        data=None,
        split: str | None = None,
        images: Callable | None = None,
        instances: Mapping | None = None,
        warn: bool = True,
    ) -> tuple[dict, dict]:
        """(scores, notes) of ``predictions`` against their images' references (:meth:`score_captions`;
        ``warn``: log the metrics' warnings, false for a model that has not trained yet)."""
        result = self.score_captions(predictions, references, data, split, images, instances, warn)
        return result.scores, result.notes

    def score_captions(
        self,
        predictions: dict[int, str],
        references: dict[int, list[str]],
        data=None,
        split: str | None = None,
        images: Callable | None = None,
        instances: Mapping | None = None,
        warn: bool = True,
    ) -> MetricResult:
        """Every chosen metric of ``predictions`` (image_id -> caption) against ``references``, in the
        registry's order (captioning/metrics/metric.py): their scores, notes, per-image columns and
        statistics. ``data`` (a CaptionData) and ``split``: the images' records (objects, boxes:
        object F1, grounding, CHAIR of the shapes data); ``images``: a function from ids to PIL images
        (CLIPScore; :func:`~captioning.evaluation.split_scores.split_images`); ``instances``: COCO
        categories per image (CHAIR). The attention figures gathered are cleared after."""
        if not predictions:
            return MetricResult()
        records = None
        if data is not None and split is not None:
            records = {r.image_id: r for r in data.records(split) if r.image_id in predictions}
        captions = Captions(
            predictions,
            references,
            records=records,
            images_root=getattr(data, "images_root", None),
            images=images,
            instances=instances,
            alignments=self.alignments if self.keep_alignments else None,
            head_alphas=self.head_alphas if self.keep_alignments else None,
            parts=self._parts,
            attention=self.health,
            vocab_size=self.vocab_size,
            known=self._known,
        )
        if self._built is None:
            self._built = build_metrics(self.metrics, self.options)
        result = MetricResult()
        try:
            for metric in self._built:
                got = metric.score(captions)
                if got is None:
                    continue
                result.update(got)
                if got.warnings:
                    if warn:  # the notes keep them either way
                        self._log_once(got.warnings)
                    result.notes[f"{metric.name}_warning"] = "; ".join(got.warnings)
        finally:
            self.health.reset()
        return result

    def _log_once(self, warnings: list[str]) -> None:
        for line in warnings:
            kind = " ".join(line.split()[:3])  # "one caption covers", "attention barely moves", ...
            (log.debug if kind in self._warned else log.warning)(line)
            self._warned.add(kind)

    def close(self) -> None:
        """Stop what the metrics hold (METEOR's Java process; a later :meth:`score` starts it again)."""
        for metric in self._built or ():
            metric.close()
