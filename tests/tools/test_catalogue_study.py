"""tools/studies/catalogue_study.py: its table from runs' results, and the grounding it adds at the
word before each noun."""

import json
import shutil

import pytest

from tools.studies.catalogue_study import main


def result(name: str, seed: int, f1: float, steering=None, faithfulness=None) -> dict:
    return {
        "name": name,
        "seed": seed,
        "data": "shapes",
        "steps": 600,
        "seconds_per_step": 0.25,
        "scores": {
            "object_f1": f1,
            "CIDEr": 2.0 * f1,
            "grounding": {"attention_correctness": f1 / 2, "pointing_game": 0.75, "count": 9},
        },
        "faithfulness": faithfulness,
        "steering": steering or [],
    }


def test_the_table_gives_the_seeds_mean_and_each_seed(tmp_path, capsys):
    runs = tmp_path / "runs" / "shapes"
    runs.mkdir(parents=True)
    weak = [{"strength": s, "named_only_focused": 0.1} for s in (1.0, 3.0, 10.0)]
    strong = [{"strength": 1.0, "named_only_focused": 0.2}, {"strength": 3.0, "named_only_focused": 0.6}]
    removal = {"removal": {"mean": {"object": {"area": {"deletion_random": 0.5, "deletion_top": 0.25}}}}}
    for r in (
        result("soft", 0, 0.4, strong, removal),
        result("soft", 1, 0.6, weak),
        result("uniform", 0, 0.1, [{"unavailable": "no maps", "strength": 1.0}]),
    ):
        (runs / f"{r['name']}_s{r['seed']}.json").write_text(json.dumps(r))
    main(["table", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert "### shapes (600 steps)" in out
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in out.splitlines()
        if line.startswith("| ")
    }
    # the catalogue's order (the atlas's): soft before uniform
    assert out.index("| soft |") < out.index("| uniform |")
    soft, uniform = rows["soft"], rows["uniform"]
    assert soft[0] == "2" and soft[1] == "0.500 (0.400 / 0.600)" and soft[2] == "1.00 (0.80 / 1.20)"
    assert soft[3] == "0.250 (0.200 / 0.300)" and soft[4] == "0.750 (0.750 / 0.750)"  # evaluate's grounding
    assert soft[5] == "-"  # no run measured the word before
    assert soft[6] == "0.250 (0.250 / -)"  # one seed's faithfulness: the mean of the one figure
    assert soft[7] == "3 / > 10"  # the first strength reaching 50%; never within the strengths tried
    assert uniform[1] == "0.100" and uniform[6] == "-" and uniform[7] == "-"


def test_before_adds_the_grounding_at_the_word_before_and_skips_what_it_has(tmp_path, tiny_checkpoint, tiny_shapes):
    runs = tmp_path / "runs"
    folder = runs / "shapes" / "soft_s0" / "lightning_logs" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copy(tiny_checkpoint, folder / "best-epoch=0-step=3.ckpt")
    path = runs / "shapes" / "soft_s0.json"
    path.write_text(json.dumps(result("soft", 0, 0.4)))
    main(["before", str(runs), "--data", f"shapes={tiny_shapes}", "--beams", "1", "--threads", "1"])
    written = json.loads(path.read_text())
    for key in ("noun", "before"):
        assert set(written[key]) == {"attention_correctness", "pointing_game", "count"}
        value = written[key]["attention_correctness"]
        assert value is None or 0.0 <= value <= 1.0
    assert written["noun"]["count"] == written["before"]["count"]  # the same nouns, scored a word apart
    assert written["scores"]["object_f1"] == 0.4  # the run's own figures stay
    stamp = path.stat().st_mtime_ns
    main(["before", str(runs), "--data", f"shapes={tiny_shapes}", "--beams", "1"])
    assert path.stat().st_mtime_ns == stamp  # measured once


def test_steer_measures_the_named_mechanisms_runs_again(tmp_path, tiny_checkpoint, tiny_shapes):
    runs = tmp_path / "runs" / "shapes"
    for name in ("soft", "soft_sharp"):  # soft_sharp_s0.json matches soft_s*.json but is not a run of soft
        folder = runs / f"{name}_s0" / "lightning_logs" / "version_0" / "checkpoints"
        folder.mkdir(parents=True)
        shutil.copy(tiny_checkpoint, folder / "best-epoch=0-step=3.ckpt")
    old = [{"strength": 1.0, "named_only_focused": 0.0}]
    for name in ("soft", "soft_sharp"):
        (runs / f"{name}_s0.json").write_text(json.dumps(result(name, 0, 0.4, old)))
    main(["steer", str(tmp_path / "runs"), "--data", f"shapes={tiny_shapes}", "--mechanisms", "soft"]
         + ["--beams", "1", "--threads", "1", "--strengths", "2", "5"])  # fmt: skip
    written = json.loads((runs / "soft_s0.json").read_text())
    assert [st["strength"] for st in written["steering"]] == [2.0, 5.0]
    assert all("named_only_focused" in st or "unavailable" in st for st in written["steering"])
    assert written["steering"] != old and written["scores"]["object_f1"] == 0.4  # the rest stays
    assert json.loads((runs / "soft_sharp_s0.json").read_text())["steering"] == old
    # a misspelt mechanism beside a right one: one line, before anything is measured
    stamp = (runs / "soft_s0.json").stat().st_mtime_ns
    with pytest.raises(SystemExit) as exit_:
        main(["steer", str(tmp_path / "runs"), "--data", f"shapes={tiny_shapes}", "--mechanisms", "soft,sfot"])
    assert str(exit_.value) == f"catalogue_study steer: no runs of 'sfot' in {runs}"
    assert (runs / "soft_s0.json").stat().st_mtime_ns == stamp


def test_lagged_grounding_scores_each_noun_with_the_map_of_the_word_before(tiny_shapes):
    """tools/studies/grounding_shift.lagged (the catalogue study's ``before``, hard_attention_study's
    grounding-lag): a caption whose colour word looks inside the object's box and whose noun looks
    outside it scores 1 a word early and 0 at the noun."""
    import numpy as np

    from captioning.data.formats import load_records
    from tools.studies.grounding_shift import lagged

    record = next(r for r in load_records(str(tiny_shapes)) if r.split == "test" and len(r.objects) == 1)
    x0, y0, x1, y1 = record.objects[0]["bbox"]
    grid = 8  # cells of 64 / 8 = 8 pixels
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    inside = int(cy // 8) * grid + int(cx // 8)
    outside = max(range(grid * grid), key=lambda c: abs(c // grid * 8 + 4 - cy) + abs(c % grid * 8 + 4 - cx))
    words = ["a", *record.objects[0]["words"]]
    maps = np.full((len(words), grid * grid), 1.0 / grid**2)
    maps[2] = np.eye(grid * grid)[inside]  # the colour word's map: the object
    maps[3] = np.eye(grid * grid)[outside]  # the noun's: the farthest cell
    at_noun, before = lagged(
        {record.image_id: record}, [{"tokens": words, "attention": maps}], tiny_shapes.parent, (0, 1)
    )
    assert at_noun["count"] == before["count"] == 1
    assert at_noun["attention_correctness"] == 0.0 and at_noun["pointing_game"] == 0.0
    # the centre cell's mass lies mostly, not wholly, inside the box (the map is spread over its 8x8 pixels)
    assert before["attention_correctness"] > 0.5 and before["pointing_game"] == 1.0


def test_a_missing_data_file_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["before", str(tmp_path), "--data", f"shapes={tmp_path / 'none.json'}"])
    assert str(exit_.value) == f"catalogue_study before: {tmp_path / 'none.json'}: no such file"
