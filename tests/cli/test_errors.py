"""Every flag of caption / attend / evaluate given a bad value: one line on stderr naming the
problem, a non-zero exit, no traceback; and the attend outputs that used to collide or be ignored."""

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from captioning.cli import main


def one_line_error(capsys, argv, *expected):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's errors (a value of the wrong kind or range)
        code = exit.code
    err = capsys.readouterr().err.strip()
    assert code != 0, argv
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.fixture
def image(tiny_shapes):
    return sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]


@pytest.mark.parametrize("command", ["caption", "attend", "evaluate"])
@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--num-beams", "0"], "--num-beams: expected an integer >= 1, got 0"),
        (["--num-beams", "-3"], "--num-beams"),
        (["--num-beams", "two"], "--num-beams: expected an integer, got 'two'"),
        (["--max-new-tokens", "-1"], "--max-new-tokens: expected an integer >= 1, got -1"),
        (["--max-new-tokens", "0"], "--max-new-tokens: expected an integer >= 1, got 0"),
        (["--length-penalty", "x"], "--length-penalty"),
        (["--device", "cuda"], "no CUDA GPU is available here"),
        (["--device", "gpu"], "not a device"),
        (["--device", "cuda:7"], "--device cuda:7"),
        (["--max-image-pixels", "0"], "--max-image-pixels"),
    ],
)
def test_bad_flag_values_are_one_line_errors(
    command, flags, expected, tiny_checkpoint, tiny_shapes, image, tmp_path, capsys
):
    if flags[:2] == ["--device", "cuda:7"]:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 7:
            pytest.skip("this machine has a cuda:7")
    common = ["--checkpoint", tiny_checkpoint, *flags]
    argv = {
        "caption": ["caption", image, *common],
        "attend": ["attend", image, "--out", tmp_path / "out", *common],
        "evaluate": ["evaluate", "--annotations", tiny_shapes, *common],
    }[command]
    one_line_error(capsys, argv, expected)


@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["attend", "IMG", "--checkpoint", "CKPT", "--out", "OUT", "--alpha", "2"],
            "--alpha: expected a number in [0, 1]",
        ),
        (["attend", "IMG", "--checkpoint", "CKPT", "--out", "OUT", "--duration-ms", "0"], "--duration-ms"),
        (["attend", "IMG", "--checkpoint", "CKPT", "--out", "OUT", "--format", "jpg"], "--format: invalid choice"),
        (["evaluate", "--checkpoint", "CKPT", "--annotations", "ANN", "--batch-size", "0"], "--batch-size"),
        (["evaluate", "--checkpoint", "CKPT", "--annotations", "ANN", "--num-workers", "-1"], "--num-workers"),
        (["make-shapes", "--out", "OUT", "--train", "0"], "--train"),
        (["make-shapes", "--out", "OUT", "--image-size", "8"], "--image-size: expected a number >= 16"),
        (["prepare", "--annotations", "ANN", "--min-word-freq", "0"], "--min-word-freq"),
        (["prepare", "--annotations", "ANN", "--max-vocab-size", "-1"], "--max-vocab-size"),
        (["extract-features", "--config", "C", "--out", "OUT", "--batch-size", "0"], "--batch-size"),
        (["extract-features", "--config", "C", "--out", "OUT", "--shard", "3/3"], "--shard 3/3"),
        (["demo", "--max-epochs", "0"], "--max-epochs"),
        (["serve", "--checkpoint", "CKPT", "--port", "-5"], "--port: expected a number >= 1"),
        (["serve", "--checkpoint", "CKPT", "--port", "99999"], "--port: expected a port from 1 to 65535"),
        (["serve", "--checkpoint", "CKPT", "--max-batch", "0"], "--max-batch"),
        (["serve", "--checkpoint", "CKPT", "--max-upload-mb", "0"], "--max-upload-mb"),
        (["caption", "--checkpoint", "CKPT"], "the following arguments are required: images"),
        (["nonsense"], "invalid choice: 'nonsense'"),
    ],
)
def test_other_bad_flags_are_one_line_errors(argv, expected, tiny_checkpoint, tiny_shapes, image, tmp_path, capsys):
    names = {
        "IMG": image,
        "CKPT": tiny_checkpoint,
        "OUT": tmp_path / "out",
        "ANN": tiny_shapes,
        "C": tmp_path / "c.yaml",
    }
    one_line_error(capsys, [names.get(a, a) for a in argv], expected)


def test_not_a_checkpoint_says_so(image, tmp_path, capsys):
    line = one_line_error(capsys, ["caption", image, "--checkpoint", image], "not a checkpoint file")
    assert "refused" not in line  # an image given as a checkpoint is a mistake, not an attack
    one_line_error(capsys, ["caption", image, "--checkpoint", tmp_path / "none.ckpt"], "no such file")


def test_no_images_is_an_error(tiny_checkpoint, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    one_line_error(capsys, ["caption", tmp_path / "empty", "--checkpoint", tiny_checkpoint], "no images found")
    one_line_error(capsys, ["caption", str(tmp_path / "*.jpg"), "--checkpoint", tiny_checkpoint], "no images found")


def test_json_lists_skipped_images_and_keeps_non_ascii_paths(tiny_checkpoint, image, tmp_path, capsys):
    named = tmp_path / "café.png"
    shutil.copy(image, named)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    code = main(["caption", str(named), str(broken), "--checkpoint", str(tiny_checkpoint), "--json"])
    out = capsys.readouterr().out
    assert code == 1 and "café.png" in out  # not escaped as \u00e9
    rows = json.loads(out)
    assert [r["image"] for r in rows] == [str(named), str(broken)]
    assert "generated_text" in rows[0] and "broken.png" in rows[1]["error"]


def test_attention_mode_on_a_soft_model_is_noted(tiny_checkpoint, image, capsys):
    assert main(["caption", str(image), "--checkpoint", str(tiny_checkpoint), "--attention-mode", "argmax"]) == 0
    assert "applies to hard-attention models" in capsys.readouterr().err


def test_attention_temperature_on_a_soft_model_is_noted_and_a_bad_one_is_one_line(tiny_checkpoint, image, capsys):
    assert main(["caption", str(image), "--checkpoint", str(tiny_checkpoint), "--attention-temperature", "0.5"]) == 0
    assert "--attention-temperature applies to hard-attention models" in capsys.readouterr().err
    one_line_error(
        capsys,
        ["caption", image, "--checkpoint", tiny_checkpoint, "--attention-temperature", "0"],
        "--attention-temperature: expected a finite number > 0, got 0.0",
    )


def test_attend_output_errors(tiny_checkpoint, image, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    base = ["--checkpoint", tiny_checkpoint]
    one_line_error(capsys, ["attend", image, "--out", a_file / "x.gif", *base], "cannot write")
    one_line_error(capsys, ["attend", image, "--out", "/proc/x.gif", *base], "cannot write")
    one_line_error(capsys, ["attend", image, image, "--out", tmp_path / "two.gif", *base], "one file for 2 images")
    one_line_error(capsys, ["attend", image, "--out", tmp_path / "c.gif", "--format", "png", *base], "make them agree")
    one_line_error(capsys, ["attend", image, "--out", tmp_path / "c.gif", "--format", "both", *base], "give a folder")
    assert not (tmp_path / "two.gif").exists()


def test_attend_names_never_collide_and_format_is_honoured(tiny_checkpoint, image, tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(image, src / "chelsea.png")
    Image.open(image).convert("RGB").save(src / "chelsea.jpg")
    out = tmp_path / "out"
    assert (
        main(
            [
                "attend",
                str(src / "chelsea.jpg"),
                str(src / "chelsea.png"),
                "--out",
                str(out),
                "--format",
                "png",
                "--checkpoint",
                str(tiny_checkpoint),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == ["chelsea.jpg.png", "chelsea.png.png"]
    assert main(["attend", str(image), "--out", str(tmp_path / "one.png"), "--checkpoint", str(tiny_checkpoint)]) == 0
    with Image.open(tmp_path / "one.png") as im:
        assert im.format == "PNG"  # the suffix decides when --format is not given


def test_predict_and_unknown_training_options_are_short(capsys):
    one_line_error(capsys, ["predict", "--config", "x.yaml"], "not a command", "captioning caption")
    # a LightningCLI user's checkpoint goes into the commands to run instead
    one_line_error(capsys, ["predict", "--ckpt_path", "runs/best.ckpt"], "caption IMAGES --checkpoint runs/best.ckpt")
    one_line_error(capsys, ["predict", "--ckpt_path=b.ckpt"], "evaluate --checkpoint b.ckpt --annotations")
    config = str(Path(__file__).resolve().parents[2] / "configs" / "shapes_soft.yaml")
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", config, "--model.nonexistent", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 3 and "unrecognized arguments" in err[-1] and "nonexistent" in err[-1]


@pytest.mark.parametrize(
    "option,value,expected",
    [
        (
            "--model.objective.init_args.semi_sampling_per",
            "bogus",
            ["model.objective", "semi_sampling_per", "bogus", "expectation"],
        ),
        ("--model.objective.init_args.lambda_r", "abc", ["model.objective", "lambda_r", "float", "abc"]),
        ("--model.objective.init_args.nonexistent", "3", ["model.objective", "'nonexistent' is not accepted"]),
        ("--data.batch_size", "abc", ["data.batch_size", "int", "abc"]),
    ],
)
def test_bad_training_option_values_are_one_line_errors(option, value, expected, capsys):
    """A bad value of a training option, inside the objective's init_args too (whose message lists every
    Union subtype), is the usage line, the --help pointer and one error line."""
    config = Path(__file__).resolve().parents[2] / "configs" / "shapes_hard.yaml"
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(config), option, value])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and err[0].startswith("usage:") and err[2].startswith("error: "), err
    for text in expected:
        assert text in err[2], (text, err[2])


def test_the_top_level_help_points_lightning_users_to_caption(capsys):
    """`captioning --help`, where a LightningCLI user looks for predict, names the commands that do it
    and the command line's default beams (the API's default is one: README's first example says so)."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "No `predict` (LightningCLI's): caption images" in text and "3 beams by default" in text
