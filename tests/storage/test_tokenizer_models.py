"""A model of each tokenizer keeps it: its checkpoint, its model folder and its ONNX folder reload
with the tokenizer (a subword one with its trained model) and caption identically, Chinese text
without spaces."""

import json
from pathlib import Path

import pytest

from captioning.api import Captioner
from captioning.cli.main import main
from captioning.data.shapes import generate
from captioning.training.cli import run_lightning_cli
from tests.helpers import fit_args


@pytest.fixture(scope="module")
def zh_shapes(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("zh"), n_train=24, n_val=4, n_test=6, seed=3, progress=False, language="zh")


SUBWORD = ("bpe", "unigram")


@pytest.mark.parametrize(
    "tokenizer",
    [
        "chars",
        pytest.param("words", marks=pytest.mark.slow),
        pytest.param("jieba", marks=pytest.mark.slow),
        pytest.param("bpe", marks=pytest.mark.slow),
        pytest.param("unigram", marks=pytest.mark.slow),
    ],
)
def test_checkpoint_folder_and_onnx_caption_alike_with_the_models_tokenizer(
    tokenizer, zh_shapes, tiny_shapes, tmp_path
):
    if tokenizer == "jieba":
        pytest.importorskip("jieba")
    if tokenizer in SUBWORD:
        pytest.importorskip("tokenizers")
    english = tokenizer in ("words", *SUBWORD)  # subwords: English, merged back into words
    data = tiny_shapes if english else zh_shapes
    extra = ["--data.tokenizer", tokenizer, "--data.min_word_freq", "1"]
    if tokenizer in SUBWORD:
        extra += ["--data.vocab_size", "60"]
    cli = run_lightning_cli(fit_args(data, tmp_path / "fit", steps=4, extra=extra))
    checkpoint = Path(cli.trainer.checkpoint_callback.last_model_path)
    images = [str(p) for p in sorted((data.parent / "images" / "test").glob("*.png"))]

    a = Captioner.from_checkpoint(checkpoint, "cpu")
    assert a.vocab.tokenizer.name == tokenizer
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "folder")]) == 0
    stored = json.loads((tmp_path / "folder" / "vocab.json").read_text(encoding="utf-8"))
    assert stored.get("tokenizer", "words") == tokenizer and ("tokenizer_model" in stored) == (tokenizer in SUBWORD)
    assert ("tokenizer" in stored) == (tokenizer != "words")  # a words vocabulary is stored as before
    b = Captioner.from_pretrained(tmp_path / "folder", "cpu")
    assert b.vocab == a.vocab
    ra, rb = a(images, num_beams=3), b(images, num_beams=3)
    texts = [r["generated_text"] for r in ra]
    assert texts == [r["generated_text"] for r in rb] and any(texts)
    for r in ra:  # the text is the tokens joined by the tokenizer
        words = [t for t in r["tokens"] if t not in (a.vocab.PAD, a.vocab.BOS, a.vocab.EOS)]  # <unk> is printed
        assert r["generated_text"] == a.vocab.tokenizer.detokenize(words)
    if not english:
        assert all(" " not in t for t in texts)
    else:
        assert all("\u2581" not in t for t in texts)  # subwords merged
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    from captioning.export.onnx_captioner import OnnxCaptioner

    assert main(["export", "--format", "onnx", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "onnx")]) == 0
    onnx = OnnxCaptioner(tmp_path / "onnx")
    assert onnx.vocab.tokenizer.name == tokenizer
    same = [x["generated_text"] == y["generated_text"] for x, y in zip(ra, onnx(images, num_beams=3))]
    assert sum(same) >= len(same) - 1  # float rounding may flip a near tie in one image
