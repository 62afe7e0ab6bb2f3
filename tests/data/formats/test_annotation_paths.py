"""Annotation files of any origin: image paths stay inside the images folder, ids are integers,
JSON of the wrong shape or nested without end is one line naming the file, and `prepare` on a file
with no usable image says so and exits 1."""

import json

import pytest

from captioning.cli import main
from captioning.data.formats.coco import load_coco
from captioning.data.formats.folder import load_folder
from captioning.data.formats.karpathy import load_karpathy
from captioning.errors import AnnotationError


def karpathy(tmp_path, **image):
    entry = {"filename": "a.jpg", "split": "train", "sentences": [{"raw": "a red circle"}], **image}
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": [entry]}))
    return path


def one_line(call, *fragments):
    with pytest.raises(AnnotationError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize(
    "filepath, filename",
    [("/etc", "passwd"), ("", "/etc/passwd"), ("..", "secret.jpg"), ("images/../..", "x.jpg"), ("", "..")],
)
def test_karpathy_paths_outside_the_images_folder_are_refused(tmp_path, filepath, filename):
    path = karpathy(tmp_path, filepath=filepath, filename=filename)
    one_line(lambda: load_karpathy(path), str(path), "images[0]", "outside the images folder")


def test_karpathy_paths_inside_are_normalised(tmp_path):
    [record] = load_karpathy(karpathy(tmp_path, filepath="val2014/./x/..", filename="a.jpg"))
    assert record.path == "val2014/a.jpg"


def test_karpathy_problems_are_listed_not_raised(tmp_path):
    problems = []
    assert load_karpathy(karpathy(tmp_path, filename="/abs.jpg"), problems=problems) == []
    assert len(problems) == 1 and "outside the images folder" in problems[0]


def coco_file(tmp_path, images, annotations):
    path = tmp_path / "captions_val2014.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


@pytest.mark.parametrize(
    "images, annotations, fragment",
    [
        (
            [{"id": 1, "file_name": "../../x.jpg"}],
            [{"image_id": 1, "caption": "a dog", "id": 9}],
            "outside the images folder",
        ),
        (
            [{"id": "1", "file_name": "x.jpg"}],
            [{"image_id": 1, "caption": "a dog", "id": 9}],
            "images[0].id: expected an integer",
        ),
        (
            [{"id": 1.5, "file_name": "x.jpg"}],
            [{"image_id": 1, "caption": "a dog", "id": 9}],
            "images[0].id: expected an integer",
        ),
        ([{"id": 1, "file_name": ["x.jpg"]}], [{"image_id": 1, "caption": "a dog", "id": 9}], "images[0].file_name"),
        (
            [{"id": 1, "file_name": "x.jpg"}],
            [{"image_id": "1", "caption": "a dog", "id": 9}],
            "annotations[0].image_id: expected an integer",
        ),
        (
            [{"id": 1, "file_name": "x.jpg"}],
            [{"image_id": 1, "caption": "a dog"}],
            "annotations[0]: expected an object with 'id'",
        ),
    ],
)
def test_coco_entries_of_the_wrong_type(tmp_path, images, annotations, fragment):
    path = coco_file(tmp_path, images, annotations)
    one_line(lambda: load_coco(path), str(path), fragment)


def test_coco_file_that_is_not_an_object(tmp_path):
    path = tmp_path / "captions_val2014.json"
    path.write_text("[1, 2, 3]")
    one_line(lambda: load_coco(path), str(path), "expected a JSON object")


@pytest.mark.parametrize(
    "content, fragment",
    [
        ({"train": ["1"]}, "expected a list of cocoids"),
        ({"images": [{"cocoid": "7", "split": "train"}]}, "cocoid: expected an integer"),
    ],
)
def test_coco_split_files_with_ids_that_are_not_integers(tmp_path, content, fragment):
    path = coco_file(tmp_path, [{"id": 1, "file_name": "x.jpg"}], [{"image_id": 1, "caption": "a dog", "id": 9}])
    split = tmp_path / "split.json"
    split.write_text(json.dumps(content))
    one_line(lambda: load_coco(path, split_file=split), str(split), fragment)


@pytest.mark.parametrize("image", ["/etc/passwd", "../up.jpg"])
def test_folder_rows_outside_the_images_folder(tmp_path, image):
    path = tmp_path / "captions.jsonl"
    path.write_text(json.dumps({"image": image, "caption": "a dog"}) + "\n")
    one_line(lambda: load_folder(path), str(path), "line 1", "outside the images folder")


def test_json_nested_without_end_is_one_line(tmp_path):
    path = tmp_path / "dataset.json"
    path.write_text("[" * 200000 + "]" * 200000)
    one_line(lambda: load_karpathy(path), str(path), "nested too deeply")


def test_prepare_on_a_file_with_no_usable_image(tmp_path, capsys):
    path = tmp_path / "dataset.json"
    path.write_text(
        json.dumps({"images": [{"filename": "/abs.jpg", "split": "train", "sentences": [{"raw": "a dog"}]}]})
    )
    assert main(["prepare", "--annotations", str(path), "--images-root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no usable images" in err and "Traceback" not in err
