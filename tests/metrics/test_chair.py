"""CHAIR against hand-computed counts: COCO synonyms, plurals and compounds; shapes from the objects field."""

import json

import pytest

from captioning.errors import AnnotationError
from captioning.metrics.chair import (
    caption_objects,
    chair_images,
    chair_scores,
    read_instances,
    shapes_chair_images,
    singularize,
)


def test_words_fold_to_categories_through_synonyms_plurals_and_compounds():
    assert caption_objects("Two men eating hot dogs") == [("man", "person"), ("hot dog", "hot dog")]
    assert caption_objects("a teddy bear beside a bear") == [("teddy bear", "teddy bear"), ("bear", "bear")]
    assert caption_objects("a baby bird and puppies") == [("bird", "bird"), ("puppy", "dog")]
    assert caption_objects("the seat of the toilet") == [("toilet", "toilet")]  # not a chair
    assert caption_objects("Wine glasses on a dining table") == [
        ("wine glass", "wine glass"),
        ("table", "dining table"),
    ]
    assert caption_objects("a passenger train on the train tracks") == [("train", "train")]
    assert [singularize(w) for w in ("knives", "buses", "benches", "ponies", "sheep", "glass")] == [
        "knife",
        "bus",
        "bench",
        "pony",
        "sheep",
        "glass",
    ]


def instances_file(tmp_path, **drop):
    data = {
        "images": [{"id": 1}, {"id": 2}, {"id": 3}],
        "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}, {"id": 62, "name": "chair"}],
        "annotations": [
            {"image_id": 1, "category_id": 18},
            {"image_id": 1, "category_id": 18},
            {"image_id": 2, "category_id": 1},
        ],
    }
    for key in drop:
        data.pop(key)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    return path


def test_chair_counts_by_hand(tmp_path):
    instances = read_instances(instances_file(tmp_path))
    assert instances == {1: {"dog"}, 2: {"person"}, 3: set()}
    references = {1: ["a dog on a couch"], 2: ["a woman"], 3: ["an empty room"]}
    predictions = {
        1: "a dog and a dog on a sofa with a cat",  # dog, dog held; couch held (references); cat: hallucinated
        2: "a man eating a hot dog",  # person held; hot dog is not the dog category: hallucinated
        3: "an empty room",  # no mention
    }
    images = chair_images(predictions, references, instances)
    assert images[1]["hallucinated"] == ["cat"] and images[1]["mentioned"] == ["dog", "dog", "couch", "cat"]
    assert images[2]["hallucinated"] == ["hot dog"]
    assert images[3]["counts"] == [0, 0, 0, 1, 0, 0]
    scores = chair_scores(images)
    assert scores["CHAIR_i"] == pytest.approx(2 / 6)  # cat and hot dog of 6 mentions (repeats count)
    assert scores["CHAIR_s"] == pytest.approx(2 / 3)
    assert scores["CHAIR_object_recall"] == pytest.approx(3 / 3)  # dog, couch; person


def test_instances_without_categories_or_of_another_dataset_are_one_line(tmp_path):
    with pytest.raises(AnnotationError, match="no 'categories' list") as err:
        read_instances(instances_file(tmp_path, categories=True))
    assert "\n" not in str(err.value)
    with pytest.raises(AnnotationError, match="ids of another dataset"):
        chair_images({7: "a dog"}, {7: ["a dog"]}, read_instances(instances_file(tmp_path)))


def test_shapes_chair_against_the_objects_field():
    truth = {1: [("small", "red", "circle"), ("large", "blue", "square")], 2: [("large", "green", "cross")]}
    mentions = {
        1: [("small", "red", "circle"), ("large", "red", "circle"), ("small", "green", "square")],
        2: [("large", "green", "cross"), ("small", "yellow", "triangle")],
    }
    images = shapes_chair_images(mentions, truth)
    assert images[1]["errors"] == ["wrong_size", "wrong_colour"] and images[2]["errors"] == ["absent"]
    scores = chair_scores(images)
    assert scores["CHAIR_i"] == pytest.approx(3 / 5) and scores["CHAIR_s"] == 1.0
    assert scores["CHAIR_object_recall"] == pytest.approx(2 / 3)
    parts = [scores[f"CHAIR_i_{e}"] for e in ("absent", "wrong_colour", "wrong_size")]
    assert parts == pytest.approx([1 / 5, 1 / 5, 1 / 5]) and sum(parts) == pytest.approx(scores["CHAIR_i"])
