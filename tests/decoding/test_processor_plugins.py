"""A decoding option from a plugin file: docs/CONTRIBUTING.md's ``ban_word.py``, named in
CAPTIONING_PLUGINS. It is a GenerationConfig field, a flag of ``caption`` (also in a fresh process),
a keyword of the API and a line of its docstring, a field of the web form, a setting of a model
folder's and a config's ``generation`` section; the ONNX captioner honours it with its numpy twin.
No file of the package is edited. Also the registry's rules: a processor without a twin is
refused by the ONNX captioner in one line, names cannot clash, removing a processor removes its
options everywhere."""

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning import plugins
from captioning.cli import main
from captioning.decoding.generation import GenerationConfig, generation_option, generation_options
from captioning.decoding.options import option
from captioning.decoding.processors import PROCESSORS, ForcedPrefix, Processor
from captioning.decoding.search import generate
from captioning.errors import ConfigError
from tests.helpers import shapes_test_images

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = [f.name for f in dataclasses.fields(GenerationConfig)]


def worked_example() -> str:
    """docs/CONTRIBUTING.md's ban_word.py, as the page shows it."""
    match = re.search(r"```python\n(# ban_word\.py.*?)```", (ROOT / "docs" / "CONTRIBUTING.md").read_text(), re.S)
    assert match, "docs/CONTRIBUTING.md: the worked example's ban_word.py"
    return match.group(1)


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(GenerationConfig)]


def warm_what_is_derived_from_the_options() -> None:
    """Import and use what keeps a product of the options (the web form's fields, the API's
    docstring, ONNX_OPTIONS), as a server that has started has: a plugin's option must reach them."""
    from captioning.api import Captioner
    from captioning.export.onnx_captioner import ONNX_OPTIONS
    from captioning.web.settings import form_options

    assert "ban_word" not in form_options() and "ban_word" not in ONNX_OPTIONS
    assert "ban_word" not in Captioner.__call__.__doc__ and "ban_word" not in [o.name for o in generation_options()]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory, tiny_checkpoint):
    """ban_word.py imported as CAPTIONING_PLUGINS names it; afterwards its processor is removed and
    GenerationConfig has the built-in fields again. The session's tiny checkpoint is written before
    (kept free of the plugin's option)."""
    path = tmp_path_factory.mktemp("plugins") / "ban_word.py"
    path.write_text(worked_example())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plugins, "_loaded", dict(plugins._loaded))
        patch.setattr(sys, "path", list(sys.path))
        patch.setenv(plugins.ENV, str(path))
        assert "ban_word" not in field_names()
        warm_what_is_derived_from_the_options()
        plugins.load_plugins()
        try:
            yield path
        finally:
            PROCESSORS.unregister("ban_word")
            sys.modules.pop("ban_word", None)
    assert field_names() == BUILT_IN
    warm_what_is_derived_from_the_options()  # and gone from them again


@contextlib.contextmanager
def registered(name: str, cls: type):
    """``cls`` registered under ``name`` for the block."""
    PROCESSORS.register(name)(cls)
    try:
        yield cls
    finally:
        PROCESSORS.unregister(name)


@pytest.fixture(scope="module")
def images(tiny_shapes) -> list:
    return shapes_test_images(tiny_shapes, 8)


@pytest.fixture(scope="module")
def captioner(tiny_checkpoint):
    from captioning.api import Captioner

    return Captioner.from_checkpoint(tiny_checkpoint, "cpu")


def frequent_word(results: list) -> str:
    """The commonest word of the captions (EOS aside): the one banning changes most."""
    counts = Counter(t for r in results for t in r["tokens"] if t != "<end>")
    return counts.most_common(1)[0][0]


# ---------------------------------------------------------------------- where the option appears
def test_the_plugin_option_is_a_field_a_flag_a_form_field_and_a_keyword(plugin, capsys):
    from jsonargparse import ArgumentParser

    from captioning.api import Captioner
    from captioning.export.onnx_captioner import HONOURED, ONNX_OPTIONS
    from captioning.web.errors import RequestError
    from captioning.web.settings import Settings, form_options

    assert field_names() == BUILT_IN[:-1] + ["ban_word", "prefix"]  # a plugin's applies before the forced prefix
    opt = generation_option("ban_word")
    assert (opt.type, opt.default, opt.flag, opt.min) == (int, -1, "--ban-word", -1)
    assert GenerationConfig(ban_word=5).ban_word == 5 and GenerationConfig().ban_word == -1
    with pytest.raises(ConfigError) as err:
        GenerationConfig(num_beams=2).replace(ban_word=-2)
    assert str(err.value) == "ban_word: expected an integer >= -1, got -2"

    with pytest.raises(SystemExit):
        main(["caption", "--help"])
    assert "--ban-word ID" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit:  # argparse's error: one line, the flag named
        main(["caption", "x.png", "--checkpoint", "c.ckpt", "--ban-word", "-3"])
    err = capsys.readouterr().err
    assert exit.value.code != 0
    assert "--ban-word" in err and "expected an integer >= -1" in err and len(err.strip().splitlines()) == 1, err

    assert "ban_word" in form_options() and Settings.parse({"ban_word": "5"}, hard=False).ban_word == 5
    with pytest.raises(RequestError, match=r"^ban_word: expected an integer, got 'five'$"):
        Settings.parse({"ban_word": "five"}, hard=False)

    line = "- ban_word (an integer >= -1; default -1): a token id the captions never hold (-1: none)"
    assert line in Captioner.__call__.__doc__
    assert ONNX_OPTIONS["ban_word"] == HONOURED

    parser = ArgumentParser()  # a config's generation section (model.test_generation: jsonargparse)
    parser.add_argument("--generation", type=GenerationConfig)
    cfg = parser.parse_args(["--generation.ban_word=4", "--generation.num_beams=2"])
    assert parser.instantiate_classes(cfg).generation == GenerationConfig(ban_word=4, num_beams=2)


def test_the_api_keyword_bans_the_word_and_a_model_folder_keeps_it(plugin, captioner, images, tmp_path):
    from captioning.api import Captioner

    plain = captioner(images, num_beams=3)
    word = frequent_word(plain)
    wid = captioner.vocab.stoi[word]
    for beams in (1, 3):
        banned = captioner(images, num_beams=beams, ban_word=wid)
        assert not any(word in r["tokens"] for r in banned), (word, banned)
    assert [r["generated_text"] for r in banned] != [r["generated_text"] for r in plain]
    with pytest.raises(ConfigError, match=rf"^ban_word: id {len(captioner.vocab)} is beyond the vocabulary"):
        captioner(images[:1], ban_word=len(captioner.vocab))

    # a model folder whose generation section sets it: read back, it is the folder's default decoding
    captioner.spec = dataclasses.replace(captioner.spec, generation=captioner.spec.generation.replace(ban_word=wid))
    try:
        folder = captioner.save_pretrained(tmp_path / "folder")
    finally:
        captioner.spec = dataclasses.replace(captioner.spec, generation=captioner.spec.generation.replace(ban_word=-1))
    loaded = Captioner.from_pretrained(folder, "cpu")
    assert loaded.generation.ban_word == wid
    assert [r["generated_text"] for r in loaded(images, num_beams=3)] == [r["generated_text"] for r in banned]

    # at its default the option is not recorded: the folder loads where the plugin is not installed
    plain_folder = captioner.save_pretrained(tmp_path / "plain")
    written = json.loads((Path(plain_folder) / "config.json").read_text())
    assert "ban_word" not in written["generation"] and "no_repeat_ngram_size" in written["generation"]


@pytest.mark.slow  # a fresh process that imports torch (the flag in this process: the first test)
def test_caption_takes_the_flag_in_a_fresh_process(plugin, captioner, tiny_checkpoint, images, tmp_path):
    """The command line of a process that only has CAPTIONING_PLUGINS: the flag, its captions."""
    word = frequent_word(captioner(images, num_beams=3))
    wid = captioner.vocab.stoi[word]
    env = {**os.environ, "PYTHONPATH": str(ROOT), plugins.ENV: str(plugin)}
    argv = ["caption", *images, "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--ban-word", str(wid)]
    done = subprocess.run(
        [sys.executable, "-m", "captioning.cli", *argv], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line.split("\t")[1] for line in done.stdout.splitlines() if "\t" in line]
    expected = [r["generated_text"] for r in captioner(images, num_beams=3, ban_word=wid)]
    assert printed == expected and not any(word in text.split() for text in printed), (word, printed)


def test_the_onnx_captioner_honours_it_with_the_numpy_twin(plugin, captioner, tiny_checkpoint, images, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    from captioning.export.onnx_captioner import OnnxCaptioner

    out = tmp_path / "onnx"
    assert main(["export", "--format", "onnx", "--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 0
    onnx = OnnxCaptioner(out)
    word = frequent_word(captioner(images, num_beams=3))
    wid = captioner.vocab.stoi[word]
    for beams in (1, 3):
        expected = captioner(images, num_beams=beams, ban_word=wid)
        got = onnx(images, num_beams=beams, ban_word=wid)
        assert [r["generated_text"] for r in got] == [r["generated_text"] for r in expected], beams
        for a, b in zip(got, expected):  # float32 sums of <= 30 terms in another order: tens of eps of the score
            assert a["score"] == pytest.approx(b["score"], rel=64 * float(np.finfo(np.float32).eps))
        assert not any(word in r["tokens"] for r in got)

    class NoTwin(Processor):
        """A processor with no numpy twin: the ONNX captioner refuses its option in one line."""

        options = {"bonus": option(0.0, "add this to every log-probability", min=0)}

        def __call__(self, logp, previous, lengths, prefix):
            return logp + self.config.bonus

    with registered("no_twin", NoTwin):
        with pytest.raises(ConfigError) as err:
            onnx(images[:1], bonus=1.0)
        assert str(err.value) == "the ONNX captioner does not implement it: bonus 1.0 needs the PyTorch model"
        NoTwin.onnx_refusal = "cannot add a bonus"  # (decided when it registers: register it again)
    with registered("no_twin", NoTwin):
        with pytest.raises(ConfigError, match="^the ONNX captioner cannot add a bonus: bonus 1.0 needs the PyTorch"):
            onnx(images[:1], bonus=1.0)
        assert onnx(images[:1]) == onnx(images[:1], bonus=0.0)  # its default is no change


# ---------------------------------------------------------------------- the registry's rules
class Offset(Processor):
    """Adds ``offset`` to the log-probability of token 4 (a processor written in a test)."""

    options = {"offset": option(0.0, "add this to token 4's log-probability", type=float)}

    def __init__(self, config, context):
        super().__init__(config, context)
        self.table = context.mask([4])

    def __call__(self, logp, previous, lengths, prefix):
        return logp + self.table * self.config.offset


def test_a_processor_applies_in_the_search_graphed_or_not(make_decoder):
    decoder = make_decoder(dtype=torch.float32, vocab_size=12, feature_dim=10, sharpen=3.0, eos=-2.0)
    features = torch.randn(4, 6, 10, generator=torch.Generator().manual_seed(1))
    before = GenerationConfig(max_new_tokens=8)  # made before the option exists: reads its default
    with registered("offset", Offset):
        assert PROCESSORS.classes()[-1] is ForcedPrefix and Offset in PROCESSORS.classes()
        assert before.offset == 0.0 and before == GenerationConfig(max_new_tokens=8)
        plain = generate(decoder, features, before)
        for beams in (1, 3):
            config = GenerationConfig(num_beams=beams, max_new_tokens=8, offset=50.0)
            out = generate(decoder, features, config)
            assert (out.sequences == 4).all(), out.sequences  # token 4 wins every step
            graphed = generate(decoder, features, config.replace(cuda_graphs=True))
            assert torch.equal(graphed.sequences, out.sequences)
        assert not (plain.sequences == 4).all()
        forced = generate(decoder, features, GenerationConfig(max_new_tokens=8, offset=50.0, prefix=(5, 6)))
        assert forced.sequences[:, :2].tolist() == [[5, 6]] * 4  # the prefix applies after it
    assert "offset" not in field_names() and not hasattr(GenerationConfig(), "offset")
    with pytest.raises(TypeError):
        GenerationConfig(offset=1.0)


def test_option_names_cannot_clash_and_options_are_declared(plugin):
    fields = field_names()
    for options, error, message in (
        ({"num_beams": option(1, "more beams")}, ValueError, "'num_beams' is already a field of GenerationConfig"),
        ({"ban_word": option(0, "again")}, ValueError, "'ban_word' is already an option of BanWord"),
        ({"replace": option(0, "a method's name")}, ValueError, "'replace' is a method of GenerationConfig"),
        ({"plain": dataclasses.field(default=0)}, TypeError, "'plain': declare it with option"),
    ):
        clash = type("Clash", (Processor,), {"options": options})
        with pytest.raises(error, match=re.escape(message)):
            PROCESSORS.register("clash")(clash)
        assert "clash" not in PROCESSORS.names() and field_names() == fields
    with pytest.raises(TypeError, match="a Processor subclass"):
        PROCESSORS.register("clash")(object)
    assert [o.name for o in generation_options()] == fields
