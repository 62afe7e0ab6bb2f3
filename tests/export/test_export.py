"""Model folders (safetensors + config.json + vocab.json), the Hub cache, ONNX export and the
numpy + onnxruntime captioner, with PyTorch made unimportable; and every bad folder's one-line error."""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.api import Captioner
from captioning.cli import main
from captioning.errors import CheckpointError
from captioning.storage.load import load_model
from tests.helpers import ROOT, TINY_PATH, fit_args, float32_tolerance


@pytest.fixture(scope="module")
def images(tiny_shapes) -> list:
    """Every image of the tiny shapes set (test split first): 56 images of the demo's kind."""
    root = tiny_shapes.parent / "images"
    return [str(p) for split in ("test", "val", "train") for p in sorted((root / split).glob("*.png"))]


@pytest.fixture(scope="module")
def soft_folder(tiny_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "soft"
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def soft_onnx(tiny_checkpoint, tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    out = tmp_path_factory.mktemp("export") / "soft_onnx"
    assert main(["export", "--format", "onnx", "--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def hard_checkpoint(tiny_shapes, tmp_path_factory) -> Path:
    from captioning.training.cli import run_lightning_cli

    # a tempered test decoding (GenerationConfig.attention_temperature), so that the ONNX test covers
    # the expected-context step graph built at the checkpoint's tau
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            tmp_path_factory.mktemp("fit_hard"),
            config="shapes_hard.yaml",
            steps=3,
            extra=["--model.test_generation.attention_temperature", "0.5"],
        )
    )
    return Path(cli.trainer.checkpoint_callback.last_model_path)


def same_results(a: list, b: list, tol: float = 1e-4) -> float:
    """The share of images whose captions agree; their scores must agree within ``tol``."""
    same = [x["generated_text"] == y["generated_text"] for x, y in zip(a, b)]
    for x, y, s in zip(a, b, same):
        if s:
            assert abs(x["score"] - y["score"]) < tol, (x, y)
    return sum(same) / len(same)


# ---------------------------------------------------------------------- safetensors folders
def test_export_writes_weights_only_and_a_self_describing_folder(tiny_checkpoint, soft_folder):
    from safetensors import safe_open

    assert sorted(p.name for p in soft_folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "vocab.json",
    ]
    config = json.loads((soft_folder / "config.json").read_text())
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    assert config["format_version"] == 1 and config["model"]["decoder"] == ckpt["hyper_parameters"]["decoder"]
    assert config["model"]["encoder"]["name"] == "small_cnn" and config["model"]["grid"] == [8, 8]
    assert config["preprocessing"]["image_size"] == 64 and config["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
    assert config["generation"]["max_new_tokens"] == 12 and config["model"]["vocab_size"] == len(
        ckpt["vocabulary"]["itos"]
    )
    assert json.loads((soft_folder / "vocab.json").read_text())["itos"] == ckpt["vocabulary"]["itos"]
    with safe_open(str(soft_folder / "model.safetensors"), "pt") as f:  # the model's weights, nothing else
        keys = set(f.keys())
    assert keys == {k.removeprefix("model.") for k in ckpt["state_dict"]}
    assert os.path.getsize(soft_folder / "model.safetensors") < 0.5 * os.path.getsize(
        tiny_checkpoint
    )  # no Adam moments
    card = (soft_folder / "README.md").read_text()
    assert "soft attention" in card and str(ckpt["training_data"]) in card


def test_from_pretrained_captions_and_scores_as_the_checkpoint(tiny_checkpoint, soft_folder, images, tmp_path):
    a, b = Captioner.from_checkpoint(tiny_checkpoint, "cpu"), Captioner.from_pretrained(soft_folder, "cpu")
    a.save_pretrained(tmp_path / "saved")  # the API writes the folder the command writes
    assert json.loads((tmp_path / "saved" / "config.json").read_text()) == json.loads(
        (soft_folder / "config.json").read_text()
    )
    from safetensors.torch import load_file  # (the header's key order may differ from file to file: compare tensors)

    saved, exported = load_file(tmp_path / "saved" / "model.safetensors"), load_file(soft_folder / "model.safetensors")
    assert saved.keys() == exported.keys() and all(torch.equal(saved[k], exported[k]) for k in saved)
    for beams in (1, 3):
        ra, rb = a(images, num_beams=beams, return_attention=True), b(images, num_beams=beams, return_attention=True)
        assert [r["generated_text"] for r in ra] == [r["generated_text"] for r in rb]
        assert [r["score"] for r in ra] == [r["score"] for r in rb]
        assert all(np.array_equal(x["attention"], y["attention"]) for x, y in zip(ra, rb))
    assert b.describe()["training_data"] == a.describe()["training_data"] is not None


def test_every_checkpoint_command_takes_a_folder(tiny_checkpoint, soft_folder, tiny_shapes, tmp_path, capsys):
    """caption and evaluate give the same output from the folder as from the checkpoint."""
    picks = [str(p) for p in sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:3]]
    outs = []
    for model in (tiny_checkpoint, soft_folder):
        assert main(["caption", *picks, "--checkpoint", str(model), "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    scores = []
    for i, model in enumerate((tiny_checkpoint, soft_folder)):
        assert (
            main(
                [
                    "evaluate",
                    "--checkpoint",
                    str(model),
                    "--annotations",
                    str(tiny_shapes),
                    "--num-beams",
                    "1",
                    "--out",
                    str(tmp_path / f"m{i}.json"),
                ]
            )
            == 0
        )
        capsys.readouterr()
        scores.append(json.loads((tmp_path / f"m{i}.json").read_text())["scores"])
    assert scores[0] == scores[1] and "CIDEr" in scores[0]
    # the metrics report goes into the model card and config.json
    out = tmp_path / "with_scores"
    assert (
        main(["export", "--checkpoint", str(soft_folder), "--out", str(out), "--metrics", str(tmp_path / "m0.json")])
        == 0
    )
    assert f"| CIDEr | {scores[0]['CIDEr']:.4f} |" in (out / "README.md").read_text()
    assert Captioner.from_pretrained(out).describe()["test_scores"]["CIDEr"] == scores[0]["CIDEr"]


def test_init_from_a_folder(tiny_shapes, soft_folder, tmp_path):
    from captioning.training.init_from import initial_model

    model = load_model(soft_folder)
    start = initial_model(str(soft_folder), model.spec)
    weights = start.state_dict()
    assert start.vocab == model.vocab and all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_hub_ids_resolve_through_the_cache_and_an_offline_miss_is_one_line(soft_folder, images, tmp_path, monkeypatch):
    """A Hub id is looked up in huggingface_hub's cache (no network here: local_files_only)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-captioner"
    shutil.copytree(soft_folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    captioner = Captioner.from_pretrained(
        "someone/tiny-captioner", cache_dir=str(tmp_path / "hub"), local_files_only=True
    )
    assert captioner(images[:4]) == Captioner.from_pretrained(soft_folder)(images[:4])
    with pytest.raises(CheckpointError) as err:
        Captioner.from_pretrained("someone/absent", cache_dir=str(tmp_path / "hub"), local_files_only=True)
    message = str(err.value)
    assert "someone/absent" in message and "not in the Hugging Face cache" in message and "\n" not in message


# ---------------------------------------------------------------------- ONNX
def test_onnx_steps_match_the_decoder_within_1e4(tiny_checkpoint, soft_onnx, images):
    """One step of the ONNX graph against decoder.step on the same states: greedy rows and 3 beams per image."""
    from captioning.data.images import load_image, to_tensor
    from captioning.export.onnx_captioner import OnnxCaptioner

    model, onnx = load_model(tiny_checkpoint), OnnxCaptioner(soft_onnx)
    batch = torch.stack([to_tensor(load_image(p), 64) for p in images[:8]])
    with torch.no_grad():
        features = model.encoder(batch)
        state = model.decoder.initial_state(features)
        encoded = onnx.encode(batch.numpy())
        assert list(encoded) == ["features", "projected", "h0", "c0"]
        for ours, theirs in zip(encoded.values(), (state.features, state.projected, state.h, state.c)):
            np.testing.assert_allclose(ours, theirs.numpy(), **float32_tolerance(theirs, TINY_PATH))
        for beams in (1, 3):
            s = state if beams == 1 else state.expand_beams(beams)
            s = s.with_recurrent(s.h + 0.3 * torch.randn_like(s.h), s.c + 0.3 * torch.randn_like(s.c))  # beams differ
            tokens = torch.randint(4, len(model.vocab), (s.h.size(0),))
            logp, new, g = model.decoder.step(tokens, s)
            carried = {"h": s.h.numpy(), "c": s.c.numpy()}
            constants = {"features": encoded["features"], "projected": encoded["projected"]}
            ours, state_next, alpha, heads = onnx.step(tokens.numpy(), carried, constants)
            assert np.abs(ours - logp.numpy()).max() < 1e-4 and heads is None
            np.testing.assert_allclose(state_next["h"], new.h.numpy(), **float32_tolerance(new.h, TINY_PATH))
            np.testing.assert_allclose(state_next["c"], new.c.numpy(), **float32_tolerance(new.c, TINY_PATH))
            np.testing.assert_allclose(alpha, g.alpha.numpy(), **float32_tolerance(1.0, TINY_PATH))


def test_onnx_captioner_refuses_a_focus_in_one_line(soft_onnx, images):
    from captioning.errors import ConfigError
    from captioning.export.onnx_captioner import OnnxCaptioner

    onnx = OnnxCaptioner(soft_onnx)
    with pytest.raises(ConfigError, match="focus: the ONNX captioner cannot steer"):
        onnx(images[:1], focus=(0, 0, 8, 8))
    plain = onnx(images[:1], num_beams=1)
    assert onnx(images[:1], num_beams=1, focus=None, focus_strength=10) == plain  # no box: no focus


def test_onnx_captions_as_pytorch_greedy_and_beam_3(tiny_checkpoint, soft_onnx, images):
    from captioning.export.onnx_captioner import OnnxCaptioner

    a, b = Captioner.from_checkpoint(tiny_checkpoint, "cpu"), OnnxCaptioner(soft_onnx)
    for beams in (1, 3):
        ra = a(images, num_beams=beams, return_attention=True, num_return_sequences=min(beams, 2), batch_size=16)
        rb = b(images, num_beams=beams, return_attention=True, num_return_sequences=min(beams, 2), batch_size=16)
        assert same_results(ra, rb) >= 0.99
        for x, y in zip(ra, rb):
            assert x.keys() == y.keys() and x["locations"] == y["locations"]
            np.testing.assert_allclose(x["attention"], y["attention"], atol=1e-4)
            if beams > 1:
                assert [r["generated_text"] for r in x["beams"]] == [r["generated_text"] for r in y["beams"]]
    settings = dict(num_beams=3, forbid_bad_endings=True, length_penalty=0.5, max_new_tokens=9)
    assert same_results(a(images, **settings), b(images, **settings)) >= 0.99


def test_an_onnx_folder_without_a_state_description_is_an_lstms(tiny_checkpoint, soft_onnx, images, tmp_path):
    """Folders written before config.json's onnx.state (and the LSTM's graphs, whose names stay
    those) are read as the LSTM's h and c over the features: the same captions as with it."""
    import onnxruntime as ort

    from captioning.export.onnx import ENCODER_OUTPUTS, STEP_INPUTS, STEP_OUTPUTS
    from captioning.export.onnx_captioner import LSTM_STATE, OnnxCaptioner

    config = json.loads((soft_onnx / "config.json").read_text())
    assert config["onnx"]["state"] == LSTM_STATE
    encoder = ort.InferenceSession(str(soft_onnx / "encoder.onnx"))
    step = ort.InferenceSession(str(soft_onnx / "decoder_step.onnx"))
    assert [o.name for o in encoder.get_outputs()] == ENCODER_OUTPUTS == ["features", "projected", "h0", "c0"]
    assert [i.name for i in step.get_inputs()] == STEP_INPUTS == ["tokens", "h", "c", "features", "projected"]
    assert [o.name for o in step.get_outputs()] == STEP_OUTPUTS == ["log_probs", "h_next", "c_next", "alpha"]
    old = tmp_path / "old"
    shutil.copytree(soft_onnx, old)
    del config["onnx"]["state"]
    (old / "config.json").write_text(json.dumps(config))
    a, b = OnnxCaptioner(soft_onnx), OnnxCaptioner(old)
    for beams in (1, 3):
        assert b(images[:16], num_beams=beams, return_attention=True)[0].keys() == {
            "generated_text",
            "score",
            "tokens",
            "attention",
            "locations",
        }
        assert [r["generated_text"] for r in a(images, num_beams=beams)] == [
            r["generated_text"] for r in b(images, num_beams=beams)
        ]


def test_onnx_hard_attention_exports_expected_and_argmax(hard_checkpoint, images, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    from captioning.export.onnx_captioner import OnnxCaptioner

    out = tmp_path / "hard_onnx"
    assert main(["export", "--format", "onnx", "--checkpoint", str(hard_checkpoint), "--out", str(out)]) == 0
    assert (out / "decoder_step.onnx").is_file() and (out / "decoder_step_argmax.onnx").is_file()
    a, b = Captioner.from_checkpoint(hard_checkpoint, "cpu"), OnnxCaptioner(out)
    for mode in ("expected", "argmax"):
        for beams in (1, 3):
            ra = a(images, num_beams=beams, attention_mode=mode, return_attention=True)
            rb = b(images, num_beams=beams, attention_mode=mode, return_attention=True)
            assert same_results(ra, rb) >= 0.99
            assert [x["locations"] for x in ra] == [y["locations"] for y in rb]
    with pytest.raises(Exception, match="sampling"):
        b(images[:1], attention_mode="sample")
    # the expected-context graph is exported at the checkpoint's attention_temperature (0.5: the
    # comparisons above covered the tempered context); another needs PyTorch
    tau = a.generation.attention_temperature
    assert tau != 1.0 and b.generation.attention_temperature == tau
    assert json.loads((out / "config.json").read_text())["onnx"]["attention_temperature"] == tau
    with pytest.raises(
        Exception, match=f"attention_temperature 1.0: this ONNX step graph reads .* at attention_temperature {tau:g}"
    ):
        b(images[:1], attention_temperature=1.0)
    assert a(images, attention_temperature=1.0) != a(images)  # the PyTorch model decodes it, differently
    # a metrics report of a tempered decoding: the model card's score table says so
    report = {
        "scores": {"CIDEr": 0.5},
        "annotations": "a.json",
        "split": "test",
        "num_images": 2,
        "generation": dict(a.generation.__dict__),
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert (
        main(
            [
                "export",
                "--checkpoint",
                str(hard_checkpoint),
                "--out",
                str(tmp_path / "carded"),
                "--metrics",
                str(tmp_path / "report.json"),
            ]
        )
        == 0
    )
    assert f"beams, attention_temperature {tau:g})" in (tmp_path / "carded" / "README.md").read_text()
    # its safetensors folder (without REINFORCE's running baseline, training state) loads as well
    assert main(["export", "--checkpoint", str(hard_checkpoint), "--out", str(tmp_path / "hard")]) == 0
    folder = Captioner.from_pretrained(tmp_path / "hard")
    for mode in ("expected", "argmax"):
        assert folder(images, num_beams=3, attention_mode=mode) == a(images, num_beams=3, attention_mode=mode)


BLOCK_TORCH = """
import importlib.abc, sys
class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith(("torch.", "torchvision", "lightning")):
            raise ImportError(f"{name} is blocked: this process has no PyTorch")
sys.meta_path.insert(0, BlockTorch())
"""


def test_onnx_route_runs_where_torch_cannot_be_imported(tiny_checkpoint, soft_onnx, images, tmp_path):
    """`captioning caption --onnx` and the Python API in a process where `import torch` fails."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "blocked" in check.stderr

    expected = Captioner.from_checkpoint(tiny_checkpoint, "cpu")(images[:6], num_beams=3)
    proc = subprocess.run(
        [sys.executable, "-m", "captioning.cli", "caption", "--onnx", str(soft_onnx), *images[:6], "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["generated_text"] for r in rows] == [r["generated_text"] for r in expected]

    script = (
        "import json, sys; from captioning.export.onnx_captioner import OnnxCaptioner; import captioning; "
        f"out = OnnxCaptioner({str(soft_onnx)!r})({images[:6]!r}, num_beams=1, return_attention=True); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'lightning')]; "
        "print(json.dumps([[o['generated_text'], o['score'], o['attention'].shape[1:]] for o in out]))"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    greedy = Captioner.from_checkpoint(tiny_checkpoint, "cpu")(images[:6], num_beams=1)
    got = json.loads(proc.stdout)
    assert [g[0] for g in got] == [r["generated_text"] for r in greedy] and all(g[2] == [8, 8] for g in got)
    assert all(abs(g[1] - r["score"]) < 1e-4 for g, r in zip(got, greedy))


# ---------------------------------------------------------------------- bad folders
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def _vocab_of_another_size(folder: Path) -> None:
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["itos"].append("zebra")
    (folder / "vocab.json").write_text(json.dumps(vocab))


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ.get('MARKER', '/nonexistent/marker')}",))


SAFETENSORS_PROBLEMS = {
    "missing config.json": ("config.json", lambda d: (d / "config.json").unlink()),
    "truncated config.json": ("config.json", lambda d: _truncate(d / "config.json")),
    "missing model.safetensors": ("model.safetensors", lambda d: (d / "model.safetensors").unlink()),
    "truncated model.safetensors": ("model.safetensors", lambda d: _truncate(d / "model.safetensors")),
    "weights that do not fit config.json": (
        "model.safetensors",
        lambda d: _edit_config(d, lambda c: c["model"]["decoder"].update(hidden_dim=64)),
    ),
    "vocabulary of another size": ("vocab.json", _vocab_of_another_size),
    "missing vocab.json": ("vocab.json", lambda d: (d / "vocab.json").unlink()),
    "a pickle instead of safetensors": (
        "model.safetensors",
        lambda d: (d / "model.safetensors").write_bytes(pickle.dumps(RunsCode())),
    ),
}


@pytest.mark.parametrize("problem", SAFETENSORS_PROBLEMS)
def test_bad_model_folder_is_one_line_naming_the_file(problem, soft_folder, images, tmp_path, capsys, monkeypatch):
    marker = tmp_path / "code_ran"
    monkeypatch.setenv("MARKER", str(marker))
    folder = tmp_path / "model"
    shutil.copytree(soft_folder, folder)
    name, damage = SAFETENSORS_PROBLEMS[problem]
    damage(folder)
    assert main(["caption", images[0], "--checkpoint", str(folder)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert str(folder / name) in err, err
    assert not marker.exists()  # nothing in the folder ran
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        Captioner.from_pretrained(folder)


ONNX_PROBLEMS = {
    "missing config.json": ("config.json", lambda d: (d / "config.json").unlink()),
    "truncated encoder.onnx": ("encoder.onnx", lambda d: _truncate(d / "encoder.onnx")),
    "truncated decoder_step.onnx": ("decoder_step.onnx", lambda d: _truncate(d / "decoder_step.onnx")),
    "missing decoder_step.onnx": ("decoder_step.onnx", lambda d: (d / "decoder_step.onnx").unlink()),
    "vocabulary of another size": ("vocab.json", _vocab_of_another_size),
    "graphs that do not fit config.json": (
        "encoder.onnx",
        lambda d: _edit_config(d, lambda c: c["model"].update(feature_dim=128)),
    ),
    "a safetensors folder": ("config.json", lambda d: _edit_config(d, lambda c: c.pop("onnx"))),
}


@pytest.mark.parametrize("problem", ONNX_PROBLEMS)
def test_bad_onnx_folder_is_one_line_naming_the_file(problem, soft_onnx, images, tmp_path, capsys):
    folder = tmp_path / "model_onnx"
    shutil.copytree(soft_onnx, folder)
    name, damage = ONNX_PROBLEMS[problem]
    damage(folder)
    assert main(["caption", images[0], "--onnx", str(folder)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert str(folder / name) in err, err


def test_export_refuses_to_overwrite_and_bad_checkpoints_are_one_line(tiny_checkpoint, soft_folder, tmp_path, capsys):
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(soft_folder)]) == 1
    assert "not empty" in capsys.readouterr().err
    bogus = tmp_path / "bogus.ckpt"
    bogus.write_bytes(b"PK\x03\x04 not really")
    assert main(["export", "--checkpoint", str(bogus), "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bogus) in err


def test_attention_variant_exports_as_a_folder_and_onnx_says_it_cannot(tiny_shapes, images, tmp_path, capsys):
    """A variant (Luong placement, two heads) round-trips through safetensors; the ONNX step graph is
    the paper's attention only, so ONNX export of a variant is a one-line error, not a wrong graph."""
    from captioning.training.cli import run_lightning_cli

    cli = run_lightning_cli(
        fit_args(
            tiny_shapes, tmp_path / "fit", config="shapes_luong.yaml", steps=2, extra=["--model.decoder.heads", "2"]
        )
    )
    ckpt = cli.trainer.checkpoint_callback.last_model_path
    assert main(["export", "--checkpoint", ckpt, "--out", str(tmp_path / "folder")]) == 0
    a = Captioner.from_checkpoint(ckpt, device="cpu")(images, num_beams=3, max_new_tokens=8)
    b = Captioner.from_pretrained(tmp_path / "folder", device="cpu")(images, num_beams=3, max_new_tokens=8)
    assert [r["generated_text"] for r in a] == [r["generated_text"] for r in b]
    capsys.readouterr()
    assert main(["export", "--format", "onnx", "--checkpoint", ckpt, "--out", str(tmp_path / "onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "placement='luong'" in err and "heads=2" in err


@pytest.mark.parametrize(
    "kind, mode, tau", [("soft", "expected", 1.0), ("hard", "argmax", 1.0), ("hard", "expected", 0.5)]
)
def test_step_graph_is_the_decoders_step_at_every_batch_and_beam_count(kind, mode, tau, tmp_path, make_decoder):
    """The step graph traces decoder.step (the cell's step): traced at B = 2, K = 3, it gives the
    PyTorch step's numbers at other batch sizes and beam counts (K is read from the shapes)."""
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    from captioning.export.onnx import STEP_INPUTS, STEP_OUTPUTS, StepGraph, _export

    V, D, L = 30, 16, 9
    dec = make_decoder(
        dtype=torch.float32,
        vocab_size=V,
        feature_dim=D,
        embed_dim=8,
        hidden_dim=12,
        attention_dim=10,
        attention_kind=kind,
    )
    with torch.no_grad():
        state = dec.initial_state(torch.randn(2, L, D)).expand_beams(3)
        axes = {
            "tokens": {0: "rows"},
            "h": {0: "rows"},
            "c": {0: "rows"},
            "features": {0: "images"},
            "projected": {0: "images"},
            **{name: {0: "rows"} for name in STEP_OUTPUTS},
        }
        _export(
            StepGraph(dec, mode, tau).eval(),
            (torch.ones(6, dtype=torch.long), state.h, state.c, state.features, state.projected),
            tmp_path / "step.onnx",
            STEP_INPUTS,
            STEP_OUTPUTS,
            axes,
            17,
        )
        session = ort.InferenceSession(str(tmp_path / "step.onnx"))
        for B, K in ((5, 4), (1, 1), (3, 2)):
            state = dec.initial_state(torch.randn(B, L, D)).expand_beams(K)
            state = state.with_recurrent(state.h + 0.1 * torch.randn_like(state.h), state.c)
            tokens = torch.randint(0, V, (B * K,))
            log_probs, new, g = dec.step(tokens, state, mode, tau)
            ours = session.run(
                None,
                {
                    "tokens": tokens.numpy(),
                    "h": state.h.numpy(),
                    "c": state.c.numpy(),
                    "features": state.features.numpy(),
                    "projected": state.projected.numpy(),
                },
            )
            for a, b in zip(ours, (log_probs, new.h, new.c, g.alpha)):
                np.testing.assert_allclose(a, b.numpy(), **float32_tolerance(b, TINY_PATH))


@pytest.mark.parametrize(
    "field, name",
    [
        ("encoder", "/etc/passwd.onnx"),
        ("encoder", "../elsewhere.onnx"),
        ("steps", "sub/decoder_step.onnx"),
        ("steps", "decoder_step.bin"),
    ],
)
def test_onnx_graph_names_must_be_files_of_the_folder(soft_onnx, tmp_path, field, name):
    from captioning.export.onnx_captioner import OnnxCaptioner

    folder = tmp_path / "copy"
    shutil.copytree(soft_onnx, folder)
    config = json.loads((folder / "config.json").read_text())
    if field == "encoder":
        config["onnx"]["encoder"] = name
    else:
        config["onnx"]["steps"]["expected"] = name
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        OnnxCaptioner(folder)
    assert f"onnx.{field}" in str(err.value) and "in the folder itself" in str(err.value) and "\n" not in str(err.value)
