"""What a newcomer meets at the command line: the nearest flag for a misspelt one (argparse and
LightningCLI alike), `fit` without a config or with a missing one, a missing checkpoint beside
real ones, `caption --out`'s closing line, the warning for captions longer than the decoding
length, and the commands the demo prints."""

import logging
import os
import sys
from pathlib import Path

import pytest

from captioning.cli import main
from tests.helpers import fit_args

ROOT = Path(__file__).resolve().parents[2]


def error_lines(capsys, argv) -> tuple[int, list[str]]:
    """(exit code, stderr's lines) of ``captioning argv``."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's and LightningCLI's usage errors
        code = exit.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["caption", "x.png", "--checkpoint", "c.ckpt", "--num-beans", "3"], "did you mean --num-beams?"),
        (["evaluate", "--checkpoint", "c", "--annotations", "a.json", "--devise", "cpu"], "did you mean --device?"),
        (["attend", "x.png", "--checkpoint", "c", "--out", "o", "--format", "gfi"], "did you mean gif?"),
        (["captoin", "x.png"], "did you mean caption?"),
    ],
)
def test_a_misspelt_flag_or_choice_names_the_nearest(capsys, argv, expected):
    code, err = error_lines(capsys, argv)
    assert code == 2 and len(err) == 1 and expected in err[0], err


def test_an_unknown_flag_with_nothing_near_gets_no_guess(capsys):
    code, err = error_lines(capsys, ["caption", "x.png", "--checkpoint", "c", "--zzzzzz", "1"])
    assert code == 2 and "unrecognized arguments: --zzzzzz" in err[0] and "did you mean" not in err[0]


def test_a_misspelt_training_key_names_the_nearest(capsys, tiny_shapes):
    config = ROOT / "configs" / "shapes_soft.yaml"
    argv = ["fit", "--config", config, "--data.annotations", tiny_shapes, "--model.decoder.hiden_dim", "3"]
    code, err = error_lines(capsys, argv)
    assert code == 2 and len(err) <= 3
    assert err[0] == "usage: captioning fit [options]"  # the command as typed, not the program's file name
    assert err[-1].endswith("--model.decoder.hiden_dim 3; did you mean --model.decoder.hidden_dim?"), err


def test_fit_without_a_config_lists_the_configs(capsys, tiny_shapes, tmp_path):
    code, err = error_lines(capsys, ["fit"])
    assert code == 1 and len(err) == 1
    assert "captioning fit: no --config given" in err[0] and "--config configs/shapes_soft.yaml" in err[0]
    assert "configs/own_small_cnn.yaml" in err[0]


def test_fit_without_a_config_but_with_data_says_it_takes_the_defaults(capsys, tiny_shapes, tmp_path):
    """Given the data, `fit` runs on the built-in defaults, and says so in one line first."""
    from captioning.training.cli import check_config_arguments

    check_config_arguments(["fit", "--data.annotations", str(tiny_shapes)])
    out = capsys.readouterr().out
    assert out.startswith("note: no --config: the model, data and trainer take the built-in defaults")
    assert "configs/shapes_soft.yaml" in out
    check_config_arguments(["fit", "--config", str(ROOT / "configs" / "shapes_soft.yaml")])
    check_config_arguments(["fit", "--help"])
    assert capsys.readouterr().out == ""  # a config, or a request for help: nothing to say


def test_a_config_path_that_does_not_exist_lists_the_configs(capsys, tiny_shapes):
    code, err = error_lines(capsys, ["fit", "--config", "configs/shapes_sotf.yaml", "--data.annotations", tiny_shapes])
    assert code == 1 and len(err) == 1
    assert err[0].startswith("error: --config configs/shapes_sotf.yaml: no such file; the configs: ")
    assert "configs/shapes_soft.yaml" in err[0]


def test_a_missing_checkpoint_names_the_ones_beside_it(capsys, tiny_checkpoint, tiny_shapes, tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("best-epoch=34-step=175.ckpt", "last.ckpt"):
        os.symlink(tiny_checkpoint, folder / name)
    image = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
    code, err = error_lines(capsys, ["caption", image, "--checkpoint", folder / "best.ckpt"])
    assert code == 1 and len(err) == 1
    assert err[0] == f"error: {folder / 'best.ckpt'}: no such file; beside it: best-epoch=34-step=175.ckpt, last.ckpt"
    code, err = error_lines(capsys, ["caption", image, "--checkpoint", tmp_path / "nowhere" / "best.ckpt"])
    assert code == 1 and err[0].endswith("best.ckpt: no such file; no folder " + str(tmp_path / "nowhere"))


def test_caption_out_ends_with_a_summary(capsys, tiny_checkpoint, tiny_shapes, tmp_path):
    images = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:3]
    out = tmp_path / "caps.jsonl"
    argv = ["caption", *map(str, images[:2]), "--checkpoint", str(tiny_checkpoint), "--out", str(out)]
    argv += ["--max-new-tokens", "5", "--num-beams", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines()[-1] == f"wrote 2 captions to {out}"
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    argv[1:3] = [str(images[0]), str(images[2]), str(broken)]  # one done already, one new, one unreadable
    assert main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"wrote 1 caption to {out} (1 image already there, 1 unreadable, with their reasons)"


def test_captions_longer_than_the_decoding_length_warn_once_at_fit(tiny_shapes, tmp_path, caplog):
    """The tiny shapes' training captions need up to 26 tokens with EOS: a decoding length of 12 cuts
    most of them (one warning naming both settings and the length that fits); 31 cuts none."""
    from captioning.data.captions import CaptionData
    from captioning.training.cli import run_lightning_cli

    data = CaptionData(str(tiny_shapes), min_word_freq=1)
    data.setup()
    longest = int(data.caption_table().lengths().max()) + 1
    assert data.decoding_length_problem({"x": longest}) is None
    problem = data.decoding_length_problem({"x": longest - 1, "y": 40}, share=0.0)
    assert problem.startswith(f"the training captions run to {longest} tokens") and f"set x {longest}" in problem
    assert "y 40" not in problem

    with caplog.at_level(logging.WARNING, logger="captioning.training.module"):
        run_lightning_cli(fit_args(tiny_shapes, tmp_path / "short", steps=1))  # max_new_tokens 12
    cut = [r.getMessage() for r in caplog.records if "stop mid-phrase" in r.getMessage()]
    assert len(cut) == 1 and "model.val_generation.max_new_tokens 12" in cut[0]
    assert f"model.test_generation.max_new_tokens {longest}" in cut[0]
    caplog.clear()
    extra = ["--model.val_generation.max_new_tokens", "31", "--model.test_generation.max_new_tokens", "31"]
    with caplog.at_level(logging.WARNING, logger="captioning.training.module"):
        run_lightning_cli(fit_args(tiny_shapes, tmp_path / "long", steps=1, extra=extra))
    assert not any("stop mid-phrase" in r.getMessage() for r in caplog.records)


def test_shipped_configs_decode_every_caption_they_train_on():
    """Every config's decoding length holds the longest caption it trains on (data.max_length
    tokens, then EOS)."""
    import yaml

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        max_length = config.get("data", {}).get("max_length", 30)
        for key in ("val_generation", "test_generation"):
            tokens = config["model"].get(key, {}).get("max_new_tokens")
            assert tokens is None or tokens >= max_length + 1, (path.name, key, tokens, max_length)


def test_printed_commands_name_this_environments_scripts(tmp_path, monkeypatch):
    """A command printed for the user runs as printed: this environment's script by its path when the
    shell's PATH finds another one or none (a virtual environment that is not activated)."""
    from captioning.cli.options import runnable

    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    for name in ("python", "captioning"):
        (env / "bin" / name).write_text("#!/bin/sh\n")
        (env / "bin" / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(env / "bin" / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert runnable() == os.path.join("env", "bin", "captioning")
    monkeypatch.setenv("PATH", str(env / "bin"))  # activated: the name is enough
    assert runnable() == "captioning"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert runnable() == str(env / "bin" / "captioning")  # outside the folder: the whole path
