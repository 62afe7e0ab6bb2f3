"""The decoding commands speak the command line's language: sampling flags imply one beam, problems
are named by the flags the user typed, an unknown flag points to the command's own --help, a URL is
refused in one line, attend's --out is a file or a folder, never a folder named like a file, and
caption's help quotes Pillow's pixel limit."""

import argparse
import json

import pytest

from captioning.cli import main
from captioning.cli.attend import out_kind
from captioning.cli.main import build_parser
from captioning.cli.options import generation_settings
from captioning.errors import CaptioningError
from tests.helpers import shapes_test_images


def run(argv: list) -> int:
    """The exit status of the CLI (argparse's errors exit)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


def parsed(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["caption", "photo.png", "--checkpoint", "model.ckpt", *flags])


def test_caption_help_quotes_pillows_pixel_limit():
    from PIL import Image

    from captioning.cli.options import PILLOW_PIXELS

    assert PILLOW_PIXELS == Image.MAX_IMAGE_PIXELS
    caption = build_parser()._subparsers._group_actions[0].choices["caption"]
    assert f"default: Pillow's, {Image.MAX_IMAGE_PIXELS:,})" in " ".join(caption.format_help().split())


@pytest.mark.parametrize(
    "flags, do_sample, beams, note",
    [
        ((), None, 3, None),
        (("--do-sample",), True, 1, "--do-sample samples one caption per image: decoding with --num-beams 1"),
        (("--top-p", "0.9"), True, 1, "--top-p samples one caption per image: decoding with --do-sample --num-beams 1"),
        (("--top-k", "5", "--temperature", "0.7"), True, 1, "--temperature, --top-k samples"),
        (("--top-p", "0.9", "--num-beams", "1"), True, 1, "decoding with --do-sample"),
        (("--temperature", "1.0"), None, 3, None),  # a neutral value samples nothing
        (("--do-sample", "--num-beams", "1"), True, 1, None),  # nothing implied: no note
        (("--top-k", "5", "--num-beams", "4"), None, 4, None),  # beams asked for: no sampling implied
    ],
)
def test_sampling_flags_imply_one_beam(flags, do_sample, beams, note):
    values, said = generation_settings(parsed(*flags))
    assert (values["do_sample"], values["num_beams"]) == (do_sample, beams)
    assert (said is None) == (note is None) and (note is None or note in said), said
    assert said is None or (said.startswith("note: ") and "\n" not in said)


def test_caption_do_sample_alone_works(tiny_checkpoint, tiny_shapes, capsys):
    """`caption --do-sample` used to fail ("do_sample works with one beam") against the default 3 beams."""
    image = shapes_test_images(tiny_shapes, 1)
    assert (
        main(
            [
                "caption",
                *image,
                "--checkpoint",
                str(tiny_checkpoint),
                "--do-sample",
                "--top-p",
                "0.8",
                "--max-new-tokens",
                "6",
                "--json",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert len(json.loads(out)) == 1
    assert err.strip() == "note: --do-sample samples one caption per image: decoding with --num-beams 1"


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--do-sample", "--num-beams", "3"],
            "--do-sample works with one beam: give --num-beams 1 to sample, or leave out --do-sample for beam search",
        ),
        (
            ["--num-beams", "4", "--num-beam-groups", "3", "--diversity-penalty", "1"],
            "--num-beam-groups (3) must divide --num-beams (4)",
        ),
        (["--min-new-tokens", "8", "--max-new-tokens", "8"], "--min-new-tokens (8) must be below --max-new-tokens (8)"),
    ],
)
@pytest.mark.parametrize("command", ["caption", "attend", "compare-attention"])
def test_problems_are_named_by_the_flags(command, flags, message, capsys, tmp_path):
    model = ["--checkpoints", "a.ckpt", "b.ckpt"] if command == "compare-attention" else ["--checkpoint", "a.ckpt"]
    out = [] if command == "caption" else ["--out", str(tmp_path / "out")]
    code = run([command, str(tmp_path / "photo.png"), *model, *out, *flags])
    err = capsys.readouterr().err
    assert code == 1 and err.strip().startswith(f"error: {message}"), err
    assert len(err.strip().splitlines()) == 1
    assert "num_beams" not in err and "do_sample" not in err


def test_the_api_keeps_its_own_words():
    from captioning.decoding.generation import GenerationConfig
    from captioning.errors import ConfigError

    with pytest.raises(ConfigError, match="do_sample works with one beam: set num_beams 1 to sample, or set do_sample"):
        GenerationConfig(num_beams=3, do_sample=True)


def test_the_help_names_flags_not_fields(capsys):
    assert run(["caption", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "with --do-sample: sample among the K likeliest" in text
    assert "with do_sample" not in text and "divides num_beams" not in text
    assert "subfolders" in text  # a folder is searched with its subfolders


@pytest.mark.parametrize("command", ["caption", "attend", "evaluate", "export"])
def test_an_unknown_flag_points_to_the_commands_help(command, capsys):
    code = run([command, "--checkpoint", "a.ckpt", "--out", "o", "--annotations", "x.json", "photo.png", "--bogus"])
    err = capsys.readouterr().err
    assert code == 2 and "--bogus" in err and f"(see captioning {command} --help)" in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_command_points_to_the_main_help(capsys):
    assert run(["--bogus"]) == 2
    assert "(see captioning --help)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "url", ["http://example.com/dog.jpg", "https://example.com/a/b.png?x=1", "s3://bucket/key.jpg"]
)
@pytest.mark.parametrize("command", ["caption", "attend"])
def test_a_url_is_refused_in_one_line(command, url, capsys, tmp_path):
    out = ["--out", str(tmp_path / "out")] if command == "attend" else []
    code = run([command, url, "--checkpoint", str(tmp_path / "missing.ckpt"), *out])
    err = capsys.readouterr().err
    assert code == 1 and err.strip().startswith(f"error: {url}: URLs are not read: download it first"), err
    assert len(err.strip().splitlines()) == 1


def test_a_local_path_with_a_colon_is_no_url(tmp_path, capsys):
    code = run(["caption", str(tmp_path / "a:b.png"), "--checkpoint", str(tmp_path / "missing.ckpt")])
    assert code == 1 and "URLs" not in capsys.readouterr().err


@pytest.mark.parametrize("out, kind", [("pictures", "folder"), ("x.gif", "file"), ("x.PNG", "file")])
def test_attend_out_is_a_file_or_a_folder(out, kind, tmp_path):
    assert out_kind(tmp_path / out) == kind


def test_an_existing_folder_with_a_dot_stays_a_folder(tmp_path):
    (tmp_path / "run.v2").mkdir()
    assert out_kind(tmp_path / "run.v2") == "folder"


@pytest.mark.parametrize("out", ["x.txt", "x.jpg", "maps.json"])
def test_attend_out_of_another_suffix_is_one_line(out, tmp_path, capsys):
    with pytest.raises(CaptioningError, match=r"attend writes \.gif or \.png files"):
        out_kind(tmp_path / out)
    code = run(
        [
            "attend",
            str(tmp_path / "photo.png"),
            "--checkpoint",
            str(tmp_path / "missing.ckpt"),
            "--out",
            str(tmp_path / out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "attend writes .gif or .png files" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / out).exists()  # no folder named x.txt


def test_a_folder_is_searched_with_its_subfolders(tmp_path):
    from captioning.cli.options import image_paths
    from tests.helpers import write_jpeg

    for name in ("photos/b.jpg", "photos/beach/a.jpg", "photos/beach/deep/c.PNG", "photos/notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        write_jpeg(tmp_path / name, 0) if not name.endswith(".txt") else (tmp_path / name).write_text("x")
    found = [p.removeprefix(str(tmp_path) + "/") for p in image_paths([str(tmp_path / "photos")])]
    assert found == ["photos/b.jpg", "photos/beach/a.jpg", "photos/beach/deep/c.PNG"]


def test_caption_reads_the_subfolders(tiny_checkpoint, tiny_shapes, tmp_path, capsys):
    import shutil

    images = shapes_test_images(tiny_shapes, 2)
    (tmp_path / "photos" / "beach").mkdir(parents=True)
    shutil.copy(images[0], tmp_path / "photos" / "top.png")
    shutil.copy(images[1], tmp_path / "photos" / "beach" / "inner.png")
    assert (
        main(
            [
                "caption",
                str(tmp_path / "photos"),
                "--checkpoint",
                str(tiny_checkpoint),
                "--max-new-tokens",
                "4",
                "--num-beams",
                "1",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    photos = tmp_path / "photos"
    assert [r["image"] for r in rows] == [str(photos / "beach" / "inner.png"), str(photos / "top.png")]


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`captioning prepare ... | head` printed a BrokenPipeError traceback once head had its lines."""
    import subprocess
    import sys

    from tests.helpers import make_karpathy

    annotations = make_karpathy(tmp_path, n_train=2, n_val=1, n_test=1)
    script = (
        "import sys, captioning.cli.prepare as p; from captioning.cli import main; "
        "p.length_report = lambda *a, **k: (_ for _ in ()).throw(BrokenPipeError(32, 'Broken pipe')); "
        f"sys.exit(main(['prepare', '--annotations', {str(annotations)!r}, '--no-image-check']))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr


def test_a_damaged_checkpoints_message_ends_on_a_whole_word(tmp_path, capsys):
    from tests.helpers import FIXTURES

    whole = (FIXTURES / "v0_1_8e72f85" / "soft.ckpt").read_bytes()
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(whole[: len(whole) // 2])  # a copy cut short: the zip's directory is missing
    code = run(["caption", str(tmp_path / "photo.png"), "--checkpoint", str(damaged)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "damaged" in err
    assert err.endswith("failed finding central directory)"), err
