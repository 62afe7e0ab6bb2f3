"""Plugins: a user's module registers an attention score, a decoder kind, a dataset format, a metric and
a command without editing the package: named in CAPTIONING_PLUGINS (a file path or a module name) or
installed as a ``captioning.plugins`` entry point. The cosine score is docs/CONTRIBUTING.md's worked
example, read from the page; the slow tests train with it and caption in fresh processes."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioning import plugins
from captioning.cli import main
from captioning.cli.commands import COMMANDS
from captioning.data.formats.base import FORMATS
from captioning.errors import ConfigError
from captioning.metrics import METRICS, chosen_metrics
from captioning.models.decoder import SCORES, DecoderConfig
from captioning.models.kinds import DECODERS, decoder_config
from tests.helpers import fit_args, path_without_java

ROOT = Path(__file__).resolve().parents[1]

#: what the test's plugin registers besides the worked example's score
EXTRAS = '''

from pathlib import Path as _Path

from captioning.cli.commands import COMMANDS, Command
from captioning.data.formats.base import FORMATS, AnnotationFormat, image_path
from captioning.data.records import ImageRecord
from captioning.metrics import METRICS, Metric
from captioning.metrics.bootstrap import per_image_mean
from dataclasses import dataclass as _dataclass

from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.kinds import DECODERS
from captioning.tokenizers import tokenize


class PluginLSTM(ShowAttendTellDecoder):
    """The paper's decoder under a name of its own."""


@DECODERS.register("plugin_lstm")
@_dataclass
class PluginLSTMConfig(DECODERS.get("lstm")):
    """Its config: the LSTM's settings, kind "plugin_lstm"."""

    kind: str = "plugin_lstm"

    def build(self, vocab_size, feature_dim):
        return PluginLSTM(vocab_size, feature_dim, self)


@FORMATS.register("plugin-tsv")
class PluginTSV(AnnotationFormat):
    """split<TAB>image<TAB>caption lines."""

    description = "a plugin's TSV file"

    def detect(self, path):
        return str(path).endswith(".plugin.tsv")

    def load(self, paths, split_file, merge_restval, problems):
        records = {}
        for line in _Path(paths[0]).read_text().splitlines():
            split, image, caption = line.split("\\t")
            rel = image_path(paths[0], image, image)
            rec = records.setdefault(rel, ImageRecord(len(records), len(records), rel, split, [], []))
            rec.captions.append(caption)
            rec.tokens.append(tokenize(caption))
        return list(records.values())


@METRICS.register("caption_words")
class CaptionWords(Metric):
    """Words per caption."""

    def statistics(self, captions):
        return per_image_mean([len(captions.predictions[i].split()) for i in captions.ids])


@COMMANDS.register("count-words")
class CountWords(Command):
    help = "a plugin's command: the words of a caption"

    def add_arguments(self, parser):
        parser.add_argument("caption")

    def run(self, args):
        print(f"{len(args.caption.split())} words")
        return 0
'''


def worked_example() -> str:
    """docs/CONTRIBUTING.md's my_scores.py, as the page shows it."""
    match = re.search(r"```python\n(# my_scores\.py.*?)```", (ROOT / "docs" / "CONTRIBUTING.md").read_text(), re.S)
    assert match, "docs/CONTRIBUTING.md: the worked example's my_scores.py"
    return match.group(1)


def write_plugin(folder: Path, name: str = "my_scores") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(worked_example() + EXTRAS)
    importlib.invalidate_caches()
    return path


REGISTRIES = (SCORES, DECODERS, FORMATS, METRICS, COMMANDS)
PLUGIN_MODULES = ("my_scores", "my_lab_plugin", "broken_plugin")


@pytest.fixture
def isolated(monkeypatch):
    """The registries, the plugins imported, sys.path and the plugins' modules as they were, after the test."""
    for registry in REGISTRIES:
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setattr(plugins, "_entry_points_read", False)
    monkeypatch.delenv(plugins.ENV, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in PLUGIN_MODULES:
        sys.modules.pop(name, None)


def assert_registered() -> None:
    """Everything the plugin registers is there, and the score keeps the Score contract."""
    assert {"cosine" in SCORES, "plugin_lstm" in DECODERS, "plugin-tsv" in FORMATS} == {True}
    assert "caption_words" in chosen_metrics() and "count-words" in COMMANDS
    assert decoder_config({"score": "cosine", "kind": "plugin_lstm"}).variant == "plugin_lstm+cosine"
    score = SCORES.get("cosine")(12, 10, 8, 1)
    features, h = torch.randn(2, 9, 12), torch.randn(6, 10)  # B = 2 images, 3 beams each
    e = score(score.project(features), h, beams=3)  # the scores e (B * beams, L); the decoder normalises them
    assert e.shape == (6, 9)
    cosines = e / score.log_scale.exp()  # s * cos: each within [-s, s]
    assert (cosines.abs() <= 1 + 1e-6).all() and cosines.abs().max() > 0


def test_a_plugin_file_registers_its_score_kind_format_metric_and_command(isolated, tmp_path, monkeypatch, capsys):
    path = write_plugin(tmp_path / "plugins")
    monkeypatch.setenv(plugins.ENV, str(path))
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "count-words" in capsys.readouterr().out  # listed: the plugins are imported before the parser is built
    assert main(["count-words", "a red circle"]) == 0
    assert capsys.readouterr().out == "3 words\n"
    assert_registered()
    assert plugins.loaded_plugins() == [str(path.resolve())]
    assert str(path.parent.resolve()) in sys.path  # (processes started by spawn import it by name)
    assert plugins.load_plugins() == []  # once per process


def test_a_plugin_module_by_name_and_a_format_read_through_it(isolated, tmp_path, monkeypatch):
    from captioning.data.formats import detect_format, load_records

    write_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv(plugins.ENV, " my_scores , ")
    assert plugins.load_plugins() == ["my_scores"]
    assert_registered()
    data = tmp_path / "captions.plugin.tsv"
    data.write_text("train\t1.jpg\ta red circle\ntrain\t1.jpg\ta circle\ntest\t2.jpg\ta blue square")
    assert detect_format(data) == "plugin-tsv"
    records = load_records(data)
    assert [(r.split, r.captions) for r in records] == [
        ("train", ["a red circle", "a circle"]),
        ("test", ["a blue square"]),
    ]


def test_an_entry_point_of_an_installed_distribution(isolated, tmp_path, monkeypatch):
    site = tmp_path / "site"
    write_plugin(site, "my_lab_plugin")
    info = site / "my_lab-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-lab\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[captioning.plugins]\nmy_lab = my_lab_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    assert "cosine" not in SCORES._entries
    assert plugins.load_plugins() == ["entry point my_lab = my_lab_plugin"]
    assert_registered()


def test_a_registry_asked_for_a_name_it_lacks_imports_the_plugins(isolated, tmp_path, monkeypatch):
    """A process that did not go through the command line (a DDP process, a spawned loader worker, a
    script) finds a plugin's names when a config or checkpoint names them."""
    monkeypatch.setenv(plugins.ENV, str(write_plugin(tmp_path)))
    assert plugins.loaded_plugins() == []
    assert DecoderConfig(score="cosine").score == "cosine"  # checked against SCORES: the plugin imported
    assert "caption_words" in METRICS


def test_a_plugin_that_fails_is_one_line_naming_it_and_the_exception(isolated, tmp_path, monkeypatch, capfd):
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import torch\n\nraise RuntimeError('needs a GPU\\nand more')\n")
    for spec, message in [
        (str(broken), f"CAPTIONING_PLUGINS: plugin {broken} failed to import: RuntimeError: needs a GPU and more"),
        (
            "no_such_plugin_module",
            "CAPTIONING_PLUGINS: plugin no_such_plugin_module failed to import: ModuleNotFoundError",
        ),
        (str(tmp_path / "gone.py"), f"CAPTIONING_PLUGINS: {tmp_path / 'gone.py'}: no such plugin file"),
    ]:
        monkeypatch.setenv(plugins.ENV, spec)
        assert main(["caption", "--help"]) == 1
        err = capfd.readouterr().err
        assert err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, err
    assert "broken_plugin" not in sys.modules  # nothing half-imported is kept


def test_an_unknown_name_says_where_a_plugins_names_come_from(isolated):
    with pytest.raises(ConfigError) as info:
        DecoderConfig(score="cosine")
    message = str(info.value)
    assert message.startswith("model.decoder.score: unknown attention score 'cosine'; expected one of additive")
    assert "CAPTIONING_PLUGINS" in message and "\n" not in message


# --------------------------------------------------------------------------- trained, in fresh processes
def run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "captioning.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow  # three processes that import torch, one of them a training run
def test_the_cosine_score_trains_then_captions_draws_and_scores_in_fresh_processes(tiny_shapes, tmp_path):
    plugin = write_plugin(tmp_path / "plugins")
    env = {**os.environ, "PYTHONPATH": str(ROOT), plugins.ENV: str(plugin)}
    env["PATH"] = path_without_java(env.get("PATH", ""))  # (no METEOR's JVM)
    fit = run(fit_args(tiny_shapes, tmp_path / "run", extra=["--model.decoder.score", "cosine"]), env, tmp_path)
    assert fit.returncode == 0, fit.stderr[-2000:]
    ckpt = next((tmp_path / "run").rglob("last.ckpt"))
    images = sorted((Path(tiny_shapes).parent / "images" / "test").glob("*.png"))[:2]

    caption = run(["caption", *map(str, images), "--checkpoint", str(ckpt), "--device", "cpu"], env, tmp_path)
    assert caption.returncode == 0, caption.stderr[-2000:]
    assert len([line for line in caption.stdout.splitlines() if line.strip()]) == 2
    gif = tmp_path / "cosine.gif"
    attend = run(
        ["attend", str(images[0]), "--checkpoint", str(ckpt), "--device", "cpu", "--out", str(gif)], env, tmp_path
    )
    assert attend.returncode == 0, attend.stderr[-2000:]
    assert gif.stat().st_size > 0
    report = tmp_path / "metrics.json"
    evaluate = [
        "evaluate", "--checkpoint", str(ckpt), "--annotations", str(tiny_shapes), "--split", "test",
        "--device", "cpu", "--out", str(report),
    ]  # fmt: skip
    done = run(evaluate, env, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(report.read_text())["scores"]["caption_words"] > 0  # the plugin's metric too

    without = run(["caption", str(images[0]), "--checkpoint", str(ckpt)], {**env, plugins.ENV: ""}, tmp_path)
    assert without.returncode == 1
    assert "unknown attention score 'cosine'" in without.stderr and len(without.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # two DDP processes on the CPU, started by Lightning: each imports the plugin
def test_ddp_processes_import_the_plugin(tiny_shapes, tmp_path):
    plugin = write_plugin(tmp_path / "plugins")
    env = {**os.environ, "PYTHONPATH": str(ROOT), plugins.ENV: str(plugin)}
    env["PATH"] = path_without_java(env.get("PATH", ""))
    extra = ["--model.decoder.score", "cosine", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    fit = run(fit_args(tiny_shapes, tmp_path / "run", extra=extra), env, tmp_path)
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert next((tmp_path / "run").rglob("last.ckpt")).is_file()


@pytest.mark.slow  # a training run
def test_a_decoder_kind_plugin_trains_and_captions(isolated, tiny_shapes, tmp_path, monkeypatch):
    from captioning.api import Captioner
    from captioning.training.cli import run_lightning_cli

    monkeypatch.setenv(plugins.ENV, str(write_plugin(tmp_path / "plugins")))
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path / "run", extra=["--model.decoder.kind", "plugin_lstm"]))
    assert type(cli.model.model.decoder).__name__ == "PluginLSTM"
    captioner = Captioner.from_checkpoint(cli.trainer.checkpoint_callback.last_model_path)
    assert captioner.model.spec.decoder.kind == "plugin_lstm"
    image = sorted((Path(tiny_shapes).parent / "images" / "test").glob("*.png"))[0]
    [out] = captioner(str(image), max_new_tokens=6)
    assert isinstance(out["generated_text"], str)
