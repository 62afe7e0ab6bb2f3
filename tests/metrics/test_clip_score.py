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


def test_evaluate_notes_why_clip_scores_are_missing_or_gives_them(
    scorer, tiny_checkpoint, tiny_shapes, tmp_path, monkeypatch
):
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
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(tiny_checkpoint),
                "--annotations",
                str(tiny_shapes),
                "--max-new-tokens",
                "5",
                "--out",
                str(out),
                "--clip-model",
                "ViT-B-32",
                "--clip-weights",
                str(weights),
            ]
        )
        == 0
    )
    scores = json.loads(out.read_text())["scores"]
    assert 0 <= scores["CLIPScore"] <= 2.5 and 0 <= scores["RefCLIPScore"] <= 2.5


def test_captioning_test_logs_clip_scores(scorer, tiny_checkpoint, tiny_shapes, tmp_path):
    from safetensors.torch import save_file

    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    weights = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in scorer.model.state_dict().items()}, str(weights))
    clip = ["--model.clip_score.model", "ViT-B-32", "--model.clip_score.weights", str(weights)]
    args = fit_args(tiny_shapes, tmp_path / "test", extra=[*clip, "--ckpt_path", str(tiny_checkpoint)])
    logged = run_lightning_cli(["test", *args[1:]]).trainer.callback_metrics
    assert 0 <= float(logged["test/CLIPScore"]) <= 2.5 and 0 <= float(logged["test/RefCLIPScore"]) <= 2.5
    assert 0 <= float(logged["test/novel_captions"]) <= 1
    assert "val/CLIPScore" not in logged  # validation scores CLIP only when clip_score.validation says so


def test_a_tag_that_is_not_openclips_is_one_line_and_nothing_is_loaded(tmp_path, monkeypatch):
    """``MODEL/TAG`` with a tag outside OpenCLIP's list (``ViT-B-32//path/x.pt``: a path) never reaches
    OpenCLIP's loader, which would read the file without the project's weights-only checks."""
    import pickle

    import open_clip

    from captioning.errors import ConfigError
    from captioning.metrics.clip_score import ClipScoring

    marker = tmp_path / "ran"
    payload = tmp_path / "x.pt"

    class Runs:
        def __reduce__(self):
            return open, (str(marker), "w")

    payload.write_bytes(pickle.dumps(Runs()))
    built = []
    monkeypatch.setattr(open_clip, "create_model_and_transforms", lambda *a, **k: built.append(a) or 1 / 0)
    for spec in (f"ViT-B-32/{payload}", "ViT-B-32/openai/../x", "ViT-B-32/no-such-tag"):
        with pytest.raises(ConfigError) as info:
            ClipScorer.load(spec)
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"--clip-model {spec}: OpenCLIP has no pretrained tag"), (
            message
        )
        assert "list_pretrained_tags_by_model('ViT-B-32')" in message
        scoring = ClipScoring(spec, device="cpu")
        assert (
            scoring.scorer() is None
            and scoring.missing.startswith("unavailable: --clip-model")
            and "\n" not in scoring.missing
        )
    assert built == [] and not marker.exists()


def test_a_damaged_clip_weights_file_is_one_line_naming_it(scorer, tmp_path):
    """Garbage bytes, a truncated file (safetensors or torch's zip) and weights of another model: a
    one-line CheckpointError naming the file from ClipScorer.load, and ClipScoring notes it (nothing escapes)."""
    from safetensors.torch import save_file

    from captioning.errors import CheckpointError
    from captioning.metrics.clip_score import ClipScoring

    state = {k: v.contiguous() for k, v in scorer.model.state_dict().items()}
    whole = tmp_path / "whole.safetensors"
    save_file(state, str(whole))
    torch.save(state, tmp_path / "whole.pt")
    files = {
        "garbage.safetensors": b"\x00\x13not a tensor file at all" * 40,
        "garbage.pt": bytes(range(256)) * 8,
        "truncated.safetensors": whole.read_bytes()[: whole.stat().st_size // 3],
        "truncated.pt": (tmp_path / "whole.pt").read_bytes()[:100_000],
    }
    other = tmp_path / "other.safetensors"
    save_file({"visual.proj": torch.zeros(3, 3), "text_projection": torch.zeros(2)}, str(other))
    partial = tmp_path / "partial.safetensors"
    save_file({"logit_scale": state["logit_scale"]}, str(partial))
    paths = [other, partial]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    for path in paths:
        with pytest.raises(CheckpointError) as info:
            ClipScorer.load("ViT-B-32", weights=str(path))
        message = str(info.value)
        assert message.startswith(str(path)) and "\n" not in message, message
        scoring = ClipScoring("ViT-B-32", str(path), device="cpu")
        images = lambda ids: [Image.new("RGB", (8, 8)) for _ in ids]  # noqa: E731
        assert scoring(images, {0: "a cat"}, {0: ["a dog"]}) == ({}, {"CLIPScore": f"unavailable: {message}"})
