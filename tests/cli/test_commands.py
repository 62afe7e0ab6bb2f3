"""The `captioning` command end to end on tiny data, and its answers to bad input."""

import json
import re
import subprocess
import sys

import pytest
from PIL import Image

from captioning.cli import main
from tests.helpers import ROOT, caption_tokens


def run_cli(*args):
    """The real console entry point in a subprocess: exit code, stdout, stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "captioning.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_make_shapes(tmp_path):
    assert main(["make-shapes", "--out", str(tmp_path), "--train", "4", "--val", "2", "--test", "2"]) == 0
    data = json.loads((tmp_path / "dataset_shapes.json").read_text())
    assert len(data["images"]) == 8


def test_caption_prints_one_caption_per_image(tiny_checkpoint, tiny_shapes, capsys):
    images = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:3]
    assert (
        main(["caption", *map(str, images), "--checkpoint", str(tiny_checkpoint), "--json", "--max-new-tokens", "8"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in rows] == [str(p) for p in images]
    assert all(isinstance(r["generated_text"], str) and isinstance(r["score"], float) for r in rows)


def test_caption_skips_bad_images_and_exits_non_zero(tiny_checkpoint, tiny_shapes, tmp_path):
    good = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
    text = tmp_path / "notes.jpg"
    text.write_text("<html>not an image</html>")
    missing = tmp_path / "missing.png"
    code, out, err = run_cli("caption", good, text, missing, "--checkpoint", tiny_checkpoint, "--max-new-tokens", "5")
    assert code != 0
    assert str(good) in out and out.count("\n") == 1  # the good image was still captioned
    assert "notes.jpg" in err and "missing.png" in err and "Traceback" not in err


@pytest.mark.parametrize("option, value", [("semi_sampling_p_final", "1.5"), ("semi_sampling_anneal_steps", "-3")])
def test_bad_objective_value_is_one_line(option, value, tiny_shapes, tmp_path):
    """The objective's own check of a value, raised while the config's classes are built (inside
    jsonargparse, which wraps it in a long ValueError), comes out as its one line."""
    code, _, err = run_cli(
        "fit",
        "--config",
        ROOT / "configs" / "shapes_hard.yaml",
        "--data.annotations",
        tiny_shapes,
        "--trainer.default_root_dir",
        tmp_path,
        f"--model.objective.init_args.{option}",
        value,
    )
    lines = [line for line in err.strip().splitlines() if not line.startswith("Seed set")]
    assert code == 1 and "Traceback" not in err
    assert lines == [lines[0]] and lines[0].startswith(f"error: model.objective.{option}:") and value in lines[0]


@pytest.mark.parametrize("problem", ["missing", "not_a_checkpoint"])
def test_bad_checkpoint_is_one_line(problem, tiny_shapes, tmp_path):
    ckpt = tmp_path / "model.ckpt"
    if problem == "not_a_checkpoint":
        ckpt.write_text("hello")
    image = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
    code, _, err = run_cli("caption", image, "--checkpoint", ckpt)
    assert code != 0 and "model.ckpt" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_attend_writes_a_gif_with_a_frame_per_word(tiny_checkpoint, tiny_shapes, tmp_path, capsys):
    image = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
    out = tmp_path / "att.gif"
    assert (
        main(["attend", str(image), "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--max-new-tokens", "6"])
        == 0
    )
    caption = capsys.readouterr().out.split("\t")[1]
    with Image.open(out) as gif:
        assert gif.n_frames == len(caption_tokens(caption)) + 1  # one per word, then the whole caption


def test_evaluate_writes_metrics_and_results(tiny_checkpoint, tiny_shapes, tmp_path, capsys):
    from captioning.data.formats.karpathy import load_karpathy
    from captioning.data.shapes import parse_objects, record_objects
    from captioning.metrics import CocoScorer, object_f1

    metrics, results = tmp_path / "metrics.json", tmp_path / "results.json"
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(tiny_shapes),
            "--split",
            "test",
            "--num-beams",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            str(metrics),
            "--results",
            str(results),
        ]
    )
    assert code == 0
    report = json.loads(metrics.read_text())
    rows = json.loads(results.read_text())
    test = {r.image_id: r for r in load_karpathy(tiny_shapes) if r.split == "test"}
    assert {r["image_id"] for r in rows} == set(test) and all(isinstance(r["caption"], str) for r in rows)
    assert report["generation"]["num_beams"] == 2 and report["generation"]["max_new_tokens"] == 8
    # the report's scores are those of the captions it wrote, scored on their own
    predictions = {r["image_id"]: r["caption"] for r in rows}
    with CocoScorer() as scorer:
        expected = scorer({i: test[i].captions for i in predictions}, predictions)
    for key in ("BLEU-1", "BLEU-4", "METEOR", "ROUGE_L", "CIDEr"):
        assert report["scores"][key] == pytest.approx(expected[key], abs=1e-9), key
    f1 = object_f1(
        {i: parse_objects(c) for i, c in predictions.items()}, {i: record_objects(r) for i, r in test.items()}
    )
    assert report["scores"]["object_f1"] == pytest.approx(f1["f1"])
    assert "SPICE" in report["notes"]


def test_evaluate_bad_annotation_files(tiny_checkpoint, tmp_path):
    missing = tmp_path / "none.json"
    code, _, err = run_cli("evaluate", "--checkpoint", tiny_checkpoint, "--annotations", missing)
    assert code != 0 and "none.json" in err and "Traceback" not in err
    fieldless = tmp_path / "fieldless.json"
    fieldless.write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "test"}]}))
    code, _, err = run_cli("evaluate", "--checkpoint", tiny_checkpoint, "--annotations", fieldless)
    assert code != 0 and "fieldless.json" in err and "sentences" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["caption", "attend", "evaluate"])
def test_forbid_bad_endings_flag_reaches_the_generation_settings(command):
    from captioning.cli import build_parser
    from captioning.cli.options import generation_overrides
    from captioning.decoding.search import GenerationConfig

    required = {"caption": ["x.png"], "attend": ["x.png", "--out", "o"], "evaluate": ["--annotations", "a.json"]}[
        command
    ]
    parser = build_parser()
    plain = parser.parse_args([command, "--checkpoint", "c.ckpt", *required])
    flagged = parser.parse_args([command, "--checkpoint", "c.ckpt", "--forbid-bad-endings", *required])
    model_default = GenerationConfig(forbid_bad_endings=True)
    assert model_default.replace(**generation_overrides(plain)).forbid_bad_endings is True  # absent: the model's
    assert GenerationConfig().replace(**generation_overrides(flagged)).forbid_bad_endings is True


def test_the_demo_finds_its_config():
    from captioning.cli.demo import config_path

    assert config_path("shapes_soft.yaml").read_text().startswith("# Soft attention on the synthetic shapes data")


@pytest.mark.parametrize("command", ["caption", "attend", "evaluate"])
def test_every_cli_option_is_a_flag_that_reaches_the_config(command):
    """The decoding flags are GenerationConfig's fields: each sets its field, absent keeps the model's."""
    from captioning.cli import build_parser
    from captioning.cli.options import generation_overrides
    from captioning.decoding.generation import GenerationConfig, generation_options

    required = {"caption": ["x.png"], "attend": ["x.png", "--out", "o"], "evaluate": ["--annotations", "a.json"]}[
        command
    ]
    parser = build_parser()
    plain = generation_overrides(parser.parse_args([command, "--checkpoint", "c.ckpt", *required]))
    options = [o for o in generation_options() if o.cli]
    assert {"temperature", "top_k", "suppress_tokens", "cuda_graphs"} <= {o.name for o in options}
    assert set(plain) == {o.name for o in options}
    assert plain.pop("num_beams") == 3 and set(plain.values()) == {None}  # the command's beams; the rest the model's
    values = {int: "2", float: "0.5", str: "argmax", tuple: "<unk>,7"}
    for option in options:
        flag = [option.flag] if option.type is bool else [option.flag, values[option.type]]
        args = parser.parse_args([command, "--checkpoint", "c.ckpt", *flag, *required])
        expected = True if option.type is bool else option.parse(values[option.type])
        assert generation_overrides(args)[option.name] == expected, option.name
    config = GenerationConfig().replace(
        **generation_overrides(
            parser.parse_args(
                [
                    command,
                    "--checkpoint",
                    "c.ckpt",
                    "--num-beams",
                    "1",
                    "--do-sample",
                    "--temperature",
                    "0.7",
                    "--top-k",
                    "5",
                    *required,
                ]
            )
        )
    )
    assert (config.do_sample, config.temperature, config.top_k) == (True, 0.7, 5)


def test_the_listing_is_the_registry_in_order(capsys):
    from captioning.cli.commands import COMMANDS

    assert COMMANDS.names() == [
        "fit",
        "validate",
        "test",
        "demo",
        "make-shapes",
        "caption",
        "attend",
        "compare-attention",
        "atlas",
        "evaluate",
        "score",
        "compare",
        "prepare",
        "export",
        "serve",
        "extract-features",
    ]
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    positions = [
        re.search(rf"\n    {re.escape(name)}\s", listing).start() for name in COMMANDS
    ]  # "compare" is not "compare-attention"
    assert positions == sorted(positions)
    with pytest.raises(Exception) as err:
        COMMANDS.get("predict")
    assert str(err.value).startswith("captioning COMMAND: unknown command 'predict'; expected one of fit, validate")


def test_a_registered_command_is_usable_by_name(monkeypatch, capsys):
    """A new command is one class: registered, it is listed, parsed and run with its exit code."""
    from captioning.cli.commands import COMMANDS, Command
    from captioning.errors import CaptioningError

    monkeypatch.setattr(COMMANDS, "_entries", dict(COMMANDS._entries))  # registered for this test only

    @COMMANDS.register("echo")
    class Echo(Command):
        help = "print its word"

        def add_arguments(self, parser):
            parser.add_argument("word")
            parser.add_argument("--times", type=int, default=1)

        def run(self, args) -> int:
            if args.word == "bad":
                raise CaptioningError("echo: a bad word")
            print(" ".join([args.word] * args.times))
            return 3

    assert main(["echo", "hi", "--times", "2"]) == 3 and capsys.readouterr().out == "hi hi\n"
    assert main(["echo", "bad"]) == 1 and capsys.readouterr().err == "error: echo: a bad word\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "print its word" in capsys.readouterr().out
