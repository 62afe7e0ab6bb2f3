"""`captioning attend` streams: images read a batch at a time (with a loader worker too), a picture
per readable image, the bad ones reported at the end, and @lists as inputs."""

import shutil

from captioning.cli import main


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
