"""`captioning compare`: paired bootstrap intervals and permutation p-values of two systems' captions."""

import json
import os

import numpy as np
import pytest

from captioning.cli import main
from captioning.cli.compare import compare_runs
from captioning.metrics import bootstrap as bs
from tests.helpers import make_aichallenger, path_without_java

FAST = dict(metrics=("BLEU", "ROUGE_L", "CIDEr"), tokenizer="python", progress=lambda line: None)


@pytest.fixture(autouse=True, scope="module")
def no_java():
    """The commands here score without Java (the Python PTB tokenizer, no METEOR): none of the tests
    reads METEOR, and a JVM's start costs seconds each."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", path_without_java(os.environ.get("PATH", "")))
        yield


@pytest.fixture(scope="module")
def systems(tmp_path_factory):
    """A shapes test split of 40 images; A: each image's first reference; B: A with half its captions
    replaced by one fixed caption. Returns (annotations, A's results file, B's)."""
    from captioning.data.shapes import generate

    root = tmp_path_factory.mktemp("compare")
    annotations = generate(root, n_train=4, n_val=2, n_test=40, seed=5, image_size=32, progress=False)
    images = [i for i in json.loads(annotations.read_text())["images"] if i["split"] == "test"]
    a = [{"image_id": i["imgid"], "caption": i["sentences"][0]["raw"]} for i in images]
    b = [dict(x, caption="a small red circle") if k % 2 else x for k, x in enumerate(a)]
    paths = []
    for name, items in (("a", a), ("b", b)):
        paths.append(root / f"{name}.json")
        paths[-1].write_text(json.dumps(items))
    return str(annotations), str(paths[0]), str(paths[1])


def test_a_against_itself_is_zero_with_p_one(systems):
    annotations, a, _ = systems
    table = compare_runs([a], [a], annotations, resamples=200, **FAST)["scores"]
    assert {"BLEU-4", "CIDEr", "ROUGE_L", "object_f1", "CHAIR_i", "CHAIR_s"} <= table.keys()
    for name, row in table.items():
        assert (row["difference"], row["ci_low"], row["ci_high"], row["p_value"]) == (0.0, 0.0, 0.0, 1.0), name


def test_half_replaced_is_worse_and_the_interval_excludes_zero(systems):
    annotations, a, b = systems
    comparison = compare_runs([a], [b], annotations, resamples=500, **FAST)
    for name in ("BLEU-4", "CIDEr", "ROUGE_L", "object_f1"):
        row = comparison["scores"][name]
        assert row["difference"] > 0 and row["ci_low"] > 0 and row["p_value"] < 0.01, (name, row)
        assert row["ci_low"] <= row["difference"] <= row["ci_high"]
    # the full sample's statistics give the corpus scores score_split computed
    scored = comparison["runs"]["b"][0][2].scores
    for name in ("BLEU-1", "BLEU-4", "CIDEr", "ROUGE_L", "object_f1", "CHAIR_i"):
        assert comparison["scores"][name]["b"] == pytest.approx(scored[name], rel=1e-12, abs=1e-15), name


def test_same_seed_same_interval_and_seeds_pool(systems):
    annotations, a, b = systems
    first = compare_runs([a], [b], annotations, resamples=300, seed=3, **FAST)["scores"]
    again = compare_runs([a], [b], annotations, resamples=300, seed=3, **FAST)["scores"]
    other = compare_runs([a], [b], annotations, resamples=300, seed=4, **FAST)["scores"]
    assert first == again
    assert first["CIDEr"]["ci_low"] != other["CIDEr"]["ci_low"]
    seeds = compare_runs([a, b], [b, b], annotations, resamples=300, seed=3, **FAST)["scores"]["CIDEr"]
    assert seeds["a"] == pytest.approx((first["CIDEr"]["a"] + first["CIDEr"]["b"]) / 2)
    assert 0 < seeds["difference"] < first["CIDEr"]["difference"]


def test_bootstrap_of_a_mean_matches_the_textbook_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 1.0, 400)
    a = bs.Statistic(bs.per_image_mean(x), bs.mean_score)
    b = bs.Statistic(bs.per_image_mean(np.zeros(400)), bs.mean_score)
    row = bs.paired_bootstrap([a], [b], resamples=2000, seed=0)
    half = 1.96 * x.std() / np.sqrt(400)
    assert row["ci_low"] == pytest.approx(x.mean() - half, abs=0.02) and row["ci_high"] == pytest.approx(
        x.mean() + half, abs=0.02
    )


def test_cli_writes_the_table_the_json_and_the_report(systems, tmp_path, capfd):
    annotations, a, b = systems
    out, report = tmp_path / "compare.json", tmp_path / "report"
    code = main(
        ["compare", a, b, "--annotations", annotations, "--resamples", "100", "--out", str(out)]
        + ["--report", str(report), "--top", "3"]
    )
    printed = capfd.readouterr().out
    assert code == 0
    saved = json.loads(out.read_text())
    assert saved["num_images"] == 40 and saved["resamples"] == 100
    assert set(saved["scores"]["CIDEr"]) == {"a", "b", "difference", "ci_low", "ci_high", "p_value"}
    assert "CIDEr" in printed and "95% interval" in printed
    page = (report / "index.html").read_text()
    assert page.count("<section>") == 3 and "a small red circle" in page
    assert len(list((report / "images").glob("*.jpg"))) == 3 and (report / "report.md").is_file()


def test_a_side_that_is_not_there_is_one_line(systems, tmp_path, capfd):
    annotations, a, _ = systems
    assert main(["compare", a, f"{a},{tmp_path / 'nope.json'}", "--annotations", annotations]) == 1
    err = capfd.readouterr().err
    assert "nope.json: no such results file" in err and len(err.strip().splitlines()) == 1


def test_checkpoints_are_decoded_and_the_report_shows_their_attention(tiny_checkpoint, tiny_shapes, tmp_path, capfd):
    report, out = tmp_path / "report", tmp_path / "compare.json"
    ckpt = str(tiny_checkpoint)
    code = main(
        ["compare", ckpt, ckpt, "--annotations", str(tiny_shapes), "--split", "val", "--max-new-tokens", "6"]
        + ["--device", "cpu", "--resamples", "50", "--out", str(out), "--report", str(report), "--top", "2"]
    )
    assert code == 0, capfd.readouterr().err
    assert json.loads(out.read_text())["scores"]["CIDEr"]["difference"] == 0.0
    assert len(list((report / "images").glob("*_a.gif"))) == 2 and len(list((report / "images").glob("*_b.gif"))) == 2
    assert (report / "index.html").read_text().count(".gif") == 4


def test_ai_challenger_checkpoint_against_its_results_file(tiny_checkpoint, tiny_shapes, tmp_path, capfd):
    """A checkpoint's captions (decoded by position) and a results file naming AI Challenger's images by
    their file names are the same images: the difference is exactly 0."""
    annotations, names = make_aichallenger(tiny_shapes, tmp_path, "val")
    results = tmp_path / "results.json"
    code = main(
        ["evaluate", "--checkpoint", str(tiny_checkpoint), "--annotations", str(annotations), "--split", "val"]
        + ["--device", "cpu", "--results", str(results)]
    )  # the checkpoint's own decoding, as compare decodes it
    assert code == 0
    assert {r["image_id"] for r in json.loads(results.read_text())} == set(names.values())
    comparison = compare_runs([str(tiny_checkpoint)], [str(results)], str(annotations), split="val", **FAST)
    assert comparison["num_images"] == 8 and comparison["coverage"] == []
    assert comparison["scores"]["CIDEr"]["difference"] == 0.0 and comparison["scores"]["CIDEr"]["p_value"] == 1.0


def test_a_report_folder_with_planted_links_never_writes_through_them(systems, tmp_path, capfd):
    """index.html and images/N.jpg planted as links to files elsewhere: the report replaces the links
    with its own files and the files they pointed at are untouched; an images/ that is a link is
    refused in one line before any scoring."""
    annotations, a, b = systems
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    report = tmp_path / "report"
    (report / "images").mkdir(parents=True)
    (report / "index.html").symlink_to(victim)
    (report / "report.md").symlink_to(victim)
    ids = [i["image_id"] for i in json.loads(open(a).read())]
    for i in ids:
        (report / "images" / f"{i}.jpg").symlink_to(victim)
    argv = ["compare", a, b, "--annotations", annotations, "--resamples", "20", "--top", "40", "--report", str(report)]
    assert main(argv) == 0
    capfd.readouterr()
    assert victim.read_text() == "keep me"
    assert not (report / "index.html").is_symlink() and "<section>" in (report / "index.html").read_text()
    assert not any(p.is_symlink() for p in (report / "images").iterdir())
    linked = tmp_path / "linked"
    (linked / "images").mkdir(parents=True)
    (linked / "images").rename(tmp_path / "elsewhere")
    (linked / "images").symlink_to(tmp_path / "elsewhere")
    argv[-1] = str(linked)
    assert main(argv) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a symbolic link" in err[0] and "captions of" not in err[0]
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_bad_out_or_report_is_one_line_before_the_scoring(systems, tmp_path, capfd):
    annotations, a, b = systems
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for flags, expected in (
        (["--report", str(a_file)], "a file; --report names the folder"),
        (["--out", str(a_file / "compare.json")], "is a file, not a folder"),
        (["--out", str(tmp_path)], "a folder; give the JSON file"),
    ):
        assert main(["compare", a, b, "--annotations", annotations, "--resamples", "20", *flags]) == 1
        captured = capfd.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err  # one line, and no scoring ran before it
        assert captured.out == ""


def test_report_md_carries_no_markup_of_the_captions(systems, tmp_path, capfd):
    annotations, a, _ = systems
    items = json.loads(open(a).read())
    html_b = tmp_path / "html.json"
    html_b.write_text(
        json.dumps([dict(x, caption="<img src=x onerror=alert(1)> ![t](http://e.example/t.png) *x*") for x in items])
    )
    report = tmp_path / "report"
    argv = ["compare", a, str(html_b), "--annotations", annotations, "--resamples", "20", "--top", "2"]
    assert main([*argv, "--report", str(report)]) == 0
    capfd.readouterr()
    md = (report / "report.md").read_text()
    assert "<img" not in md and "](http" not in md and "&lt;img src=x onerror=alert\\(1\\)&gt;" in md
    assert "<img src=x" not in (report / "index.html").read_text()
