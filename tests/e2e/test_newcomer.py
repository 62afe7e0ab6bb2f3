"""A newcomer's first hour, walked as the README and docs/TRAINING.md say (slow: a fresh virtual
environment, `make demo`, then one's own dozen photos).

The walk: a copy of the repository as a clone has it, `make demo` (which makes its own .venv), the
serve command the demo prints last answering /healthz, then a 12-image CSV without a split column
prepared, trained for a few steps with the documented small config, captioned and evaluated. No
command may print a warning that does not concern the user (Python warnings, third-party chatter).
"""

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow

# what a warning that does not concern the user looks like on stderr: Python's warnings module, and
# the third-party lines the project filters elsewhere
NOISE = re.compile(
    r"(Warning:|warnings\.warn|PossibleUserWarning|DeprecationWarning|UserWarning|FutureWarning|"
    r"PTBTokenizer tokenized|It is recommended to use|consider increasing the value of the `num_workers`)"
)


def _copy_as_cloned(destination: Path) -> None:
    """The repository's tracked and not-ignored files (what a clone of this tree holds)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / name.decode()
        if source.is_file():
            target = destination / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command: list[str], cwd: Path, timeout: float, transcript: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "VIRTUAL_ENV"))}
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    transcript.append(f"$ {' '.join(command)}  -> rc {done.returncode}: {last}")
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _own_photos(folder: Path, count: int = 12) -> Path:
    """A dozen photos of one's own (coloured shapes drawn with PIL) and captions.csv without a split."""
    from PIL import Image, ImageDraw

    colours = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 60)}
    rows = []
    for i in range(count):
        name, rgb = list(colours.items())[i % 3]
        shape = ("circle", "square")[i % 2]
        image = Image.new("RGB", (160, 120), (245, 245, 240))
        draw = ImageDraw.Draw(image)
        box = (40 + 3 * i, 30, 110 + 3 * i, 100)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=rgb)
        path = folder / ("beach" if i % 2 else "garden") / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        rows.append({"image": str(path.relative_to(folder)), "caption": f"a {name} {shape} on a white wall"})
    with open(folder / "captions.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["image", "caption"])
        writer.writeheader()
        writer.writerows(rows)
    return folder / "captions.csv"


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("git") is None, reason="needs make and git")
def test_a_newcomer_walks_from_make_demo_to_their_own_photos(tmp_path):
    clone = tmp_path / "clone"
    _copy_as_cloned(clone)
    transcript: list[str] = []
    demo = _run(["make", "demo", f"PYTHON={sys.executable}"], clone, 40 * 60, transcript)
    printed = re.search(r"try it in a browser: (\S*captioning serve .*)", demo.stdout)
    assert printed, demo.stdout[-2000:]
    assert "needs the web extra" not in printed.group(1)  # make demo installed what its last line runs
    assert re.search(r"trained 1,200 steps in [\d.]+ min", demo.stdout), demo.stdout[-2000:]
    bin_dir = clone / ".venv" / "bin"

    # the serve command as printed, from the clone, with the environment not activated (PATH without .venv/bin)
    port = _free_port()
    serve = [*printed.group(1).split(), "--port", str(port)]
    assert serve[0] == os.path.join(".venv", "bin", "captioning"), serve[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "VIRTUAL_ENV"))}
    server = subprocess.Popen(serve, cwd=clone, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, answer = time.monotonic() + 180, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
                    answer = reply.status
                    break
            except OSError:
                time.sleep(1)
        assert answer == 200, f"the printed serve command did not answer /healthz: {server.poll()}"
        transcript.append(f"$ {printed.group(1)} --port {port}  -> /healthz {answer}")
    finally:
        server.terminate()
        server.wait(30)

    photos = tmp_path / "photos"
    annotations = _own_photos(photos)
    captioning = str(bin_dir / "captioning")
    run_dir = tmp_path / "run"
    commands = [
        [
            captioning,
            "prepare",
            "--annotations",
            str(annotations),
            "--images-root",
            str(photos),
            "--min-word-freq",
            "1",
        ],
        [
            captioning,
            "fit",
            "--config",
            "configs/own_small_cnn.yaml",
            "--data.annotations",
            str(annotations),
            "--data.images_root",
            str(photos),
            "--trainer.max_steps",
            "6",
            "--trainer.default_root_dir",
            str(run_dir),
        ],
    ]
    stderr = []
    for command in commands:
        stderr.append(_run(command, clone, 15 * 60, transcript).stderr)
    checkpoint = next(run_dir.rglob("last.ckpt"))
    for command in (
        [captioning, "caption", str(photos), "--checkpoint", str(checkpoint)],
        [
            captioning,
            "evaluate",
            "--checkpoint",
            str(checkpoint),
            "--annotations",
            str(annotations),
            "--images-root",
            str(photos),
            "--split",
            "test",
        ],
    ):
        stderr.append(_run(command, clone, 15 * 60, transcript).stderr)
    print("\n".join(transcript))  # the walk's transcript (pytest -s shows it)
    assert "held out" in stderr[0] + stderr[1]  # the split the CSV lacked is made and said
    noise = [line for text in stderr for line in text.splitlines() if NOISE.search(line)]
    assert not noise, "warnings that do not concern the user:\n" + "\n".join(noise)
