"""Every float field of the model's and the optimizer's configs refuses nan and infinities with one line naming
the field (the decoding options have their own walk in tests/decoding)."""

import dataclasses

import pytest

from captioning.errors import CaptioningError
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.training.optim import OptimizerConfig

BUILD = {
    DecoderConfig: DecoderConfig,
    EncoderConfig: lambda **kw: EncoderConfig("small_cnn", **kw),
    OptimizerConfig: OptimizerConfig,
}
FIELDS = [(cls, f.name) for cls in BUILD for f in dataclasses.fields(cls) if "float" in str(f.type)]


def test_the_walk_finds_float_fields():
    assert {(DecoderConfig, "dropout"), (DecoderConfig, "local_sigma")} <= set(FIELDS)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(("cls", "name"), FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
def test_a_float_field_refuses_non_finite_values(cls, name, value):
    with pytest.raises((CaptioningError, ValueError)) as refused:
        BUILD[cls](**{name: value})
    assert name in str(refused.value) and "\n" not in str(refused.value)
