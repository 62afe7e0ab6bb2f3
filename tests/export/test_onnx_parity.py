"""The ONNX captioner (numpy + onnxruntime) against PyTorch's decoding, option by option: every
GenerationConfig field is either honoured (the same captions and scores at a value other than its
default) or refused in one line (export/onnx_captioner.py: ONNX_OPTIONS). A new field fails here
until it is decided and has a setting (here, or its logits processor's ``example``)."""

import dataclasses

import pytest

from captioning.cli import main
from captioning.decoding.generation import GenerationConfig
from captioning.decoding.options import option
from captioning.decoding.processors import PROCESSORS, Processor
from captioning.errors import ConfigError
from captioning.vocab import Vocabulary
from tests.helpers import shapes_test_images

#: for each field, a setting where it differs from its default (with what it needs beside it)
NON_DEFAULT = {
    "num_beams": dict(num_beams=3, no_repeat_ngram_size=1),
    "max_new_tokens": dict(max_new_tokens=4),
    "length_penalty": dict(num_beams=3, length_penalty=0.2),
    "do_sample": dict(do_sample=True),
    "temperature": dict(temperature=0.5),
    "top_k": dict(top_k=3),
    "attention_mode": dict(attention_mode="argmax"),
    "attention_temperature": dict(attention_temperature=0.5),
    "num_return_sequences": dict(num_beams=3, num_return_sequences=3),
    "forbid_bad_endings": dict(forbid_bad_endings=True, max_new_tokens=5),
    "location_samples": dict(location_samples=2),
    "cuda_graphs": dict(cuda_graphs=True, num_beams=2),
    "num_beam_groups": dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0),
    "diversity_penalty": dict(num_beams=2, num_beam_groups=2, diversity_penalty=0.5),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=1),
    "repetition_penalty": dict(repetition_penalty=1.5),
    "top_p": dict(do_sample=True, top_p=0.9),
    "min_new_tokens": dict(min_new_tokens=8, num_beams=3, length_penalty=0.2),
    "suppress_tokens": dict(suppress_tokens=("<unk>", "picture")),
    "prefix": dict(prefix=("a",)),
}


def setting_of(name: str) -> dict | None:
    """The setting of the field ``name``: NON_DEFAULT's, else its logits processor's ``example``."""
    if name in NON_DEFAULT:
        return NON_DEFAULT[name]
    owner = [p for p in PROCESSORS.classes() if name in p.options]
    return (owner[0].example or None) if owner else None


#: the honoured options whose setting above changes the tiny model's captions (the others are ignored
#: by a soft-attention model's greedy search, PyTorch's as the ONNX captioner's, or do not bite on it)
CHANGES_CAPTIONS = {
    "num_beams",
    "max_new_tokens",
    "length_penalty",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "min_new_tokens",
    "suppress_tokens",
}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint with its decoder sharpened (weights doubled) and EOS likelier: its beams end
    at different lengths, so that every option of CHANGES_CAPTIONS bites (a model three steps old
    hardly ends its captions by itself)."""
    import torch

    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    state = ckpt["state_dict"]
    for name in [k for k in state if k.startswith("model.decoder.") and state[k].is_floating_point()]:
        state[name] = state[name] * 2.0
    state["model.decoder.L_o.bias"][2] += 1.0
    path = tmp_path_factory.mktemp("eos") / "eos.ckpt"
    torch.save(ckpt, path)
    return path


@pytest.fixture(scope="module")
def onnx_folder(checkpoint, tmp_path_factory):
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    out = tmp_path_factory.mktemp("export") / "onnx"
    assert main(["export", "--format", "onnx", "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def captioners(checkpoint, onnx_folder):
    from captioning.api import Captioner
    from captioning.export.onnx_captioner import OnnxCaptioner

    return Captioner.from_checkpoint(checkpoint, "cpu"), OnnxCaptioner(onnx_folder)


@pytest.fixture(scope="module")
def images(tiny_shapes) -> list:
    return shapes_test_images(tiny_shapes, 12)


def assert_same(ra: list, rb: list, what) -> None:
    """Nine in ten captions the same (float32 sums in another order may swap near-ties), their scores
    within 1e-4; the listed beams too."""
    same = [x["generated_text"] == y["generated_text"] for x, y in zip(ra, rb)]
    assert len(ra) == len(rb) and sum(same) / len(same) >= 0.9, (what, ra, rb)
    for x, y, s in zip(ra, rb, same):
        if s:
            assert abs(x["score"] - y["score"]) < 1e-4, what
            assert [b["generated_text"] for b in x.get("beams", [])] == [
                b["generated_text"] for b in y.get("beams", [])
            ]


def test_every_field_has_a_setting_and_a_decision():
    from captioning.export.onnx_captioner import ONNX_OPTIONS

    fields = [f.name for f in dataclasses.fields(GenerationConfig)]
    missing = [name for name in fields if setting_of(name) is None]
    assert not missing, f"a new decoding option: give it a setting here, or its processor an example: {missing}"
    assert sorted(ONNX_OPTIONS) == sorted(fields), "a new decoding option: decide it in ONNX_OPTIONS"


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(GenerationConfig)])
def test_each_option_is_honoured_or_refused_in_one_line(name, captioners, images):
    from captioning.export.onnx_captioner import HONOURED, ONNX_OPTIONS

    torch_captioner, onnx_captioner = captioners
    setting = setting_of(name)
    assert setting is not None, f"{name}: no setting in NON_DEFAULT, nor an example of its processor"
    config = GenerationConfig(**setting)
    assert getattr(config, name) != getattr(GenerationConfig(), name), name  # the setting does set the field
    decision = ONNX_OPTIONS.get(name)
    assert decision is not None, f"{name}: no decision in ONNX_OPTIONS"
    if decision == HONOURED:
        expected = torch_captioner(images, **setting)
        assert_same(expected, onnx_captioner(images, **setting), setting)
        if name in CHANGES_CAPTIONS:  # the comparison is not of two default decodings
            without = torch_captioner(images, **{k: v for k, v in setting.items() if k != name})
            assert [r["generated_text"] for r in expected] != [r["generated_text"] for r in without], setting
    else:
        with pytest.raises(ConfigError) as err:
            onnx_captioner(images[:1], **setting)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"the ONNX captioner {decision}: "), message
        assert "needs the PyTorch model" in message


def test_a_prefix_is_refused_before_its_words_are_read(captioners, images):
    """A prefix the vocabulary cannot spell is refused for what the captioner cannot do, not for its words."""
    from captioning.export.onnx_captioner import ONNX_OPTIONS

    with pytest.raises(ConfigError) as err:
        captioners[1](images[:1], prefix=("zyzzyva",))
    assert str(err.value).startswith(f"the ONNX captioner {ONNX_OPTIONS['prefix']}: prefix"), str(err.value)


def test_an_undecided_field_is_refused(captioners, images, monkeypatch):
    """A field missing from ONNX_OPTIONS is refused at any value but its default, never ignored."""
    from captioning.export import onnx_captioner

    monkeypatch.delitem(onnx_captioner.ONNX_OPTIONS, "repetition_penalty")
    with pytest.raises(ConfigError, match="does not implement it: repetition_penalty 1.5 needs the PyTorch model"):
        captioners[1](images[:1], repetition_penalty=1.5)
    assert captioners[1](images[:1]) == captioners[1](images[:1], repetition_penalty=1.0)


@pytest.mark.parametrize(
    "options",
    [
        dict(no_repeat_ngram_size=2),
        dict(no_repeat_ngram_size=1),
        dict(repetition_penalty=1.5),
        dict(min_new_tokens=4),
        dict(suppress_tokens=("<unk>", "a")),
        dict(no_repeat_ngram_size=3, repetition_penalty=1.2, min_new_tokens=2, forbid_bad_endings=True),
    ],
    ids=str,
)
@pytest.mark.parametrize("beams", [1, 3])
def test_onnx_captions_as_pytorch_with_options_together(captioners, images, options, beams):
    torch_captioner, onnx_captioner = captioners
    assert_same(
        torch_captioner(images, num_beams=beams, **options),
        onnx_captioner(images, num_beams=beams, **options),
        (options, beams),
    )


def test_onnx_refuses_diverse_beams_and_sampling_in_one_line(captioners, images):
    for options, message in (
        (dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0), "no diverse beam search"),
        (dict(do_sample=True, top_p=0.9), "sampling"),
        (dict(attention_mode="sample"), "sampling"),
    ):
        with pytest.raises(ConfigError) as err:
            captioners[1](images[:1], **options)
        assert message in str(err.value) and "\n" not in str(err.value)


class EosBonus(Processor):
    """Adds ``eos_bonus`` to EOS's log-probability (a processor written in a test, with its twin)."""

    options = {"eos_bonus": option(0.0, "add this to EOS's log-probability", type=float)}
    example = {"eos_bonus": 1.5, "num_beams": 3}

    def __call__(self, logp, previous, lengths, prefix):
        logp[:, Vocabulary.eos_id] += self.config.eos_bonus
        return logp

    def numpy(self, logp, previous, lengths, prefix):
        logp[:, Vocabulary.eos_id] += self.config.eos_bonus
        return logp


def test_a_processor_brings_its_setting_and_is_held_to_pytorch(captioners, images):
    """A new processor is one file: its ``example`` is its setting here, its twin its ONNX decision."""
    from captioning.export.onnx_captioner import HONOURED, ONNX_OPTIONS

    PROCESSORS.register("eos_bonus")(EosBonus)
    try:
        assert setting_of("eos_bonus") == EosBonus.example and ONNX_OPTIONS["eos_bonus"] == HONOURED
        torch_captioner, onnx_captioner = captioners
        expected = torch_captioner(images, **EosBonus.example)
        assert_same(expected, onnx_captioner(images, **EosBonus.example), EosBonus.example)
        plain = torch_captioner(images, num_beams=3)
        assert [r["generated_text"] for r in expected] != [r["generated_text"] for r in plain]  # it bites
    finally:
        PROCESSORS.unregister("eos_bonus")
    assert setting_of("eos_bonus") is None and "eos_bonus" not in ONNX_OPTIONS
