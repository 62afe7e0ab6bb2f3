"""CHAIR: the objects a caption names that its image does not hold (Rohrbach et al., EMNLP 2018).

COCO: a caption's words are lower-cased, singularised and joined into the two-word compounds of the
paper's released code (github.com/LisaAnne/Hallucination, utils/chair.py): "hot dog" is the hot dog
category, not a dog; "teddy bear" is not a bear; "baby bird" is a bird, not a person ("baby" names
a person); "toilet seat" is a toilet. Each remaining word found in the synonym lists of the 80
categories (data/chair_synonyms.txt, the paper's file) is a mention of its category. The objects
an image holds are the categories of its instance annotations (``instances_val2014.json``) and the
categories its reference captions mention. Every mention counts, repeats included, as in the
released code:

* CHAIR-i = mentions of categories the image does not hold / all mentions;
* CHAIR-s = captions with at least one such mention / captions;
* object recall = the image's categories the caption mentions / the image's categories (summed over images).

Two choices differ from the released code, which needs nltk's tokenizer data and the ``pattern``
library: words are runs of letters (nltk's tokens, less punctuation and clitics), and plurals are
folded by :func:`singularize` (regular English plurals and the irregular ones of COCO's objects),
where the released code calls ``pattern.en.singularize``. The synonym file's entries are stripped of
spaces (the released code keeps " motor bike" with its leading space, so it never matches).

Shapes data (``shapes_chair``): the same counts with (size, colour, shape) mentions against the
image's objects field, and each hallucinated mention told apart: a shape the image does not hold
("absent"), a shape it holds but not in that colour ("wrong_colour"), a shape and colour it holds
but not at that size ("wrong_size").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np

from captioning.errors import AnnotationError

SYNONYMS_FILE = Path(__file__).with_name("data") / "chair_synonyms.txt"

#: two words read as one (utils/chair.py's coco_double_words and its special cases)
_DOUBLE_WORDS = (
    "motor bike, motor cycle, air plane, traffic light, street light, traffic signal, stop light, fire hydrant, "
    "stop sign, parking meter, suit case, sports ball, baseball bat, baseball glove, tennis racket, wine glass, "
    "hot dog, cell phone, mobile phone, teddy bear, hair drier, potted plant, bow tie, laptop computer, "
    "stove top oven, home plate, train track"
).split(", ")
_ANIMALS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub")
_VEHICLES = ("jet", "train")

#: plurals the suffix rules of :func:`singularize` get wrong
_IRREGULAR = {
    "men": "man",
    "women": "woman",
    "children": "child",
    "mice": "mouse",
    "geese": "goose",
    "feet": "foot",
    "teeth": "tooth",
    "knives": "knife",
    "oxen": "ox",
    "buses": "bus",
    "glasses": "glass",
    "tomatoes": "tomato",
    "potatoes": "potato",
    "calves": "calf",
    "wolves": "wolf",
    "shelves": "shelf",
    "loaves": "loaf",
    "halves": "half",
    "wives": "wife",
    "skis": "skis",
    "scissors": "scissors",
    "dice": "die",
}
_UNINFLECTED = {"sheep", "bison", "buffalo", "deer", "fish", "cattle", "moose", "species", "series", "people"}


def singularize(word: str) -> str:
    """The singular of an English noun (lower case): irregular plurals, then the suffix rules
    (-ies -> -y, -ches/-shes/-sses/-xes/-zes -> drop -es, -s -> drop it unless -ss, -us, -is)."""
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word in _UNINFLECTED or len(word) <= 2:
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "sses", "xes", "zzes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@cache
def coco_synonyms(path: str = str(SYNONYMS_FILE)) -> dict[str, str]:
    """word -> the COCO category it names, from the synonym file (first entry of a line: the category)."""
    table: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        words = [w.strip() for w in line.split(",") if w.strip()]
        for w in words:
            table[w] = words[0]  # a word of two lines names the later one, as in the released code
    return table


@cache
def _double_words() -> dict[str, str]:
    table = {w: w for w in _DOUBLE_WORDS}
    for animal in _ANIMALS:
        table[f"baby {animal}"] = table[f"adult {animal}"] = animal
    for vehicle in _VEHICLES:
        table[f"passenger {vehicle}"] = vehicle
    table.update({"bow tie": "tie", "toilet seat": "toilet", "wine glas": "wine glass"})
    return table


def caption_objects(caption: str) -> list[tuple[str, str]]:
    """(word, category) of each COCO object mention in ``caption``, in order, repeats kept."""
    words = [singularize(w) for w in re.findall(r"[a-z]+", caption.lower())]
    doubles, joined, i = _double_words(), [], 0
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
    instances file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise AnnotationError(f"{path}: no such instances file") from None
    except (OSError, ValueError) as err:
        raise AnnotationError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("categories"), list) or not data["categories"]:
        raise AnnotationError(
            f"{path}: no 'categories' list: a COCO instances file (instances_val2014.json) names its object categories"
        )
    if not isinstance(data.get("annotations"), list):
        raise AnnotationError(f"{path}: no 'annotations' list: expected a COCO instances file")
    synonyms = coco_synonyms()
    try:
        names = {c["id"]: synonyms.get(c["name"], c["name"]) for c in data["categories"]}
    except (TypeError, KeyError):
        raise AnnotationError(f"{path}: categories[]: expected objects with 'id' and 'name'") from None
    objects: dict[int, set[str]] = {}
    for image in data.get("images") or []:
        if isinstance(image, dict) and "id" in image:
            objects.setdefault(image["id"], set())
    for k, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or ann.get("category_id") not in names or "image_id" not in ann:
            raise AnnotationError(
                f"{path}: annotations[{k}]: expected an 'image_id' and a 'category_id' among the categories"
            )
        objects.setdefault(ann["image_id"], set()).add(names[ann["category_id"]])
    return objects


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
    (size, colour, shape) triples, data/shapes.py's parse_objects) against ``truth`` (the objects
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
