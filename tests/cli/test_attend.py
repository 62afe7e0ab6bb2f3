"""`captioning attend`: a GIF (and/or a grid PNG) per image from files, folders and globs."""

import shutil
from pathlib import Path

import pytest
from PIL import Image, ImageSequence

from captioning.cli import main
from captioning.viz import pictures as V
from tests.helpers import caption_tokens


@pytest.fixture(scope="module")
def image_dir(tiny_shapes, tmp_path_factory):
    """A folder of three test images (and a non-image file that folders and globs must pass over)."""
    folder = tmp_path_factory.mktemp("attend_in")
    for p in sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:3]:
        shutil.copy(p, folder / p.name)
    (folder / "notes.txt").write_text("not an image")
    return folder


def _attend(checkpoint, capsys, *args):
    code = main(
        [
            "attend",
            *map(str, args),
            "--checkpoint",
            str(checkpoint),
            "--device",
            "cpu",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "6",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    return code, {line.split("\t")[2][3:]: line.split("\t")[1] for line in lines}  # target -> caption


def test_folder_writes_one_gif_per_image_with_a_frame_per_word(tiny_checkpoint, image_dir, tmp_path, capsys):
    out = tmp_path / "gifs"
    code, captions = _attend(tiny_checkpoint, capsys, image_dir, "--out", out, "--duration-ms", "250")
    assert code == 0
    stems = sorted(p.stem for p in image_dir.glob("*.png"))
    assert sorted(p.name for p in out.iterdir()) == [f"{s}.gif" for s in stems]
    for target, caption in captions.items():
        with Image.open(target) as gif:
            frames = list(ImageSequence.Iterator(gif))
            assert len(frames) == len(caption_tokens(caption)) + 1  # a frame per word, then the whole caption
            assert all(f.info["duration"] == 250 for f in frames) and gif.info["loop"] == 0


def test_glob_and_format_both_write_gif_and_grid_png(tiny_checkpoint, image_dir, tmp_path, capsys):
    out = tmp_path / "both"
    code, captions = _attend(tiny_checkpoint, capsys, image_dir / "*.png", "--out", out, "--format", "both")
    assert code == 0
    stems = sorted(p.stem for p in image_dir.glob("*.png"))
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{s}.gif" for s in stems] + [f"{s}.png" for s in stems])
    # the grid PNG: one 192 px panel per word (64 px images scaled up), five to a row
    pw = 192
    title = V._line_height(V.ui_font(int(pw / 12))) + 6
    for target, caption in captions.items():
        if not target.endswith(".png"):
            continue
        rows, cols = V.panel_layout(len(caption_tokens(caption)), 5)
        with Image.open(target) as png:
            assert png.size == (cols * (pw + 8) + 8, rows * (title + pw + 8) + 8)


def test_one_image_to_a_named_file(tiny_checkpoint, image_dir, tmp_path, capsys):
    image = sorted(image_dir.glob("*.png"))[0]
    code, captions = _attend(tiny_checkpoint, capsys, image, "--out", tmp_path / "one.png")
    assert code == 0 and list(captions) == [str(tmp_path / "one.png")]
    assert [p.name for p in tmp_path.iterdir()] == ["one.png"]


def test_compare_attention_command(tiny_checkpoint, image_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(
        [
            "compare-attention",
            "--checkpoints",
            str(tiny_checkpoint),
            str(tiny_checkpoint),
            "--labels",
            "soft",
            "again",
            "--out",
            str(out),
            "--gif",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "5",
            "--duration-ms",
            "200",
            "--device",
            "cpu",
            str(image_dir),
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    stems = sorted(p.stem for p in image_dir.glob("*.png"))
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{s}.png" for s in stems] + [f"{s}.gif" for s in stems])
    for line in lines:
        path, soft, again = line.split("\t")
        assert soft[len("soft: ") :] == again[len("again: ") :]  # the same checkpoint twice: the same caption
        n = len(caption_tokens(soft[len("soft: ") :]))
        with Image.open(out / f"{Path(path).stem}.png") as png:  # two rows of n 128 px panels
            assert png.width == 8 + max(n, 1) * (128 + 8)
        with Image.open(out / f"{Path(path).stem}.gif") as gif:
            assert gif.n_frames == n + 1 and gif.info["duration"] == 200
            assert gif.width > 2 * 256  # two GIFs side by side
    assert (
        main(
            [
                "compare-attention",
                "--checkpoints",
                str(tiny_checkpoint),
                "--labels",
                "a",
                "b",
                "--out",
                str(out),
                str(image_dir),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "1 checkpoint(s)" in err[0] and "label(s)" in err[0]
