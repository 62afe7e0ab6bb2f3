"""Scoring without Java: the pure-Python PTB tokenizer (equal to pycocoevalcap's Java one),
CocoScorer without Java, and the in-process CIDEr-D (equal to pycocoevalcap's Cider).

The comparisons with Java run pycocoevalcap's own PTBTokenizer and skip when ``java`` is not on
PATH; the tests of the documented behaviour (expected tokens written out) run everywhere.
"""

import json
import math
import random
import shutil

import numpy as np
import pytest

from captioning.metrics import CocoScorer
from captioning.metrics.cider import CiderD, tokenize
from captioning.metrics.ptb import ptb_tokenize, tokenize_corpus

needs_java = pytest.mark.skipif(
    shutil.which("java") is None, reason="compares with pycocoevalcap's Java PTBTokenizer, and 'java' is not on PATH"
)


def java_tokenize(corpus: dict) -> dict:
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    return PTBTokenizer().tokenize({k: [{"caption": c} for c in captions] for k, captions in corpus.items()})


# --------------------------------------------------------------------------- tokenizer
# (caption, pycocoevalcap's tokens): checked against Java by test_known_cases_are_javas
KNOWN = [
    ("A man riding a wave on top of a surfboard.", "a man riding a wave on top of a surfboard"),
    ("A  man\tand   a woman  ", "a man and a woman"),
    ("The dog's ball.", "the dog 's ball"),
    ("Two dogs' bowls", "two dogs bowls"),
    ("James' hat", "james hat"),
    ("IT'S", "it 's"),
    ("A dog that doesn't bark.", "a dog that does n't bark"),
    ("I can't, won't, and shan't", "i ca n't wo n't and sha n't"),
    (
        "They're here; we'll go; I'm done; you've seen; he'd left",
        "they 're here we 'll go i 'm done you 've seen he 'd left",
    ),
    ("rock 'n' roll", "rock 'n' roll"),
    ("o'clock", "o'clock"),
    ("y'all", "y' all"),
    ("a man,woman and child", "a man woman and child"),
    ("t-shirt", "t-shirt"),
    ("e-mail", "e-mail"),
    ("well-known 3-year-old", "well-known 3-year-old"),
    ("mother-in-law's car", "mother-in-law 's car"),
    ("3.5", "3.5"),
    ("$5.50", "$ 5.50"),
    ("50%", "50 %"),
    ("1,000", "1,000"),
    ("5 7/8", "5\xa07/8"),  # one token, with a no-break space
    ("'90s", "'90s"),
    ('"like this"', "like this"),
    ("'single quotes'", "single quotes"),
    ("\u201ccurly\u201d \u2018quotes\u2019", "curly quotes"),
    ("(parens) [brackets] {braces}", "-lrb- parens -rrb- -lsb- brackets -rsb- -lcb- braces -rcb-"),
    ("a <b> c", "a <b> c"),
    ("wait... what", "wait what"),
    ("U.S. The end", "u.s. the end"),
    ("Mr. Smith", "mr. smith"),
    ("etc. x", "etc. x"),
    ("No. 5", "no. 5"),
    ("gonna wanna gotta cannot", "gon na wan na got ta can not"),
    ("'tis", "'t is"),
    ("caf\u00e9 na\u00efve r\u00e9sum\u00e9", "caf\u00e9 na\u00efve r\u00e9sum\u00e9"),
    (
        "\u041c\u043e\u0441\u043a\u0432\u0430 \u039f\u0394\u039f\u03a3",
        "\u043c\u043e\u0441\u043a\u0432\u0430 \u03bf\u03b4\u03bf\u03c2",
    ),
    (
        "\u039f\u0394\u039f\u03a3-ORANGE \u0391\u03a3.\u0391",
        "\u03bf\u03b4\u03bf\u03c3-orange \u03b1\u03c3.\u03b1",
    ),  # Java's sigmas
    ("a dog \U0001f436 runs", "a dog runs"),  # characters beyond the BMP are dropped
    ("\u2605 \u00a9 \u00b0 \u00bd", "\u2605 \u00a9 \u00b0 1/2"),
    ("-- --- - ...", ""),
    ("hello!!! what?!", "hello !!! what ?!"),
    ("x:D :) ;-)", "x :d :-rrb- ;--rrb-"),
    ("C++ C#", "c++ c#"),
    ("AT&T Q&A q&a", "at&t q&a q & a"),
    ("a/b and/or", "a/b and/or"),
    ("http://example.com/a www.foo.com a@b.com @user #tag", "http://example.com/a www.foo.com a@b.com @user #tag"),
    ("img.jpg", "img.jpg"),
    ("5'6\"", "5 6"),
    ("", ""),
]

WORDS = (
    "a an the man woman men people child girl boy dog dogs cat horse bus train plate pizza table street "
    "sign field grass ball frisbee kite beach water surfboard wave skateboard bench laptop bed kitchen "
    "giraffe elephant zebra snow skis tennis racket cake broccoli umbrella clock car truck bicycle boat "
    "red blue green white black yellow large small two three is are sitting standing riding holding "
    "eating playing flying looking next to on in of with near under front top while his her their its"
).split()
FRAGMENTS = """dog's dogs' James' it's ITS IT'S won't can't don't doesn't isn't ain't y'all I'm you're they've
we'd he'll she'd've o'clock rock'n'roll 'n' 'em 'cause '90s 90's ma'am c'mon l'amour d'Artagnan O'Neil t-shirt
e-mail x-ray well-known 3-year-old A-1 pre-war anti-war pro-choice co-op mother-in-law hi-fi -- --- - ... .. . , ;
: ! ? !!! ?! ( ) [ ] { } < > << >> " ' ` `` '' \u201c \u201d \u2018 \u2019 \u00ab \u00bb 3.5 .5 5. 1,000 10:30 12:00pm
1/2 3-4 10/12/2014 $5 $5.50 US$5 #1 \u00a35 \u20ac \u00a55 \u00a2 50% % 100 2x4 3D 1080p 1st 555-1234 (555)
123-4567 +5 -5 \u22125 U.S. U.S u.s. Mr. Mrs. Dr. St. etc. e.g. i.e. a.m. p.m. vs. No. Fig. Inc. Co. Jan. a.k.a.
Ph.D. A. I. x. http://www.example.com www.foo.com foo.org a@b.com @user #hashtag C++ C# :) :( :D ;) :-) ^_^
(^_^) -_- caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c6gir \u00df \u0130stanbul \u039f\u0394\u039f\u03a3 \u041c\u043e\u0441\u043a\u0432\u0430
\u5317\u4eac \U0001f600 \U0001f436 \u2605 \u00a9 \u2122 \u00b0 \u00bd \u00bc \u2192 \u00d7 \u00b2 H\u2082O \ufb01 cannot
gonna wanna gotta lemme gimme 'tis 'twas CANNOT &amp; &lt; &gt; &quot; AT&T Q&A q&a R&D S&P-500 A+B a/b and/or
_ __ snake_case * ** = + & ~ ^ | \\ / @ # $ <b> </b> img.jpg photo.PNG 1.jpg x.c, Co.-A Jan.-3 etc.-ab
\u00ad \u200b \u00a0 \u2013 \u2014 \u2026 \u3000""".split()
SEPARATORS = [" ", " ", " ", "  ", "", "\t", ",", ", ", ". ", ".", "-", "'", "'s ", ")", "(", '"', "\u00a0"]
TRICKY_CHARACTERS = list("aAeEnNsStTyY019 .,;:!?'\"`-_/\\()[]{}<>@#$%&*+=~^|") + [
    "\u00a0",
    "\u2019",
    "\u2018",
    "\u201c",
    "\u201d",
    "\u2013",
    "\u2014",
    "\u2026",
    "\u00ad",
    "\u00e9",
    "\u00df",
    "\u03a3",
    "\u0416",
    "\u4e2d",
    "\u00bd",
    "\u2212",
    "\u00b0",
    "\u20ac",
    "\u0085",
    "\u200b",
    "\u3000",
]


def tricky_captions(count: int, seed: int = 0) -> list:
    """Captions for the Java comparison: COCO-like sentences with tricky fragments, fragments
    glued by odd separators, and character soup, in random letter case."""
    rng = random.Random(seed)
    captions = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.4:
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
            for _ in range(rng.randint(1, 3)):
                words.insert(rng.randint(0, len(words)), rng.choice(FRAGMENTS))
            caption = " ".join(words)
        elif kind < 0.75:
            caption = "".join(rng.choice(FRAGMENTS + WORDS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 6)))
        else:
            caption = "".join(
                rng.choice([rng.choice(TRICKY_CHARACTERS), rng.choice(WORDS), rng.choice(FRAGMENTS)])
                for _ in range(rng.randint(1, 12))
            )
        case = rng.random()
        caption = (
            caption.upper()
            if case < 0.1
            else caption.capitalize()
            if case < 0.25
            else caption.title()
            if case < 0.3
            else caption
        )
        captions.append(caption + rng.choice(["", "", ".", " .", "!", "...", " "]))
    return captions


def test_known_cases():
    for caption, expected in KNOWN:
        assert ptb_tokenize(caption) == expected, caption


@needs_java
def test_known_cases_are_javas():
    corpus = {i: [caption] for i, (caption, _) in enumerate(KNOWN)}
    corpus[len(KNOWN)] = ["a last line"]  # ptb_tokenize's default: the caption is followed by another
    tokens = java_tokenize(corpus)
    assert [tokens[i][0] for i in range(len(KNOWN))] == [expected for _, expected in KNOWN]


@needs_java
def test_python_tokenizer_equals_java_on_generated_captions():
    captions = tricky_captions(400)
    corpus = {k: captions[5 * k : 5 * k + 5] for k in range(len(captions) // 5)}
    corpus["next line matters"] = ["the vitamin C.", "A dog.", "vitamin B.", "two dogs"]
    corpus["last line"] = ["what a day :)"]  # at the end of Java's input the smiley is split
    expected = java_tokenize(corpus)
    assert tokenize_corpus(corpus) == expected
    assert tokenize_corpus({k: [{"caption": c} for c in v] for k, v in corpus.items()}) == expected  # its own form
    assert expected["next line matters"][:3] == ["the vitamin c", "a dog", "vitamin b."]
    assert expected["last line"] == ["what a day -rrb-"]


def test_what_follows_a_caption():
    # Java peeks across the line end: a one-letter acronym loses its period before a line that
    # starts a sentence, and a smiley at the very end of the input is split (":" is then dropped)
    assert ptb_tokenize("the vitamin C.", next_caption="A dog") == "the vitamin c"
    assert ptb_tokenize("the vitamin C.", next_caption="two dogs") == "the vitamin c."
    assert ptb_tokenize("the vitamin C.") == "the vitamin c."
    assert ptb_tokenize("what a day :)") == "what a day :-rrb-"
    assert ptb_tokenize("what a day :)", next_caption=None) == "what a day -rrb-"
    assert tokenize_corpus({1: ["x C.", "A y :)"], 2: ["z :)"]}) == {1: ["x c", "a y :-rrb-"], 2: ["z -rrb-"]}


def test_documented_differences():
    # Java's other line ends split a caption over two lines (shifting the later captions onto the
    # wrong images); here they are spaces, as CocoScorer's whitespace clean-up makes them anyway
    assert ptb_tokenize("a man\rriding\x0ba\x0chorse\u2028on\u2029the beach") == "a man riding a horse on the beach"
    # letters Unicode added after 6.2 (the scanner's) are untokenisable and dropped, like emoji
    assert ptb_tokenize("a \u0528\u0529 b \U0001f600 c") == "a b c"


@needs_java
def test_java_splits_lines_where_documented():
    tokens = java_tokenize({1: ["a man\rriding"], 2: ["two dogs"]})
    assert tokens == {1: ["a man"], 2: ["riding"]}  # pycocoevalcap's misalignment, avoided here


def test_tokenize_corpus_checks_input():
    assert tokenize_corpus({}) == {}
    assert tokenize_corpus({"a": []}) == {"a": []}
    with pytest.raises(TypeError, match="captions must be str"):
        tokenize_corpus({1: [None]})
    with pytest.raises(TypeError):
        ptb_tokenize(3)


# --------------------------------------------------------------------------- CocoScorer without Java
REFS = {
    1: ["A man's riding a horse (brown) on the beach.", "a person rides a brown horse near the sea"],
    2: ["Two dogs play with a red ball in the grass!", "two dogs are playing in a field, don't they?"],
    3: ["A plate of food: broccoli and rice.", "a white plate holding rice and vegetables"],
    4: ["A man in a t-shirt holds an e-mail printout.", 'A guy wearing a "cool" T-shirt...'],
}
PREDICTIONS = {
    1: "A man riding a horse.",
    2: "two dogs playing with a ball",
    3: "a plate with rice and broccoli",
    4: "a man's t-shirt",
}
COCO_METRICS = ("BLEU", "ROUGE_L", "CIDEr")


def hide_java(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no 'java' anywhere
    assert shutil.which("java") is None


def test_without_java_scores_and_reports_meteor_and_spice(monkeypatch, tmp_path):
    hide_java(monkeypatch, tmp_path)
    scores = CocoScorer(metrics=("BLEU", "METEOR", "ROUGE_L", "CIDEr"), spice=True)(REFS, PREDICTIONS)
    assert scores["METEOR"] is None
    assert scores["METEOR_error"] == "METEOR unavailable: needs Java (no 'java' on PATH)"
    assert scores["SPICE"] is None and "needs Java" in scores["SPICE_error"]
    assert all(
        isinstance(scores[k], float) and math.isfinite(scores[k])
        for k in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE_L", "CIDEr")
    )
    assert list(scores)[:6] == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "METEOR_error"]
    with pytest.raises(RuntimeError, match="needs Java"):
        CocoScorer(metrics=COCO_METRICS, tokenizer="java")(REFS, PREDICTIONS)


def test_unknown_tokenizer():
    with pytest.raises(ValueError, match="unknown tokenizer"):
        CocoScorer(tokenizer="perl")


@needs_java
def test_without_java_scores_equal_java_tokenised_scores(monkeypatch, tmp_path):
    expected = CocoScorer(metrics=COCO_METRICS, tokenizer="java")(REFS, PREDICTIONS)
    hide_java(monkeypatch, tmp_path)
    got = CocoScorer(metrics=("BLEU", "METEOR", "ROUGE_L", "CIDEr"))(REFS, PREDICTIONS)  # tokenizer "auto"
    assert {k: got[k] for k in expected} == pytest.approx(expected, rel=0, abs=1e-9)
    assert got["METEOR"] is None and got["METEOR_error"] == "METEOR unavailable: needs Java (no 'java' on PATH)"


@needs_java
def test_python_tokenizer_with_java_present_gives_the_same_scores():
    expected = CocoScorer(metrics=COCO_METRICS, tokenizer="java")(REFS, PREDICTIONS)
    auto = CocoScorer(metrics=COCO_METRICS)  # Java is here: "auto" is Java
    assert auto(REFS, PREDICTIONS) == pytest.approx(expected, rel=0, abs=1e-9)
    python = CocoScorer(metrics=COCO_METRICS, tokenizer="python")
    assert python(REFS, PREDICTIONS) == pytest.approx(expected, rel=0, abs=1e-9)


# --------------------------------------------------------------------------- CIDEr-D
GTS = {
    1: ["a man riding a horse on a beach", "a person rides a brown horse near the sea", "man on horse"],
    2: ["two dogs play with a red ball in the grass", "two dogs are playing in a field"],
    3: [
        "a plate of food with broccoli and rice",
        "a white plate holding rice and vegetables",
        "a plate of rice and broccoli",
        "food on a plate",
        "a meal of rice and broccoli on a white plate",
    ],
    4: ["a dog a dog a dog", "the the the dog"],  # repeated words
    5: ["a man riding a horse on a beach", "a person rides a brown horse near the sea", "man on horse"],  # = 1
    6: ["a cat sleeping on a red couch"],
    7: ["a clock tower in a city"],
}
RES = {
    1: "a man riding a horse on a beach",  # equal to a reference
    2: "dogs",  # shorter than the references
    3: "a plate of rice and broccoli and rice and broccoli on a white plate with food and vegetables",  # longer
    4: "a dog a dog",
    5: "a horse",
    6: "",  # empty
    7: "a zebra in a field",  # n-grams missing from the corpus
}


def pycocoevalcap_cider(gts: dict, res: dict) -> tuple:
    from pycocoevalcap.cider.cider import Cider

    return Cider().compute_score(gts, {k: [v] for k, v in res.items()})


def test_cider_d_equals_pycocoevalcap():
    mean, per_image = pycocoevalcap_cider(GTS, RES)
    scores = CiderD([GTS[k] for k in GTS]).scores([RES[k] for k in GTS], [GTS[k] for k in GTS])
    assert scores.dtype == np.float64 and scores.shape == (len(GTS),)
    np.testing.assert_allclose(scores, per_image, rtol=0, atol=1e-9)
    assert scores.mean() == pytest.approx(mean, abs=1e-9)
    assert scores[5] == 0.0  # the empty candidate


def test_cider_d_equals_pycocoevalcap_on_random_corpora():
    rng = random.Random(1)
    vocabulary = WORDS[:30]
    for _ in range(5):
        gts = {
            k: [" ".join(rng.choices(vocabulary, k=rng.randint(1, 14))) for _ in range(rng.randint(1, 6))]
            for k in range(rng.randint(1, 40))
        }
        res = {k: " ".join(rng.choices(vocabulary + ["unseen"], k=rng.randint(0, 16))) for k in gts}
        _, per_image = pycocoevalcap_cider(gts, res)
        scores = CiderD(list(gts.values())).scores(list(res.values()), list(gts.values()))
        np.testing.assert_allclose(scores, per_image, rtol=0, atol=1e-9)


def test_cider_d_prefers_a_reference_and_ignores_the_batch():
    cider = CiderD([GTS[k] for k in GTS])
    right, wrong = cider.scores([GTS[3][2], "a dog on a beach"], [GTS[3], GTS[3]])
    assert right > wrong > 0
    batch = cider.scores([RES[k] for k in GTS], [GTS[k] for k in GTS])
    alone = [cider.scores([RES[k]], [GTS[k]])[0] for k in GTS]
    np.testing.assert_allclose(batch, alone, rtol=0, atol=1e-12)  # df are the corpus's, not the batch's
    assert cider.scores([], []).shape == (0,)
    with pytest.raises(ValueError, match="at least one reference"):
        cider.scores(["a dog"], [[]])
    with pytest.raises(ValueError, match="candidates but"):
        cider.scores(["a dog"], [])


def test_cider_d_state_dict_round_trip(tmp_path):
    import torch

    cider = CiderD([GTS[k] for k in GTS])
    candidates, references = [RES[k] for k in GTS], [GTS[k] for k in GTS]
    expected = cider.scores(candidates, references)
    state = cider.state_dict()
    from_json = CiderD.from_state_dict(json.loads(json.dumps(state)))
    np.testing.assert_array_equal(from_json.scores(candidates, references), expected)
    torch.save({"cider": state}, tmp_path / "checkpoint.pt")
    loaded = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["cider"]
    np.testing.assert_array_equal(CiderD.from_state_dict(loaded).scores(candidates, references), expected)
    with pytest.raises(ValueError, match="not a CiderD state dict"):
        CiderD.from_state_dict({"format": "other"})


def test_tokenize_raw_captions_for_cider_d():
    assert tokenize(["A dog's ball.", "Two (big) dogs!"]) == ["a dog 's ball", "two -lrb- big -rrb- dogs"]
    assert tokenize([]) == []
