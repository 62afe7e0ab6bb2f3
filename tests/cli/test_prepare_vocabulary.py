"""`captioning prepare` on a small set of one's own: the words the vocabulary loses are named, with
the flag that keeps them, instead of a bare percentage."""

import json

from captioning.cli import main
from tests.helpers import write_jpeg

CAPTIONS = [
    "a dog runs on the beach",
    "a brown dog jumps over a log",
    "two children build a sandcastle",
    "a red kite flies over the sea",
    "a dog catches a frisbee",
    "a woman reads a book on the beach",
    "a man surfs a big wave",
    "a boat sails near the harbour",
    "a cat sleeps on a blue sofa",
    "a girl eats an ice cream",
    "a bird sits on the fence",
    "a dog swims in the lake",
]


def own_set(root):
    """12 training images with one caption each, and one image each for val and test."""
    images = []
    for i, text in enumerate(CAPTIONS + ["a dog on the beach", "a cat on a sofa"]):
        write_jpeg(root / "images" / f"{i}.jpg", i)
        split = "train" if i < 12 else ("val" if i == 12 else "test")
        images.append(
            {
                "filepath": "images",
                "filename": f"{i}.jpg",
                "imgid": i,
                "split": split,
                "sentences": [{"raw": text, "tokens": text.split()}],
            }
        )
    path = root / "dataset_own.json"
    path.write_text(json.dumps({"images": images}))
    return path


def test_prepare_names_the_words_it_loses(tmp_path, capsys):
    assert main(["prepare", "--annotations", str(own_set(tmp_path)), "--no-image-check"]) == 0
    err = capsys.readouterr().err
    [warning] = [line for line in err.splitlines() if line.startswith("warning: ") and "<unk>" in line]
    assert "are seen fewer than 5 times and become <unk>: 'dog', 'on', " in warning  # the most frequent first
    keep = "on a small set keep them with --min-word-freq 1 (and --data.min_word_freq 1 when training)"
    assert f", ...; {keep}" in warning
    assert warning.startswith("warning: 44 of 46 distinct training words (69% of the training words)")


def test_no_warning_when_few_words_are_lost(tmp_path, capsys):
    assert main(["prepare", "--annotations", str(own_set(tmp_path)), "--no-image-check", "--min-word-freq", "1"]) == 0
    assert "<unk>" not in capsys.readouterr().err


def test_counts_of_one_are_singular(tmp_path, capsys):
    """ "the run's 1 steps": a count of one takes the singular."""
    from tests.helpers import make_karpathy

    annotations = make_karpathy(tmp_path, n_train=1, n_val=1, n_test=1, captions=1)
    assert main(["prepare", "--annotations", str(annotations), "--min-word-freq", "1"]) == 0
    out = capsys.readouterr().out
    assert "3 images," in out and "train" in out and "1 image " in out and "1 caption" in out
    assert "1 images" not in out and "1 captions" not in out
