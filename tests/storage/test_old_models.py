"""Models written by an earlier version of this code still load and caption identically.

tests/fixtures/v0_1_8e72f85/ was written by commit 8e72f85 (make_fixtures.py there): a soft checkpoint,
a Luong-placement checkpoint with the local window and two heads, and a hard-attention model
folder, with the captions, scores and attention maps that commit gave for three images.
"""

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "v0_1_8e72f85"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
IMAGES = [str(FIXTURES / "images" / f"{i}.png") for i in range(3)]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("beams", [1, 3])
def test_an_old_model_captions_as_it_did(name, beams):
    from captioning.api import Captioner

    path = str(FIXTURES / name)
    captioner = Captioner.from_checkpoint(path) if name.endswith(".ckpt") else Captioner.from_pretrained(path)
    results = captioner(IMAGES, num_beams=beams, return_attention=True)
    attention = np.load(FIXTURES / "expected_attention.npz")
    for i, (result, expected) in enumerate(zip(results, EXPECTED[name][f"beams{beams}"])):
        assert result["generated_text"] == expected["text"]
        assert result["score"] == pytest.approx(expected["score"], abs=1e-5)
        np.testing.assert_allclose(np.asarray(result["attention"]), attention[f"{name}/beams{beams}/{i}"], atol=1e-5)
