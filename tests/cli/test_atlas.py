"""`captioning atlas`: the catalogue's table (each mechanism named from its config), the word the
panels share, a PNG with one panel per checkpoint and each caption's object F1, --train-all's runs
(trained, then reused; a missing config skipped with a note), and the one-line errors."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from captioning.cli import main
from captioning.models.decoder import DecoderConfig
from captioning.models.kinds import decoder_config
from captioning.models.transformer import TransformerConfig
from captioning.storage.folder import save_folder
from captioning.viz import atlas as A
from tests.cli.test_attend_views import tiny
from tests.helpers import ROOT, shapes_test_images

LSTM = dict(embed_dim=8, hidden_dim=16, attention_dim=8)


def test_the_catalogue_is_one_table_of_every_mechanism():
    names = [m.name for m in A.CATALOGUE]
    assert names == [
        "soft", "hard", "dot", "general", "scaled_dot", "concat", "uniform", "normalized", "scaled", "sparsemax",
        "multihead", "luong", "local", "local_p", "local_m", "hierarchical", "attention_pool", "over_attention",
        "aoa", "refiner", "transformer", "conv",
    ]  # fmt: skip
    assert all(m.config == f"shapes_{m.name}.yaml" and "=" in m.equation for m in A.CATALOGUE)


@pytest.mark.parametrize("mechanism", A.CATALOGUE, ids=lambda m: m.name)
def test_each_configs_model_is_named_its_mechanism(mechanism):
    """Each mechanism has its shapes config (`--train-all` and the catalogue study train it), and the
    decoder it trains is that mechanism (the atlas titles its panel so)."""
    config = yaml.safe_load((ROOT / "configs" / mechanism.config).read_text())
    decoder = decoder_config(config["model"]["decoder"])
    assert A.mechanism_of(decoder) == (mechanism.name, [mechanism.equation])


def test_a_model_of_several_mechanisms_is_named_by_each():
    name, equations = A.mechanism_of(DecoderConfig(**LSTM, placement="luong", window="local", heads=2))
    assert name == "multihead + luong + local" and len(equations) == 3
    assert A.mechanism_of(DecoderConfig(**LSTM))[0] == "soft"
    assert A.mechanism_of(TransformerConfig(hidden_dim=16, heads=2, refiner_layers=1))[0] == "transformer"
    assert A.mechanism_of(None) == ("unknown", [])


@pytest.mark.parametrize(
    "captions, word, expected",
    [
        ([["a", "red", "circle", "and", "a", "blue", "square"], ["a", "blue", "square", "and", "a", "red", "circle"]], None, "circle"),
        ([["a", "red", "circle"], ["a", "red", "square"], ["the", "red", "circle"]], None, "red"),  # no shared shape
        ([["a", "dog", "runs"], ["a", "cat", "sits"]], None, None),  # nothing but "a" shared
        ([["a", "red", "circle"], ["a", "square"]], "square", "square"),
    ],
)  # fmt: skip
def test_the_word_is_the_first_object_word_the_captions_share(captions, word, expected):
    chosen, note = A.choose_word(captions, word)
    assert chosen == expected
    assert (note is not None) == (expected is None or any(expected not in c for c in captions))


def test_a_one_panel_atlas_keeps_its_title_inside_the_picture():
    """A narrow atlas (one panel) wraps its title instead of writing past the picture's right edge."""
    image = Image.new("RGB", (64, 64), (40, 90, 140))
    panel = A.Panel("soft", "soft", ["e_ij = a(s_{i-1}, h_j)"], ["a", "circle"], "circle", 1, np.full((4, 4), 1 / 16))
    picture = np.asarray(A.render_atlas(image, [panel], "circle", size=96).convert("L"))
    assert picture.shape[1] < 200  # narrower than the title's one line at 20 px
    assert (picture[:40, -8:] == 255).all()  # nothing written in the right margin above the panel


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas_models")
    return {kind: save_folder(root / kind, tiny(kind)) for kind in ("soft", "hard", "transformer")}


@pytest.fixture(scope="module")
def shapes_image(tiny_shapes):
    return shapes_test_images(tiny_shapes, 1)[0]


def atlas(*args) -> int:
    return main(["atlas", *map(str, args), "--device", "cpu", "--max-new-tokens", "6"])


def panels_printed(out: str) -> list[list[str]]:
    return [line.split("\t") for line in out.splitlines() if "\t" in line]  # label, mechanism, caption, word, F1


def test_the_atlas_has_one_panel_per_checkpoint_with_its_object_f1(checkpoints, shapes_image, tmp_path, capsys):
    out = tmp_path / "atlas.png"
    code = atlas(shapes_image, "--checkpoint", checkpoints["soft"], "--checkpoint", f"paper={checkpoints['hard']}",
                 "--checkpoint", checkpoints["transformer"], "--out", out, "--panel-size", 160)  # fmt: skip
    assert code == 0
    rows = panels_printed(capsys.readouterr().out)
    assert [r[:2] for r in rows] == [["soft", "soft"], ["paper", "hard"], ["transformer", "transformer"]]
    objects, _ = A.image_objects(shapes_image)  # the dataset_shapes.json above the image
    for _, _, caption, _, f1 in rows:
        assert float(f1) == pytest.approx(A.caption_f1(caption.split(), objects))
    with Image.open(out) as picture:  # three panels of 160 + 2 x 8 pixels side by side, 6 apart
        assert picture.format == "PNG" and picture.width == 3 * (160 + 16 + 6) + 6


def test_a_word_given_is_each_panels_word(checkpoints, shapes_image, tmp_path, capsys):
    assert atlas(shapes_image, "--checkpoint", checkpoints["soft"], "--out", tmp_path / "a.png") == 0
    word = panels_printed(capsys.readouterr().out)[0][2].split()[-1]
    assert atlas(shapes_image, "--checkpoint", checkpoints["soft"], "--checkpoint", checkpoints["transformer"],
                 "--word", word, "--out", tmp_path / "b.png") == 0  # fmt: skip
    captured = capsys.readouterr()
    rows = panels_printed(captured.out)
    for _, _, caption, shown, _ in rows:
        assert shown == (word if word in caption.split() else "")
    lacking = sum(word not in r[2].split() for r in rows)
    assert (f"{lacking} of 2 captions lack {word!r}" in captured.err) == bool(lacking)


def test_an_image_outside_the_shapes_data_has_no_object_f1(checkpoints, shapes_image, tmp_path, capsys):
    image = tmp_path / "alone.png"
    shutil.copy(shapes_image, image)
    assert atlas(image, "--checkpoint", checkpoints["soft"], "--out", tmp_path / "a.png") == 0
    assert panels_printed(capsys.readouterr().out)[0][4] == ""


def test_train_all_trains_each_mechanism_then_reuses_it(tiny_shapes, shapes_image, tmp_path, capsys, monkeypatch):
    """Each mechanism's config trained for the steps asked, a panel each; run again, the runs are
    reused; a mechanism whose config the checkout lacks is skipped with a note."""
    missing = A.Mechanism("missing", "shapes_missing_mechanism.yaml", "e_ij = 0", {"score": "none"})
    monkeypatch.setattr(A, "CATALOGUE", A.CATALOGUE + (missing,))
    monkeypatch.setattr(A, "MECHANISMS", {**A.MECHANISMS, "missing": missing})
    runs = tmp_path / "runs"
    args = [shapes_image, "--train-all", 1, "--mechanisms", "soft,transformer,missing", "--runs", runs,
            "--annotations", tiny_shapes, "--out", tmp_path / "atlas.png"]  # fmt: skip
    assert atlas(*args) == 0
    captured = capsys.readouterr()
    assert "note: skipped missing: configs/shapes_missing_mechanism.yaml is not in this checkout" in captured.err
    assert "training soft (configs/shapes_soft.yaml) for 1 steps" in captured.out
    rows = [r for r in panels_printed(captured.out) if len(r) == 5]
    assert [r[:2] for r in rows] == [["soft", "soft"], ["transformer", "transformer"]]
    for name in ("soft", "transformer"):
        assert Path(yaml.safe_load((runs / name / "atlas_run.json").read_text())["checkpoint"]).is_file()
    assert atlas(*args) == 0
    again = capsys.readouterr().out
    assert "soft: trained for 1 steps already" in again and "training soft" not in again


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--out", "a.png"], "atlas: give the models, --checkpoint CKPT (repeat it), or --train-all STEPS"),
        (["--checkpoint", "x", "--out", "a.gif"], "--out a.gif: the atlas is a .png file"),
        (["--train-all", "5", "--out", "a.png"], "--train-all: trains on the shapes data: give --annotations DATASET_JSON"),
        (["--train-all", "5", "--mechanisms", "soft,bahdanau", "--out", "a.png"], "--mechanisms: unknown mechanism 'bahdanau'; the catalogue: soft, hard"),
        (["--checkpoint", "x", "--mechanisms", "soft", "--out", "a.png"], "--mechanisms: chooses what --train-all trains"),
        (["--checkpoint", "x", "--annotations", "nowhere.json", "--out", "a.png"], "--annotations: no such file: nowhere.json"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_line(tmp_path, capsys, monkeypatch, extra, words):
    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (32, 32)).save(tmp_path / "img.png")
    assert atlas("img.png", *extra) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a.png").exists()
