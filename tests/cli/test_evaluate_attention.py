"""evaluate on shapes data made with --holdout (novel pairs) and with --faithfulness."""

import json

from captioning.cli.main import main
from captioning.decoding.faithfulness import FRACTIONS


def test_evaluate_reports_novel_pairs_and_faithfulness(tiny_checkpoint, tmp_path, capsys):
    data = tmp_path / "held"
    args = ["--train", "6", "--val", "2", "--test", "4", "--test-novel", "6", "--holdout", "red:circle,blue:square"]
    assert main(["make-shapes", "--out", str(data), *args]) == 0
    out = tmp_path / "metrics.json"
    argv = ["evaluate", "--checkpoint", str(tiny_checkpoint), "--annotations", str(data / "dataset_shapes.json")]
    code = main(argv + ["--faithfulness", "--faithfulness-images", "3", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    novel = report["novel_pairs"]
    assert novel["images"] == 6 and novel["objects"] >= 6  # each test_novel image holds a held-out pair
    assert novel["novel_pairs"] == ["red:circle", "blue:square"]
    named = novel["recall"] * novel["objects"]
    substituted = sum(novel["substituted_colour"].values()) + sum(novel["substituted_shape"].values())
    assert round(named) + substituted + novel["missed"] == novel["objects"]
    faith = report["faithfulness"]
    assert faith["images"] == 3 and faith["words"] > 0
    for removal in ("mean", "zero"):
        every = faith["removal"][removal]["all"]
        assert len(every["deletion"]["top"]) == len(FRACTIONS)
        assert every["deletion"]["top"][0] == every["deletion"]["random"][0]  # nothing removed: the same words
    printed = capsys.readouterr().out
    assert '"novel_pairs"' in printed and '"faithfulness_areas"' in printed


def test_data_without_a_novel_split_is_not_read_again(tiny_checkpoint, tiny_shapes, monkeypatch):
    """The held-out pairs are read from the annotation file only for data with a test_novel split
    (a second parse of a COCO-sized file costs seconds and most of a gigabyte)."""
    from captioning.data.captions import CaptionData
    from captioning.evaluation import attention_reports

    def refuse(annotations):
        raise AssertionError(f"{annotations} read again")

    monkeypatch.setattr(attention_reports, "read_holdout", refuse)
    data = CaptionData(str(tiny_shapes))
    assert attention_reports.novel_pair_report(None, data, str(tiny_shapes), None, "cpu") is None
