"""`captioning attend` streams: images read a batch at a time (with a loader worker too), a picture
per readable image, the bad ones reported at the end, and @lists as inputs."""

import shutil

from PIL import Image

from captioning.cli import main
from tests.helpers import large_png, record_held_pixels


def test_attend_streams_batches_and_reports_bad_images(tiny_shapes, tiny_checkpoint, tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    for p in sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:3]:
        shutil.copy(p, folder / p.name)
    (folder / "broken.png").write_bytes(b"not a png")
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{p}\n" for p in sorted(folder.glob("*.png"))))
    out = tmp_path / "gifs"
    argv = ["attend", f"@{listing}", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--device", "cpu"]
    code = main([*argv, "--num-beams", "1", "--max-new-tokens", "4", "--batch-size", "2", "--num-workers", "1"])
    captured = capsys.readouterr()
    assert code == 1
    good = sorted(p.stem for p in folder.glob("*.png") if p.name != "broken.png")
    assert sorted(p.stem for p in out.glob("*.gif")) == good
    assert len(captured.out.splitlines()) == 3 and "broken.png" in captured.err


def test_attend_holds_the_models_pixels_and_a_pictures_copy_not_the_images(
    tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    """Three 3000 x 2000 photos in one batch: the batch holds each image's model pixels and a copy at
    the GIF's size (640 pixels at most), not 3 x 18 MB; the GIF is the one drawn from the photo."""
    from captioning.api import Captioner

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        large_png(folder / f"big{i}.png")
    held = record_held_pixels(monkeypatch)
    out = tmp_path / "gifs"
    argv = ["attend", str(folder), "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--device", "cpu"]
    assert main([*argv, "--num-beams", "1", "--max-new-tokens", "4", "--batch-size", "3"]) == 0
    capsys.readouterr()
    assert held and max(held) < 3 * (3 * 640 * 427 + 3 * 256 * 256)  # per image: a display copy and the pixels
    captioner = Captioner.from_checkpoint(tiny_checkpoint, "cpu")
    image = str(folder / "big0.png")
    result = captioner(image, return_attention=True, num_beams=1, max_new_tokens=4)[0]
    frames = captioner.render(image, result)  # drawn from the full-size photo
    with Image.open(out / "big0.gif") as gif:
        assert gif.n_frames == len(frames) and gif.size == frames[0].size
