"""Models written by earlier versions of this code still load and caption identically.

tests/fixtures/v0_1_8e72f85/ was written by commit 8e72f85 (make_fixtures.py there): a soft checkpoint,
a Luong-placement checkpoint with the local window and two heads, and a hard-attention model
folder. tests/fixtures/v0_2_35824d9/ was written by 35824d9, the last version whose LSTM decoder
stored its parameters fused: a soft checkpoint, a scaled-dot/two-head/local checkpoint, model folders
of hard attention, general+AoA+AoA-refiner, Luong+dot and a transformer. Each with the captions,
scores and attention maps that version gave for three images; their weights reach the paper's names
through storage/paper_names.py.
"""

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = ("v0_1_8e72f85", "v0_2_35824d9")
MODELS = [(v, name) for v in VERSIONS for name in sorted(json.loads((ROOT / v / "expected.json").read_text()))]


@pytest.mark.parametrize("version,name", MODELS)
@pytest.mark.parametrize("beams", [1, 3])
def test_an_old_model_captions_as_it_did(version, name, beams):
    from captioning.api import Captioner

    fixtures = ROOT / version
    expected_all = json.loads((fixtures / "expected.json").read_text())
    images = [str(fixtures / "images" / f"{i}.png") for i in range(3)]
    path = str(fixtures / name)
    captioner = Captioner.from_checkpoint(path) if name.endswith(".ckpt") else Captioner.from_pretrained(path)
    results = captioner(images, num_beams=beams, return_attention=True)
    attention = np.load(fixtures / "expected_attention.npz")
    for i, (result, expected) in enumerate(zip(results, expected_all[name][f"beams{beams}"])):
        assert result["generated_text"] == expected["text"]
        assert result["score"] == pytest.approx(expected["score"], abs=1e-5)
        np.testing.assert_allclose(np.asarray(result["attention"]), attention[f"{name}/beams{beams}/{i}"], atol=1e-5)
