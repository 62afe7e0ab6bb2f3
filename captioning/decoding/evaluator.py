"""The one evaluator: decode a split batch by batch, gather the captions of every rank, score them.

Validation and ``captioning test`` call it from the LightningModule, ``captioning evaluate`` from a
plain loop (evaluate.py); the decoding, the gathering and the scoring are the same code. Scores
are the coco-caption metrics plus whatever the dataset adds through its hook (the shapes data:
object F1 and, when asked, attention grounding; see ``CaptionData.dataset_scores``).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from captioning.metrics import CocoScorer
from captioning.decoding.search import GenerationConfig, GenerationOutput
from captioning.vocab import Vocabulary

#: (words, alphas (T, L), chosen locations (T,) of hard attention or None) of one decoded
#: caption, for grounding scores
Alignment = tuple


class Evaluator:
    """Collects decoded captions (:meth:`add`), then :meth:`predictions` and :meth:`score`.

    Args:
        metrics: the coco-caption metrics to compute (see :class:`~captioning.metrics.CocoScorer`).
        spice: also try SPICE.
        keep_alignments: keep each caption's attention maps and locations (for grounding scores).
        tokenizer: the PTB tokenizer of the coco-caption scores (metrics/coco.py: "auto", "java" or
            "python", the same tokens without a Java process: training's validation uses it).
    """

    def __init__(self, metrics: Sequence[str] = ("BLEU", "CIDEr"), spice: bool = False, keep_alignments: bool = False,
                 tokenizer: str = "auto"):
        self.metrics, self.spice, self.keep_alignments = tuple(metrics), spice, keep_alignments
        self.tokenizer = tokenizer
        self._scorer: Optional[CocoScorer] = None
        self.reset()

    def reset(self) -> None:
        self._ids: list[Tensor] = []
        self._sequences: list[Tensor] = []
        self.alignments: dict[int, Alignment] = {}
        self.head_alphas: dict[int, object] = {}  # multi-head models: image_id -> (T, heads, L)

    @torch.no_grad()
    def add(self, model, batch: dict, config: GenerationConfig) -> GenerationOutput:
        """Decode one batch (its images or cached features, on the model's device) with ``config``."""
        out = model.generate(features=model.features(batch), config=config)
        seq = out.sequences.new_full((out.sequences.size(0), config.max_new_tokens), Vocabulary.pad_id)
        seq[:, : out.sequences.size(1)] = out.sequences  # a fixed width, so that ranks can be gathered
        self._ids.append(batch["image_ids"].to(seq.device))
        self._sequences.append(seq)
        if self.keep_alignments:
            for i, image_id in enumerate(batch["image_ids"].tolist()):
                n = int(out.lengths[i])
                chosen = out.locations[i, :n].cpu().numpy() if model.attention_kind == "hard" and out.locations.dim() == 2 else None
                self.alignments[image_id] = (model.vocab.decode(out.sequences[i, :n].tolist()),
                                             out.alphas[i, :n].cpu().numpy(), chosen)
                if out.head_alphas is not None:
                    self.head_alphas[image_id] = out.head_alphas[i, :n].cpu().numpy()
        return out

    def predictions(self, vocab: Vocabulary, all_gather: Optional[Callable] = None) -> dict[int, str]:
        """image_id -> caption over every rank (``all_gather``: the LightningModule's, under DDP);
        each image once (distributed samplers repeat some). Clears what was collected."""
        if self._ids:
            ids, seqs = torch.cat(self._ids), torch.cat(self._sequences)
        else:
            ids, seqs = torch.zeros(0, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long)
        self._ids, self._sequences = [], []
        if all_gather is not None:  # ranks may hold different counts: pad to the largest with id -1
            count = int(all_gather(torch.tensor(ids.numel(), device=ids.device)).max())
            width = int(all_gather(torch.tensor(seqs.size(1), device=ids.device)).max())
            ids = torch.cat([ids, ids.new_full((count - ids.numel(),), -1)])
            padded = seqs.new_full((count, width), Vocabulary.pad_id)
            padded[: seqs.size(0), : seqs.size(1)] = seqs
            ids, seqs = all_gather(ids).flatten(0, 1), all_gather(padded).flatten(0, 1)
            keep = ids >= 0
            ids, seqs = ids[keep], seqs[keep]
        return {i: vocab.decode_text(row) for i, row in zip(ids.tolist(), seqs.tolist())}

    def score(self, predictions: dict[int, str], references: dict[int, list[str]],
              dataset_scores: Optional[Callable] = None) -> tuple[dict, dict]:
        """(scores, notes) of ``predictions`` against their images' references.

        Scores: floats of the coco-caption metrics, and what ``dataset_scores(predictions,
        alignments)`` adds. Notes: why a metric could not be computed (e.g. SPICE offline).
        """
        if not predictions:
            return {}, {}
        if self._scorer is None:
            self._scorer = CocoScorer(metrics=self.metrics, spice=self.spice, tokenizer=self.tokenizer)
        raw = self._scorer({i: references[i] for i in predictions}, predictions)
        scores = {k: v for k, v in raw.items() if isinstance(v, float)}
        notes = {k: v for k, v in raw.items() if not isinstance(v, float)}
        if dataset_scores is not None:
            scores.update(dataset_scores(predictions, self.alignments if self.keep_alignments else None))
            if self.keep_alignments and self.head_alphas and isinstance(scores.get("grounding"), dict):
                # multi-head attention: "grounding" scores the mean of the heads' maps; each head's own
                heads = next(iter(self.head_alphas.values())).shape[1]
                scores["grounding"]["per_head"] = [
                    dataset_scores(predictions, {i: (words, self.head_alphas[i][:, k], None)
                                                 for i, (words, _, _) in self.alignments.items()}).get("grounding")
                    for k in range(heads)]
        return scores, notes

    def close(self) -> None:
        """Stop the scorers' Java processes (a later :meth:`score` starts new ones)."""
        if self._scorer is not None:
            self._scorer.close()
        self._scorer = None
