"""The shapes data with Chinese captions (make-shapes --language zh): the same images, captions of
Chinese word order that name every object, object F1 read from Chinese text and from any
tokenizer's tokens."""

import json

import pytest

from captioning.cli.main import main
from captioning.data.captions import CaptionData
from captioning.data.shapes import generate, locate_objects, parse_objects, record_objects
from captioning.errors import ConfigError
from captioning.tokenizers import build_tokenizer


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("zh")
    en = generate(root / "en", n_train=30, n_val=4, n_test=6, seed=5, progress=False)
    assert main(["make-shapes", "--out", str(root / "zh"), "--train", "30", "--val", "4", "--test", "6",
                 "--seed", "5", "--language", "zh"]) == 0  # fmt: skip
    return en, root / "zh" / "dataset_shapes.json"


def test_the_same_images_with_chinese_captions_naming_every_object(both):
    en, zh = both
    a, b = json.loads(en.read_text()), json.loads(zh.read_text(encoding="utf-8"))
    assert [im["objects"] for im in a["images"]] == [im["objects"] for im in b["images"]]
    for im_zh in b["images"]:
        path = f"{im_zh['filepath']}/{im_zh['filename']}"
        assert (en.parent / path).read_bytes() == (zh.parent / path).read_bytes()
        truth = sorted(record_objects(im_zh))
        for sentence in im_zh["sentences"]:
            raw = sentence["raw"]
            assert " " not in raw and "tokens" not in sentence  # split by the data's tokenizer
            assert sorted(parse_objects(raw)) == truth, raw
    captions = [s["raw"] for im in b["images"] for s in im["sentences"]]
    assert any(c.startswith("从左到右依次是一个") for c in captions) and any(
        "在" in c and "的左边" in c for c in captions
    )


@pytest.mark.parametrize("name", ["chars", "jieba", "bpe"])
def test_objects_are_found_in_every_tokenizers_tokens(name):
    if name == "jieba":
        pytest.importorskip("jieba")
    tokenizer = build_tokenizer(name, vocab_size=60 if name == "bpe" else None)
    caption = "红色的大圆形在蓝色的小十字形的左边"
    if name == "bpe":
        pytest.importorskip("tokenizers")
        tokenizer.train([caption, "一个绿色的小正方形"] * 3)
    tokens = tokenizer.tokenize(caption)
    found = locate_objects(tokens)
    assert [triple for _, triple in found] == [("large", "red", "circle"), ("small", "blue", "cross")]
    assert all("形" in tokens[i] for i, _ in found)  # the token that ends the shape's name
    assert locate_objects(["a", "large", "red", "circle"]) == [(3, ("large", "red", "circle"))]  # English as before


def test_chinese_shapes_train_with_a_cjk_tokenizer_and_score_objects(both):
    _, zh = both
    data = CaptionData(str(zh), min_word_freq=1)
    data.setup()
    assert data.vocab.tokenizer.name in ("jieba", "chars") and "红色" in "".join(data.vocab.itos)
    test = data.records("test")
    references = {r.image_id: r.captions[0] for r in test}
    assert data.dataset_scores("test", references)["object_f1"] == 1.0


def test_an_unknown_language_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="^--language: expected one of en, zh, got 'fr'$"):
        generate(tmp_path, n_train=1, n_val=1, n_test=1, language="fr", progress=False)
