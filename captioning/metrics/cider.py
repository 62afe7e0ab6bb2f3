"""In-process CIDEr-D for self-critical training rewards (Rennie et al. 2017), equal to pycocoevalcap's ``Cider``.

The order-n vector of a sentence holds, for each of its n-grams g (n = 1..4), ``tf(g) * (log(N) -
log(max(1, df(g))))``, N being the number of images and df(g) the number of images whose references
contain g. Between candidate c and reference r (vectors c_n, r_n)::

    sim_n(c, r) = sum_g min(c_n[g], r_n[g]) * r_n[g] / (|c_n| |r_n|) * exp(-(l_c - l_r)^2 / (2 sigma^2))
    CIDEr-D(c)  = 10 * mean over n of (mean over the references r of sim_n(c, r))

with sigma = 6 and l the sentence's number of bigrams, as pycocoevalcap counts it. :class:`CiderD`
takes df and N once from the training references, where pycocoevalcap takes them from the corpus it
scores, and :meth:`CiderD.state_dict` stores them in a checkpoint, so every process and a resumed run
give the same rewards. Built from exactly the reference sets it scores, it gives pycocoevalcap's
per-image scores. :func:`tokenize` gives its tokens from raw captions.

The derivation in full: docs/EVALUATION.md, "CIDEr-D, in process"; why a call is fast (vectorised
n-gram ids, one hash lookup per order, ``searchsorted`` joins) and its speed: docs/PERFORMANCE.md,
"The benchmark".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain, count, repeat

import numpy as np

__all__ = ["CiderD", "tokenize"]

_FORMAT = "CiderD-1"


def tokenize(captions: Sequence[str]) -> list:
    """Raw captions -> the space-separated tokens :class:`CiderD` takes, as pycocoevalcap
    tokenises them (PTB tokens, lower case, punctuation removed; pure Python, see :mod:`.ptb`)."""
    from captioning.metrics.ptb import tokenize_corpus

    return tokenize_corpus({0: list(captions)})[0]


class CiderD:
    """CIDEr-D with document frequencies fixed from a reference corpus.

    Args:
        references: the corpus, one entry per image: its reference captions, already tokenised
            (space-separated tokens, e.g. from :func:`tokenize`).
        n: the largest n-gram order (pycocoevalcap: 4).
        sigma: the standard deviation of the length penalty (pycocoevalcap: 6.0).

    ``scores(candidates, references)`` scores candidate i against ``references[i]``; those need
    not be in the corpus. The corpus index takes about 30 bytes per distinct n-gram (COCO's
    training captions have a few million); :meth:`state_dict` holds two ints per n-gram.
    """

    def __init__(self, references: Sequence[Sequence[str]], n: int = 4, sigma: float = 6.0):
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if not len(references):
            raise ValueError("CiderD needs a reference corpus of at least one image")
        self.n, self.sigma, self.num_images = int(n), float(sigma), len(references)
        sets = [_reference_set(refs) for refs in references]
        sentences = [caption.split() for refs in sets for caption in refs]
        image_of_sentence = np.repeat(np.arange(len(sets)), [len(refs) for refs in sets])
        self.vocabulary = list(dict.fromkeys(chain.from_iterable(sentences)))
        self._word_id = dict(zip(self.vocabulary, count()))
        sentence, remaining = _word_positions(sentences)
        word_ids = np.fromiter(
            map(self._word_id.__getitem__, chain.from_iterable(sentences)), dtype=np.int64, count=len(sentence)
        )
        # per order: the sorted keys of the corpus's k-grams (for k = 1 the word ids) and their df
        self._keys, self._df = [], []
        for k, (ids, keys) in enumerate(_ngram_ids(word_ids, remaining, self.n, len(self.vocabulary)), 1):
            keys = np.arange(len(self.vocabulary), dtype=np.int64) if k == 1 else keys
            at = ids >= 0
            image_ngram = np.unique(image_of_sentence[sentence[at]] * len(keys) + ids[at])  # once per image
            self._keys.append(keys)
            self._df.append(np.bincount(image_ngram % len(keys), minlength=len(keys)))
        self._finish()

    def _finish(self) -> None:
        self._index = [None] + [_KeyIndex(keys) for keys in self._keys[1:]]
        self._log_num_images = math.log(float(self.num_images))

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """The document frequencies as plain lists, ints, floats and strings (JSON-able, and
        loadable with ``torch.load(weights_only=True)``).

        ``vocabulary``: the corpus's words (word id = position); ``ngram_keys[k - 2]`` for k = 2..n:
        the corpus's k-grams, sorted, each as ``id of its (k-1)-gram prefix * (len(vocabulary) +
        1) + id of its last word``, a k-gram's id being its position here (a unigram's, its word
        id); ``document_frequency[k - 1]`` for k = 1..n: per k-gram id, the number of images whose
        references hold it; ``num_images``, ``n``, ``sigma``.
        """
        return {
            "format": _FORMAT,
            "n": self.n,
            "sigma": self.sigma,
            "num_images": self.num_images,
            "vocabulary": list(self.vocabulary),
            "ngram_keys": [keys.tolist() for keys in self._keys[1:]],
            "document_frequency": [df.tolist() for df in self._df],
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> CiderD:
        """The CiderD that :meth:`state_dict` gave ``state``; it scores identically."""
        if state.get("format") != _FORMAT:
            raise ValueError(f"not a CiderD state dict (format {state.get('format')!r}, expected {_FORMAT!r})")
        self = cls.__new__(cls)
        self.n, self.sigma, self.num_images = int(state["n"]), float(state["sigma"]), int(state["num_images"])
        self.vocabulary = list(state["vocabulary"])
        self._word_id = dict(zip(self.vocabulary, count()))
        self._keys = [np.arange(len(self.vocabulary), dtype=np.int64)]
        self._keys += [np.asarray(keys, dtype=np.int64) for keys in state["ngram_keys"]]
        self._df = [np.asarray(df, dtype=np.int64) for df in state["document_frequency"]]
        if len(self._keys) != self.n or [len(d) for d in self._df] != [len(k) for k in self._keys]:
            raise ValueError("CiderD state dict: ngram_keys and document_frequency do not match n")
        self._finish()
        return self

    # ------------------------------------------------------------------ scoring
    def scores(self, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
        """CIDEr-D of each candidate against its references.

        Args:
            candidates: B tokenised captions (space-separated tokens).
            references: B reference sets, each a non-empty sequence of tokenised captions;
                candidate i is scored against ``references[i]``. Equal sets (the usual case: the
                samples of one image) are vectorised once.

        Returns a (B,) float64 array, on pycocoevalcap's scale (0 to about 10).
        """
        if len(candidates) != len(references):
            raise ValueError(f"{len(candidates)} candidates but {len(references)} reference sets")
        if not all(isinstance(c, str) for c in candidates):
            raise TypeError("candidates must be str (space-separated tokens)")
        reference_sets: dict = {}  # distinct set -> index
        set_of = np.fromiter(
            (reference_sets.setdefault(_reference_set(refs), len(reference_sets)) for refs in references),
            dtype=np.int64,
            count=len(references),
        )
        if any(not refs for refs in reference_sets):
            raise ValueError("every candidate needs at least one reference")
        set_size = np.fromiter(map(len, reference_sets), dtype=np.int64, count=len(reference_sets))
        sentences = [c.split() for c in candidates] + [r.split() for refs in reference_sets for r in refs]
        vectors = self._vectors(sentences)

        # pair p = (candidate i, j-th reference of its set), in order of i then j
        pairs_of = set_size[set_of]
        pair_candidate = np.repeat(np.arange(len(candidates)), pairs_of)
        first_reference = len(candidates) + np.cumsum(set_size) - set_size  # sentence index, per set
        pair_reference = np.repeat(first_reference[set_of], pairs_of) + _ranges(pairs_of)
        similarity = self._overlaps(vectors, set_of, set_size)  # (P, n)
        norms = vectors["norm"][pair_candidate] * vectors["norm"][pair_reference]
        np.divide(similarity, norms, out=similarity, where=norms != 0)
        length = np.fromiter(map(len, sentences), dtype=np.float64, count=len(sentences))
        length = np.maximum(length - 1, 0)  # pycocoevalcap's: the number of bigrams
        delta = length[pair_candidate] - length[pair_reference]
        similarity *= np.exp(-(delta**2) / (2 * self.sigma**2))[:, None]
        total = np.bincount(pair_candidate, weights=similarity.mean(axis=1), minlength=len(candidates))
        return total / np.maximum(pairs_of, 1) * 10.0

    def _vectors(self, sentences: list) -> dict:
        """Sparse tf-idf vectors of S sentences (lists of words).

        Returns a dict of: per entry, (E,) arrays sorted by (sentence, order, n-gram): ``sentence``,
        ``key`` (``(order - 1) * stride + the n-gram's id in this batch``) and ``weight`` (tf *
        idf); ``norm`` (S, n), each sentence's vector norm per order; ``stride``.
        """
        sentence, remaining = _word_positions(sentences)
        words = list(chain.from_iterable(sentences))
        batch_words = list(dict.fromkeys(words))
        word_ids = np.fromiter(
            map(dict(zip(batch_words, count())).__getitem__, words), dtype=np.int64, count=len(words)
        )
        corpus_word_id = np.fromiter(
            map(self._word_id.get, batch_words, repeat(-1)), dtype=np.int64, count=len(batch_words)
        )
        orders = _ngram_ids(word_ids, remaining, self.n, len(batch_words))
        stride = max([len(batch_words)] + [len(keys) for _, keys in orders[1:]])
        sentence_of, key, idf = [], [], []
        corpus_id = corpus_word_id  # of the batch's distinct k-grams: their id in the corpus, or -1
        for k, (ids, batch_keys) in enumerate(orders, 1):
            if k > 1:  # a k-gram is in the corpus if its prefix is and (prefix, last word) is there
                prefix, last = np.divmod(batch_keys, len(batch_words) + 1)
                prefix, last = corpus_id[prefix], corpus_word_id[last]
                known = (prefix >= 0) & (last >= 0)
                corpus_id = np.full(len(batch_keys), -1, dtype=np.int64)
                corpus_id[known] = self._index[k - 1].find(prefix[known] * (len(self.vocabulary) + 1) + last[known])
            df = np.where(corpus_id >= 0, self._df[k - 1][np.maximum(corpus_id, 0)], 0)
            at = ids >= 0
            sentence_of.append(sentence[at])
            key.append((k - 1) * stride + ids[at])
            idf.append((self._log_num_images - np.log(np.maximum(df, 1).astype(np.float64)))[ids[at]])
        span = self.n * stride
        entries, first, tf = np.unique(
            np.concatenate(sentence_of) * span + np.concatenate(key), return_index=True, return_counts=True
        )
        entry_sentence, entry_key = np.divmod(entries, span)
        weight = tf * np.concatenate(idf)[first]
        norm = np.sqrt(
            np.bincount(
                entry_sentence * self.n + entry_key // stride, weights=weight**2, minlength=len(sentences) * self.n
            )
        ).reshape(len(sentences), self.n)
        return {"sentence": entry_sentence, "key": entry_key, "weight": weight, "norm": norm, "stride": stride}

    def _overlaps(self, vectors: dict, set_of: np.ndarray, set_size: np.ndarray) -> np.ndarray:
        """(P, n): sum over the shared n-grams g of min(c[g], r[g]) * r[g], for each pair p
        (candidate i, j-th reference of its set) in order of i then j.

        The candidates' entries are joined with their set's reference entries, sorted by (set,
        n-gram): an n-gram of a candidate meets the same n-gram in each reference that has it.
        """
        sentence, key, weight, stride = vectors["sentence"], vectors["key"], vectors["weight"], vectors["stride"]
        span, num_candidates = self.n * stride, len(set_of)
        first_reference = np.cumsum(set_size) - set_size  # among the reference sentences, per set
        set_of_reference = np.repeat(np.arange(len(set_size)), set_size)
        candidate = np.flatnonzero(sentence < num_candidates)  # entries
        reference = np.flatnonzero(sentence >= num_candidates)
        reference_key = set_of_reference[sentence[reference] - num_candidates] * span + key[reference]
        by_key = np.argsort(reference_key, kind="stable")
        reference_key, reference = reference_key[by_key], reference[by_key]
        candidate_key = set_of[sentence[candidate]] * span + key[candidate]
        low = np.searchsorted(reference_key, candidate_key, side="left")
        matches = np.searchsorted(reference_key, candidate_key, side="right") - low
        c = np.repeat(candidate, matches)
        r = reference[np.repeat(low, matches) + _ranges(matches)]
        pairs_of = set_size[set_of]
        first_pair = np.cumsum(pairs_of) - pairs_of  # per candidate
        j = sentence[r] - num_candidates - first_reference[set_of[sentence[c]]]  # reference's place in its set
        contribution = np.minimum(weight[c], weight[r]) * weight[r]
        num_pairs = int(pairs_of.sum())
        overlap = np.bincount(
            (first_pair[sentence[c]] + j) * self.n + key[c] // stride,
            weights=contribution,
            minlength=num_pairs * self.n,
        )
        return overlap.astype(np.float64).reshape(num_pairs, self.n)  # (float even when empty)


class _KeyIndex:
    """Where distinct int64 keys are in their array, found by a vectorised hash lookup (a sorted
    array's ``searchsorted`` makes ~20 cache-missing steps per key on a large corpus).

    Buckets (a multiplicative hash's top bits, about one key per bucket) list their keys'
    positions, grouped as in a CSR matrix: ``position[start[b]:start[b + 1]]``.
    """

    _MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio

    def __init__(self, keys: np.ndarray):
        self.keys = keys
        self.bits = max(len(keys).bit_length(), 1)
        bucket = self._bucket(keys)
        self.position = np.argsort(bucket, kind="stable").astype(np.int32)
        self.start = np.searchsorted(bucket[self.position], np.arange((1 << self.bits) + 1)).astype(np.int32)

    def _bucket(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * self._MULTIPLIER) >> np.uint64(64 - self.bits)).astype(np.int64)

    def find(self, needles: np.ndarray) -> np.ndarray:
        """The position of each needle in ``keys``, -1 where it is not there."""
        found = np.full(len(needles), -1, dtype=np.int64)
        bucket = self._bucket(needles)
        slot, stop = self.start[bucket], self.start[bucket + 1]
        active = np.flatnonzero(slot < stop)
        slot, stop = slot[active], stop[active]
        while len(active):  # one round per bucket entry: a few rounds
            position = self.position[slot]
            hit = self.keys[position] == needles[active]
            found[active[hit]] = position[hit]
            slot += 1
            go_on = ~hit & (slot < stop)
            active, slot, stop = active[go_on], slot[go_on], stop[go_on]
        return found


def _reference_set(references) -> tuple:
    if isinstance(references, str):
        raise TypeError("each reference set must be a sequence of captions, not a str")
    return tuple(references)


def _word_positions(sentences: Sequence[Sequence[str]]) -> tuple:
    """(sentence index, number of words from here to the sentence's end) of every word position:
    two (W,) int64 arrays over the sentences' words, concatenated."""
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    return np.repeat(np.arange(len(sentences)), lengths), np.repeat(lengths, lengths) - _ranges(lengths)


def _ngram_ids(word_ids: np.ndarray, remaining: np.ndarray, n: int, vocabulary_size: int) -> list:
    """Ids of the k-grams starting at each word position, k = 1..n.

    A k-gram's key is ``id of its (k-1)-gram prefix * (vocabulary_size + 1) + id of its last
    word``, its id the rank of its key among the distinct keys. Returns per order k a pair: (W,)
    int64 ids (-1 where no k-gram starts), and the sorted distinct keys (None for k = 1, whose
    ids are the word ids).
    """
    orders = [(word_ids, None)]
    for k in range(2, n + 1):
        valid = remaining >= k
        keys = orders[-1][0][valid] * (vocabulary_size + 1) + word_ids[k - 1 :][valid[: len(word_ids) - k + 1]]
        distinct, ids = np.unique(keys, return_inverse=True)
        k_ids = np.full(len(word_ids), -1, dtype=np.int64)
        k_ids[valid] = ids.reshape(-1)
        orders.append((k_ids, distinct))
    return orders


def _ranges(counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(c) for c in counts])``."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
