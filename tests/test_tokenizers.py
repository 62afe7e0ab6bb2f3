"""The tokenizer registry: ``words`` (today's tokens and text), one-line errors listing the names,
and a new tokenizer (defined here, one class) carried by the vocabulary and by CaptionData."""

import importlib.util
import json
import sys

import pytest

from captioning.data.captions import CaptionData
from captioning.errors import ConfigError
from captioning.tokenizers import (
    SPECIALS,
    TOKENIZERS,
    WORDS_VERSION,
    Tokenizer,
    WordTokenizer,
    build_tokenizer,
    list_tokenizers,
    tokenize,
    word_pattern,
)
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
        tokenizer = build_tokenizer(name, vocab_size=32 if TOKENIZERS.get(name).trainable else None)
        assert tokenizer.name == name


def test_words_is_tokenize_and_the_join_rule():
    words = build_tokenizer("words")
    assert isinstance(words, WordTokenizer)
    text = "A Dog’s ball, 2 cafe\u0301s! t-shirt"
    assert words.tokenize(text) == tokenize(text) == ["a", "dog's", "ball", "2", "cafés", "t-shirt"]
    assert words.detokenize(["a", "cross", ",", "a", "circle", "."]) == "a cross, a circle."
    assert words.detokenize(["a", ",b"]) == "a ,b"  # only a punctuation token is attached


def test_an_unknown_tokenizer_is_one_line_naming_the_field_and_the_names():
    with pytest.raises(ConfigError) as info:
        build_tokenizer("bpe2", "data.tokenizer")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("data.tokenizer: unknown tokenizer 'bpe2'; expected one of words, chars, jieba, bpe")
    assert "test-chars" in message
    with pytest.raises(ConfigError, match="^vocabulary.tokenizer: unknown tokenizer 'bpe2'"):
        Vocabulary.from_dict({"itos": list(Vocabulary.SPECIALS), "tokenizer": "bpe2"})


def test_a_words_vocabulary_is_stored_as_before_with_its_word_pattern_version(tmp_path):
    v = Vocabulary.build([["a", "dog"], ["a", "cat"]], min_freq=1)
    assert v.tokenizer.name == "words" and v.to_dict() == {
        "itos": [*Vocabulary.SPECIALS, "a", "cat", "dog"],
        "min_freq": 1,
        "tokenizer_version": WORDS_VERSION,
    }
    old = {"itos": [*Vocabulary.SPECIALS, "a", "dog", ","], "min_freq": 5}  # a file written before tokenizers
    assert Vocabulary.from_dict(old).tokenizer.name == "words"
    assert Vocabulary.from_dict(old).to_dict() == {**old, "tokenizer_version": 1}  # the version it always had


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


# ---------------------------------------------------------------------- the built-in tokenizers
TEXTS = {
    "en": "A man riding a horse on the beach.",
    "zh": "左上角有一个红色的星形。",
    "ja": "猫がテーブルの上に座っている",
    "mixed": "一个穿着T恤的男人在看3本books",
}
SUBWORD_TRAINING = [
    "a man riding a horse on the beach",
    "a dog on the beach",
    "左上角有一个红色的星形",
    "一个男人在看书",
    "猫がテーブルの上に座っている",
    "穿着t恤的男人 3 books",
    *TEXTS.values(),  # every character seen (an unseen one is <unk>)
] * 5


def trained(name: str, vocab_size: int = 120):
    tokenizer = build_tokenizer(name, vocab_size=vocab_size)
    tokenizer.train(SUBWORD_TRAINING)
    return tokenizer


def test_chars_and_jieba_split_cjk_and_keep_spaced_words_whole():
    chars = build_tokenizer("chars")
    assert chars.tokenize(TEXTS["zh"]) == list("左上角有一个红色的星形")  # the full stop dropped, as words does
    assert chars.tokenize(TEXTS["mixed"]) == [*"一个穿着", "t", *"恤的男人在看", "3", *"本", "books"]
    assert chars.tokenize(TEXTS["en"]) == tokenize(TEXTS["en"])
    pytest.importorskip("jieba")
    jieba = build_tokenizer("jieba")
    assert jieba.tokenize(TEXTS["zh"]) == ["左上角", "有", "一个", "红色", "的", "星形"]
    assert jieba.tokenize(TEXTS["en"]) == tokenize(TEXTS["en"])
    assert jieba.detokenize(["a", "dog", "在", "草地", "上", "3", "个"]) == "a dog在草地上3个"


@pytest.mark.parametrize("name", ["words", "chars", "jieba", "bpe", "unigram"])
@pytest.mark.parametrize("language", list(TEXTS))
def test_each_tokenizer_round_trips_text(name, language):
    """encode -> decode gives the text back (lower-cased, punctuation as the tokenizer keeps it), and
    splitting that text again gives the same tokens."""
    if name == "jieba":
        pytest.importorskip("jieba")
    if name in ("bpe", "unigram"):
        pytest.importorskip("tokenizers")
        tokenizer = trained(name)
    else:
        tokenizer = build_tokenizer(name)
    if name == "words" and language != "en":
        pytest.skip("words keeps a CJK run as one token (the automatic pick avoids it)")
    text = TEXTS[language]
    tokens = tokenizer.tokenize(text)
    vocab = Vocabulary.build([tokens], min_freq=1, tokenizer=tokenizer)
    back = vocab.decode_text(vocab.encode(tokens))
    if name in ("bpe", "unigram"):
        assert back == text.lower()  # subwords keep punctuation and spaces: the text itself
    else:
        assert back == text.lower().rstrip("。.")  # the final full stop is dropped by these three
    assert tokenizer.tokenize(back) == tokens
    if language in ("zh", "ja"):
        assert " " not in back


def test_subword_vocabulary_is_the_trained_tokenizers_and_is_stored_with_it(tmp_path):
    pytest.importorskip("tokenizers")
    bpe = trained("bpe", 80)
    v = Vocabulary.build([bpe.tokenize(t) for t in SUBWORD_TRAINING], min_freq=5, tokenizer=bpe)
    assert v.itos[:4] == list(Vocabulary.SPECIALS) and set(v.itos[4:]) == set(bpe.tokens()) - set(Vocabulary.SPECIALS)
    assert len(v) == 80 and v.min_freq == 1  # every token the tokenizer can emit, however rare
    assert bpe.tokens()[:4] == list(SPECIALS) == list(Vocabulary.SPECIALS)  # the specials at the same ids
    v.save(tmp_path / "vocab.json")
    stored = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    assert stored["tokenizer"] == "bpe" and stored["tokenizer_model"]["vocab_size"] == 80
    back = Vocabulary.load(tmp_path / "vocab.json")
    assert back == v and back.tokenizer.tokenize("a horse on a 星形") == bpe.tokenize("a horse on a 星形")
    del stored["tokenizer_model"]
    (tmp_path / "bad.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match=r"bad.json: the 'bpe' tokenizer is trained, but its model .* is missing$"):
        Vocabulary.load(tmp_path / "bad.json")


def test_bad_tokenizer_options_are_one_line_naming_the_option(tmp_path):
    path = karpathy_file(tmp_path)
    with pytest.raises(ConfigError, match=r"^data.vocab_size: the 'bpe' tokenizer learns a vocabulary of a given size"):
        CaptionData(str(path), tokenizer="bpe")
    with pytest.raises(ConfigError, match=r"^data.vocab_size: only a trained tokenizer .* not 'chars'"):
        CaptionData(str(path), tokenizer="chars", vocab_size=100)
    with pytest.raises(ConfigError, match=r"^data.vocab_size: expected an integer >= 8, got 2$"):
        CaptionData(str(path), tokenizer="unigram", vocab_size=2)
    with pytest.raises(ConfigError, match="^data.tokenizer: unknown tokenizer 'bp'; expected one of"):
        CaptionData(str(path), tokenizer="bp")


def chinese_karpathy_file(tmp_path, captions=("左上角有一个红色的星形", "一个蓝色的圆形在中间")):
    images = [
        {"filename": f"{i}.jpg", "imgid": i, "split": split, "sentences": [{"raw": c} for c in captions]}
        for i, split in enumerate(["train", "train", "val", "test"])
    ]
    path = tmp_path / "zh.json"
    path.write_text(json.dumps({"images": images}, ensure_ascii=False), encoding="utf-8")
    return path


def test_mostly_cjk_captions_get_a_cjk_tokenizer_said_in_one_line(tmp_path, capsys):
    path = chinese_karpathy_file(tmp_path)
    data = CaptionData(str(path), min_word_freq=1)
    data.setup()
    expected = "jieba" if importlib.util.find_spec("jieba") else "chars"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"mostly CJK; splitting them with the {expected!r} tokenizer" in err[0]
    assert data.vocab.tokenizer.name == expected and "星" in "".join(data.vocab.itos)
    named = CaptionData(str(path), min_word_freq=1, tokenizer="words")  # a name given: no pick, no line
    named.setup()
    assert named.vocab.itos[4:] == ["一个蓝色的圆形在中间", "左上角有一个红色的星形"] and capsys.readouterr().err == ""
    english = CaptionData(str(karpathy_file(tmp_path)), min_word_freq=1)
    english.setup()
    assert english.vocab.tokenizer.name == "words" and capsys.readouterr().err == ""


def test_caption_data_trains_a_subword_tokenizer_on_the_training_captions(tmp_path):
    pytest.importorskip("tokenizers")
    path = chinese_karpathy_file(tmp_path)
    data = CaptionData(str(path), tokenizer="bpe", vocab_size=30)
    data.setup()
    assert data.vocab.tokenizer.name == "bpe" and data.vocab.tokenizer.trained and len(data.vocab) <= 30
    ids = data.vocab.encode(data.records("val")[0].tokens[0])
    assert data.vocab.decode_text(ids) == "左上角有一个红色的星形"
    data.vocab.save(tmp_path / "vocab.json")
    again = CaptionData(str(path), vocabulary=str(tmp_path / "vocab.json"))  # the stored model, not a new one
    again.setup()
    assert again.vocab == data.vocab and again.records("train")[0].tokens == data.records("train")[0].tokens
    with pytest.raises(ConfigError, match=r"data.tokenizer: 'chars', but .*vocab.json was built with the 'bpe'"):
        CaptionData(str(path), tokenizer="chars", vocabulary=str(tmp_path / "vocab.json")).setup()


def test_words_is_bit_identical_on_the_shapes_data(tiny_shapes, tmp_path):
    """Unnamed (the default) and named, `words` gives the vocabulary and tokens of the file's own
    tokens, as before tokenizers existed, and stores the same bytes."""
    raw = json.loads(tiny_shapes.read_text())
    file_tokens = {im["imgid"]: [s["tokens"] for s in im["sentences"]] for im in raw["images"]}
    train = [t for im in raw["images"] if im["split"] == "train" for t in file_tokens[im["imgid"]]]
    before = Vocabulary(
        list(Vocabulary.SPECIALS)
        + sorted({w for t in train for w in t}, key=lambda w: (-sum(x.count(w) for x in train), w)),
        min_freq=1,
    )
    for tokenizer in (None, "words"):
        data = CaptionData(str(tiny_shapes), min_word_freq=1, tokenizer=tokenizer)
        data.setup()
        assert data.vocab.itos == before.itos
        assert data.vocab.to_dict() == {"itos": before.itos, "min_freq": 1, "tokenizer_version": WORDS_VERSION}
        assert all(r.tokens == file_tokens[r.imgid] for r in data.all_records())
        data.vocab.save(tmp_path / "a.json")
        before.save(tmp_path / "b.json")
        assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_a_subword_vocabulary_prints_text_without_the_library(tmp_path, monkeypatch):
    """Inference needs no Hugging Face tokenizers: the stored model is parsed only to split text."""
    pytest.importorskip("tokenizers")
    bpe = trained("bpe", 80)
    Vocabulary.build([], tokenizer=bpe).save(tmp_path / "vocab.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now fails
    v = Vocabulary.load(tmp_path / "vocab.json")
    tokens = bpe.tokenize("a man on the beach")
    assert v.decode_text(v.encode(tokens)) == "a man on the beach"
    with pytest.raises(ConfigError, match=r"^data.tokenizer: 'bpe' and 'unigram' need Hugging Face tokenizers: pip"):
        v.tokenizer.tokenize("a man")
    monkeypatch.undo()
    stored = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    stored["tokenizer_model"]["model"] = {"model": "nonsense"}
    (tmp_path / "bad.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match=r"bad.json: vocabulary.tokenizer_model: not a 'bpe' model as") as info:
        Vocabulary.load(tmp_path / "bad.json")  # refused as it is read, before the library sees it
    assert "\n" not in str(info.value)


def test_cjk_share_counts_cjk_letters_among_all_letters_and_digits():
    """cjk_share (regular expressions, a run at a time) equals its definition, character by character."""
    import random

    from captioning.tokenizers import cjk_share, is_cjk

    def by_character(texts):
        letters = [c for t in texts for c in t if c.isalnum()]
        return sum(map(is_cjk, letters)) / len(letters) if letters else 0.0

    rng = random.Random(0)
    alphabet = "abc XYZ 09_,.!é左上角有一个红色的星形。カタカナ　１２ｶ𠀀"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(2000)]
    for text in texts[:300]:
        assert cjk_share([text]) == by_character([text]), text
    assert abs(cjk_share(texts) - by_character(texts)) < 1e-12
    assert cjk_share(["a red star", "红色的星形"]) == 5 / 13 and cjk_share(["", "..."]) == 0.0


# ---------------------------------------------------------------------- the word pattern's versions
# (docs/LANGUAGES.md: the table of eight scripts; tools/dev/tokens_table.py prints it)
WORD_CASES = [
    # caption, version 1 (nltk 3.10.4's), version 2
    ("एक काला कुत्ता घास पर दौड़ता है", ["एक", "काला", "कुत्ता", "घास", "पर", "दौड़ता", "है"], None),
    ("ஒரு கருப்பு நாய்", ["ஒரு", "கருப்பு", "நாய்"], None),
    ("كلبٌ أسودُ يجري", ["كلبٌ", "أسودُ", "يجري"], None),
    ("כֶּלֶב שָׁחוֹר", ["כֶּלֶב", "שָׁחוֹר"], None),
    ("สุนัขสีดำวิ่งบนหญ้า", ["สุนัขสีดำวิ่งบนหญ้า"], None),  # Thai writes no spaces: one run
    ("2½ pizzas, 10² tiles, chapter Ⅷ, ① sign", ["2", "pizzas", "10", "tiles", "chapter", "ⅷ", "sign"],
     ["2½", "pizzas", "10²", "tiles", "chapter", "ⅷ", "①", "sign"]),
    ("سگ می\u200cدود", ["سگ", "می\u200cدود"], None),  # the zero-width non-joiner inside a Persian word
    ("\u200dabc \u200c", ["\u200dabc", "\u200c"], ["abc"]),  # a joiner never starts a word of version 2
    ("Ⓐ circled", ["ⓐ", "circled"], ["circled"]),  # an enclosed letter: regex's \w, no letter
    ("A Dog’s t-shirt, cafe\u0301s!", ["a", "dog's", "t-shirt", "cafés"], None),
]  # fmt: skip


@pytest.mark.parametrize("caption, v1, v2", WORD_CASES, ids=range(len(WORD_CASES)))
def test_each_version_of_the_word_pattern(caption, v1, v2):
    assert tokenize(caption, 1) == v1
    assert tokenize(caption, 2) == (v1 if v2 is None else v2)
    assert tokenize(caption) == tokenize(caption, WORDS_VERSION)


def test_version_1_is_nltk_3_10_4s_pattern_on_every_assigned_character():
    """nltk 3.10.3-3.10.4 compiled RegexpTokenizer's pattern with the regex engine: version 1 splits
    a text of every character this Python's Unicode database assigns as that engine does."""
    import unicodedata

    regex = pytest.importorskip("regex", reason="the dev extra brings regex, the engine nltk 3.10.4 used")
    nltk_words = regex.compile(r"\w+(?:['\-]\w+)*", regex.UNICODE | regex.MULTILINE | regex.DOTALL)
    assigned = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    text = "a" + "a ".join(assigned) + "a-b'c"  # each character between letters, and alone after a space
    assert word_pattern(1).findall(text) == nltk_words.findall(text)


def test_the_word_tables_are_this_pythons_unicode_database():
    import unicodedata

    from captioning import word_chars
    from tools.dev.word_chars import OUT, source

    if unicodedata.unidata_version != word_chars.UNICODE_VERSION:
        pytest.skip(
            f"the tables are of Unicode {word_chars.UNICODE_VERSION}, this Python's {unicodedata.unidata_version}"
        )
    assert OUT.read_text(encoding="utf-8") == source(), "run python -m tools.dev.word_chars"


def test_an_old_vocabulary_splits_as_before_and_a_new_one_records_its_version(tmp_path):
    from tests.helpers import ROOT

    old = Vocabulary.load(ROOT / "tests" / "fixtures" / "v0_1_8e72f85" / "hard_folder" / "vocab.json")
    assert old.tokenizer.version == 1 and old.tokenizer.tokenize("2½ red circles") == ["2", "red", "circles"]
    old.save(tmp_path / "vocab.json")
    assert Vocabulary.load(tmp_path / "vocab.json") == old
    new = Vocabulary.build([["a"]], min_freq=1)
    assert new.tokenizer.version == WORDS_VERSION and new.tokenizer.tokenize("2½ red circles") == [
        "2½",
        "red",
        "circles",
    ]
    assert new != Vocabulary(new.itos, 1, tokenizer=old.tokenizer)  # same tokens, another split
    for name in ("chars", "jieba"):  # the spaced-script words of the CJK tokenizers follow the version
        assert Vocabulary.from_dict({"itos": list(Vocabulary.SPECIALS), "tokenizer": name}).tokenizer.version == 1
    with pytest.raises(ConfigError, match=r"^vocabulary.tokenizer_version: 3 is not a version .* \(1, 2\)"):
        Vocabulary.from_dict({"itos": list(Vocabulary.SPECIALS), "tokenizer_version": 3})
    with pytest.raises(ConfigError, match="^vocabulary: 'tokenizer_version' must be an integer"):
        Vocabulary.from_dict({"itos": list(Vocabulary.SPECIALS), "tokenizer_version": "2"})


def test_caption_data_splits_with_the_version_of_a_vocabulary_given(tmp_path):
    images = [
        {"filename": f"{i}.jpg", "imgid": i, "split": split, "sentences": [{"raw": "2½ cabs."}]}
        for i, split in enumerate(["train", "train", "val", "test"])
    ]
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"images": images}))
    fresh = CaptionData(str(path), min_word_freq=1)
    fresh.setup()
    assert fresh.records("train")[0].tokens == [["2½", "cabs"]] and fresh.vocab.tokenizer.version == WORDS_VERSION
    (tmp_path / "old.json").write_text(json.dumps({"itos": [*Vocabulary.SPECIALS, "2", "cabs"], "min_freq": 1}))
    old = CaptionData(str(path), vocabulary=str(tmp_path / "old.json"), tokenizer="words")
    old.setup()
    assert old.tokenizer.version == 1 and old.records("train")[0].tokens == [["2", "cabs"]]
