import json

import pytest
import torch

from captioning.errors import ConfigError
from captioning.tokenizers import tokenize
from captioning.vocab import Vocabulary

CAPTIONS = [
    ["a", "dog", "runs"],
    ["a", "dog", "sits"],
    ["a", "cat", "sits"],
    ["a", "red", "zebra"],
]


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("A Dog's ball, on 2 T-shirts!") == ["a", "dog's", "ball", "on", "2", "t-shirts"]
    assert tokenize("  -- ... !!") == []
    assert tokenize("Un CAFÉ crème \u2014 Dog\u2019s") == ["un", "café", "crème", "dog's"]
    assert tokenize("cafe\u0301") == ["café"]  # decomposed accent joined to its letter
    assert tokenize("\u5317\u4eac \u0441\u043e\u0431\u0430\u043a\u0430") == [
        "\u5317\u4eac",
        "\u0441\u043e\u0431\u0430\u043a\u0430",
    ]


def test_specials_and_build_with_min_freq():
    v = Vocabulary.build(CAPTIONS, min_freq=2)
    assert v.itos == ["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "sits"]  # by count, then alphabetical
    assert (v.pad_id, v.bos_id, v.eos_id, v.unk_id) == (0, 1, 2, 3)
    assert [v.stoi[t] for t in Vocabulary.SPECIALS] == [0, 1, 2, 3]
    assert len(v) == 7 and "dog" in v and "cat" not in v
    assert v.min_freq == 2
    assert len(Vocabulary.build(CAPTIONS, min_freq=1)) == 4 + 7


def test_build_is_deterministic_and_capped():
    v = Vocabulary.build(CAPTIONS, min_freq=1, max_size=2)
    assert v.itos[4:] == ["a", "dog"]
    assert Vocabulary.build(reversed(CAPTIONS), min_freq=1) == Vocabulary.build(CAPTIONS, min_freq=1)
    assert Vocabulary.build([["<unk>", "<pad>", "a"]] * 9, min_freq=1).itos[4:] == ["a"]  # specials not doubled
    with pytest.raises(ConfigError):
        Vocabulary.build(CAPTIONS, min_freq=0)


def test_encode_decode_round_trip_with_unk_and_truncation():
    v = Vocabulary.build(CAPTIONS, min_freq=2)
    ids = v.encode(["a", "dog", "sits"])
    assert ids[0] == v.bos_id and ids[-1] == v.eos_id and len(ids) == 5
    assert v.decode(ids) == ["a", "dog", "sits"]
    assert v.encode(["a", "zebra"]) == [v.bos_id, v.stoi["a"], v.unk_id, v.eos_id]
    assert v.encode(["a", "dog", "sits", "a"], max_length=2) == [v.bos_id, v.stoi["a"], v.stoi["dog"], v.eos_id]
    assert v.decode([v.bos_id, v.stoi["a"], v.unk_id, v.eos_id, v.stoi["dog"], v.pad_id]) == ["a", "<unk>"]
    assert v.decode(torch.tensor([v.stoi["dog"], v.pad_id, v.stoi["sits"]])) == ["dog", "sits"]  # no EOS: all words
    assert v.decode_text(torch.tensor([[v.stoi["a"], v.stoi["dog"], v.eos_id]])[0]) == "a dog"
    assert v.decode([]) == [] and v.decode([v.eos_id, v.stoi["a"]]) == []


def test_dict_and_file_round_trip(tmp_path):
    v = Vocabulary.build(CAPTIONS + [["café", "café", "café", "café", "café"]], min_freq=2)
    d = v.to_dict()
    assert json.loads(json.dumps(d)) == d and d["min_freq"] == 2
    assert Vocabulary.from_dict(d) == v
    v.save(tmp_path / "vocab.json")
    back = Vocabulary.load(tmp_path / "vocab.json")
    assert back == v and back.min_freq == 2 and "café" in back


def test_bad_vocabularies(tmp_path):
    with pytest.raises(ConfigError, match="must start with"):
        Vocabulary(["a", "b"])
    with pytest.raises(ConfigError, match="appears twice"):
        Vocabulary(list(Vocabulary.SPECIALS) + ["a", "a"])
    with pytest.raises(ConfigError, match="'itos'"):
        Vocabulary.from_dict({"words": []})
    with pytest.raises(ConfigError, match="no such file"):
        Vocabulary.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"itos": [\n  "<pad>",\n}')
    with pytest.raises(ConfigError, match=r"bad.json: malformed JSON at line 3, column 1"):
        Vocabulary.load(tmp_path / "bad.json")
    (tmp_path / "wrong.json").write_text('{"itos": ["x"]}')
    with pytest.raises(ConfigError, match=r"wrong.json: must start with"):
        Vocabulary.load(tmp_path / "wrong.json")
