"""What `captioning evaluate` prints: scores to four decimals (the --out report keeps every digit),
and no line of the scorers' own (Java's tokenizer report)."""

import json

from captioning.cli import main
from captioning.cli.evaluate import shown_scores


def test_shown_scores_have_four_decimals():
    scores = {"BLEU-4": 6.666666666222223e-17, "CIDEr": 1.234567, "METEOR": None, "METEOR_error": "no Java"}
    assert shown_scores(scores) == {"BLEU-4": 0.0, "CIDEr": 1.2346, "METEOR": None, "METEOR_error": "no Java"}


def test_evaluate_prints_rounded_scores_and_keeps_them_whole(tiny_checkpoint, tiny_shapes, tmp_path, capfd):
    report = tmp_path / "metrics.json"
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(tiny_shapes),
            "--split",
            "val",
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
            "--out",
            str(report),
        ]
    )
    out, err = capfd.readouterr()
    assert code == 0, err
    printed, kept = json.loads(out), json.loads(report.read_text())["scores"]
    numbers = {k: v for k, v in kept.items() if isinstance(v, float)}
    assert numbers and all(printed[k] == round(v, 4) for k, v in numbers.items())
    assert all(len(repr(printed[k]).split(".")[-1]) <= 4 and "e" not in repr(printed[k]) for k in numbers)
    assert "PTBTokenizer" not in err and "tokenized" not in err
