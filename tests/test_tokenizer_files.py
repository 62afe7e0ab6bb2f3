"""A subword tokenizer read from a file (a vocabulary, a model folder, a checkpoint) is checked in
plain Python against what training writes, and rebuilt from its vocabulary and merges (or pieces).
A stored pipeline of another's (padding, truncation, a regular expression, a native normaliser) is
one line before the library sees it; a Rust panic of the library is one line too. jieba's
dictionary cache is this user's, never a file anyone could plant in the shared $TMPDIR."""

import json
import os
import subprocess
import sys

import pytest

from captioning.errors import ConfigError
from captioning.tokenizers import SUBWORD_PIPELINE, build_tokenizer, native
from captioning.vocab import Vocabulary

tokenizers = pytest.importorskip("tokenizers", reason="the subword extra: pip install -e '.[subword]'")

TEXTS = [
    "a man riding a horse on the beach",
    "a dog on the beach",
    "左上角有一个红色的星形",
    "un café près de l'eau",
] * 5
SAMPLES = ["a man on a horse", "le café", "左上角", "zebra ÉCOLE 星", "a dog's  beach!"]


def trained(name: str):
    tokenizer = build_tokenizer(name, vocab_size=80)
    tokenizer.train(TEXTS)
    return tokenizer


def stored(name: str) -> dict:
    """A trained tokenizer's stored form, as a vocabulary file holds it (a JSON round trip)."""
    return json.loads(json.dumps(trained(name).state()))


@pytest.mark.parametrize("name", ["bpe", "unigram"])
def test_a_stored_model_is_rebuilt_as_training_wrote_it(name):
    """What training writes is the pipeline the checks expect (SUBWORD_PIPELINE: a new version of
    the library that writes another fails here first), and the model rebuilt from the vocabulary and
    merges alone splits text as the trained one and stores the same JSON."""
    original = trained(name)
    state = json.loads(json.dumps(original.state()))
    assert {k: v for k, v in state["model"].items() if k not in ("model", "version")} == SUBWORD_PIPELINE
    rebuilt = build_tokenizer(name, state=state)
    assert [rebuilt.tokenize(t) for t in SAMPLES] == [original.tokenize(t) for t in SAMPLES]
    assert rebuilt.tokens() == original.tokens()
    assert json.loads(rebuilt._require_trained().to_str()) == state["model"]


#: parts of a stored model that training never writes, each a way in for a crafted file
CRAFTED = {
    "padding of 1e8": ("padding", {"strategy": {"Fixed": 100_000_000}, "direction": "Right", "pad_id": 0,
                                   "pad_type_id": 0, "pad_token": "<pad>", "pad_to_multiple_of": None}),
    "a Split regex": ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": "(a)(?1)"}, "behavior": "Isolated",
                                        "invert": False}),
    "a native normaliser": ("normalizer", {"type": "Precompiled", "precompiled_charsmap": "AAAA"}),
    "truncation whose stride panics": ("truncation", {"direction": "Right", "max_length": 1,
                                                      "strategy": "LongestFirst", "stride": 5}),
    "a post-processor": ("post_processor", {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                            "use_regex": True}),
    "another key": ("mystery", {"a": 1}),
}  # fmt: skip


@pytest.mark.parametrize("name", ["bpe", "unigram"])
@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_pipeline_training_never_writes_is_refused_as_the_file_is_read(tmp_path, name, case):
    key, value = CRAFTED[case]
    state = stored(name)
    state["model"][key] = value
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"itos": ["<pad>", "<start>", "<end>", "<unk>"], "min_freq": 1, "tokenizer": name,
                                "tokenizer_model": state}))  # fmt: skip
    with pytest.raises(ConfigError) as err:
        Vocabulary.load(path)  # read, never split: the library has not seen the file
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: vocabulary.tokenizer_model: not a {name!r} model")
    assert key in message


@pytest.mark.parametrize(
    "name, field, value, expected",
    [
        ("bpe", "vocab", {"<pad>": 0, "<start>": 1, "<end>": 2, "<unk>": 3, "a": 9}, "ids 0..n-1"),
        ("bpe", "vocab", {"<pad>": 0, "<start>": 1, "<end>": 2, "<unk>": 3, "a": 3}, "ids 0..n-1"),
        ("bpe", "merges", [["a", "zz"]], "merges[0]"),
        ("bpe", "merges", "a b", "merges"),
        ("bpe", "dropout", 0.5, "model.dropout"),
        ("bpe", "byte_fallback", True, "model.byte_fallback"),
        (
            "unigram",
            "vocab",
            [["<pad>", 0.0], ["<start>", 0.0], ["<end>", 0.0], ["<unk>", 0.0], ["a", float("nan")]],
            "[4]",
        ),
        ("unigram", "vocab", [["<pad>", 0.0], ["<start>", 0.0], ["<end>", 0.0], ["<unk>", 0.0], ["", -1.0]], "[4]"),
        ("unigram", "unk_id", 7, "model.unk_id"),
    ],
)
def test_a_vocabulary_of_bad_ids_merges_or_pieces_is_one_line(name, field, value, expected):
    state = stored(name)
    state["model"]["model"][field] = value
    with pytest.raises(ConfigError, match=rf"not a '{name}' model as training writes it \(model\.model.*") as err:
        build_tokenizer(name, state=state)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_panic_of_the_library_is_one_line():
    """The library's Rust panics are BaseExceptions (pyo3's PanicException): native() turns them,
    like its errors, into one ConfigError; Ctrl-C still stops."""
    state = stored("bpe")["model"]
    state["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": "AAAA"}
    crafted = json.dumps(state)
    with pytest.raises(BaseException) as raw:  # what the library does on its own
        tokenizers.Tokenizer.from_str(crafted)
    assert not isinstance(raw.value, Exception)
    with pytest.raises(ConfigError, match=r"^a tokenizer file: the tokenizers library failed \(PanicException: "):
        native(lambda: tokenizers.Tokenizer.from_str(crafted), "a tokenizer file")

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        native(interrupted, "a tokenizer file")


JIEBA = """
import json, sys
from captioning.tokenizers import build_tokenizer, jieba_cache_folder
print(json.dumps([jieba_cache_folder(), build_tokenizer("jieba").tokenize(sys.argv[1])]))
"""


def test_jiebas_cache_is_this_users_and_a_planted_one_is_not_read(tmp_path):
    """A marshal file planted as $TMPDIR/jieba.cache (jieba's default cache, loaded unchecked) would
    change every segmentation: it is never read; the cache lives in $XDG_CACHE_HOME/captioning/jieba,
    made 0700; a cache folder others may write in is not used."""
    pytest.importorskip("jieba", reason="the zh extra: pip install -e '.[zh]'")
    import marshal

    text = "左上角有一个红色的星形"
    shared, home = tmp_path / "tmp", tmp_path / "cache"
    shared.mkdir()
    with open(shared / "jieba.cache", "wb") as f:  # a dictionary of single characters only
        marshal.dump(({c: 1 for c in text}, len(text)), f)
    env = dict(os.environ, TMPDIR=str(shared), XDG_CACHE_HOME=str(home))
    run = subprocess.run([sys.executable, "-c", JIEBA, text], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    folder, tokens = json.loads(run.stdout)
    assert folder == str(home / "captioning" / "jieba") and (os.stat(folder).st_mode & 0o777) == 0o700
    assert tokens == ["左上角", "有", "一个", "红色", "的", "星形"]  # the real dictionary's words
    assert os.path.isfile(os.path.join(folder, "jieba.cache"))  # built there, for the next run
    os.chmod(folder, 0o777)  # a folder others could plant a cache in: not used
    run = subprocess.run([sys.executable, "-c", JIEBA, text], capture_output=True, text=True, env=env, timeout=300)
    other, tokens = json.loads(run.stdout)
    assert other != folder and tokens == ["左上角", "有", "一个", "红色", "的", "星形"]
