"""What an install route costs: the download (the wheels pip fetches), the installed size and the time,
in a fresh virtual environment (docs/INSTALL.md's table).

    python -m tools.dev.install_size --route cuda          # PyPI's torch (the CUDA build on Linux) + .[web]
    python -m tools.dev.install_size --route cpu --torch-index https://download.pytorch.org/whl/cpu
    python -m tools.dev.install_size --route cpu --torch-wheel torch-2.13.0+cpu-....whl --torchvision 0.28.0

Each route is ``make demo``'s install (the package and the web extra) after PyTorch; ``--torch-wheel``
measures a CPU wheel at hand where the index cannot be reached. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure(torch_args: list[str], python: str = sys.executable) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # a clean environment
    run = lambda args, **kw: subprocess.run(args, check=True, env=env, **kw)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="install-size-") as tmp:
        venv, wheels = Path(tmp) / "venv", Path(tmp) / "wheels"
        run([python, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        steps = {"torch": [*torch_args], "package": ["-e", f"{ROOT}[web]"]}
        out: dict = {"python": python, "torch_args": torch_args}
        for name, args in steps.items():
            start = time.perf_counter()
            run([*pip, "install", "--quiet", "--no-cache-dir", *args])
            out[f"{name}_install_s"] = round(time.perf_counter() - start, 1)
        site = next((venv / "lib").glob("python*/site-packages"))
        out["installed_bytes"] = _size(venv)
        parts = {}
        for group, pattern in (("torch", "torch"), ("nvidia", "nvidia"), ("triton", "triton")):
            found = [p for p in site.iterdir() if p.name == pattern or p.name.startswith(pattern + "_")]
            parts[group] = sum(_size(p) for p in found if p.is_dir())
        out["installed_parts_bytes"] = parts
        frozen = run([*pip, "freeze", "--exclude-editable"], capture_output=True, text=True)
        requirements = Path(tmp) / "frozen.txt"
        requirements.write_text(
            "\n".join(
                line for line in frozen.stdout.splitlines() if not line.startswith(("torch", "captioning", "-e"))
            ),
            encoding="utf-8",
        )
        run([*pip, "download", "--quiet", "--no-deps", "-d", str(wheels), *torch_args])
        run([*pip, "download", "--quiet", "--no-deps", "-d", str(wheels), "-r", str(requirements)])
        out["download_bytes"] = _size(wheels)
        out["wheels"] = len(list(wheels.iterdir()))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--torch-index", default=None, help="the index of PyTorch's wheels (pip's --index-url)")
    parser.add_argument("--torch-wheel", default=None, help="a torch wheel file instead of an index")
    parser.add_argument("--torchvision", default=None, help="the torchvision release beside --torch-wheel")
    args = parser.parse_args(argv)
    torch_args = ["torch", "torchvision"]
    if args.torch_wheel:
        torch_args = [args.torch_wheel, f"torchvision=={args.torchvision}" if args.torchvision else "torchvision"]
    elif args.torch_index:
        torch_args = ["--index-url", args.torch_index, *torch_args]
    print(json.dumps({"route": args.route, **measure(torch_args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
