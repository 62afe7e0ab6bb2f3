"""The GPU check: everything a GPU user depends on, in one command, through the public command line.

    python -m tools.benchmarks.gpu_check --out outputs/gpu_check            # on a CUDA machine (make gpu-check)
    python -m tools.benchmarks.gpu_check --out outputs/gpu_check --dry-run  # anywhere: the CPU, tiny sizes

A few ``fit`` steps of the soft, hard and Transformer shapes configs at COCO's sizes (224 px, a
ResNet-101 grid of 14 x 14 x 2048, 512-wide decoders, batch 64) in each speed mode (eager fp32, bf16-mixed,
static shapes, CUDA graphs, the compiled decoder step); beam-5 decoding with ``caption`` (plain and
CUDA graphs); the loader's feed rate decoding JPEGs on the CPU and with nvJPEG; DDP on every device
present; ``caption`` and ``serve`` on the device. It writes gpu_check.json and gpu_check.md (one row a
case: what ran, its rate, seconds) in ``--out``, and stops at the first failure with the command that
reproduces it (exit 1). ``--dry-run`` runs the same cases on the CPU at tiny sizes (CUDA-only ones
are listed as skipped), so that the script itself is known to work (CI runs it). Sized to take at
most 8 minutes on one H100/H200 (an estimate: not yet run on a GPU); docs/PERFORMANCE.md has the dry
run's table and time.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"soft": "shapes_soft.yaml", "hard": "shapes_hard.yaml", "transformer": "shapes_transformer.yaml"}
#: each speed mode's flags (on the CPU, cuda-graphs runs its static step uncaptured, as the project does there)
MODES = {
    "eager": [],
    "bf16-mixed": ["--trainer.precision", "bf16-mixed"],
    "static": ["--model.static_shapes", "true"],
    # the configs' warm-up is stepped by Lightning's automatic optimisation, which the captured step replaces
    "cuda-graphs": ["--model.cuda_graphs", "true", "--model.optimizer.schedule.kind", "none"],
    "compiled": ["--model.decoder.compile_step", "true"],
}
#: (config, mode) pairs the project refuses by design (one line, said by the command): not run
UNSUPPORTED = {("transformer", "compiled"): "compile_step is an LSTM option"}
#: pairs the dry run leaves out: a compile on the CPU takes minutes (the soft config's shows the path works)
DRY_SKIPPED = {("hard", "compiled"): "a CPU compile takes minutes: the dry run compiles the soft step only"}
_RATE = re.compile(r"step (\d+)\s+(?:loss ([-+0-9.naif]+)\s+)?([0-9.]+) steps/s")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes of a run: COCO's on a GPU, tiny for the dry run."""

    image_size: int
    encoder: tuple[str, ...]  # flags of the encoder
    decoder: dict  # flags of each decoder kind ("lstm", "transformer")
    batch: int
    steps: int  # fit steps a case
    every: int  # the progress line's interval: the rate is the last line's (after warm-up)
    images: tuple[int, int, int]  # make-shapes' train, val, test
    decode: tuple[int, int]  # images captioned: the small run (start-up and warm-up) and the large one
    jpeg_size: int  # the loader's JPEGs (make-shapes --preset hard writes JPEG)
    workers: int
    max_tokens: int


GPU = Sizes(
    image_size=224,
    encoder=("--model.encoder.name", "resnet101", "--model.encoder.pretrained", "false",
             "--model.encoder.grid_size", "14", "--model.encoder.channels_last", "true"),
    decoder={
        "lstm": ("--model.decoder.embed_dim", "512", "--model.decoder.hidden_dim", "512",
                 "--model.decoder.attention_dim", "512"),
        "transformer": ("--model.decoder.embed_dim", "512", "--model.decoder.hidden_dim", "512",
                        "--model.decoder.heads", "8", "--model.decoder.layers", "3"),
    },
    batch=64, steps=40, every=10, images=(1024, 64, 640), decode=(128, 640), jpeg_size=512,
    workers=min(8, os.cpu_count() or 1), max_tokens=20,
)  # fmt: skip
DRY = Sizes(
    image_size=32,
    encoder=("--model.encoder.channels", "[8,16]", "--model.encoder.dim", "32"),
    decoder={
        "lstm": ("--model.decoder.embed_dim", "16", "--model.decoder.hidden_dim", "32",
                 "--model.decoder.attention_dim", "16"),
        "transformer": ("--model.decoder.embed_dim", "32", "--model.decoder.hidden_dim", "32",
                        "--model.decoder.heads", "2", "--model.decoder.layers", "1"),
    },
    batch=4, steps=4, every=2, images=(32, 4, 24), decode=(4, 24), jpeg_size=64, workers=1, max_tokens=8,
)  # fmt: skip


class CheckFailed(RuntimeError):
    """A case failed: the message holds the command that reproduces it and its output's tail."""


class GpuCheck:
    """Runs the cases in order, keeps their rows, and writes the report (also after a failure)."""

    def __init__(self, out: Path, dry_run: bool, sizes: Sizes, device: str, devices: int):
        self.out, self.dry_run, self.sizes, self.device, self.devices = out, dry_run, sizes, device, devices
        self.rows: list[dict] = []
        self.failure: str | None = None
        self.started = time.perf_counter()
        self.work = out / "work"
        self.work.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ running
    def command(self, args: list) -> list[str]:
        return [sys.executable, "-m", "captioning.cli", *map(str, args)]

    def run(self, section: str, case: str, args: list, timeout: float = 600, env: dict | None = None) -> tuple:
        """Run ``captioning ARGS``: (stdout, seconds); a failure raises :class:`CheckFailed`."""
        command = self.command(args)
        print(f"gpu-check: {section} / {case}: $ {shlex.join(command)}", flush=True)
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
            )
        except subprocess.TimeoutExpired:
            self.fail(section, case, command, f"no answer within {timeout:.0f} s")
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            self.fail(section, case, command, f"exit {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-4000:]}")
        return done.stdout + done.stderr, seconds

    def fail(self, section: str, case: str, command: list[str], detail: str):
        self.failure = f"{section} / {case}: {detail.splitlines()[0]}\nreproduce: {shlex.join(command)}"
        self.rows.append({"section": section, "case": case, "status": "FAILED", "command": shlex.join(command)})
        raise CheckFailed(
            f"{section} / {case} failed: {detail}\n\nreproduce with:\n  cd {ROOT} && {shlex.join(command)}"
        )

    def row(self, section: str, case: str, status: str, **values) -> None:
        self.rows.append({"section": section, "case": case, "status": status, **values})
        shown = ", ".join(f"{k} {v}" for k, v in values.items() if k != "command")
        print(f"gpu-check: {section} / {case}: {status}{'; ' + shown if shown else ''}", flush=True)

    # ------------------------------------------------------------------ the cases
    def data(self) -> None:
        s = self.sizes
        train, val, test = s.images
        common = ["--train", train, "--val", val, "--test", test, "--image-size", s.image_size, "--seed", 0]
        _, seconds = self.run("data", "shapes (PNG)", ["make-shapes", "--out", self.work / "shapes", *common])
        self.row("data", "shapes (PNG)", "ok", images=sum(s.images), seconds=round(seconds, 1))
        jpeg = ["--train", 1, "--val", 1, "--test", s.decode[1], "--image-size", s.jpeg_size, "--preset", "hard"]
        _, seconds = self.run("data", "shapes (JPEG)", ["make-shapes", "--out", self.work / "jpeg", *jpeg])
        self.row("data", "shapes (JPEG)", "ok", images=s.decode[1] + 2, seconds=round(seconds, 1))

    def fit_args(self, config: str, root: Path, extra: list) -> list:
        s = self.sizes
        kind = "transformer" if config == "transformer" else "lstm"
        return [
            "fit", "--config", ROOT / "configs" / CONFIGS[config],
            "--data.annotations", self.work / "shapes" / "dataset_shapes.json",
            "--data.image_size", s.image_size, "--data.batch_size", s.batch, "--data.num_workers", 0,
            *s.encoder, *s.decoder[kind],
            "--trainer.accelerator", "cpu" if self.dry_run else "gpu", "--trainer.devices", 1,
            "--trainer.max_steps", s.steps, "--trainer.max_time", "null", "--trainer.max_epochs", 1000,
            "--trainer.log_every_n_steps", s.every, "--trainer.num_sanity_val_steps", 0,
            "--trainer.limit_val_batches", 1, "--trainer.logger", "false", "--trainer.default_root_dir", root,
            "--model.val_generation.max_new_tokens", s.max_tokens, *extra,
        ]  # fmt: skip

    def fit(self) -> None:
        for config in CONFIGS:
            for mode, flags in MODES.items():
                case = f"{config} {mode}"
                if (config, mode) in UNSUPPORTED:
                    self.row("fit", case, "not supported", note=UNSUPPORTED[config, mode])
                    continue
                if self.dry_run and (config, mode) in DRY_SKIPPED:
                    self.row("fit", case, "skipped", note=DRY_SKIPPED[config, mode])
                    continue
                root = self.work / "fit" / f"{config}-{mode}"
                output, seconds = self.run("fit", case, self.fit_args(config, root, flags))
                rates = _RATE.findall(output)
                if not rates:
                    self.fail(
                        "fit", case, self.command(self.fit_args(config, root, flags)), "no progress line\n" + output
                    )
                step, loss, rate = rates[-1]
                if loss and not _finite(loss):
                    self.fail(
                        "fit", case, self.command(self.fit_args(config, root, flags)), f"loss {loss} at step {step}"
                    )
                self.row("fit", case, "ok", steps_per_s=float(rate), images_per_s=round(float(rate) * self.sizes.batch, 1),
                         loss=float(loss) if loss else None, seconds=round(seconds, 1))  # fmt: skip

    def checkpoint(self) -> str:
        found = sorted(glob.glob(str(self.work / "fit" / "soft-eager" / "**" / "last.ckpt"), recursive=True))
        if not found:
            raise CheckFailed(f"no last.ckpt under {self.work / 'fit' / 'soft-eager'}: the soft eager fit wrote none")
        return found[0]

    def images(self, folder: Path, count: int) -> Path:
        """A list file (``@list``) of the first ``count`` images under ``folder``."""
        paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg"))[:count]
        listed = self.work / f"{folder.name}-{count}.txt"
        listed.write_text("".join(f"{p}\n" for p in paths), encoding="utf-8")
        return listed

    def rate(self, section: str, case: str, folder: Path, args: list) -> None:
        """Images a second of ``caption`` over a folder's images: the difference of two runs (the small one
        holds start-up, loading and warm-up), so that only the captioning itself is timed."""
        small, large = self.sizes.decode
        times = []
        for count in (small, large):
            out = self.work / f"caption-{re.sub(r'[^a-z0-9]+', '-', case)}-{count}.jsonl"
            out.unlink(missing_ok=True)
            listed = self.images(folder, count)
            _, seconds = self.run(section, f"{case} ({count} images)", ["caption", f"@{listed}", "--out", out, *args])
            lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
            if len(lines) != count:
                self.fail(section, case, self.command(["caption", f"@{listed}", "--out", out, *args]),
                          f"{len(lines)} captions for {count} images")  # fmt: skip
            times.append(seconds)
        rate = (large - small) / max(times[1] - times[0], 1e-6)
        self.row(section, case, "ok", images_per_s=round(rate, 1), seconds=round(sum(times), 1))

    def decode(self) -> None:
        checkpoint, s = self.checkpoint(), self.sizes
        base = ["--checkpoint", checkpoint, "--device", self.device, "--batch-size", s.batch,
                "--max-new-tokens", s.max_tokens, "--num-beams", 5]  # fmt: skip
        folder = self.work / "shapes" / "images"
        self.rate("decode", "beam 5", folder, base)
        if self.dry_run:
            self.row("decode", "beam 5, CUDA graphs", "skipped", note="CUDA only")
        else:
            self.rate("decode", "beam 5, CUDA graphs", folder, [*base, "--cuda-graphs"])

    def loader(self) -> None:
        checkpoint, s = self.checkpoint(), self.sizes
        base = ["--checkpoint", checkpoint, "--device", self.device, "--batch-size", s.batch,
                "--max-new-tokens", 2, "--num-beams", 1, "--num-workers", s.workers]  # fmt: skip
        folder = self.work / "jpeg" / "images"
        self.rate("loader", f"JPEG {s.jpeg_size} px, CPU decode, {s.workers} workers", folder,
                  [*base, "--decode-device", "cpu"])  # fmt: skip
        if self.dry_run:
            self.row("loader", "JPEG, nvJPEG decode", "skipped", note="CUDA only")
        else:
            self.rate("loader", f"JPEG {s.jpeg_size} px, nvJPEG decode", folder, [*base, "--decode-device", "cuda"])

    def ddp(self) -> None:
        devices = self.devices if not self.dry_run else 2
        root = self.work / "fit" / "ddp"
        args = self.fit_args("soft", root, ["--trainer.strategy", "ddp", "--trainer.devices", devices])
        output, seconds = self.run("ddp", f"soft, {devices} processes", args)
        rates = _RATE.findall(output)
        if not rates:
            self.fail("ddp", f"soft, {devices} processes", self.command(args), "no progress line\n" + output)
        self.row("ddp", f"soft, {devices} processes", "ok", steps_per_s=float(rates[-1][2]), seconds=round(seconds, 1))

    def caption_and_serve(self) -> None:
        checkpoint = self.checkpoint()
        image = sorted((self.work / "shapes" / "images").rglob("*.png"))[0]
        output, seconds = self.run("serve", "caption", ["caption", image, "--checkpoint", checkpoint, "--device",
                                                         self.device, "--json"])  # fmt: skip
        self.row("serve", f"caption on {self.device}", "ok", seconds=round(seconds, 1))
        self.serve(checkpoint, image)

    def serve(self, checkpoint: str, image: Path) -> None:
        from captioning.web.client import encode_multipart, wait_for_server

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        args = ["serve", "--checkpoint", checkpoint, "--port", port, "--device", self.device]
        command = self.command(args)
        print(f"gpu-check: serve / serve: $ {shlex.join(command)}", flush=True)
        log = open(self.work / "serve.log", "wb")
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            problem = wait_for_server(url, proc, 300)
            if problem:
                self.fail("serve", "serve", command, f"the server {problem}\n{_tail(self.work / 'serve.log')}")
            import urllib.request

            body, content_type = encode_multipart({"num_beams": 3}, image.name, image.read_bytes())
            request = urllib.request.Request(f"{url}/api/caption", data=body, headers={"Content-Type": content_type})
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    reply = json.loads(answer.read())
            except OSError as err:
                self.fail("serve", "serve", command, f"POST /api/caption: {err}\n{_tail(self.work / 'serve.log')}")
            text = json.dumps(reply)[:120]
            self.row("serve", f"serve on {self.device}: POST /api/caption", "ok", answer=text,
                     seconds=round(time.perf_counter() - start, 1))  # fmt: skip
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            log.close()

    # ------------------------------------------------------------------ the report
    def report(self) -> tuple[Path, Path]:
        meta = machine(self.device)
        meta.update(dry_run=self.dry_run, sizes=dataclasses.asdict(self.sizes), seconds=round(self.elapsed(), 1))
        data = {"machine": meta, "failure": self.failure, "rows": self.rows}
        json_path, md_path = self.out / "gpu_check.json", self.out / "gpu_check.md"
        json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        md_path.write_text(markdown(data), encoding="utf-8")
        return json_path, md_path

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def _finite(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return value == value and abs(value) != float("inf")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def machine(device: str) -> dict:
    import torch

    meta = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
            "cpu_count": os.cpu_count(), "cuda": torch.version.cuda}  # fmt: skip
    if torch.cuda.is_available():
        meta["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return meta


def markdown(data: dict) -> str:
    meta = data["machine"]
    gpus = ", ".join(meta.get("gpus", [])) or "no GPU"
    lines = [
        f"GPU check ({'dry run on the CPU, tiny sizes' if meta['dry_run'] else 'COCO sizes'}): {gpus}, "
        f"torch {meta['torch']} (CUDA {meta['cuda']}), Python {meta['python']}, {meta['seconds']:.0f} s in all.",
        "",
        "| section | case | status | steps/s | images/s | loss | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        note = r.get("note", "")
        cells = [r["section"], r["case"], r["status"] + (f" ({note})" if note else ""),
                 _cell(r.get("steps_per_s")), _cell(r.get("images_per_s")), _cell(r.get("loss")), _cell(r.get("seconds"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if data["failure"]:
        lines += ["", "**Failed**: " + data["failure"].replace("\n", "  \n")]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:,.2f}" if isinstance(value, float) and value < 100 else f"{value:,}"


SECTIONS = ("data", "fit", "decode", "loader", "ddp", "serve")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/gpu_check", help="folder for gpu_check.json, gpu_check.md and work/")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at tiny sizes (no CUDA needed)")
    parser.add_argument("--steps", type=int, default=None, help="fit steps a case (default: 40 on a GPU, 4 dry)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"a subset of {','.join(SECTIONS)}")
    args = parser.parse_args(argv)
    import torch

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown {unknown[0]!r} (expected some of {', '.join(SECTIONS)})")
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; run with --dry-run for the CPU check at tiny sizes", file=sys.stderr)
        return 2
    sizes = DRY if args.dry_run else GPU
    if args.steps:
        sizes = dataclasses.replace(sizes, steps=args.steps, every=max(1, args.steps // 3))
    device = "cpu" if args.dry_run else "cuda"
    devices = 1 if args.dry_run else torch.cuda.device_count()
    check = GpuCheck(Path(args.out), args.dry_run, sizes, device, devices)
    steps = {"data": check.data, "fit": check.fit, "decode": check.decode, "loader": check.loader,
             "ddp": check.ddp, "serve": check.caption_and_serve}  # fmt: skip
    code = 0
    try:
        for name in SECTIONS:
            if name in sections or name == "data":
                steps[name]()
    except CheckFailed as err:
        print(f"\ngpu-check: FAILED: {err}", file=sys.stderr)
        code = 1
    json_path, md_path = check.report()
    print(f"gpu-check: {'FAILED' if code else 'passed'} in {check.elapsed():.0f} s; wrote {json_path} and {md_path}")
    return code


if __name__ == "__main__":
    sys.exit(main())
