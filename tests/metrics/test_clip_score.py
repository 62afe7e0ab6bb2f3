"""CLIPScore and RefCLIPScore (metrics/clip_score.py) against a hand computation with the same CLIP
model (random weights: nothing is downloaded), and `evaluate`'s notes when no CLIP can be loaded."""
import json

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

pytest.importorskip("open_clip", reason="the ecosystem extra: pip install -e '.[ecosystem]'")

from captioning.cli import main  # noqa: E402
from captioning.metrics.clip_score import PREFIX, ClipScorer  # noqa: E402


@pytest.fixture(scope="module")
def scorer():
    torch.manual_seed(0)
    return ClipScorer.load("ViT-B-32", pretrained=False)


def test_scores_are_the_papers_formulas(scorer):
    images = [Image.new("RGB", (40, 30), c) for c in ((200, 10, 10), (10, 200, 10), (10, 10, 200))]
    captions = ["a red square", "a green field", "a blue sky"]
    references = [["red", "a red thing"], ["grass"], ["the sky", "blue", "water"]]
    got = scorer(images, captions, references, batch_size=2)
    with torch.no_grad():
        v = F.normalize(scorer.model.encode_image(torch.stack([scorer.preprocess(i) for i in images])), dim=-1)
        c = F.normalize(scorer.model.encode_text(scorer.tokenizer([PREFIX + t for t in captions])), dim=-1)
        clip = 2.5 * (v * c).sum(-1).clamp(min=0)
        ref = []
        for i, refs in enumerate(references):
            r = F.normalize(scorer.model.encode_text(scorer.tokenizer([PREFIX + t for t in refs])), dim=-1)
            best = (r @ c[i]).max().clamp(min=0)
            ref.append(2 * clip[i] * best / (clip[i] + best))
    assert got["CLIPScore"] == pytest.approx(float(clip.mean()), abs=1e-5)
    assert got["RefCLIPScore"] == pytest.approx(float(torch.stack(ref).mean()), abs=1e-5)
    assert scorer(images, captions)["CLIPScore"] == pytest.approx(got["CLIPScore"], abs=1e-6)


def test_local_weights_give_the_same_model(scorer, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in scorer.model.state_dict().items()}, str(path))
    again = ClipScorer.load("ViT-B-32", weights=str(path))
    image, caption = [Image.new("RGB", (32, 32), (90, 90, 90))], ["a grey square"]
    assert again(image, caption) == pytest.approx(scorer(image, caption))


def test_evaluate_notes_why_clip_scores_are_missing_or_gives_them(scorer, tiny_checkpoint, tiny_shapes, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from captioning.cli.evaluate import clip_scores

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for model, expected in ((None, "not computed"), ("ViT-B-32", "name its weights"), ("NoSuchModel/x", "unavailable")):
        notes = {}
        clip_scores({}, notes, None, "test", {1: "a cat"}, model, None, "cpu")  # (no data read before the model loads)
        assert expected in notes["CLIPScore"] and "\n" not in notes["CLIPScore"]
    weights = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in scorer.model.state_dict().items()}, str(weights))
    out = tmp_path / "metrics.json"
    assert main(["evaluate", "--checkpoint", str(tiny_checkpoint), "--annotations", str(tiny_shapes), "--max-new-tokens", "5",
                 "--out", str(out), "--clip-model", "ViT-B-32", "--clip-weights", str(weights)]) == 0
    scores = json.loads(out.read_text())["scores"]
    assert 0 <= scores["CLIPScore"] <= 2.5 and 0 <= scores["RefCLIPScore"] <= 2.5


def test_captioning_test_logs_clip_scores(scorer, tiny_checkpoint, tiny_shapes, tmp_path):
    from safetensors.torch import save_file

    from tests.helpers import fit_args
    from captioning.training.cli import run_lightning_cli

    weights = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in scorer.model.state_dict().items()}, str(weights))
    clip = ["--model.clip_score.model", "ViT-B-32", "--model.clip_score.weights", str(weights)]
    args = fit_args(tiny_shapes, tmp_path / "test", extra=[*clip, "--ckpt_path", str(tiny_checkpoint)])
    logged = run_lightning_cli(["test", *args[1:]]).trainer.callback_metrics
    assert 0 <= float(logged["test/CLIPScore"]) <= 2.5 and 0 <= float(logged["test/RefCLIPScore"]) <= 2.5
    assert 0 <= float(logged["test/novel_captions"]) <= 1
    assert "val/CLIPScore" not in logged  # validation scores CLIP only when clip_score.validation says so
