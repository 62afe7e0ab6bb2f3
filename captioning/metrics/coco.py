"""coco-caption scores through the COCO caption evaluation code (PyPI ``pycocoevalcap``).

Both sides are PTB-tokenised, then scored with BLEU-1..4, METEOR (Java), ROUGE-L, CIDEr (in fact
CIDEr-D) and, when asked and available, SPICE (Java). These are the numbers of the paper's Table 1
(there shown x100).

pycocoevalcap's PTBTokenizer runs Stanford's tokenizer in Java (:func:`java_tokenize` runs the same
command, quietly); :mod:`.ptb` gives the same tokens in pure Python. With ``tokenizer="auto"`` (the default) :class:`CocoScorer` uses Java when ``java`` is
on PATH and Python otherwise, so without Java BLEU, ROUGE-L and CIDEr (pure Python in pycocoevalcap)
are the same numbers, and METEOR and SPICE are reported unavailable (``"METEOR": None,
"METEOR_error": why``) instead of raising.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import threading
from collections.abc import Hashable, Mapping, Sequence

from captioning.metrics import languages
from captioning.metrics.languages import scoring_tokenizer

METRICS = ("BLEU", "METEOR", "ROUGE_L", "CIDEr")
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
        tokenizer: "java" (pycocoevalcap's PTBTokenizer), "python" (:mod:`.ptb`, the same tokens
            without Java) or "auto": Java when ``java`` is on PATH at the call, else Python.
            Without Java, a requested METEOR is ``None`` with ``"METEOR_error"``, like SPICE.

    ``scorer(references, predictions)`` with ``references: {image_id: [str, ...]}`` and
    ``predictions: {image_id: str}`` over exactly the same ids returns floats in pycocoevalcap's
    scale (0-1; CIDEr about 0-10): keys "BLEU-1".."BLEU-4", "METEOR", "ROUGE_L", "CIDEr".
    """

    def __init__(self, metrics: Sequence[str] = METRICS, spice: bool = False, tokenizer: str = "auto"):
        metrics = tuple(metrics)
        unknown = [m for m in metrics if m not in METRICS + ("SPICE",)]
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; choose from {list(METRICS + ('SPICE',))}")
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {list(TOKENIZERS)}")
        self.metrics = tuple(m for m in METRICS if m in metrics)  # canonical order
        self.spice = spice or "SPICE" in metrics
        self.tokenizer = tokenizer
        self._scorers: dict = {}  # name -> pycocoevalcap scorer, made on first use
        self.scored_tokens: str | None = None  # the last call's tokens: "ptb", or a tokenizer's name (languages.py)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scoring
    def __call__(self, references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str]) -> dict:
        return self.score_images(references, predictions)[0]

    def score_images(
        self, references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str]
    ) -> tuple[dict, dict]:
        """(the scores of ``__call__``, per image): per image, {"ids": the ids in order, each metric's
        list of per-image scores in that order ("BLEU-1".."BLEU-4", "METEOR", "ROUGE_L", "CIDEr"; CIDEr-D
        with the document frequencies of all these references), "tokens": (the PTB-tokenised
        references {id: [str]}, predictions {id: [str]})} (metrics/bootstrap.py resamples them)."""
        if not references:
            raise ValueError("no references to score against")
        _check_ids(references, predictions)
        for i, refs in references.items():
            if isinstance(refs, str) or not refs:
                raise ValueError(f"references[{i!r}] must be a non-empty list of captions")
        language = scoring_tokenizer(c for refs in references.values() for c in refs)  # None: PTB (English)
        meteor_reason = meteor_unavailable_reason() if "METEOR" in self.metrics else None
        if language is not None and meteor_reason is None and "METEOR" in self.metrics:
            meteor_reason = languages.meteor_reason(language)
        gts, res = self._tokenize(references, predictions, language)
        images: dict = {"ids": list(gts), "tokens": (gts, res)}
        with self._lock:
            scores: dict = {}
            for name in self.metrics:
                if name == "METEOR" and meteor_reason is not None:
                    scores.update({"METEOR": None, "METEOR_error": meteor_reason})
                    continue
                score, each = self._scorer(name).compute_score(gts, res, **({"verbose": 0} if name == "BLEU" else {}))
                if name == "BLEU":
                    scores.update({f"BLEU-{n + 1}": float(s) for n, s in enumerate(score)})
                    images.update({f"BLEU-{n + 1}": [float(x) for x in e] for n, e in enumerate(each)})
                else:
                    scores[name] = float(score)
                    images[name] = [float(x) for x in each]
            if self.spice:
                scores.update(self._spice(gts, res))
            self.scored_tokens = language.name if language is not None else languages.PTB  # what was counted
            if language is not None:  # (English scores keep their keys)
                scores["tokens"] = language.name
        return scores, images

    def _tokenize(self, references: Mapping, predictions: Mapping, language=None) -> tuple[dict, dict]:
        """PTB-tokenise both sides in one call (of Java, or of :mod:`.ptb`: the same tokens), or split
        them with ``language`` (a Tokenizer, for CJK references: metrics/languages.py).
        Returns ({id: [ref, ...]}, {id: [pred]})."""
        if language is not None:
            ids = list(references)
            return languages.tokenize_corpus(language, {i: list(references[i]) for i in ids}), {
                i: languages.tokenize_corpus(language, {0: [predictions[i]]})[0] for i in ids
            }
        java = shutil.which("java") is not None
        if self.tokenizer == "java" and not java:
            raise RuntimeError("tokenizer='java' needs Java (no 'java' on PATH); use tokenizer='auto' or 'python'")
        if self.tokenizer == "java" or (self.tokenizer == "auto" and java):
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
                detail = textwrap.shorten(f"{type(err).__name__}: {err}", 200, placeholder=" ...")
                reason = f"SPICE failed: {detail}"
        return {"SPICE": None, "SPICE_error": reason}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop METEOR's Java process (a later call starts a new one)."""
        with self._lock:
            meteor = self._scorers.pop("METEOR", None)
        if meteor is not None:
            meteor.close()

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
