"""The smoke set: every command a user runs first, through the public command line, on tiny data.

``make test-floors`` runs it in a virtual environment with every dependency at its floor
(tools/dev/floors.py), so that an install at the declared floors is known to fit, evaluate, caption,
serve, export (a model folder, read back as a Hub id from huggingface_hub's cache offline; ONNX) and
caption with onnxruntime. Each step is ``python -m captioning.cli ...`` with the
interpreter that runs this script; the first failure prints its command and output, and exits 1.

    python -m tools.dev.smoke [--work DIR] [--steps 8] [--skip serve,onnx]

About a minute on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("make-shapes", "fit", "evaluate", "caption", "serve", "export", "caption-hub", "export-onnx", "caption-onnx")


class StepFailed(RuntimeError):
    """A step exited non-zero; the message holds its command and its output's tail."""


def run(name: str, args: list[str], timeout: float = 600, env: dict | None = None) -> str:
    """``python -m captioning.cli ARGS`` (``env`` added to the environment); its stdout, or :class:`StepFailed`."""
    command = [sys.executable, "-m", "captioning.cli", *map(str, args)]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired:
        raise StepFailed(f"{name}: no answer within {timeout:.0f} s\n  $ {shlex.join(command)}") from None
    if done.returncode != 0:
        raise StepFailed(
            f"{name}: exit {done.returncode}\n  $ {shlex.join(command)}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    print(f"smoke: {name} ok ({time.perf_counter() - start:.1f} s)", flush=True)
    return done.stdout


def serve_healthz(checkpoint: str, timeout: float = 180) -> None:
    """``captioning serve`` on a free port until /healthz answers 200, then stopped."""
    import socket

    from captioning.web.client import wait_for_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "captioning.cli", "serve", "--checkpoint", checkpoint, "--port", str(port)]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            problem = wait_for_server(f"http://127.0.0.1:{port}", proc, timeout)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        if problem:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-4000:]
            raise StepFailed(f"serve: the server {problem}\n  $ {shlex.join(command)}\n{tail}")
    print(f"smoke: serve ok (/healthz answered, {time.perf_counter() - start:.1f} s)", flush=True)


def hub_cache(folder: Path, cache: Path, repo: str) -> Path:
    """``folder`` laid out as huggingface_hub's cache keeps a download of ``repo`` (a snapshot and the
    ref ``main``), so that the Hub route reads it with HF_HUB_OFFLINE set: nothing leaves the machine."""
    import shutil

    revision = "0" * 40
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, root / "snapshots" / revision)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(revision)
    return cache


def smoke(work: Path, steps: int = 8, skip: tuple[str, ...] = ()) -> None:
    data = work / "data"
    annotations = data / "dataset_shapes.json"
    run("make-shapes", ["make-shapes", "--out", data, "--train", 48, "--val", 8, "--test", 8, "--seed", 0])
    fit = [
        "fit", "--config", ROOT / "configs" / "shapes_soft.yaml", "--data.annotations", annotations,
        "--data.batch_size", 8, "--trainer.default_root_dir", work / "train", "--trainer.max_epochs", 1,
        "--trainer.max_time", "null", "--trainer.limit_train_batches", steps, "--trainer.limit_val_batches", 1,
        "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        "--model.optimizer.ema_start_step", 0, "--model.val_generation.max_new_tokens", 12,
    ]  # fmt: skip
    run("fit", fit)
    found = sorted(glob.glob(str(work / "train" / "**" / "last.ckpt"), recursive=True))
    if not found:
        raise StepFailed(f"fit: no last.ckpt under {work / 'train'}")
    checkpoint = found[0]
    run("evaluate", ["evaluate", "--checkpoint", checkpoint, "--annotations", annotations, "--split", "test",
                     "--num-beams", 2, "--max-new-tokens", 12, "--out", work / "metrics.json"])  # fmt: skip
    images = sorted(glob.glob(str(data / "images" / "*")))[:2]
    run("caption", ["caption", *images, "--checkpoint", checkpoint, "--max-new-tokens", 12])
    if "serve" not in skip:
        serve_healthz(checkpoint)
    run("export", ["export", "--checkpoint", checkpoint, "--out", work / "folder"])
    cache = hub_cache(work / "folder", work / "hub", "local/smoke")
    run("caption-hub", ["caption", *images, "--checkpoint", "hf://local/smoke", "--max-new-tokens", 12],
        env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})  # fmt: skip
    if "onnx" not in skip:
        run("export-onnx", ["export", "--checkpoint", checkpoint, "--out", work / "onnx", "--format", "onnx"])
        run("caption-onnx", ["caption", *images, "--onnx", work / "onnx", "--max-new-tokens", 12])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one, removed)")
    parser.add_argument("--steps", type=int, default=8, help="training steps of the fit")
    parser.add_argument("--skip", default="", help="steps to skip: serve, onnx (comma-separated)")
    args = parser.parse_args(argv)
    skip = tuple(s.strip() for s in args.skip.split(",") if s.strip())
    start = time.perf_counter()
    try:
        if args.work:
            Path(args.work).mkdir(parents=True, exist_ok=True)
            smoke(Path(args.work), args.steps, skip)
        else:
            with tempfile.TemporaryDirectory(prefix="captioning-smoke-") as work:
                smoke(Path(work), args.steps, skip)
    except StepFailed as err:
        print(f"smoke: FAILED at {err}", file=sys.stderr)
        return 1
    print(f"smoke: all steps passed in {time.perf_counter() - start:.0f} s ({sys.executable})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
