"""`captioning demo --language zh`: the demo's steps on Chinese captions (tiny data, a few steps):
captions without spaces between words, scores on jieba words, GIFs and grids titled in a CJK font
(or the one warning that none was found)."""

import json
import logging

import pytest
from PIL import Image

from captioning.cli.demo import DEMO_CONFIGS, run_demo
from captioning.errors import ConfigError
from captioning.tokenizers import is_cjk
from captioning.viz import fonts

TINY = dict(n_train=24, n_val=4, n_test=6, image_size=64)
FEW_STEPS = (
    "--trainer.max_epochs",
    "1",
    "--trainer.limit_train_batches",
    "3",
    "--trainer.limit_val_batches",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--data.batch_size",
    "8",
    "--model.test_generation.max_new_tokens",
    "12",
    "--model.val_generation.max_new_tokens",
    "12",
)


@pytest.mark.slow
def test_the_chinese_demo_writes_chinese_captions_pictures_and_scores(tmp_path, capsys, caplog):
    fonts.cjk_font_path.cache_clear()
    fonts._warn_no_cjk_font.cache_clear()
    out = tmp_path / "demo_zh"
    with caplog.at_level(logging.WARNING, logger="captioning.viz.fonts"):
        report = run_demo(str(out), language="zh", examples=2, data=TINY, fit_extra=FEW_STEPS)
    printed = capsys.readouterr().out
    assert "configs/shapes_soft_zh.yaml" in printed and "CJK font:" in printed

    data = json.loads((out / "data" / "dataset_shapes.json").read_text(encoding="utf-8"))
    raw = data["images"][0]["sentences"][0]["raw"]
    assert sum(map(is_cjk, raw)) > len(raw) / 2  # Chinese captions
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["notes"]["tokens"] in ("jieba", "chars") and report["notes"]["tokens"] == metrics["notes"]["tokens"]
    assert isinstance(metrics["scores"]["object_f1"], float)

    captions = json.loads((out / "captions.json").read_text(encoding="utf-8"))
    assert len(captions) == 2
    for c in captions:
        text = c["generated_text"]
        assert text and " " not in text and any(map(is_cjk, text)), text
        gif, grid = Image.open(c["gif"]), Image.open(c["grid"])
        assert gif.n_frames >= 2 and grid.size[0] > 0
    # the words are drawn in a CJK font, or one warning says there is none (never boxes silently)
    warnings = [r.getMessage() for r in caplog.records if "no font with CJK glyphs" in r.getMessage()]
    if fonts.cjk_font_path() is None:
        assert len(warnings) == 1 and "none found" in printed
    else:
        assert not warnings and f"CJK font:        {fonts.cjk_font_path()}" in printed


def test_the_demo_knows_its_languages(capsys):
    from captioning.cli.main import main

    assert set(DEMO_CONFIGS) == {"en", "zh"} and DEMO_CONFIGS["en"] == "shapes_soft.yaml"
    with pytest.raises(ConfigError, match=r"^--language: expected one of en, zh, got 'fr'$"):
        run_demo(language="fr")
    with pytest.raises(SystemExit):
        main(["demo", "--language", "fr"])
    assert "--language" in capsys.readouterr().err
