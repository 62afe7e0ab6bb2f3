"""Self-critical sequence training (Rennie et al. 2017): optimise the CIDEr-D of sampled captions.

For each image of a batch, K captions are sampled from the model (the B x K rows decoded at once),
each is rewarded by its CIDEr-D against the image's training references, and a baseline is
subtracted:

    greedy  b = the reward of the image's greedy caption (Rennie et al.)
    mean    b = the mean reward of the image's other K - 1 samples (Luo 2020, "new self-critical")

    loss = -(r - b) * log p(sample)

with log p summed over the sample's tokens, EOS included, and the loss averaged over the B x K
samples. For hard attention log p(sample) also holds sum_t log p(s_t | a) (``location_gradient false``
keeps the word-only gradient). The rewards are computed in process (metrics/cider.py, no JVM) from
document frequencies of the training references, kept in the checkpoints (``checkpoint_state``);
nothing is gathered across ranks. The decoder's dropout is off while the samples are drawn and scored
(two passes in train mode would draw two different masks), so the estimate is exact REINFORCE for the
policy that decoding at test time uses.

The loss, the reward and the settings: docs/TRAINING.md, "Self-critical sequence training (SCST)".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from captioning.decoding.search import BAD_ENDINGS, GenerationConfig
from captioning.errors import ConfigError
from captioning.metrics import languages
from captioning.metrics.cider import CiderD
from captioning.metrics.languages import scoring_tokenizer
from captioning.metrics.ptb import ptb_tokenize, tokenize_corpus
from captioning.objectives.base import OBJECTIVES, Objective, ObjectiveOutput
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.tokenizers import Tokenizer
from captioning.vocab import Vocabulary

_PLAIN_WORD = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")  # the form of vocab.tokenize's words


def mean_of_others(rewards: Tensor) -> Tensor:
    """(B, K) -> (B, K): for each sample, the mean reward of its image's other K - 1 samples."""
    K = rewards.size(1)
    return (rewards.sum(1, keepdim=True) - rewards) / (K - 1)


def bad_ending_rate(captions: Sequence[Sequence[str]]) -> float:
    """The share of captions (lists of words) whose last word is in BAD_ENDINGS (empty ones: not)."""
    if not len(captions):
        return 0.0
    return sum(1 for words in captions if words and words[-1].lower() in BAD_ENDINGS) / len(captions)


@contextmanager
def _eval_mode(module: torch.nn.Module):
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@OBJECTIVES.register("scst")
class SCST(Objective):
    """Self-critical sequence training: REINFORCE with CIDEr-D rewards and a self-critical baseline.

    Start it from a cross-entropy checkpoint (``--model.init_from CKPT``), with a small constant
    learning rate (Adam 5e-5 for COCO).

    Args:
        num_samples: K, captions sampled per image (5 in Luo's recipe).
        baseline: "greedy" (the greedy caption's reward, Rennie et al.) or "mean" (the mean reward
            of the image's other samples; needs num_samples >= 2).
        max_new_tokens: the longest sampled (and greedy) caption, EOS included.
        location_gradient: hard attention: the sampled locations get the advantage too (true) or
            only the words do (false).
    """

    attention_kinds = ("soft", "hard")

    def __init__(
        self,
        num_samples: int = 5,
        baseline: Literal["greedy", "mean"] = "greedy",
        max_new_tokens: int = 30,
        location_gradient: bool = True,
    ):
        super().__init__(
            num_samples=num_samples,
            baseline=baseline,
            max_new_tokens=max_new_tokens,
            location_gradient=location_gradient,
        )
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ConfigError(f"model.objective.num_samples: expected an integer >= 1, got {num_samples!r}")
        if baseline not in ("greedy", "mean"):
            raise ConfigError(f"model.objective.baseline: expected 'greedy' or 'mean', got {baseline!r}")
        if baseline == "mean" and num_samples < 2:
            raise ConfigError("model.objective.baseline mean needs num_samples >= 2 (the other samples of the image)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"model.objective.max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
        self.num_samples, self.baseline, self.max_new_tokens = num_samples, baseline, max_new_tokens
        self.location_gradient = location_gradient
        self._references: dict | None = None  # image_id -> tuple of tokenised training references
        self._cider: CiderD | None = None
        self._cider_state: dict | None = None
        self._word_tokens: dict = {}  # vocabulary word -> its PTB tokens (None: tokenise its captions whole)
        self._language: Tokenizer | None = None  # the references' tokenizer when not PTB (CJK captions)

    # ------------------------------------------------------------------ references and CIDEr-D
    def setup(self, datamodule) -> None:
        """Called by CaptioningModule.setup: the training split's references (the same on every rank)."""
        self.set_references(datamodule.references("train"))

    def set_references(self, references: Mapping[int, Sequence[str]]) -> None:
        """image_id -> raw reference captions of the training images (tokenised here, as the evaluation does:
        PTB tokens, or the language's for mostly-CJK captions, metrics/languages.py)."""
        references = dict(references)
        self._language = scoring_tokenizer(c for refs in references.values() for c in refs)
        if self._language is not None:
            tokens = languages.tokenize_corpus(self._language, references)
        else:
            tokens = tokenize_corpus(references)
        self._references = {int(k): tuple(v) for k, v in tokens.items()}

    @property
    def cider(self) -> CiderD:
        """CIDEr-D with the training references' document frequencies (built once, or from a checkpoint)."""
        if self._cider is None:
            if self._references is None:
                raise ConfigError(
                    "SCST needs the training references: train it through `captioning fit` (or call set_references)"
                )
            self._cider = CiderD(list(self._references.values()))
        return self._cider

    def checkpoint_state(self) -> dict:
        """The document frequencies, as plain values and int64 tensors (CaptioningModule puts them in checkpoints)."""
        if self._cider is None and self._references is None:
            return {}
        if self._cider_state is None:  # fixed for the run: converted once
            state = self.cider.state_dict()
            state["ngram_keys"] = [torch.tensor(k, dtype=torch.int64) for k in state["ngram_keys"]]
            state["document_frequency"] = [torch.tensor(d, dtype=torch.int64) for d in state["document_frequency"]]
            self._cider_state = {"cider_d": state}
        return self._cider_state

    def load_checkpoint_state(self, state: dict) -> None:
        if state.get("cider_d"):
            self._cider = CiderD.from_state_dict(state["cider_d"])
            self._cider_state = state

    def _ptb_tokens(self, words: Sequence[str]) -> str | None:
        """The PTB tokens of a caption of vocabulary words, from each word's tokens (cached): a word of
        letters and digits with inner apostrophes or hyphens ("dog's", "t-shirt", "cannot") is
        tokenised alike alone or in a caption. None if a word is not of that form ("<unk>", "5.5")."""
        parts = []
        for word in words:
            tokens = self._word_tokens.get(word, False)
            if tokens is False:
                tokens = self._word_tokens[word] = ptb_tokenize(word) if _PLAIN_WORD.fullmatch(word) else None
            if tokens is None:
                return None
            if tokens:
                parts.append(tokens)
        return " ".join(parts)

    # ------------------------------------------------------------------ the loss
    def rewards(self, vocab: Vocabulary, sequences: Tensor, references: Sequence[tuple]) -> tuple[np.ndarray, list]:
        """CIDEr-D of each row of ``sequences`` (N, T) against ``references[i]``; also the rows' words."""
        rows = sequences.tolist()
        words = [vocab.decode(row) for row in rows]
        if self._language is not None:  # the references' language: the caption's text split as they were
            texts = [" ".join(self._language.tokenize(vocab.decode_text(row))) for row in rows]
            return self.cider.scores(texts, references), words
        texts = [self._ptb_tokens(w) for w in words]
        for i, text in enumerate(texts):
            if (
                text is None
            ):  # a word the per-word shortcut does not vouch for: the whole caption, as the evaluation does
                texts[i] = ptb_tokenize(vocab.decode_text(rows[i]))
        return self.cider.scores(texts, references), words

    def static_step_problem(self) -> str | None:
        return "self-critical training decodes captions of varying length inside its step"

    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        ids = batch["image_ids"]  # (B,) images; features: a row per caption of a grouped batch
        if "image_index" in batch:
            ids = ids[batch["image_index"]]
        # One row per distinct image (a batch of caption pairs may repeat an image; a grouped one does).
        distinct, inverse = torch.unique(ids, return_inverse=True)
        first = torch.full_like(distinct, ids.numel()).scatter_reduce(
            0, inverse, torch.arange(ids.numel(), device=ids.device), "amin"
        )
        features = features[first]  # (B, L, D)
        B, K = features.size(0), self.num_samples
        try:
            references = [self._references[i] for i in distinct.tolist()] if self._references is not None else None
        except KeyError as err:
            raise ConfigError(f"SCST: image {err.args[0]} of the training batch has no training references") from None
        if references is None:
            _ = self.cider  # raises the error that says what to do
        hard = model.attention_kind == "hard"
        decoder = model.decoder
        with _eval_mode(decoder):  # dropout off: see the module's docstring
            sample_config = GenerationConfig(
                max_new_tokens=self.max_new_tokens, do_sample=True, attention_mode="sample" if hard else "expected"
            )
            sampled = model.generate(features=features.detach().repeat_interleave(K, 0), config=sample_config)
            greedy = model.generate(
                features=features.detach(), config=GenerationConfig(max_new_tokens=self.max_new_tokens)
            )
            # log p(sample): a teacher-forced pass over the samples (hard attention: at the sampled locations)
            captions = torch.cat([sampled.sequences.new_full((B * K, 1), Vocabulary.bos_id), sampled.sequences], 1)
            out = model(
                features.repeat_interleave(K, 0),
                captions,
                sampled.lengths + 1,
                static=static,
                **(dict(mode="sample", locations=sampled.locations) if hard else {}),
            )
        log_p = caption_log_likelihood(out.logits, captions[:, 1:], out.mask)  # (B*K,)
        if hard and self.location_gradient:
            log_p = log_p + (out.location_log_probs * out.mask).sum(1)

        vocab = model.vocab
        reward, sample_words = self.rewards(vocab, sampled.sequences, [r for r in references for _ in range(K)])
        greedy_reward, greedy_words = self.rewards(vocab, greedy.sequences, references)
        reward = torch.as_tensor(reward, dtype=torch.float32, device=log_p.device).view(B, K)
        greedy_reward = torch.as_tensor(greedy_reward, dtype=torch.float32, device=log_p.device)
        baseline = greedy_reward.unsqueeze(1).expand(B, K) if self.baseline == "greedy" else mean_of_others(reward)
        advantage = (reward - baseline).view(-1)
        loss = -(advantage * log_p).mean()
        logs = {
            "reward": reward.mean(),
            "baseline": baseline.mean(),
            "advantage": advantage.mean(),
            "advantage_std": advantage.std() if advantage.numel() > 1 else advantage.new_zeros(()),
            "greedy_cider": greedy_reward.mean(),
            "bad_endings": torch.tensor(bad_ending_rate(greedy_words), device=log_p.device),
            "sample_bad_endings": torch.tensor(bad_ending_rate(sample_words), device=log_p.device),
            "sample_words": torch.tensor(float(np.mean([len(w) for w in sample_words])), device=log_p.device),
        }
        state = {
            "sequences": sampled.sequences,
            "lengths": sampled.lengths,
            "locations": sampled.locations,
            "advantage": advantage,
        }  # the samples (row i: image i // K), for tests and tools
        return ObjectiveOutput(loss, B * K, logs, state)
