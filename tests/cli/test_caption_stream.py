"""`captioning caption` as a stream: --out JSON lines / CSV written a batch at a time, resumed after a
stop anywhere with every image exactly once, bad images among good ones, @lists, shards, loader
workers, memory bounded by the batch, and the bad inputs of the streaming flags."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioning.cli import main
from tests.helpers import large_png, record_held_pixels

DECODE = ["--device", "cpu", "--num-beams", "1", "--max-new-tokens", "5"]


@pytest.fixture(scope="module")
def photos(tiny_shapes, tmp_path_factory) -> Path:
    """The tiny shapes' 8 test images in nested folders, with a broken one among them."""
    root = tmp_path_factory.mktemp("stream") / "photos"
    for i, p in enumerate(sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))):
        target = root / ("" if i < 3 else f"sub{i % 2}") / p.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, target)
    (root / "sub1" / "broken.png").write_bytes(b"not a png")
    return root


def _caption(checkpoint, *args) -> int:
    try:
        return main(["caption", *map(str, args), "--checkpoint", str(checkpoint), *DECODE])
    except SystemExit as exit:
        return exit.code


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_out_holds_a_line_per_image_and_a_rerun_captions_nothing_again(tiny_checkpoint, photos, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    assert _caption(tiny_checkpoint, photos, "--out", out, "--batch-size", "3") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    report = [line for line in captured.err.splitlines() if "could not be read" in line]
    assert len(report) == 1 and "broken.png" in report[0]
    rows = _lines(out)
    expected = sorted(str(p) for p in photos.rglob("*.png"))
    assert [r["image"] for r in rows] == expected
    assert [("error" in r) for r in rows] == [p.endswith("broken.png") for p in expected]
    assert all(isinstance(r["generated_text"], str) and isinstance(r["score"], float) for r in rows if "error" not in r)

    assert _caption(tiny_checkpoint, photos, "--out", out) == 0  # resumed: every image is there already
    assert "9 images already in" in capsys.readouterr().err
    assert _lines(out) == rows

    assert _caption(tiny_checkpoint, photos, "--json") == 1  # the same captions as printed ones
    printed = json.loads(capsys.readouterr().out)
    assert {r["image"]: r.get("generated_text") for r in printed} == {r["image"]: r.get("generated_text") for r in rows}


def test_text_output_streams_one_line_per_image_as_before(tiny_checkpoint, photos, capsys):
    assert _caption(tiny_checkpoint, photos / "sub0", "--batch-size", "2", "--num-workers", "2") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == sorted(str(p) for p in (photos / "sub0").glob("*.png"))


def test_csv_out_and_a_list_naming_missing_files(tiny_checkpoint, photos, tmp_path, capsys):
    listing = tmp_path / "list.txt"
    good = sorted(str(p) for p in photos.glob("*.png"))
    listing.write_text("\n".join([good[0], str(tmp_path / "gone.png"), *good[1:]]) + "\n")
    out = tmp_path / "captions.csv"
    assert _caption(tiny_checkpoint, f"@{listing}", "--out", out) == 1
    assert "gone.png" in capsys.readouterr().err
    text = out.read_text().splitlines()
    assert text[0] == "image,generated_text,score,error" and len(text) == 1 + len(good) + 1
    assert "gone.png" in text[2] and "no such file" in text[2]


def test_shards_are_captioned_by_member(tiny_checkpoint, photos, tmp_path, capsys):
    shard = tmp_path / "images-000.tar"
    with tarfile.open(shard, "w") as tar:
        for p in sorted(photos.glob("*.png")):
            data = p.read_bytes()
            info = tarfile.TarInfo(p.stem + ".png")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "shards.jsonl"
    assert _caption(tiny_checkpoint, shard, "--out", out) == 0
    rows = _lines(out)
    assert [r["image"] for r in rows] == [f"{shard}:{p.stem}.png" for p in sorted(photos.glob("*.png"))]
    assert all("generated_text" in r for r in rows)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--batch-size", "0"], "--batch-size: expected a number >= 1, got 0"),
        (["--num-workers", "-1"], "--num-workers: expected a number >= 0, got -1"),
        (["--json", "--out", "x.jsonl"], "--json prints to stdout"),
        (["@missing-list.txt"], "no such list file"),
    ],
)
def test_bad_streaming_flags_are_one_line(tiny_checkpoint, photos, tmp_path, capsys, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    assert _caption(tiny_checkpoint, photos, *args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err


def test_an_out_that_is_not_this_commands_is_refused_and_kept(tiny_checkpoint, photos, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    out.write_text('{"image_id": 1, "caption": "a cat"}\n')
    assert _caption(tiny_checkpoint, photos, "--out", out) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a file written by `captioning caption --out`" in err[0]
    assert out.read_text() == '{"image_id": 1, "caption": "a cat"}\n'


# ------------------------------------------------------------------------- stopped and restarted
#: a child that runs the command and kills itself (SIGKILL: no clean-up) at a chosen point of batch K
KILLER = """
import os, signal, sys
from captioning.api import Captioner
from captioning.cli import main
from captioning.data.captions_out import CaptionsFile
where, k = sys.argv[1], int(sys.argv[2])
calls = {"append": 0, "caption": 0}
append, caption = CaptionsFile.append, Captioner.caption_pixels
def killing_append(self, rows):
    calls["append"] += 1
    if calls["append"] == k and where == "in-write":  # half of the batch's bytes written, then killed
        data = self._encode(rows, os.path.getsize(self.path) == 0 if os.path.exists(self.path) else True)
        with open(self.path, "ab") as f:
            f.write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    append(self, rows)
    if calls["append"] == k and where == "between":  # a batch written, the next not begun
        os.kill(os.getpid(), signal.SIGKILL)
def killing_caption(self, *args, **kwargs):
    calls["caption"] += 1
    if calls["caption"] == k and where == "in-batch":  # a batch read, captioning it
        os.kill(os.getpid(), signal.SIGKILL)
    return caption(self, *args, **kwargs)
CaptionsFile.append, Captioner.caption_pixels = killing_append, killing_caption
sys.exit(main(sys.argv[3:]))
"""


def _argv(checkpoint, photos, out):
    return ["caption", str(photos), "--checkpoint", str(checkpoint), "--out", str(out), "--batch-size", "2", *DECODE]


def _check_once(out: Path, photos: Path, reference: dict) -> None:
    rows = _lines(out)
    names = [r["image"] for r in rows]
    assert sorted(names) == sorted(str(p) for p in photos.rglob("*.png"))  # every image exactly once
    assert {r["image"]: r.get("generated_text") for r in rows} == reference


@pytest.mark.slow
@pytest.mark.parametrize("where,batch", [("between", 2), ("in-batch", 3), ("in-write", 2), ("in-write", 1)])
def test_killed_and_restarted_run_has_every_image_once(tiny_checkpoint, photos, tmp_path, capsys, where, batch):
    reference_out = tmp_path / "reference.jsonl"
    _caption(tiny_checkpoint, photos, "--out", reference_out)
    reference = {r["image"]: r.get("generated_text") for r in _lines(reference_out)}
    out = tmp_path / "killed.jsonl"
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, where, str(batch), *_argv(tiny_checkpoint, photos, out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    written = out.read_bytes() if out.exists() else b""
    assert len(written.splitlines()) < len(reference)  # stopped before the end
    assert _caption(tiny_checkpoint, photos, "--out", out, "--batch-size", "2") == 1  # the broken image
    _check_once(out, photos, reference)


@pytest.mark.slow
def test_signals_at_any_moment_then_a_restart_leave_every_image_once(tiny_checkpoint, photos, tmp_path, capsys):
    reference_out = tmp_path / "reference.jsonl"
    _caption(tiny_checkpoint, photos, "--out", reference_out)
    reference = {r["image"]: r.get("generated_text") for r in _lines(reference_out)}
    out = tmp_path / "stopped.jsonl"
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
        proc = subprocess.Popen(
            [sys.executable, "-m", "captioning.cli", *_argv(tiny_checkpoint, photos, out), "--batch-size", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        before = len(out.read_text().splitlines()) if out.exists() else 0
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:  # stopped once a line more is there
            if out.exists() and len(out.read_text().splitlines()) > before:
                proc.send_signal(sig)
                break
            time.sleep(0.02)
        proc.wait(timeout=120)
    _caption(tiny_checkpoint, photos, "--out", out)
    _check_once(out, photos, reference)


# ------------------------------------------------------------------------------------------ memory
def _photo(path: Path, seed: int) -> None:
    """A smooth 320x240 JPEG (a few KB on disk, 230 KB of pixels)."""
    y, x = np.mgrid[0:240, 0:320]
    rgb = np.stack([(x + seed) % 256, (y * 2 + seed) % 256, (x + y + 7 * seed) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(rgb).save(path, "JPEG", quality=80)


def _peak_rss_mb(argv) -> float:
    """The peak resident memory (MB) of a command run in a child process (ru_maxrss of its wait4)."""
    proc = subprocess.Popen([sys.executable, "-m", "captioning.cli", *argv], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return usage.ru_maxrss / 1024


@pytest.mark.slow
def test_memory_is_bounded_by_the_batch_not_by_the_number_of_images(tiny_checkpoint, tmp_path):
    few, many = tmp_path / "few", tmp_path / "many"
    for i in range(1500):  # 1,500 images of 320x240: ~345 MB of pixels if they were all held
        folder = many / f"{i // 500:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        _photo(folder / f"{i:05d}.jpg", i)
        if i < 100:
            few.mkdir(exist_ok=True)
            shutil.copy(folder / f"{i:05d}.jpg", few)
    args = ["--checkpoint", str(tiny_checkpoint), *DECODE, "--batch-size", "16"]
    small = _peak_rss_mb(["caption", str(few), "--out", str(tmp_path / "few.jsonl"), *args])
    large = _peak_rss_mb(["caption", str(many), "--out", str(tmp_path / "many.jsonl"), *args])
    assert len((tmp_path / "many.jsonl").read_text().splitlines()) == 1500
    assert large - small < 60, (small, large)  # 15 times the images, the same memory give or take 60 MB


# ------------------------------------------------------------------------- names, shards, writers, pixels
def test_a_forged_shard_header_is_one_problem_and_the_rest_is_captioned(tiny_checkpoint, photos, tmp_path):
    """A shard whose second member's size is negative (base-256): the members before it are
    captioned, the shard is one problem (on stderr, and the exit status), the next argument is
    captioned; no endless loop (a deadline), no traceback, no batch lost."""
    shard = tmp_path / "forged.tar"
    pngs = sorted(photos.glob("*.png"))
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for p in pngs[:2]:
            info = tarfile.TarInfo(p.name)
            info.size = p.stat().st_size
            tar.addfile(info, io.BytesIO(p.read_bytes()))
    data = bytearray(shard.read_bytes())
    second = 512 + -(-pngs[0].stat().st_size // 512) * 512  # the second member's header
    data[second + 124 : second + 136] = b"\xff" + (-512 % 256**11).to_bytes(11, "big")  # its size: -512
    data[second + 148 : second + 156] = b" " * 8
    data[second + 148 : second + 156] = b"%06o\0 " % sum(data[second : second + 512])
    shard.write_bytes(bytes(data))
    out = tmp_path / "out.jsonl"
    args = ["caption", str(shard), str(pngs[2]), "--checkpoint", str(tiny_checkpoint), "--out", str(out), *DECODE]
    done = subprocess.run([sys.executable, "-m", "captioning.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    rows = _lines(out)  # the images captioned; the shard's problem is the run's (stderr), not an image's line
    assert [r["image"] for r in rows] == [f"{shard}:{pngs[0].name}", str(pngs[2])]
    assert all("generated_text" in r for r in rows)
    assert f"{shard}: member '{pngs[1].name}': its header declares -512 bytes" in done.stderr


def test_names_that_are_not_utf8_or_hold_control_characters(tiny_checkpoint, photos, tmp_path, capsys):
    """A Latin-1 file name (bytes, as the file system gives it) is captioned into --out with its bytes
    and resumed; printed, every name is one TSV record (a newline, a tab, an escape sequence shown
    escaped)."""
    folder = tmp_path / "names"
    folder.mkdir()
    png = sorted(photos.glob("*.png"))[0].read_bytes()
    latin = os.path.join(os.fsencode(folder), b"caf\xe9.png")
    with open(latin, "wb") as f:
        f.write(png)
    tricky = folder / "two\nlines\t\x1b[31mred.png"
    tricky.write_bytes(png)
    out = tmp_path / "out.jsonl"
    assert _caption(tiny_checkpoint, folder, "--out", out) == 0
    assert b"caf\xe9.png" in out.read_bytes() and len(out.read_bytes().splitlines()) == 2
    assert _caption(tiny_checkpoint, folder, "--out", out) == 0
    assert "2 images already in" in capsys.readouterr().err
    listing = tmp_path / "list.txt"
    listing.write_bytes(latin + b"\n")
    assert _caption(tiny_checkpoint, f"@{listing}") == 0
    assert _caption(tiny_checkpoint, folder) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.count("\t") == 1 for line in lines)
    assert lines[0].startswith(f"{folder}/caf\\xe9.png\t")
    assert f"{folder}/two\\nlines\\tx\\x1b[31mred.png".replace("\\tx", "\\t") in lines[2] and "\x1b" not in lines[2]


HOLDER = """
import sys
from captioning.data.captions_out import CaptionsFile
out = CaptionsFile(sys.argv[1])
out.check()
print("locked", flush=True)
sys.stdin.readline()  # held until the test says
out.append([{"image": "first.png", "generated_text": "x", "score": -1.0}])
out.close()
"""


def test_a_second_run_on_one_out_is_refused_while_the_first_writes(tiny_checkpoint, photos, tmp_path):
    out = tmp_path / "out.jsonl"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "locked"
        args = ["caption", str(photos), "--checkpoint", str(tiny_checkpoint), "--out", str(out), *DECODE]
        second = subprocess.run(
            [sys.executable, "-m", "captioning.cli", *args], capture_output=True, text=True, timeout=300
        )
        err = second.stderr.strip().splitlines()
        assert second.returncode != 0 and len(err) == 1, second.stderr[-2000:]
        assert "another `captioning caption` run is writing to it" in err[0]
        assert out.read_bytes() == b""  # nothing of the second run's
    finally:
        first.communicate("\n", timeout=60)
    assert first.returncode == 0 and [r["image"] for r in _lines(out)] == ["first.png"]


def test_one_image_spelt_three_ways_is_captioned_once(tiny_checkpoint, photos, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(photos.parent)
    out = tmp_path / "out.jsonl"
    assert _caption(tiny_checkpoint, photos.name, "--out", out) == 1  # (the broken image)
    count = len(_lines(out))
    assert _caption(tiny_checkpoint, f"./{photos.name}", "--out", out) == 0
    assert _caption(tiny_checkpoint, str(photos), "--out", out) == 0
    assert len(_lines(out)) == count
    assert capsys.readouterr().err.count(f"{count} images already in") == 2


@pytest.fixture
def held_pixels(monkeypatch):
    return record_held_pixels(monkeypatch)


def test_focus_holds_the_models_pixels_not_the_images(tiny_checkpoint, tmp_path, held_pixels, capsys):
    for i in range(3):
        large_png(tmp_path / f"big{i}.png")
    assert _caption(tiny_checkpoint, tmp_path, "--focus", "0,0,1500,1000", "--batch-size", "3", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and all(r["generated_text"] is not None for r in rows)
    assert held_pixels and max(held_pixels) < 3 * 3 * 256 * 256  # the model's few pixels, not 3 x 18 MB
