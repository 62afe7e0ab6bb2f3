"""The coco-caption metrics through the COCO caption evaluation code (PyPI ``pycocoevalcap``),
registered in METRICS: BLEU (BLEU-1..4), METEOR (Java), ROUGE_L, CIDEr (in fact CIDEr-D) and, when
asked, SPICE (Java). These are the numbers of the paper's Table 1 (there shown x100).

Both sides are PTB-tokenised once per scoring (:func:`coco_tokens`): in Java as pycocoevalcap's
PTBTokenizer does (:func:`java_tokenize`, quietly), or with the same tokens in pure Python
(:mod:`.ptb`); with the tokenizer "auto" (the default) Java when ``java`` is on PATH. Without Java,
BLEU, ROUGE-L and CIDEr (pure Python in pycocoevalcap) are the same numbers, and METEOR and SPICE are
reported unavailable (``"METEOR": None, "METEOR_error": why``) instead of raising. :class:`CocoScorer`
computes these metrics alone, outside the Evaluator.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from captioning.metrics import languages
from captioning.metrics.bootstrap import Statistic, mean_score, per_image_mean
from captioning.metrics.languages import scoring_tokenizer
from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult, build_metrics
from captioning.tokenizers import Tokenizer

#: the coco-caption metrics computed unless asked otherwise (SPICE: when asked)
COCO_METRICS = ("BLEU", "METEOR", "ROUGE_L", "CIDEr")
TOKENIZERS = ("auto", "java", "python")


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


@dataclass
class CocoTokens:
    """The tokens the coco-caption metrics score: ``references`` {id: [str]} and ``predictions``
    {id: [str]} (one each), PTB-tokenised or split by ``language`` (CJK references: metrics/languages.py)."""

    references: dict
    predictions: dict
    language: Tokenizer | None = None

    @property
    def name(self) -> str:
        """What was counted: "ptb", or the language's tokenizer."""
        return self.language.name if self.language is not None else languages.PTB


def coco_tokens(references: Mapping, predictions: Mapping, tokenizer: str = "auto") -> CocoTokens:
    """Both sides' tokens in one call: the PTB tokenizer of ``tokenizer`` ("java", "python" or "auto":
    Java where ``java`` is on PATH), or the language's for mostly-CJK references. ValueError unless
    ``predictions`` covers exactly the ids of ``references``, each with a non-empty list of captions."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {list(TOKENIZERS)}")
    if not references:
        raise ValueError("no references to score against")
    _check_ids(references, predictions)
    for i, refs in references.items():
        if isinstance(refs, str) or not refs:
            raise ValueError(f"references[{i!r}] must be a non-empty list of captions")
    language = scoring_tokenizer(c for refs in references.values() for c in refs)  # None: PTB (English)
    if language is not None:
        ids = list(references)
        gts = languages.tokenize_corpus(language, {i: list(references[i]) for i in ids})
        res = {i: languages.tokenize_corpus(language, {0: [predictions[i]]})[0] for i in ids}
        return CocoTokens(gts, res, language)
    java = shutil.which("java") is not None
    if tokenizer == "java" and not java:
        raise RuntimeError("tokenizer='java' needs Java (no 'java' on PATH); use tokenizer='auto' or 'python'")
    if tokenizer == "java" or (tokenizer == "auto" and java):
        tokenize = java_tokenize
    else:
        from captioning.metrics.ptb import tokenize_corpus as tokenize

    def clean(text) -> str:  # one line per caption: the tokenizer reads the file line by line
        if not isinstance(text, str):
            raise ValueError(f"captions must be strings, got {type(text).__name__}: {text!r}")
        return " ".join(text.split())

    ids = list(references)
    both = {("ref", k): [{"caption": clean(c)} for c in references[i]] for k, i in enumerate(ids)}
    both.update({("pred", k): [{"caption": clean(predictions[i])}] for k, i in enumerate(ids)})
    tokens = tokenize(both)
    return CocoTokens(
        {i: tokens[("ref", k)] for k, i in enumerate(ids)}, {i: tokens[("pred", k)] for k, i in enumerate(ids)}
    )


# --------------------------------------------------------------------------- the registered metrics
class CocoMetric(Metric):
    """What the coco-caption metrics share: chosen by name (``optional``), scored on the tokens of
    :func:`coco_tokens`, computed once per scoring for all of them (the "tokenizer" option)."""

    optional = True

    def tokens(self, captions: Captions) -> CocoTokens:
        tokenizer = self.options.get("tokenizer", "auto")
        return captions.shared(
            ("coco_tokens", tokenizer), lambda: coco_tokens(captions.references, captions.predictions, tokenizer)
        )

    def per_image_scores(
        self, captions: Captions, tokens: CocoTokens, name: str, score: float, each, statistic: str | None = None
    ) -> MetricResult:
        """The corpus ``score``, the per-image scores ``each`` (their column and, the corpus score
        being their mean, the statistic named ``statistic`` or ``name``) and the note "tokens"."""
        each = [float(x) for x in each]
        return MetricResult(
            scores={name: float(score)},
            notes={"tokens": tokens.name},
            statistics={statistic or name: Statistic(per_image_mean(each), mean_score)},
            per_image={name: each},
            rows={i: {name: v} for i, v in zip(captions.ids, each)},
        )


#: pycocoevalcap's BleuScorer constants (bleu_scorer.py: compute_score)
_TINY, _SMALL = 1e-15, 1e-9


@METRICS.register("BLEU")
class Bleu(CocoMetric):
    """BLEU-1..4 (pycocoevalcap's BleuScorer, its "closest" reference length)."""

    def score(self, captions: Captions) -> MetricResult:
        from pycocoevalcap.bleu.bleu import Bleu as CocoBleu

        tokens = self.tokens(captions)
        score, each = CocoBleu(4).compute_score(tokens.references, tokens.predictions, verbose=0)
        values = bleu_statistics(tokens.references, tokens.predictions, captions.ids)
        result = MetricResult(notes={"tokens": tokens.name})
        for n in range(1, 5):
            result.scores[f"BLEU-{n}"] = float(score[n - 1])
            result.per_image[f"BLEU-{n}"] = [float(x) for x in each[n - 1]]
            result.statistics[f"BLEU-{n}"] = Statistic(values, bleu_score(n))
        result.rows = {i: {"BLEU-4": v} for i, v in zip(captions.ids, result.per_image["BLEU-4"])}
        return result


def bleu_statistics(references: Mapping, predictions: Mapping, ids: Sequence) -> np.ndarray:
    """(N, 10): per image, clipped matches for n = 1..4, n-gram counts for n = 1..4, the caption's
    length and its closest reference length, from tokenised ``references`` {id: [str]} and
    ``predictions`` {id: [str]} (pycocoevalcap's cook_refs / cook_test)."""
    from pycocoevalcap.bleu.bleu_scorer import cook_refs, cook_test

    rows = []
    for i in ids:
        comps = cook_test(predictions[i][0], cook_refs(references[i]))
        testlen = comps["testlen"]
        reflen = min((abs(r - testlen), r) for r in comps["reflen"])[1]
        rows.append([*comps["correct"], *comps["guess"], testlen, reflen])
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), 10)


def bleu_score(n: int) -> Callable[[np.ndarray], np.ndarray]:
    """Corpus BLEU-n of summed :func:`bleu_statistics` (..., 10), as pycocoevalcap computes it (its
    smoothing constants included): on every image, coco-caption's number."""

    def score(s: np.ndarray) -> np.ndarray:
        bleu = np.ones(s.shape[:-1])
        for k in range(n):
            bleu = bleu * (s[..., k] + _TINY) / (s[..., 4 + k] + _SMALL)
        bleu = bleu ** (1.0 / n)
        ratio = (s[..., 8] + _TINY) / (s[..., 9] + _SMALL)
        with np.errstate(divide="ignore", over="ignore"):
            penalty = np.where(ratio < 1, np.exp(1 - 1 / np.minimum(ratio, 1)), 1.0)
        return bleu * penalty

    return score


@METRICS.register("METEOR")
class Meteor(CocoMetric):
    """METEOR (Java; without it, or for CJK references, None and "METEOR_error": why). compare
    resamples the mean of its per-image scores, ``METEOR_image_mean``: the corpus METEOR is Java's
    aggregate of every segment's matches, which per-image scores cannot recombine."""

    validation = False  # a JVM, about 7 s to start

    def __init__(self, name: str, options: Mapping | None = None):
        super().__init__(name, options)
        self._meteor: _SafeMeteor | None = None  # started on first use, kept until close()
        self._lock = threading.Lock()

    def score(self, captions: Captions) -> MetricResult:
        tokens = self.tokens(captions)
        reason = meteor_unavailable_reason()
        if reason is None and tokens.language is not None:
            reason = languages.meteor_reason(tokens.language)
        if reason is not None:
            return MetricResult(notes={"METEOR": None, "METEOR_error": reason, "tokens": tokens.name})
        with self._lock:
            if self._meteor is None:
                self._meteor = _SafeMeteor()
            score, each = self._meteor.compute_score(tokens.references, tokens.predictions)
        return self.per_image_scores(captions, tokens, "METEOR", score, each, statistic="METEOR_image_mean")

    def close(self) -> None:
        with self._lock:
            meteor, self._meteor = self._meteor, None
        if meteor is not None:
            meteor.close()


@METRICS.register("ROUGE_L")
class RougeL(CocoMetric):
    """ROUGE-L: the mean of the images' ROUGE-L (pycocoevalcap's Rouge)."""

    validation = False

    def score(self, captions: Captions) -> MetricResult:
        from pycocoevalcap.rouge.rouge import Rouge

        tokens = self.tokens(captions)
        score, each = Rouge().compute_score(tokens.references, tokens.predictions)
        return self.per_image_scores(captions, tokens, "ROUGE_L", score, each)


@METRICS.register("CIDEr")
class Cider(CocoMetric):
    """CIDEr-D (pycocoevalcap's Cider): the mean of the images' CIDEr-D, the document frequencies
    those of the scored references (kept for every resample of ``compare``; docs/EVALUATION.md)."""

    def score(self, captions: Captions) -> MetricResult:
        from pycocoevalcap.cider.cider import Cider as CocoCider

        tokens = self.tokens(captions)
        score, each = CocoCider().compute_score(tokens.references, tokens.predictions)
        return self.per_image_scores(captions, tokens, "CIDEr", score, each)


@METRICS.register("SPICE")
class Spice(CocoMetric):
    """SPICE (Java and Stanford CoreNLP; where it cannot run, None and "SPICE_error": why)."""

    default = False  # --spice
    validation = False

    def score(self, captions: Captions) -> MetricResult:
        tokens = self.tokens(captions)
        reason = spice_unavailable_reason()
        if reason is None:
            try:
                from pycocoevalcap.spice.spice import Spice as CocoSpice

                score, _ = CocoSpice().compute_score(tokens.references, tokens.predictions)
                return MetricResult(scores={"SPICE": float(score)}, notes={"tokens": tokens.name})
            except Exception as err:  # Java out of memory, failed parse, ...
                detail = textwrap.shorten(f"{type(err).__name__}: {err}", 200, placeholder=" ...")
                reason = f"SPICE failed: {detail}"
        return MetricResult(notes={"SPICE": None, "SPICE_error": reason, "tokens": tokens.name})


class CocoScorer:
    """coco-caption scores of predicted captions against references, alone (the registered metrics
    BLEU, METEOR, ROUGE_L, CIDEr and SPICE above, without the Evaluator). Create once per run.

    METEOR and SPICE start a JVM (about 7 s for METEOR), kept between calls: reuse one CocoScorer
    across validation epochs and call :meth:`close` (or use it as a context manager) to stop it.

    Args:
        metrics: any of "BLEU" (gives BLEU-1..BLEU-4), "METEOR", "ROUGE_L", "CIDEr" ("SPICE" is
            the same as ``spice=True``).
        spice: also compute SPICE. It needs Stanford CoreNLP 3.6.0, which pycocoevalcap downloads
            on first use; offline (or if it fails for any other reason) the result holds
            ``"SPICE": None`` and ``"SPICE_error"``: the reason, instead of raising.
        tokenizer: "java" (pycocoevalcap's PTBTokenizer), "python" (:mod:`.ptb`, the same tokens
            without Java) or "auto": Java when ``java`` is on PATH at the call, else Python.
            Without Java, a requested METEOR is ``None`` with ``"METEOR_error"``, like SPICE.

    ``scorer(references, predictions)`` with ``references: {image_id: [str, ...]}`` and
    ``predictions: {image_id: str}`` over exactly the same ids returns floats in pycocoevalcap's
    scale (0-1; CIDEr about 0-10): keys "BLEU-1".."BLEU-4", "METEOR", "ROUGE_L", "CIDEr".
    """

    def __init__(self, metrics: Sequence[str] = COCO_METRICS, spice: bool = False, tokenizer: str = "auto"):
        metrics = tuple(metrics)
        unknown = [m for m in metrics if m not in COCO_METRICS + ("SPICE",)]
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; choose from {list(COCO_METRICS + ('SPICE',))}")
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {list(TOKENIZERS)}")
        self.metrics = tuple(m for m in COCO_METRICS if m in metrics)  # canonical order
        self.spice = spice or "SPICE" in metrics
        self.tokenizer = tokenizer
        self._metrics = build_metrics(self.metrics + (("SPICE",) if self.spice else ()), {"tokenizer": tokenizer})
        self.scored_tokens: str | None = None  # the last call's tokens: "ptb", or a tokenizer's name (languages.py)
        self._lock = threading.Lock()

    def __call__(self, references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str]) -> dict:
        return self.score_images(references, predictions)[0]

    def score_images(
        self, references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str]
    ) -> tuple[dict, dict]:
        """(the scores of ``__call__``, per image): per image, {"ids": the ids in order, each metric's
        list of per-image scores in that order ("BLEU-1".."BLEU-4", "METEOR", "ROUGE_L", "CIDEr"; CIDEr-D
        with the document frequencies of all these references), "tokens": (the tokenised
        references {id: [str]}, predictions {id: [str]})}."""
        tokens = coco_tokens(references, predictions, self.tokenizer)  # (its checks first)
        captions = Captions({i: predictions[i] for i in references}, dict(references))
        captions.shared(("coco_tokens", self.tokenizer), lambda: tokens)
        scores: dict = {}
        images: dict = {"ids": captions.ids, "tokens": (tokens.references, tokens.predictions)}
        with self._lock:
            for metric in self._metrics:
                result = metric.score(captions)
                scores.update(result.scores)
                scores.update({k: v for k, v in result.notes.items() if k != "tokens"})
                images.update(result.per_image)
            self.scored_tokens = tokens.name  # what was counted
            if tokens.language is not None:  # (English scores keep their keys)
                scores["tokens"] = tokens.language.name
        return scores, images

    def running(self) -> dict:
        """The scorers that hold a Java process now, by metric (METEOR's once it has scored)."""
        return {m.name: m._meteor for m in self._metrics if isinstance(m, Meteor) and m._meteor is not None}

    def close(self) -> None:
        """Stop METEOR's Java process (a later call starts a new one)."""
        for metric in self._metrics:
            metric.close()

    def __enter__(self) -> CocoScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def java_tokenize(captions_for_image: Mapping) -> dict:
    """pycocoevalcap's ``PTBTokenizer().tokenize``: the same Java command on the same lines, so the
    same tokens, with Java's report ("PTBTokenizer tokenized N tokens at ...") kept off the
    terminal (its stderr is read, and shown only when Java fails), and the lines written to a
    temporary file outside site-packages. ``{key: [{"caption": str}, ...]}`` -> ``{key: [str, ...]}``."""
    import subprocess
    import tempfile

    from pycocoevalcap.tokenizer import ptbtokenizer as ptb

    keys = [k for k, v in captions_for_image.items() for _ in range(len(v))]
    sentences = "\n".join(c["caption"].replace("\n", " ") for v in captions_for_image.values() for c in v)
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(sentences.encode())
    try:
        proc = subprocess.run(
            [
                "java",
                "-cp",
                ptb.STANFORD_CORENLP_3_4_1_JAR,
                "edu.stanford.nlp.process.PTBTokenizer",
                "-preserveLines",
                "-lowerCase",
                f.name,
            ],
            cwd=os.path.dirname(os.path.abspath(ptb.__file__)),
            capture_output=True,
        )
    finally:
        os.remove(f.name)
    if proc.returncode != 0:
        detail = " ".join(proc.stderr.decode(errors="replace").split())
        raise RuntimeError(f"the PTB tokenizer (Java) failed: {textwrap.shorten(detail, 200, placeholder=' ...')}")
    tokenized: dict = {}
    for k, line in zip(keys, proc.stdout.decode().split("\n")):
        tokenized.setdefault(k, []).append(" ".join(w for w in line.rstrip().split(" ") if w not in ptb.PUNCTUATIONS))
    return tokenized


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


def meteor_unavailable_reason() -> str | None:
    """None if METEOR can run here (Java is on PATH), else why not."""
    if shutil.which("java") is None:
        return "METEOR unavailable: needs Java (no 'java' on PATH)"
    return None


def spice_unavailable_reason() -> str | None:
    """None if SPICE can run here, else why not (checked without touching the network)."""
    if shutil.which("java") is None:
        return "SPICE unavailable: needs Java (no 'java' on PATH)"
    try:
        from pycocoevalcap.spice import get_stanford_models as g
    except ImportError as err:
        return f"SPICE unavailable: {err}"
    jar = os.path.join(g.SPICEDIR, g.SPICELIB, f"{g.JAR}.jar")
    if not os.path.exists(jar):
        return (
            f"SPICE unavailable: needs Stanford CoreNLP ({g.JAR}.jar, which pycocoevalcap downloads "
            f"from nlp.stanford.edu on first use) at {jar}"
        )
    return None
