"""What several test files share: paths, `fit` arguments, tiny datasets written on the fly, the exact
gradient of a hard-attention problem small enough to enumerate. Fixtures (the builders of decoders,
batches and models among them) live in the conftest.py files; plain functions here (import them from
``tests.helpers``)."""

import http.client
import io
import itertools
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from captioning.decoding.generation import GenerationConfig
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.web.client import encode_multipart, wait_for_server

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

#: the sizes of conftest.py's builders (make_decoder, make_batch): a vocabulary of V tokens, D-wide
#: annotation vectors (the LSTM's width too, for the dot score) on a GRID x GRID grid
V, D, GRID = 13, 12, 3

#: every variant of models/attention/ and some of their combinations ({} is the paper's model)
VARIANTS = {
    "paper": {},
    "dot": dict(score="dot"),
    "general": dict(score="general"),
    "scaled_dot": dict(score="scaled_dot"),
    "multihead": dict(heads=2),
    "multihead_dot": dict(score="dot", heads=3),
    "luong": dict(placement="luong"),
    "local": dict(window="local", local_sigma=0.8),
    "refiner": dict(refiner_layers=1, refiner_heads=2),
    "luong_local_heads": dict(placement="luong", window="local", heads=2, score="scaled_dot"),
    "aoa": dict(aoa=True),
    "refiner_aoa": dict(refiner_layers=1, refiner_heads=2, refiner_aoa=True),
    "luong_aoa_heads": dict(placement="luong", aoa=True, heads=2),
    "no_deep_output_extras": dict(prev2out=False, ctx2out=False),
    # the course notes' catalogue (docs/CATALOGUE.md)
    "uniform": dict(score="uniform"),
    "concat": dict(score="concat"),
    "normalized": dict(normalize=True),
    "normalized_concat_heads": dict(score="concat", normalize=True, heads=2),
    "scaled": dict(score="general", scale=True),
    "scaled_dot_heads": dict(score="dot", scale=True, heads=3),
    "sparsemax": dict(normalizer="sparsemax"),
    "local_p": dict(window="local_p", local_width=1),
    "local_m": dict(window="local_m", local_width=1),
    "luong_local_p_sparsemax_heads": dict(
        placement="luong", window="local_p", local_width=1, normalizer="sparsemax", heads=2
    ),  # fmt: skip
    "hierarchical": dict(window="hierarchical", region_size=2),
    "hierarchical_sparsemax_heads": dict(window="hierarchical", region_size=2, normalizer="sparsemax", heads=2),
    "attention_pool": dict(init="attention_pool"),
    "over_attention": dict(over_attention=True),
    "over_attention_general_sparsemax": dict(over_attention=True, score="general", normalizer="sparsemax"),
}

#: the variants the fast path's twin computes (tests/fast/): over_attention's decoder is a subclass,
#: which the commands run as written
TWIN_VARIANTS = {name: settings for name, settings in VARIANTS.items() if not settings.get("over_attention")}


# ---------------------------------------------------------------------- captions and training runs
def shapes_test_images(annotations: Path, n: int) -> list[str]:
    """The paths of the first ``n`` test images of shapes data (sorted by name)."""
    return [str(p) for p in sorted((annotations.parent / "images" / "test").glob("*.png"))][:n]


def caption_tokens(text: str) -> list[str]:
    """The tokens of a caption as printed: words, and punctuation attached to them ("a cross, a")."""
    return re.findall(r"[,.;:!?]|[^\s,.;:!?]+", text)


def fit_args(annotations, root_dir, config="shapes_soft.yaml", steps=2, extra=()):
    """`captioning fit` arguments for a few fast steps of a config on tiny data."""
    return [
        "fit",
        "--config",
        str(ROOT / "configs" / config),
        "--data.annotations",
        str(annotations),
        "--data.batch_size",
        "8",
        "--data.num_workers",
        "0",
        "--trainer.default_root_dir",
        str(root_dir),
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        str(steps),
        "--trainer.limit_val_batches",
        "1",
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger",
        "false",
        "--model.val_generation.max_new_tokens",
        "12",
        "--model.test_generation.max_new_tokens",
        "12",
        *extra,
    ]


# ---------------------------------------------------------------------- tiny real-format datasets
WORDS = ["a", "dog", "cat", "runs", "on", "the", "grass", "red", "ball", "sits", "mat", "blue"]


def write_jpeg(path: Path, seed: int, size: int = 48) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8)).save(path, "JPEG")


def caption(rng) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(3, 9))))


def make_karpathy(
    root: Path, n_train: int = 12, n_val: int = 4, n_test: int = 4, captions: int = 3, cocoid: bool = False
) -> Path:
    """A Karpathy split file with JPEGs under root/images; returns the annotation file."""
    rng = np.random.default_rng(0)
    images = []
    for i, split in enumerate(["train"] * n_train + ["val"] * n_val + ["test"] * n_test):
        write_jpeg(root / "images" / f"{i}.jpg", i)
        sents = [{"raw": c, "tokens": c.split()} for c in (caption(rng) for _ in range(captions))]
        img = {"filepath": "images", "filename": f"{i}.jpg", "imgid": i, "split": split, "sentences": sents}
        if cocoid:
            img["cocoid"] = 1000 + i
        images.append(img)
    path = root / "dataset_tiny.json"
    path.write_text(json.dumps({"images": images, "dataset": "tiny"}))
    return path


def make_coco(root: Path) -> tuple[Path, Path, Path]:
    """captions_train2014.json (ids 1-6), captions_val2014.json (ids 7-10), a Karpathy split file."""
    rng = np.random.default_rng(1)
    files = []
    for folder, ids in (("train2014", range(1, 7)), ("val2014", range(7, 11))):
        images, anns = [], []
        for k in ids:
            name = f"COCO_{folder}_{k:012d}.jpg"
            write_jpeg(root / folder / name, k)
            images.append({"id": k, "file_name": name, "width": 56, "height": 48})
            anns += [{"id": 100 * k + j, "image_id": k, "caption": caption(rng).capitalize() + "."} for j in range(2)]
        path = root / "annotations" / f"captions_{folder}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"info": {}, "images": images, "licenses": [], "annotations": anns}))
        files.append(path)
    split = {1: "train", 2: "train", 3: "restval", 4: "train", 7: "train", 8: "val", 9: "test", 10: "test"}
    karpathy = {"images": [{"cocoid": k, "split": s, "filename": "x", "sentences": []} for k, s in split.items()]}
    (root / "dataset_coco.json").write_text(json.dumps(karpathy))
    return files[0], files[1], root / "dataset_coco.json"


def path_without_java(path: str) -> str:
    """``path`` (a PATH value) without its folders that hold ``java``: the coco-caption scorers then use the
    Python PTB tokenizer and leave METEOR out, taking milliseconds instead of a JVM's start each."""
    import os

    return os.pathsep.join(p for p in path.split(os.pathsep) if not os.path.isfile(os.path.join(p, "java")))


def make_aichallenger(annotations: Path, root: Path, split: str = "val") -> tuple[Path, dict]:
    """One split of a shapes annotation file in AI Challenger's layout (caption_<split>_annotations_<date>.json
    and its images folder; each image named by the SHA-1 of its shapes file name, "<40 hex>.jpg", as AI
    Challenger names them). Returns (the file, shapes imgid -> AI Challenger image_id)."""
    import hashlib
    import shutil

    part = {"val": "validation"}.get(split, split)
    folder = root / f"caption_{part}_images_20170910"
    folder.mkdir(parents=True, exist_ok=True)
    items, names = [], {}
    for image in json.loads(Path(annotations).read_text())["images"]:
        if image["split"] != split:
            continue
        name = hashlib.sha1(image["filename"].encode()).hexdigest() + ".jpg"
        shutil.copy(Path(annotations).parent / image["filepath"] / image["filename"], folder / name)
        items.append(
            {"url": f"http://example.org/{name}", "image_id": name, "caption": [s["raw"] for s in image["sentences"]]}
        )
        names[image["imgid"]] = name
    path = root / f"caption_{part}_annotations_20170910.json"
    path.write_text(json.dumps(items, ensure_ascii=False))
    return path, names


# ---------------------------------------------------------------------- a hard-attention problem small enough to enumerate
#: the enumerable problem (tests/objectives/conftest.py's ``tiny_problem``): vocabulary, feature width, locations
HARD_V, HARD_D, HARD_L = 7, 5, 3


def flat_grad(loss, params):
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, grads)])


def exact_gradient(dec, features, captions, lengths):
    """Gradient of E_s[log p(y | s, a)] = sum_s p(s | a) log p(y | s, a), every s enumerated."""
    seqs = torch.tensor(list(itertools.product(range(HARD_L), repeat=2)))  # (9, 2)
    n = len(seqs)
    out = dec(features.expand(n, -1, -1), captions.expand(n, -1), lengths.expand(n), mode="sample", locations=seqs)
    log_py = caption_log_likelihood(out.logits, captions.expand(n, -1)[:, 1:], out.mask)  # (9,)
    p_s = out.location_log_probs.sum(1).exp()  # (9,)
    assert torch.allclose(p_s.sum(), torch.tensor(1.0), atol=1e-5)
    return flat_grad((p_s * log_py).sum(), list(dec.parameters()))


def z_scores(est, exact, directions):
    proj = est @ directions.T  # (batches, k)
    mean, se = proj.mean(0), proj.std(0) / est.size(0) ** 0.5
    return (mean - exact @ directions.T) / se


# ---------------------------------------------------------------------- the web server in a subprocess, and a stand-in model
MAX_UPLOAD_MB = 1
MAX_PIXELS = 4_000_000
SETTINGS = dict(num_beams=2, max_new_tokens=8)


# ---------------------------------------------------------------------- a server in a subprocess
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m captioning.web`` on 127.0.0.1 and a free port; waits until /healthz answers."""

    def __init__(self, checkpoints, *extra, log: Path, timeout: float = 180.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")
        args = [
            sys.executable,
            "-m",
            "captioning.web",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        for spec in checkpoints:
            args += ["--checkpoint", str(spec)]
        self.proc = subprocess.Popen(args + [str(a) for a in extra], stdout=self._log, stderr=subprocess.STDOUT)
        problem = wait_for_server(self.url, self.proc, timeout)
        if problem:
            self.stop()
            raise RuntimeError(f"the server {problem}:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None and get_json(self.url, "/healthz")[0] == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    host, port = url.split("//")[1].split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def get_json(url: str, path: str, timeout: float = 10) -> tuple[int, dict]:
    conn = _connection(url, timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def post(url: str, body, headers: dict, timeout: float = 120, encode_chunked: bool = False) -> tuple[int, dict]:
    conn = _connection(url, timeout)
    try:
        conn.request("POST", "/api/caption", body=body, headers=headers, encode_chunked=encode_chunked)
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, {"raw": raw.decode("utf-8", "replace")}
    finally:
        conn.close()


def post_image(url: str, data: bytes, filename: str = "image.jpg", **fields) -> tuple[int, dict]:
    body, content_type = encode_multipart(fields, filename, data)
    return post(url, body, {"Content-Type": content_type})


# ---------------------------------------------------------------------- fixtures
def jpeg_640x480(path: Path) -> bytes:
    """A test image stretched to 640 x 480, as JPEG bytes (a photo-sized upload)."""
    buffer = io.BytesIO()
    Image.open(path).convert("RGB").resize((640, 480), Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _bomb_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (3000, 3000)).save(buffer, "PNG")  # 9 Mpixels in a few kB, over --max-pixels 4,000,000
    return buffer.getvalue()


class FakeVocab(list):
    EOS = "<end>"


class FakeCaptioner:
    """The coming API: describe() and num_return_sequences (top beams, best first)."""

    attention_kind = "hard"
    image_size = 32
    vocab = FakeVocab(["<pad>", "<start>", "<end>", "<unk>", "a", "cat"])
    model = torch.nn.Linear(2, 2)
    generation = GenerationConfig()

    def __init__(self):
        self.calls = []

    def describe(self):
        return {
            "attention": "hard",
            "encoder": "resnet101",
            "vocab_size": 6,
            "image_size": 32,
            "training_data": "coco (Karpathy train)",
            "test_scores": {"BLEU-4": np.float32(0.25), "CIDEr": 0.9},
        }

    def __call__(
        self,
        images,
        num_beams=3,
        max_new_tokens=None,
        length_penalty=None,
        attention_mode=None,
        return_attention=False,
        num_return_sequences=1,
    ):
        self.calls.append(
            dict(
                n=len(images),
                num_beams=num_beams,
                attention_mode=attention_mode,
                num_return_sequences=num_return_sequences,
            )
        )
        beams = [{"generated_text": "a cat", "score": -0.5}, {"generated_text": "a a cat", "score": -0.9}]
        return [
            {
                "generated_text": "a cat",
                "score": -0.5,
                "tokens": ["a", "cat", "<end>"],
                "attention": np.full((3, 2, 2), 0.25),
                "locations": [(0, 1), (1, 1), (0, 0)],
                "beams": beams[:num_return_sequences],
            }
            for _ in images
        ]


# ---------------------------------------------------------------------- what a loader's batch holds
def large_png(path: Path, size: tuple[int, int] = (3000, 2000)) -> None:
    """A PNG of ``size`` pixels in few colours: 18 MB of pixels at the default size, a few KB on disk."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, (200, 30, 30))
    ImageDraw.Draw(image).rectangle((size[0] // 4, size[1] // 4, size[0] // 2, size[1] // 2), fill=(20, 40, 220))
    image.save(path)


def record_held_pixels(monkeypatch) -> list[int]:
    """Records, per batch the stream loader (data/inputs.py: read_batch) reads, the bytes of pixels
    its items hold (numpy arrays, PIL images, tuples of them): the list it returns fills as they run."""
    from captioning.data import inputs

    held: list[int] = []
    read = inputs.read_batch

    def nbytes(value) -> int:
        if hasattr(value, "nbytes"):
            return int(value.nbytes)
        if hasattr(value, "size") and hasattr(value, "mode"):  # a PIL image
            return value.size[0] * value.size[1] * len(value.getbands())
        if isinstance(value, (tuple, list)):
            return sum(nbytes(v) for v in value)
        return 0

    def recording(sources, *args, **kwargs):
        batch = read(sources, *args, **kwargs)
        held.append(sum(nbytes(b.image) for b in batch))
        return batch

    monkeypatch.setattr(inputs, "read_batch", recording)
    return held


# ---------------------------------------------------------------------- float32 tolerances
FLOAT32_EPS = float(np.finfo(np.float32).eps)  # 1.19e-7: the spacing of float32 numbers near 1
#: the float32 operations along a value's path through the tests' tiny models (a few small
#: convolutions, decoders of 16 to 64 dimensions over 4 to 49 locations, a dozen steps): a bound
#: on the roundings that two ways of computing it (a batch or one image, another runtime) differ by
TINY_PATH = 1024


def float32_tolerance(reference, terms: int) -> dict:
    """``rtol`` and ``atol`` for float32 results computed two ways (another order of sums, another
    runtime or kernel) compared with ``reference``. Each may differ by the rounding of ``terms``
    float32 operations (the products summed along the computation's path, added up: a bound) on
    numbers as large as the reference's largest, a value near zero included (it may come from large
    ones that cancel). So atol = eps * terms * max|reference| and rtol = eps * terms: never a fixed
    absolute below float32's own error for the values compared."""
    if hasattr(reference, "detach"):  # a tensor
        reference = reference.detach().cpu().double().numpy()
    scale = float(np.max(np.abs(np.asarray(reference, dtype=np.float64)), initial=0.0))
    return {"rtol": FLOAT32_EPS * terms, "atol": FLOAT32_EPS * terms * scale}
