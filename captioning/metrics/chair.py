"""CHAIR: the objects a caption names that its image does not hold (Rohrbach et al., EMNLP 2018).

COCO: the procedure of the paper's released code (github.com/LisaAnne/Hallucination, utils/chair.py,
``CHAIR.caption_to_words``), step by step. The caption is lower-cased and split into words as
``nltk.word_tokenize`` (nltk 3.2.5) splits it (:func:`word_tokenize`, transcribed: no nltk data is
needed). Each word is singularised as ``pattern.en.singularize`` (Pattern 3.6) does, quirks kept (a
table, data/chair_singulars.txt, derived from pattern's source by tools/dev/chair_reference.py). Two
consecutive words that form one of its compounds are joined (:func:`double_words`). "seat" is dropped
from a caption that says "toilet". Each remaining word that is an entry of the synonym file
(data/chair_synonyms.txt, the paper's file, read as the released code reads it) is a mention of its
line's category. The objects an image holds: the categories of its instance annotations
(``instances_val2014.json``) and those its reference captions mention, by the same procedure. CHAIR-i,
CHAIR-s and object recall (not in the released code) are counted from these.

Shapes data (``shapes_chair``): the same counts with (size, colour, shape) mentions against the
image's objects field, each hallucinated mention told apart ("absent", "wrong_colour", "wrong_size").

Each step's rules and quirks, the counts, where this can differ from the released code (sentence
splits without punkt) and how it was checked: docs/EVALUATION.md, "Hallucination: CHAIR".
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np

from captioning.errors import AnnotationError
from captioning.metrics.bootstrap import Statistic
from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult

DATA = Path(__file__).with_name("data")
SYNONYMS_FILE = DATA / "chair_synonyms.txt"
SINGULARS_FILE = DATA / "chair_singulars.txt"

#: utils/chair.py's coco_double_words, in its order (its repeats left out)
_DOUBLE_WORDS = (
    "motor bike, motor cycle, air plane, traffic light, street light, traffic signal, stop light, fire hydrant, "
    "stop sign, parking meter, suit case, sports ball, baseball bat, baseball glove, tennis racket, wine glass, "
    "hot dog, cell phone, mobile phone, teddy bear, hair drier, potted plant, bow tie, laptop computer, "
    "stove top oven, home plate, train track"
).split(", ")
#: utils/chair.py's animal_words and vehicle_words: "baby dog" is a dog, "passenger jet" a jet (not a person)
_ANIMALS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub")
_VEHICLES = ("jet", "train")


# --------------------------------------------------------------------------- nltk 3.2.5's word_tokenize
# The Treebank tokenizer of nltk 3.2.5 (nltk/tokenize/treebank.py) with the rules word_tokenize puts
# first (nltk/tokenize/__init__.py: Unicode quotes, the final period before closing quotes). Python 2
# compiled its patterns without re.UNICODE: \d, \s and \b are ASCII here too (re.ASCII).
_A = re.ASCII
_STARTING_QUOTES = [
    (re.compile("([«“‘])"), r" \1 "),
    (re.compile(r"^\"", _A), r"``"),
    (re.compile(r"(``)", _A), r" \1 "),
    (re.compile(r'([ (\[{<])"', _A), r"\1 `` "),
]
_PUNCTUATION = [
    (re.compile(r"([^\.])(\.)([\]\)}>\"\'»”’ ]*)\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])", _A), r" \1 \2"),
    (re.compile(r"([:,])$", _A), r" \1 "),
    (re.compile(r"\.\.\.", _A), r" ... "),
    (re.compile(r"[;@#$%&]", _A), r" \g<0> "),
    (re.compile(r"([^\.])(\.)([\]\)}>\"\']*)\s*$", _A), r"\1 \2\3 "),
    (re.compile(r"[?!]", _A), r" \g<0> "),
    (re.compile(r"([^'])' ", _A), r"\1 ' "),
]
_PARENS_BRACKETS = (re.compile(r"[\]\[\(\)\{\}\<\>]", _A), r" \g<0> ")
_DOUBLE_DASHES = (re.compile(r"--", _A), r" -- ")
_ENDING_QUOTES = [
    (re.compile("([»”’])"), r" \1 "),
    (re.compile(r'"', _A), " '' "),
    (re.compile(r"(\S)(\'\')", _A), r"\1 \2 "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') ", _A), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", _A), r"\1 \2 "),
]
_CONTRACTIONS = [
    re.compile(p, _A)
    for p in (
        r"(?i)\b(can)(?#X)(not)\b",
        r"(?i)\b(d)(?#X)('ye)\b",
        r"(?i)\b(gim)(?#X)(me)\b",
        r"(?i)\b(gon)(?#X)(na)\b",
        r"(?i)\b(got)(?#X)(ta)\b",
        r"(?i)\b(lem)(?#X)(me)\b",
        r"(?i)\b(mor)(?#X)('n)\b",
        r"(?i)\b(wan)(?#X)(na)\s",
        r"(?i) ('t)(?#X)(is)\b",
        r"(?i) ('t)(?#X)(was)\b",
    )
]
#: where punkt would end a sentence: ".", "?" or "!" (not an ellipsis), closing quotes or brackets, white space
_SENTENCE_END = re.compile(r"(?<!\.)[.?!][\"')\]}]*(?=\s+\S)")


def treebank_tokenize(text: str) -> list[str]:
    """nltk 3.2.5's ``TreebankWordTokenizer().tokenize`` with ``word_tokenize``'s added rules."""
    for regexp, substitution in _STARTING_QUOTES + _PUNCTUATION + [_PARENS_BRACKETS, _DOUBLE_DASHES]:
        text = regexp.sub(substitution, text)
    text = f" {text} "
    for regexp, substitution in _ENDING_QUOTES:
        text = regexp.sub(substitution, text)
    for regexp in _CONTRACTIONS:
        text = regexp.sub(r" \1 \2 ", text)
    return text.split()


def sentences(text: str) -> list[str]:
    """``text`` split where punkt would end a sentence (as :data:`_SENTENCE_END` approximates it)."""
    found, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        found.append(text[start : match.end()])
        start = match.end()
    found.append(text[start:])
    return found


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize`` (3.2.5): :func:`sentences`, then each sentence's Treebank tokens."""
    return [token for sentence in sentences(text) for token in treebank_tokenize(sentence)]


# --------------------------------------------------------------------------- the released code's tables
@cache
def _synonym_lines(path: str = str(SYNONYMS_FILE)) -> tuple[tuple[str, ...], ...]:
    """The synonym file's lines as the released code splits them (``line.strip().split(", ")``)."""
    lines = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        lines.append(tuple(line.strip().split(", ")))
    return tuple(lines)


@cache
def coco_synonyms(path: str = str(SYNONYMS_FILE)) -> dict[str, str]:
    """entry -> the COCO category it names (its line's first entry; an entry of two lines names the later)."""
    return {entry: line[0] for line in _synonym_lines(path) for entry in line}


def coco_objects() -> frozenset[str]:
    """Every entry of the synonym file, as the released code's ``mscoco_objects`` (" motor bike" included)."""
    return frozenset(coco_synonyms())


@cache
def double_words() -> dict[str, str]:
    """utils/chair.py's ``double_word_dict``: two singularised words -> the word they are read as."""
    table = {w: w for w in _DOUBLE_WORDS}
    for animal in _ANIMALS:
        table[f"baby {animal}"] = table[f"adult {animal}"] = animal
    for vehicle in _VEHICLES:
        table[f"passenger {vehicle}"] = vehicle
    table.update({"bow tie": "tie", "toilet seat": "toilet", "wine glas": "wine glass"})
    return table


@cache
def _singulars(path: str = str(SINGULARS_FILE)) -> dict[str, str]:
    table = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            word, singular = line.split("\t")
            table[word] = singular
    return table


def singularize(word: str) -> str:
    """``pattern.en.singularize(word)`` (Pattern 3.6) for every word whose singular, or which itself, CHAIR
    looks up (data/chair_singulars.txt); any other word comes back as it is (no object either way)."""
    return _singulars().get(word, word)


def caption_objects(caption: str) -> list[tuple[str, str]]:
    """(word, category) of each COCO object mention in ``caption``, in order, repeats kept: the released
    code's ``caption_to_words`` (its ``words`` and ``node_words``)."""
    words = [singularize(w) for w in word_tokenize(caption.lower())]
    doubles, joined, i = double_words(), [], 0
    while i < len(words):
        pair = " ".join(words[i : i + 2])
        if pair in doubles:
            joined.append(doubles[pair])
            i += 2
        else:
            joined.append(words[i])
            i += 1
    if "toilet" in joined and "seat" in joined:  # "the seat of the toilet" is not a chair
        joined = [w for w in joined if w != "seat"]
    synonyms = coco_synonyms()
    return [(w, synonyms[w]) for w in joined if w in synonyms]


def read_instances(path: str | os.PathLike) -> dict[int, set[str]]:
    """image_id -> the COCO categories (names) of its instance annotations, for every image the file
    lists ("images") or annotates. One line of :class:`AnnotationError` for a file that is not a COCO
    instances file: unreadable JSON (files.py: read_json_file), or a field of another type (ids must
    be 64-bit integers, names strings, ``images`` and ``annotations`` lists of objects)."""
    from captioning.files import read_json_file

    data = read_json_file(path, AnnotationError, "a COCO instances file", missing="no such instances file")
    if not isinstance(data, dict) or not isinstance(data.get("categories"), list) or not data["categories"]:
        raise AnnotationError(
            f"{path}: no 'categories' list: a COCO instances file (instances_val2014.json) names its object categories"
        )
    if not isinstance(data.get("annotations"), list):
        raise AnnotationError(f"{path}: no 'annotations' list: expected a COCO instances file")
    images = data.get("images")
    if images is not None and not isinstance(images, list):
        raise AnnotationError(f"{path}: 'images' must be a list of objects with an 'id', got {type(images).__name__}")
    synonyms = coco_synonyms()
    names: dict[int, str] = {}
    for k, c in enumerate(data["categories"]):
        if not (isinstance(c, dict) and _is_id(c.get("id")) and isinstance(c.get("name"), str)):
            raise AnnotationError(f"{path}: categories[{k}]: expected an object with an integer 'id' and a 'name'")
        names[c["id"]] = synonyms.get(c["name"], c["name"])
    objects: dict[int, set[str]] = {}
    for k, image in enumerate(images or []):
        if isinstance(image, dict) and "id" in image:
            if not _is_id(image["id"]):
                raise AnnotationError(
                    f"{path}: images[{k}].id: expected a 64-bit integer, got {repr(image['id'])[:40]}"
                )
            objects.setdefault(image["id"], set())
    for k, ann in enumerate(data["annotations"]):
        if not (isinstance(ann, dict) and _is_id(ann.get("image_id")) and _is_id(ann.get("category_id"))):
            raise AnnotationError(
                f"{path}: annotations[{k}]: expected an integer 'image_id' and an integer 'category_id'"
            )
        if ann["category_id"] not in names:
            raise AnnotationError(
                f"{path}: annotations[{k}]: category_id {ann['category_id']} is not among the categories"
            )
        objects.setdefault(ann["image_id"], set()).add(names[ann["category_id"]])
    return objects


def _is_id(value) -> bool:
    """An id of a COCO file: an integer (not a boolean) that 64 bits hold."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


#: the per-image counts CHAIR is a ratio of (metrics/bootstrap.py sums them over a resample)
CHAIR_COUNTS = ("hallucinated", "mentions", "hallucinated_caption", "captions", "recalled", "objects")
SHAPES_ERRORS = ("absent", "wrong_colour", "wrong_size")


def chair_images(
    predictions: Mapping[int, str], references: Mapping[int, Sequence[str]], instances: Mapping[int, Iterable[str]]
) -> dict[int, dict]:
    """Per image of ``predictions``: {"mentioned": [category per mention], "hallucinated": [words],
    "objects": sorted categories it holds, and the counts of :data:`CHAIR_COUNTS`}. The image's
    objects: its ``instances`` categories and those its ``references`` mention. One line of
    :class:`AnnotationError` if some images are not in ``instances`` (ids of another dataset)."""
    missing = [i for i in predictions if i not in instances]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise AnnotationError(
            f"--instances: {len(missing)} of the {len(predictions)} images scored are not in the instances file "
            f"(ids of another dataset?): {shown}"
        )
    out = {}
    for i, caption in predictions.items():
        held = set(instances[i]) | {c for ref in references.get(i, ()) for _, c in caption_objects(ref)}
        mentions = caption_objects(caption)
        wrong = [w for w, c in mentions if c not in held]
        named = {c for _, c in mentions}
        out[i] = {
            "mentioned": [c for _, c in mentions],
            "hallucinated": wrong,
            "objects": sorted(held),
            "hallucinated_count": len(wrong),
            "counts": [len(wrong), len(mentions), int(bool(wrong)), 1, len(named & held), len(held)],
        }
    return out


def shapes_chair_images(mentions: Mapping[int, Sequence[tuple]], truth: Mapping[int, Sequence[tuple]]) -> dict:
    """CHAIR's per-image entries for the shapes data: ``mentions`` (image_id -> the caption's
    (size, colour, shape) triples, data/shapes/__init__.py's parse_objects) against ``truth`` (the objects
    field's triples). Counts: :data:`CHAIR_COUNTS` then one per :data:`SHAPES_ERRORS`."""
    out = {}
    for i, held_list in truth.items():
        held = {tuple(map(str.lower, t)) for t in held_list}
        said = [tuple(map(str.lower, t)) for t in mentions.get(i, ())]
        errors = []
        for size, colour, shape in said:
            if (size, colour, shape) in held:
                continue
            if any((c, s) == (colour, shape) for _, c, s in held):
                errors.append("wrong_size")
            elif any(s == shape for _, _, s in held):
                errors.append("wrong_colour")
            else:
                errors.append("absent")
        out[i] = {
            "mentioned": [" ".join(t) for t in said],
            "hallucinated": [" ".join(t) for t in said if t not in held],
            "errors": errors,
            "objects": sorted(" ".join(t) for t in held),
            "counts": [len(errors), len(said), int(bool(errors)), 1, len(set(said) & held), len(held)]
            + [errors.count(e) for e in SHAPES_ERRORS],
        }
    return out


def chair_from_counts(counts: np.ndarray) -> dict[str, np.ndarray]:
    """The scores of summed counts (..., 6 or 9): CHAIR_i, CHAIR_s, CHAIR_object_recall and, with the
    shapes errors, CHAIR_i_absent / _wrong_colour / _wrong_size (shares of all mentions; they sum
    to CHAIR_i). A ratio with nothing to count is 0."""
    counts = np.asarray(counts, dtype=np.float64)

    def ratio(a, b):
        return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b > 0)

    scores = {
        "CHAIR_i": ratio(counts[..., 0], counts[..., 1]),
        "CHAIR_s": ratio(counts[..., 2], counts[..., 3]),
        "CHAIR_object_recall": ratio(counts[..., 4], counts[..., 5]),
    }
    if counts.shape[-1] > 6:
        for k, name in enumerate(SHAPES_ERRORS):
            scores[f"CHAIR_i_{name}"] = ratio(counts[..., 6 + k], counts[..., 1])
    return scores


def chair_scores(images: Mapping[int, dict]) -> dict[str, float]:
    """CHAIR over the images of :func:`chair_images` or :func:`shapes_chair_images`."""
    if not images:
        return {}
    total = np.sum([v["counts"] for v in images.values()], axis=0)
    return {k: float(v) for k, v in chair_from_counts(total).items()}


def chair_score(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """One CHAIR score of summed counts (..., 6 or 9) (:func:`chair_from_counts`)."""
    return lambda s: chair_from_counts(s)[name]


@METRICS.register("CHAIR")
class Chair(Metric):
    """CHAIR-i, CHAIR-s and object recall: against a COCO instances file (``--instances``), or the
    shapes data's objects (with the kinds of error); compare resamples the per-image counts."""

    def score(self, captions: Captions) -> MetricResult | None:
        if captions.instances is not None:
            images = chair_images(captions.predictions, captions.references, captions.instances)
        else:
            from captioning.metrics.shapes_metrics import shapes_objects

            mentions, truth = shapes_objects(captions)
            images = shapes_chair_images(mentions, truth) if truth else {}
        if not images:
            return None
        result = MetricResult(scores=chair_scores(images))
        for i, entry in images.items():
            row = {
                "CHAIR_s": int(bool(entry["hallucinated"])),
                "CHAIR_i": float(chair_from_counts(entry["counts"])["CHAIR_i"]),
                "hallucinated": entry["hallucinated"],
                "mentioned": entry["mentioned"],
            }
            if "errors" in entry:
                row["hallucination_errors"] = entry["errors"]
            result.rows[i] = row
        if all(i in images for i in captions.ids):
            counts = np.asarray([images[i]["counts"] for i in captions.ids], dtype=np.float64)  # (N, 6 or 9)
            result.statistics = {name: Statistic(counts, chair_score(name)) for name in result.scores}
        return result
