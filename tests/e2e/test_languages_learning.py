"""A learning test in Chinese: on the shapes data with Chinese captions (make-shapes --language zh),
configs/shapes_soft_zh.yaml learns to name the objects, split by jieba or by characters, and the
scores are counted on Chinese words."""

import pytest

from captioning.cli.evaluate import evaluate
from captioning.data.shapes import generate
from captioning.decoding.search import GenerationConfig
from captioning.training.cli import run_lightning_cli
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def zh_data(tmp_path_factory):
    return generate(
        tmp_path_factory.mktemp("learn_zh"), n_train=300, n_val=20, n_test=40, seed=11, progress=False, language="zh"
    )


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["jieba", "chars"])
def test_model_learns_chinese_captions(tokenizer, zh_data, tmp_path):
    if tokenizer == "jieba":
        pytest.importorskip("jieba")
    epochs = "8" if tokenizer == "jieba" else "16"  # characters: captions 1.7x as long, learned more slowly
    args = [
        "--config",
        str(ROOT / "configs" / "shapes_soft_zh.yaml"),
        "--data.annotations",
        str(zh_data),
        "--data.tokenizer",
        tokenizer,
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.max_epochs",
        epochs,
        "--trainer.max_time",
        "null",
        "--trainer.check_val_every_n_epoch",
        epochs,
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.accelerator",
        "cpu",
    ]
    cli = run_lightning_cli(args, run=False)
    quick = dict(generation=GenerationConfig(num_beams=1), device="cpu", progress=False, metrics=("BLEU", "CIDEr"))
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.vocab.tokenizer.name == tokenizer
    after = evaluate(cli.model, str(zh_data), split="test", **quick)
    assert after["notes"]["tokens"] in ("jieba", "chars")  # Chinese words, not PTB tokens
    # a mention of a random size, colour and shape is right 1 time in 2 x 5 x 4 = 40 (F1 ~0.025)
    assert after["scores"]["object_f1"] > 2 * (1 / 40)
    assert after["scores"]["CIDEr"] > 0.3
    captions = list(after["predictions"].values())
    assert captions and all(" " not in c for c in captions)  # Chinese comes back without spaces
