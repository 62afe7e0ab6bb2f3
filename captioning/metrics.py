"""Caption metrics: coco-caption scores, object F1 and attention grounding.

* :class:`CocoScorer` wraps the COCO caption evaluation code (PyPI ``pycocoevalcap``): both sides
  are tokenised by its PTBTokenizer (Java), then scored with BLEU-1..4, METEOR (Java), ROUGE-L,
  CIDEr (in fact CIDEr-D) and, when asked and available, SPICE. These are the numbers of the
  paper's Table 1 (there shown x100).
* :func:`object_f1` checks the (size, colour, shape) objects a caption names against the truth of
  the synthetic shapes dataset.
* :func:`grounding_scores` measures whether attention falls on the object a word names: attention
  correctness (Liu et al., AAAI 2017) and the pointing game (Zhang et al., ECCV 2016), with a
  uniform and a centre-prior map as baselines.
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Hashable, Iterable, Mapping, Optional, Sequence

import numpy as np

METRICS = ("BLEU", "METEOR", "ROUGE_L", "CIDEr")


def _check_ids(references: Mapping, predictions: Mapping, what: str = "predictions") -> None:
    """Raise ValueError unless ``predictions`` covers exactly the ids of ``references``."""
    missing = [i for i in references if i not in predictions]
    extra = [i for i in predictions if i not in references]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} id(s): {_show(missing)}")
    if extra:
        problems.append(f"{len(extra)} id(s) without references: {_show(extra)}")
    if problems:
        raise ValueError(f"{what} must cover exactly the reference ids: " + "; ".join(problems))


def _show(ids: list, n: int = 10) -> str:
    return ", ".join(map(repr, ids[:n])) + (", ..." if len(ids) > n else "")


class CocoScorer:
    """coco-caption scores of predicted captions against references. Create once per run.

    The scorers are made on first use and kept: METEOR and SPICE start a JVM (about 7 s for
    METEOR), so reuse one CocoScorer across validation epochs and call :meth:`close` (or use it
    as a context manager) to stop METEOR's Java process.

    Args:
        metrics: any of "BLEU" (gives BLEU-1..BLEU-4), "METEOR", "ROUGE_L", "CIDEr" ("SPICE" is
            the same as ``spice=True``). Validation uses ("BLEU", "CIDEr"), which needs no JVM
            beyond the tokenizer's.
        spice: also compute SPICE. It needs Stanford CoreNLP 3.6.0, which pycocoevalcap downloads
            on first use; offline (or if it fails for any other reason) the result holds
            ``"SPICE": None`` and ``"SPICE_error"``: the reason, instead of raising.

    ``scorer(references, predictions)`` with ``references: {image_id: [str, ...]}`` and
    ``predictions: {image_id: str}`` over exactly the same ids returns floats in pycocoevalcap's
    scale (0-1; CIDEr about 0-10): keys "BLEU-1".."BLEU-4", "METEOR", "ROUGE_L", "CIDEr".
    """

    def __init__(self, metrics: Sequence[str] = METRICS, spice: bool = False):
        metrics = tuple(metrics)
        unknown = [m for m in metrics if m not in METRICS + ("SPICE",)]
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; choose from {list(METRICS + ('SPICE',))}")
        self.metrics = tuple(m for m in METRICS if m in metrics)  # canonical order
        self.spice = spice or "SPICE" in metrics
        self._scorers: dict = {}  # name -> pycocoevalcap scorer, made on first use
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scoring
    def __call__(self, references: Mapping[Hashable, Sequence[str]],
                 predictions: Mapping[Hashable, str]) -> dict:
        if not references:
            raise ValueError("no references to score against")
        _check_ids(references, predictions)
        for i, refs in references.items():
            if isinstance(refs, str) or not refs:
                raise ValueError(f"references[{i!r}] must be a non-empty list of captions")
        gts, res = self._tokenize(references, predictions)
        with self._lock:
            scores: dict = {}
            for name in self.metrics:
                score, _ = self._scorer(name).compute_score(gts, res, **({"verbose": 0} if name == "BLEU" else {}))
                if name == "BLEU":
                    scores.update({f"BLEU-{n + 1}": float(s) for n, s in enumerate(score)})
                else:
                    scores[name] = float(score)
            if self.spice:
                scores.update(self._spice(gts, res))
        return scores

    @staticmethod
    def _tokenize(references: Mapping, predictions: Mapping) -> tuple[dict, dict]:
        """PTB-tokenise both sides in one Java call. Returns ({id: [ref, ...]}, {id: [pred]})."""
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        def clean(text) -> str:  # one line per caption: the tokenizer reads the file line by line
            if not isinstance(text, str):
                raise ValueError(f"captions must be strings, got {type(text).__name__}: {text!r}")
            return " ".join(text.split())

        ids = list(references)
        both = {("ref", k): [{"caption": clean(c)} for c in references[i]] for k, i in enumerate(ids)}
        both.update({("pred", k): [{"caption": clean(predictions[i])}] for k, i in enumerate(ids)})
        tokens = PTBTokenizer().tokenize(both)
        gts = {i: tokens[("ref", k)] for k, i in enumerate(ids)}
        res = {i: tokens[("pred", k)] for k, i in enumerate(ids)}
        return gts, res

    def _scorer(self, name: str):
        if name not in self._scorers:
            if name == "BLEU":
                from pycocoevalcap.bleu.bleu import Bleu
                self._scorers[name] = Bleu(4)
            elif name == "METEOR":
                self._scorers[name] = _SafeMeteor()
            elif name == "ROUGE_L":
                from pycocoevalcap.rouge.rouge import Rouge
                self._scorers[name] = Rouge()
            elif name == "CIDEr":
                from pycocoevalcap.cider.cider import Cider
                self._scorers[name] = Cider()
        return self._scorers[name]

    def _spice(self, gts: dict, res: dict) -> dict:
        """{"SPICE": float} or {"SPICE": None, "SPICE_error": reason}; never raises."""
        reason = spice_unavailable_reason()
        if reason is None:
            try:
                from pycocoevalcap.spice.spice import Spice
                score, _ = Spice().compute_score(gts, res)
                return {"SPICE": float(score)}
            except Exception as err:  # Java out of memory, failed parse, ...
                reason = f"SPICE failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
        return {"SPICE": None, "SPICE_error": reason}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop METEOR's Java process (a later call starts a new one)."""
        with self._lock:
            meteor = self._scorers.pop("METEOR", None)
        if meteor is not None:
            meteor.close()

    def __enter__(self) -> "CocoScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SafeMeteor:
    """pycocoevalcap's Meteor with a close() and a clear error if its Java process dies."""

    def __init__(self):
        from pycocoevalcap.meteor.meteor import Meteor

        self._meteor = Meteor()  # starts the JVM

    def compute_score(self, gts: dict, res: dict):
        # "|||" separates fields in METEOR's protocol; the wrapper only strips it from hypotheses
        gts = {i: [r.replace("|||", "") for r in refs] for i, refs in gts.items()}
        try:
            return self._meteor.compute_score(gts, res)
        except ValueError as err:  # float("") after the JVM died
            stderr = self._meteor.meteor_p.stderr
            detail = stderr.read().decode(errors="replace")[-300:] if self._meteor.meteor_p.poll() is not None else ""
            raise RuntimeError(f"METEOR's Java process failed ({err}) {' '.join(detail.split())}".strip()) from None

    def close(self) -> None:
        p = self._meteor.meteor_p
        with self._meteor.lock:
            if p.poll() is None:
                p.stdin.close()
                p.kill()
                p.wait()
        for stream in (p.stdout, p.stderr):
            stream.close()


def spice_unavailable_reason() -> Optional[str]:
    """None if SPICE can run here, else why not (checked without touching the network)."""
    import shutil

    if shutil.which("java") is None:
        return "SPICE unavailable: needs Java (no 'java' on PATH)"
    try:
        from pycocoevalcap.spice import get_stanford_models as g
    except ImportError as err:
        return f"SPICE unavailable: {err}"
    jar = os.path.join(g.SPICEDIR, g.SPICELIB, f"{g.JAR}.jar")
    if not os.path.exists(jar):
        return (f"SPICE unavailable: needs Stanford CoreNLP ({g.JAR}.jar, which pycocoevalcap downloads "
                f"from nlp.stanford.edu on first use) at {jar}")
    return None


# ---------------------------------------------------------------------- object F1
def object_f1(predictions: Mapping[Hashable, str], objects: Mapping[Hashable, Iterable[Sequence[str]]]) -> dict:
    """Micro-averaged precision, recall and F1 of the (size, colour, shape) objects captions name.

    For every image id of ``objects`` (its ground-truth triples) the mentions in the predicted
    caption (``captioning.data.shapes.parse_objects``) are matched as multisets: two "small red
    circle" mentions match at most as many small red circles as the image has. Counts are summed
    over images before dividing (micro average); a ratio with a zero denominator is 0.
    Predictions for ids that are not in ``objects`` are ignored.

    Returns {"precision", "recall", "f1", "true_positives", "predicted", "actual"}.
    """
    from captioning.data.shapes import parse_objects

    missing = [i for i in objects if i not in predictions]
    if missing:
        raise ValueError(f"object_f1: no prediction for {len(missing)} id(s): {_show(missing)}")
    tp = predicted = actual = 0
    for i, truth in objects.items():
        said = Counter(parse_objects(predictions[i]))
        true = Counter(tuple(str(w).lower() for w in t) for t in truth)
        tp += sum((said & true).values())
        predicted += sum(said.values())
        actual += sum(true.values())
    precision = tp / predicted if predicted else 0.0
    recall = tp / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "true_positives": tp, "predicted": predicted, "actual": actual}


# ---------------------------------------------------------------------- grounding
def _box_mask(bbox: Sequence[float], width: int, height: int) -> np.ndarray:
    """(H, W) bool: pixels whose centre lies in ``bbox`` = [x0, y0, x1, y1] (exclusive ends)."""
    x0, y0, x1, y1 = bbox
    xs, ys = np.arange(width) + 0.5, np.arange(height) + 0.5
    return ((ys >= y0) & (ys < y1))[:, None] & ((xs >= x0) & (xs < x1))[None, :]


def _center_prior(width: int, height: int) -> np.ndarray:
    """(H, W) isotropic Gaussian centred in the image, sigma = a quarter of each side, sum 1."""
    xs = (np.arange(width) + 0.5 - width / 2) / (width / 4)
    ys = (np.arange(height) + 0.5 - height / 2) / (height / 4)
    g = np.exp(-0.5 * ys[:, None] ** 2) * np.exp(-0.5 * xs[None, :] ** 2)
    return g / g.sum()


def grounding_scores(items: Iterable[tuple]) -> dict:
    """Attention correctness and pointing game of attention maps against object boxes.

    Each item is ``(grid_map, image_size, bbox)``: a non-negative (gh, gw) attention map over the
    whole image, the original image's (W, H) and the box [x0, y0, x1, y1] (pixels, exclusive
    ends; a pixel is inside when its centre is) of the object the attended word names.

    The map is upsampled to (H, W) with :func:`captioning.visualize.upsample_map` (as the overlays
    are drawn) and normalised to sum 1 (an all-zero map counts as uniform). Then

    * attention correctness (Liu et al. 2017) = the map's mass inside the box;
    * pointing game (Zhang et al. 2016) = 1 if the map's maximum pixel (first in row-major order)
      lies in the box, else 0.

    Baselines, scored on the same boxes:

    * "uniform": a constant map. Its correctness is the box's share of the image; its maximum is
      every pixel, so its pointing score is defined as the chance that a pixel drawn at random
      hits the box, also the box's share of the image.
    * "center_prior": an isotropic Gaussian at the image centre with sigma = W/4 across and H/4
      down; it points at the image centre (a hit if the centre point lies in the box).

    Returns {"attention_correctness", "pointing_game", "count", "uniform": {...}, "center_prior":
    {...}} with means over the items (None when there are none).
    """
    from captioning.visualize import upsample_map

    rows = []  # (correctness, pointing) for: attention, uniform, centre prior
    for grid, (width, height), bbox in items:
        width, height = int(width), int(height)
        m = upsample_map(grid, (width, height))  # (H, W)
        total = m.sum()
        m = m / total if total > 0 else np.full_like(m, 1.0 / m.size)
        inside = _box_mask(bbox, width, height)  # (H, W)
        share = inside.mean()
        prior = _center_prior(width, height)
        x0, y0, x1, y1 = bbox
        centre_hit = float(x0 <= width / 2 < x1 and y0 <= height / 2 < y1)
        rows.append((m[inside].sum(), float(inside.flat[m.argmax()]),
                     share, share,
                     prior[inside].sum(), centre_hit))

    def mean(column: int) -> Optional[float]:
        return float(np.mean([r[column] for r in rows])) if rows else None

    return {
        "attention_correctness": mean(0), "pointing_game": mean(1), "count": len(rows),
        "uniform": {"attention_correctness": mean(2), "pointing_game": mean(3)},
        "center_prior": {"attention_correctness": mean(4), "pointing_game": mean(5)},
    }
