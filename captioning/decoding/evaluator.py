"""The one evaluator: decode a split batch by batch, gather the captions of every rank, score them.

Validation and ``captioning test`` call it from the LightningModule, ``captioning evaluate`` from a
plain loop (evaluate.py); the decoding, the gathering and the scoring are the same code. Scores
are the coco-caption metrics, the captions' diversity (metrics/diversity.py), the health of the
attention maps the search returned (metrics/attention_health.py), plus whatever the dataset adds
through its hook (the shapes data: object F1 and, when asked, attention grounding; see
``CaptionData.dataset_scores``), and CLIPScore / RefCLIPScore when a CLIP model is named
(metrics/clip_score.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from captioning.decoding.search import GenerationConfig, GenerationOutput
from captioning.errors import AnnotationError
from captioning.metrics import CocoScorer
from captioning.metrics.attention_health import MOVEMENT_FLOOR, UNIFORM_RATIO, AttentionHealth
from captioning.metrics.clip_score import ClipScoring
from captioning.metrics.diversity import DOMINANT_SHARE, diversity_scores, known_captions
from captioning.vocab import Vocabulary

#: (words, alphas (T, L), chosen locations (T,) of hard attention or None) of one decoded
#: caption, for grounding scores
Alignment = tuple

log = logging.getLogger(__name__)


def training_captions(data) -> list[str] | None:
    """The training split's references of a CaptionData (for the share of novel captions); None
    without a training split."""
    try:
        return [c for r in data.records("train") for c in r.captions]
    except AnnotationError:
        return None


def known_training_captions(data) -> frozenset[str] | None:
    """:func:`training_captions` as the novelty score compares them (``known_captions``): one set
    that several evaluators can share; None without a training split."""
    captions = training_captions(data)
    return None if captions is None else known_captions(captions)


def split_images(data, split: str) -> Callable[[list], list]:
    """A function from image ids of ``split`` to their PIL images as stored, read by ``data`` (from
    its files or its WebDataset shards: what CLIP scores, whatever the model was fed, cached features
    included)."""

    def images(ids: list) -> list:
        records = {r.image_id: r for r in data.records(split)}
        return [data.read_image(records[i]) for i in ids]

    return images


class Evaluator:
    """Collects decoded captions (:meth:`add`), then :meth:`predictions` and :meth:`score`.

    Args:
        metrics: the coco-caption metrics to compute (see :class:`~captioning.metrics.CocoScorer`).
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

    Besides the coco-caption metrics, :meth:`score` gives the diversity figures of
    :func:`~captioning.metrics.diversity.diversity_scores` and the attention figures of
    :class:`~captioning.metrics.attention_health.AttentionHealth` (from the maps of every decoded
    caption); their warnings are kept in the notes ("diversity_warning", "attention_warning") of every
    :meth:`score`, and logged once per kind for the Evaluator's life (a training run validates many
    times; a repeat goes to the debug log).
    """

    def __init__(
        self,
        metrics: Sequence[str] = ("BLEU", "CIDEr"),
        spice: bool = False,
        keep_alignments: bool = False,
        training_captions: Iterable[str] | None = None,
        dominant_share: float = DOMINANT_SHARE,
        uniform_ratio: float = UNIFORM_RATIO,
        movement_floor: float = MOVEMENT_FLOOR,
        tokenizer: str = "auto",
        clip: ClipScoring | None = None,
    ):
        self.metrics, self.spice, self.keep_alignments = tuple(metrics), spice, keep_alignments
        self.tokenizer, self.clip = tokenizer, clip
        self.set_training_captions(training_captions)
        self.dominant_share = dominant_share
        self.health = AttentionHealth(uniform_ratio, movement_floor)
        self.vocab_size: int | None = None
        self._scorer: CocoScorer | None = None
        self._warned: set[str] = set()  # the kinds of warning already logged (once per Evaluator)
        self.reset()

    def set_training_captions(self, captions: Iterable[str] | None = None, known: Set[str] | None = None) -> None:
        """The training references novel captions are counted against: ``captions``, or ``known``,
        the same through :func:`known_training_captions` (None for both: no novelty score)."""
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
    def add(self, model, batch: dict, config: GenerationConfig) -> GenerationOutput:
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
        dataset_scores: Callable | None = None,
        images: Callable | None = None,
    ) -> tuple[dict, dict]:
        """(scores, notes) of ``predictions`` against their images' references.

        Scores: floats of the coco-caption metrics, of diversity and of attention health (then
        the attention figures gathered are cleared), what ``dataset_scores(predictions,
        alignments)`` adds, and with a ``clip`` model CLIPScore and RefCLIPScore of the images
        ``images(ids)`` gives (:func:`split_images`). Notes: why a metric could not be computed
        (e.g. SPICE offline, CLIPScore without a CLIP model), and the diversity and attention warnings.
        """
        return self.score_images(predictions, references, dataset_scores, images)[:2]

    def score_images(
        self,
        predictions: dict[int, str],
        references: dict[int, list[str]],
        dataset_scores: Callable | None = None,
        images: Callable | None = None,
    ) -> tuple[dict, dict, dict]:
        """:meth:`score`'s (scores, notes) and the coco-caption scores per image (CocoScorer.score_images)."""
        if not predictions:
            return {}, {}, {}
        if self._scorer is None:
            self._scorer = CocoScorer(metrics=self.metrics, spice=self.spice, tokenizer=self.tokenizer)
        scored = {i: references[i] for i in predictions}
        if hasattr(self._scorer, "score_images"):  # a CocoScorer: its per-image scores too
            raw, per_image = self._scorer.score_images(scored, predictions)
        else:  # any callable (references, predictions) -> scores (the tests' stand-ins)
            raw, per_image = self._scorer(scored, predictions), {}
        scores = {k: v for k, v in raw.items() if isinstance(v, float)}
        notes = {k: v for k, v in raw.items() if not isinstance(v, float)}
        # the tokens scored: "ptb", or the language's tokenizer (metrics/languages.py)
        tokens = getattr(self._scorer, "scored_tokens", None)
        if tokens is not None:
            notes["tokens"] = tokens
        diversity, diversity_warnings = diversity_scores(
            predictions, self.vocab_size, dominant_share=self.dominant_share, known=self._known
        )
        attention, attention_warnings = self.health.scores()
        self.health.reset()
        scores.update(diversity)
        scores.update(attention)
        for key, warnings in (("diversity_warning", diversity_warnings), ("attention_warning", attention_warnings)):
            for line in warnings:
                kind = " ".join(line.split()[:3])  # "one caption covers", "attention barely moves", ...
                (log.debug if kind in self._warned else log.warning)(line)
                self._warned.add(kind)
            if warnings:
                notes[key] = "; ".join(warnings)
        if self.clip is not None:
            if images is None:
                raise ValueError(
                    "the Evaluator's CLIP scores need the split's images (score(..., images=split_images(data, split)))"
                )
            clip_scores, clip_notes = self.clip(images, predictions, references)
            scores.update(clip_scores)
            notes.update(clip_notes)
        if dataset_scores is not None:
            scores.update(dataset_scores(predictions, self.alignments if self.keep_alignments else None))
            if self.keep_alignments and self.head_alphas and isinstance(scores.get("grounding"), dict):
                # multi-head attention (an ensemble): "grounding" scores the mean of the heads' (members') maps; each one's own
                heads = next(iter(self.head_alphas.values())).shape[1]
                scores["grounding"][self._parts] = [
                    dataset_scores(
                        predictions,
                        {i: (words, self.head_alphas[i][:, k], None) for i, (words, _, _) in self.alignments.items()},
                    ).get("grounding")
                    for k in range(heads)
                ]
        return scores, notes, per_image

    def close(self) -> None:
        """Stop the scorers' Java processes (a later :meth:`score` starts new ones)."""
        if self._scorer is not None:
            self._scorer.close()
        self._scorer = None


# --------------------------------------------------------------------------- scoring a split's captions
def dataset_ids(data) -> dict[int, str]:
    """image_id -> the dataset's own id of that image, for a CaptionData whose format names its images
    otherwise (AI Challenger: the file name); {} where the image_ids are the dataset's (COCO, Flickr)."""
    return dict(data.read_annotations().dataset_ids or {})


def results_items(predictions: dict[int, str], names: dict[int, str] | None = None) -> list[dict]:
    """A COCO results list [{"image_id", "caption"}] of {image_id: caption}, each image named by the
    dataset's own id where ``names`` (:func:`dataset_ids`) has one."""
    names = names or {}
    return [{"image_id": names.get(i, i), "caption": c} for i, c in predictions.items()]


def read_results(path: str) -> dict[int | str, str]:
    """A COCO results file [{"image_id": int or str, "caption": str}, ...] -> {image_id: caption}, the ids
    as the file names them (integers, or a dataset's own names such as AI Challenger's file names; see
    :func:`cover_split`). One line of :class:`AnnotationError` for anything else (not a list, an id that is
    neither, a duplicate id, a caption that is not a string), so that nothing is scored from half a file."""
    from captioning.files import read_json_file

    items = read_json_file(path, AnnotationError, "a COCO results file", missing="no such results file")
    if not isinstance(items, list):
        raise AnnotationError(f'{path}: expected a COCO results list [{{"image_id": int, "caption": str}}, ...]')
    captions: dict[int | str, str] = {}
    for k, item in enumerate(items):
        if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
            raise AnnotationError(f'{path}: item {k}: expected an object with "image_id" and "caption"')
        i, caption = item["image_id"], item["caption"]
        if isinstance(i, bool) or not isinstance(i, (int, str)) or (isinstance(i, str) and not i.strip()):
            raise AnnotationError(
                f"{path}: item {k}: image_id must be an integer (or the dataset's own name of the image), "
                f"got {repr(i)[:40]}"
            )
        if isinstance(i, int) and not -(2**63) <= i < 2**63:
            raise AnnotationError(f"{path}: item {k}: image_id {str(i)[:40]}... is outside the 64-bit integers")
        if not isinstance(caption, str):
            raise AnnotationError(
                f"{path}: item {k} (image {i}): the caption must be a string, got {repr(caption)[:40]}"
            )
        if i in captions:
            raise AnnotationError(
                f"{path}: image_id {i!r} has more than one caption (items of a results file are one per image)"
            )
        captions[i] = caption
    if not captions:
        raise AnnotationError(f"{path}: no captions")
    return captions


def _shown(ids: list, n: int = 5) -> str:
    return ", ".join(map(str, ids[:n])) + (", ..." if len(ids) > n else "")


def _ordered(ids) -> list:
    return sorted(ids, key=lambda i: (isinstance(i, str), i))


def cover_split(
    predictions: dict, references: dict, source: str, split: str, names: dict[int, str] | None = None
) -> tuple[dict[int, str], list[str]]:
    """(the captions of images the split has, by image_id; one line per problem). ``predictions`` name
    the images as a results file does: by image_id, or where ``names`` (:func:`dataset_ids`) gives the
    dataset's own ids, by those (AI Challenger's "<hex>.jpg", also without its extension, as AI
    Challenger's evaluation names them). Captions for images the split does not have are set aside, and
    images without a caption named; an :class:`AnnotationError` when no caption is for an image of the
    split (ids of another dataset), or when one image is named twice."""
    names = names or {}
    by_name: dict = {}
    for i in references:
        name = names.get(i, i)
        by_name[name] = i
        if isinstance(name, str) and "." in name:
            by_name.setdefault(name.rsplit(".", 1)[0], i)
    kept: dict[int, str] = {}
    extra = []
    for key, caption in predictions.items():
        i = by_name.get(key)
        if i is None:
            extra.append(key)
        elif i in kept:
            raise AnnotationError(f"{source}: image {names.get(i, i)!r} has more than one caption (as {key!r} too)")
        else:
            kept[i] = caption
    missing = [names.get(i, i) for i in references if i not in kept]
    if not kept:
        raise AnnotationError(
            f"{source}: none of its {len(predictions)} image ids is an image of the {split!r} split "
            f"(ids of another dataset or split?): {_shown(_ordered(extra))}"
        )
    lines = []
    if extra:
        lines.append(
            f"{source}: {len(extra)} caption(s) for images the {split!r} split does not have, not scored: "
            f"{_shown(_ordered(extra))}"
        )
    if missing:
        lines.append(
            f"{source}: {len(missing)} image(s) of the {split!r} split without a caption, not scored: "
            f"{_shown(_ordered(missing))}"
        )
    return kept, lines


@dataclass
class SplitScores:
    """What :func:`score_split` gives: the report's ``scores`` and ``notes``, the coco-caption
    scores per image (CocoScorer.score_images), and per image the object counts (shapes data:
    (matched, mentioned, held)) and CHAIR's entries (metrics/chair.py)."""

    scores: dict
    notes: dict
    per_image: dict
    objects: dict | None = None
    chair: dict | None = None
    names: dict | None = None  # image_id -> the dataset's own id (dataset_ids), where it has one

    def rows(self, predictions: dict[int, str], references: dict) -> list[dict]:
        """One JSON-able row per scored image: its caption, references and scores; the image named as
        the results file names it (the dataset's own id where it has one)."""
        from captioning.metrics.chair import chair_from_counts

        index = {i: k for k, i in enumerate(self.per_image.get("ids", []))}
        names = self.names or {}
        rows = []
        for i, k in index.items():
            row = {"image_id": names.get(i, i), "caption": predictions[i], "references": list(references[i])}
            for name in ("BLEU-4", "METEOR", "ROUGE_L", "CIDEr"):
                if name in self.per_image:
                    row[name] = self.per_image[name][k]
            if self.objects and i in self.objects:
                tp, said, held = self.objects[i]
                row["object_f1"] = 2 * tp / (said + held) if said + held else 0.0
                row["objects_matched"], row["objects_mentioned"], row["objects_held"] = tp, said, held
            if self.chair and i in self.chair:
                entry = self.chair[i]
                row["CHAIR_s"] = int(bool(entry["hallucinated"]))
                row["CHAIR_i"] = float(chair_from_counts(entry["counts"])["CHAIR_i"])
                row["hallucinated"] = entry["hallucinated"]
                row["mentioned"] = entry["mentioned"]
                if "errors" in entry:
                    row["hallucination_errors"] = entry["errors"]
            rows.append(row)
        return rows

    def statistics(self) -> dict:
        """metric name -> :class:`~captioning.metrics.bootstrap.Statistic` over the scored images, in
        ``per_image["ids"]`` order (what ``captioning compare`` resamples)."""
        from captioning.metrics import bootstrap as bs

        ids = self.per_image.get("ids", [])
        stats = {}
        if "BLEU-1" in self.per_image:
            gts, res = self.per_image["tokens"]
            bleu = bs.bleu_statistics(gts, res, ids)
            stats.update({f"BLEU-{n}": bs.Statistic(bleu, bs.bleu_score(n)) for n in range(1, 5)})
        for name in ("ROUGE_L", "CIDEr"):
            if name in self.per_image:
                stats[name] = bs.Statistic(bs.per_image_mean(self.per_image[name]), bs.mean_score)
        if "METEOR" in self.per_image:  # not coco-caption's corpus METEOR (Java's aggregate): named apart
            stats["METEOR_image_mean"] = bs.Statistic(bs.per_image_mean(self.per_image["METEOR"]), bs.mean_score)
        if self.objects and all(i in self.objects for i in ids):
            counts = np.asarray([self.objects[i] for i in ids], dtype=np.float64)
            for which in ("f1", "precision", "recall"):
                stats[f"object_{which}"] = bs.Statistic(counts, bs.object_score(which))
        if self.chair and all(i in self.chair for i in ids):
            counts = np.asarray([self.chair[i]["counts"] for i in ids], dtype=np.float64)
            for name in self.scores:
                if name.startswith("CHAIR"):
                    stats[name] = bs.Statistic(counts, bs.chair_score(name))
        return stats


def score_split(
    evaluator: Evaluator,
    data,
    split: str,
    predictions: dict[int, str],
    instances: str | dict | None = None,
    images: Callable | None = None,
) -> SplitScores:
    """Score a split's captions: the one scoring path of ``captioning evaluate`` (a model's captions)
    and ``captioning score`` / ``compare`` (a results file's). ``data``: the split's CaptionData;
    ``predictions``: captions of images of the split (:func:`cover_split`); ``instances``: a COCO
    instances file for CHAIR, or what metrics/chair.py's read_instances read from one (the shapes data gets its CHAIR from its objects field).

    The scores are the Evaluator's (coco-caption, diversity, attention health of what it decoded,
    CLIP, the dataset's own) and CHAIR's."""
    from captioning.data.shapes import parse_objects, record_objects
    from captioning.metrics.chair import chair_images, chair_scores, read_instances, shapes_chair_images
    from captioning.metrics.objects import object_counts

    references = data.references(split)
    scores, notes, per_image = evaluator.score_images(
        predictions, references, lambda p, a: data.dataset_scores(split, p, a), images=images
    )
    result = SplitScores(scores, notes, per_image, names=dataset_ids(data) or None)
    records = [r for r in data.records(split) if r.image_id in predictions]
    truth = {r.image_id: record_objects(r) for r in records if r.objects}
    if truth:
        mentions = {i: parse_objects(predictions[i]) for i in truth}
        result.objects = object_counts(mentions, truth)
        result.chair = shapes_chair_images(mentions, truth)
    if instances is not None:
        objects = instances if isinstance(instances, dict) else read_instances(instances)
        result.chair = chair_images(predictions, references, objects)
    if result.chair:
        scores.update(chair_scores(result.chair))
    return result
