"""A text ``prefix`` is split by the model's own tokenizer (GenerationConfig.resolve_tokens): words,
characters, jieba words and subword pieces, so a Chinese prefix ("左上角有") or a subword model's
prefix ("a large") forces the tokens the model writes; a prefix the vocabulary cannot spell is one line."""

import json

import pytest

from captioning.decoding.generation import GenerationConfig
from captioning.errors import ConfigError
from captioning.tokenizers import build_tokenizer
from captioning.vocab import Vocabulary

ENGLISH = [
    "a large red circle to the left of a small blue square",
    "there is a large green star in the top left corner",
    "a small purple triangle above a large red cross",
]
CHINESE = ["左上角有一个红色的星形", "一个蓝色的大圆形在中间", "从左到右依次是红色的十字形和绿色的三角形"]
TRAINING = (ENGLISH + CHINESE) * 4


def vocabulary(name: str) -> Vocabulary:
    if name == "jieba":
        pytest.importorskip("jieba")
    if name in ("bpe", "unigram"):
        pytest.importorskip("tokenizers")
        tokenizer = build_tokenizer(name, vocab_size=90)
        tokenizer.train(TRAINING)
    else:
        tokenizer = build_tokenizer(name)
    return Vocabulary.build([tokenizer.tokenize(t) for t in TRAINING], min_freq=1, tokenizer=tokenizer)


@pytest.mark.parametrize("name", ["words", "chars", "jieba", "bpe", "unigram"])
@pytest.mark.parametrize("text", ["A large red", "左上角有", "从左到右 依次是"])
def test_a_text_prefix_is_split_by_the_models_tokenizer(name, text):
    """The prefix's ids are the ids of the tokens the tokenizer gives for the same text in a caption,
    and they read back as the text (without spaces between CJK words)."""
    if name == "words" and not text.isascii():
        pytest.skip("words keeps a CJK run as one token (a CJK model has a CJK tokenizer)")
    vocab = vocabulary(name)
    config = GenerationConfig(prefix=text, max_new_tokens=20).resolve_tokens(vocab)
    expected = [vocab.stoi[t] for t in vocab.tokenizer.tokenize(text)]
    assert list(config.prefix) == expected and len(expected) >= 2, (vocab.tokenizer.tokenize(text), config.prefix)
    assert all(isinstance(t, int) for t in config.prefix)
    spaced = name in ("bpe", "unigram")  # subwords keep the text's spaces; the others join CJK words without
    assert vocab.decode_text(list(config.prefix)) == (text.lower() if spaced else text.lower().replace(" 依", "依"))
    # the prefix of a caption is the caption's first tokens: what training taught the model to write
    caption = next(c for c in TRAINING if c.startswith(text.lower().split()[0][:2]))
    whole = vocab.tokenizer.tokenize(caption)
    if name not in ("bpe", "unigram"):  # (a subword cut inside a word may differ from the word's pieces)
        assert whole[: len(expected)] == vocab.tokenizer.tokenize(text)


def test_a_chinese_prefix_as_jieba_and_chars_split_it():
    pytest.importorskip("jieba")
    jieba, chars = vocabulary("jieba"), vocabulary("chars")
    assert [jieba.itos[i] for i in GenerationConfig(prefix="左上角有").resolve_tokens(jieba).prefix] == ["左上角", "有"]
    assert [chars.itos[i] for i in GenerationConfig(prefix="左上角有").resolve_tokens(chars).prefix] == list("左上角有")
    # a vocabulary token typed as it is stands for itself, and ids and text mix
    one = GenerationConfig(prefix=("左上角", jieba.stoi["有"], "一个")).resolve_tokens(jieba)
    assert [jieba.itos[i] for i in one.prefix] == ["左上角", "有", "一个"]


def test_subword_pieces_and_specials_stand_for_themselves():
    bpe = vocabulary("bpe")
    piece = next(t for t in bpe.itos if t.startswith("\u2581") and len(t) > 2)
    assert GenerationConfig(prefix=(piece,)).resolve_tokens(bpe).prefix == (bpe.stoi[piece],)
    assert GenerationConfig(prefix="<unk> a").resolve_tokens(bpe).prefix[0] == Vocabulary.unk_id
    # "a" alone is the word "▁a", not the inner piece "a" the vocabulary also holds
    assert "a" in bpe.stoi
    assert [bpe.itos[i] for i in GenerationConfig(prefix="a").resolve_tokens(bpe).prefix] == ["\u2581a"]


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("words", "a zebra", r"^prefix: 'zebra' is not a word of the model's vocabulary$"),
        (
            "chars",
            "左上角有斑马",
            r"^prefix: '左上角有斑马' splits into 左 上 角 有 斑 马 by the model's 'chars' tokenizer; '斑' ",
        ),
        ("jieba", "斑马", r"^prefix: '斑马' is not a word of the model's vocabulary$"),
        (
            "jieba",
            "左上角有斑马",
            r"^prefix: '左上角有斑马' splits into .* by the model's 'jieba' tokenizer; '斑马' is not in",
        ),
        ("bpe", "a zebra", r"^prefix: 'zebra' holds characters the model's 'bpe' vocabulary lacks \(z\)$"),
        ("unigram", "斑马", r"^prefix: '斑马' holds characters the model's 'unigram' vocabulary lacks \(斑马\)$"),
        ("words", "...", r"^prefix: '...' holds no token of the model's 'words' tokenizer$"),
    ],
)
def test_a_prefix_the_vocabulary_cannot_spell_is_one_line(name, text, message):
    vocab = vocabulary(name)
    with pytest.raises(ConfigError, match=message) as info:
        GenerationConfig(prefix=text).resolve_tokens(vocab)
    assert "\n" not in str(info.value)


def test_a_prefix_longer_than_the_caption_counts_its_tokens():
    """The limit holds for the split tokens, not the typed words: '左上角有' is four characters."""
    chars = vocabulary("chars")
    assert len(GenerationConfig(prefix="左上角有", max_new_tokens=5).resolve_tokens(chars).prefix) == 4
    with pytest.raises(ConfigError, match=r"prefix \(4 words\) must be shorter than max_new_tokens \(4\)"):
        GenerationConfig(prefix="左上角有", max_new_tokens=4).resolve_tokens(chars)


def test_the_caption_command_continues_a_chinese_prefix(tiny_shapes_zh, tiny_zh_checkpoint, capsys):
    """`caption --prefix 左上角有` on a Chinese model: each caption starts with the prefix, no spaces."""
    from captioning.cli.main import main

    images = sorted((tiny_shapes_zh.parent / "images" / "test").glob("*.png"))[:2]
    args = ["caption", *map(str, images), "--checkpoint", str(tiny_zh_checkpoint), "--json"]
    assert main([*args, "--prefix", "左上角有", "--num-beams", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all(r["generated_text"].startswith("左上角有") for r in rows), rows
    assert all(" " not in r["generated_text"] for r in rows)
