"""CLIPScore and RefCLIPScore as a registered metric: computed when the run names a CLIP model (the
option "clip", a :class:`~captioning.metrics.clip_score.ClipScoring`), else absent. The scoring itself,
and its torch and OpenCLIP imports, are metrics/clip_score.py's; this module imports neither, so that
the metrics register where torch cannot be imported (``captioning caption --onnx``)."""

from __future__ import annotations

from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult


@METRICS.register("CLIPScore")
class ClipScore(Metric):
    """CLIPScore and RefCLIPScore (Hessel et al. 2021) with the run's CLIP model, or a note saying
    why they are missing (no model named, open_clip missing, weights not found)."""

    def score(self, captions: Captions) -> MetricResult | None:
        clip = self.options.get("clip")
        if clip is None:
            return None
        if captions.images is None:
            raise ValueError(
                "the Evaluator's CLIP scores need the split's images (score(..., images=split_images(data, split)))"
            )
        scores, notes = clip(captions.images, captions.predictions, captions.references)
        return MetricResult(scores=scores, notes=notes)
