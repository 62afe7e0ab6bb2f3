"""The tokenizer registry: ``words`` (today's tokens and text), one-line errors listing the names,
and a new tokenizer (defined here, one class) carried by the vocabulary and by CaptionData."""

import json

import pytest

from captioning.data.captions import CaptionData
from captioning.errors import ConfigError
from captioning.tokenizers import TOKENIZERS, Tokenizer, WordTokenizer, build_tokenizer, list_tokenizers, tokenize
from captioning.vocab import Vocabulary


@TOKENIZERS.register("test-chars")
class CharTokenizer(Tokenizer):
    name = "test-chars"

    def tokenize(self, text):
        return [c for c in text.lower() if c.isalpha()]

    def detokenize(self, tokens):
        return "".join(tokens)


def test_every_registered_tokenizer_carries_its_name():
    assert list_tokenizers()[0] == "words"
    for name in list_tokenizers():
        assert build_tokenizer(name).name == name


def test_words_is_tokenize_and_the_join_rule():
    words = build_tokenizer("words")
    assert isinstance(words, WordTokenizer)
    text = "A Dog’s ball, 2 cafe\u0301s! t-shirt"
    assert words.tokenize(text) == tokenize(text) == ["a", "dog's", "ball", "2", "cafés", "t-shirt"]
    assert words.detokenize(["a", "cross", ",", "a", "circle", "."]) == "a cross, a circle."
    assert words.detokenize(["a", ",b"]) == "a ,b"  # only a punctuation token is attached


def test_an_unknown_tokenizer_is_one_line_naming_the_field_and_the_names():
    with pytest.raises(ConfigError) as info:
        build_tokenizer("bpe", "data.tokenizer")
    message = str(info.value)
    assert "\n" not in message and message.startswith("data.tokenizer: unknown tokenizer 'bpe'; expected one of words")
    assert "test-chars" in message
    with pytest.raises(ConfigError, match="^vocabulary.tokenizer: unknown tokenizer 'bpe'"):
        Vocabulary.from_dict({"itos": list(Vocabulary.SPECIALS), "tokenizer": "bpe"})


def test_a_words_vocabulary_is_stored_as_before(tmp_path):
    v = Vocabulary.build([["a", "dog"], ["a", "cat"]], min_freq=1)
    assert v.tokenizer.name == "words" and v.to_dict() == {
        "itos": [*Vocabulary.SPECIALS, "a", "cat", "dog"],
        "min_freq": 1,
    }
    old = {"itos": [*Vocabulary.SPECIALS, "a", "dog", ","], "min_freq": 5}  # a file written before tokenizers
    assert Vocabulary.from_dict(old).tokenizer.name == "words" and Vocabulary.from_dict(old).to_dict() == old


def test_a_registered_tokenizer_builds_records_and_decodes_a_vocabulary(tmp_path):
    chars = build_tokenizer("test-chars")
    v = Vocabulary.build([chars.tokenize("abba"), chars.tokenize("cab")], min_freq=1, tokenizer="test-chars")
    assert v.itos[4:] == ["a", "b", "c"] and v.tokenizer.name == "test-chars"
    assert v.decode_text([v.bos_id, v.stoi["c"], v.stoi["a"], v.stoi["b"], v.eos_id]) == "cab"
    v.save(tmp_path / "vocab.json")
    assert json.loads((tmp_path / "vocab.json").read_text())["tokenizer"] == "test-chars"
    back = Vocabulary.load(tmp_path / "vocab.json")
    assert back == v and back.tokenizer.name == "test-chars"
    assert back != Vocabulary(v.itos, 1)  # same tokens, other tokenizer


def karpathy_file(tmp_path):
    images = [
        {"filename": f"{i}.jpg", "imgid": i, "split": split, "sentences": [{"raw": "A cab.", "tokens": ["a", "cab"]}]}
        for i, split in enumerate(["train", "train", "val", "test"])
    ]
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"images": images}))
    return path


def test_caption_data_splits_the_captions_with_its_tokenizer(tmp_path):
    path = karpathy_file(tmp_path)
    words = CaptionData(str(path), min_word_freq=1)
    words.setup()
    assert words.records("train")[0].tokens == [["a", "cab"]] and words.vocab.itos[4:] == ["a", "cab"]
    chars = CaptionData(str(path), min_word_freq=1, tokenizer="test-chars")
    chars.setup()
    assert chars.records("train")[0].tokens == [["a", "c", "a", "b"]]
    assert chars.vocab.tokenizer.name == "test-chars" and chars.vocab.itos[4:] == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="^data.tokenizer: unknown tokenizer 'nope'"):
        CaptionData(str(path), tokenizer="nope")


def test_caption_data_takes_the_tokenizer_of_a_vocabulary_given(tmp_path):
    path = karpathy_file(tmp_path)
    chars_vocab = Vocabulary([*Vocabulary.SPECIALS, "a", "b", "c"], 1, tokenizer="test-chars")
    data = CaptionData(str(path))
    data.setup()  # words first
    data.set_vocab(chars_vocab)  # a checkpoint's: its tokenizer from now on
    assert data.tokenizer.name == "test-chars" and data.records("train")[0].tokens == [["a", "c", "a", "b"]]
    named = CaptionData(str(path), tokenizer="words")
    with pytest.raises(ConfigError, match="built with the 'test-chars' tokenizer; set data.tokenizer: test-chars"):
        named.set_vocab(chars_vocab)
    chars_vocab.save(tmp_path / "vocab.json")
    from_file = CaptionData(str(path), vocabulary=str(tmp_path / "vocab.json"))
    from_file.setup()
    assert from_file.vocab == chars_vocab and from_file.records("train")[0].tokens == [["a", "c", "a", "b"]]
