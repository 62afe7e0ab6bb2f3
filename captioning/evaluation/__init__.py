"""Evaluation: decoding a split and scoring its captions with the registered metrics.

* :mod:`.evaluator`: ``Evaluator``, the decoding, the gathering over ranks and the scoring of
  validation, ``captioning test`` and ``captioning evaluate``.
* :mod:`.split_scores`: ``score_split`` and ``SplitScores``, the one scoring of a split's captions
  (``evaluate``, ``score``, ``compare``): scores, per-image rows, the statistics ``compare`` resamples.
* :mod:`.results_files`: COCO results files, read, written and matched to a split's images.
* :mod:`.attention_reports`: what ``evaluate`` adds (faithfulness curves, held-out pairs).

The metrics themselves are captioning/metrics/ (``METRICS``, captioning/metrics/metric.py).
"""
