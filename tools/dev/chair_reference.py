"""CHAIR against the paper's released code: derive the singulars table, and check metrics/chair.py on captions.

    git clone https://github.com/clips/pattern          # Pattern 3.6: d25511f9ca7ed9356b801d8663b8b5168464e68f
    git clone https://github.com/LisaAnne/Hallucination # 6e4d33c4bedf6dfcd24c61bf527f40714717be47
    git clone https://github.com/nltk/nltk && git -C nltk checkout 3.2.5
    # write captioning/metrics/data/chair_singulars.txt (and check it on a word list)
    python -m tools.dev.chair_reference --inflect pattern/pattern/text/en/inflect.py \
        --check-words .venv/lib/python3.*/site-packages/pycocoevalcap/meteor/data/paraphrase-en.gz
    # compare metrics/chair.py with the released caption_to_words on random captions (nothing written)
    python -m tools.dev.chair_reference --inflect pattern/pattern/text/en/inflect.py --no-write \
        --released Hallucination/utils/chair.py --released-synonyms Hallucination/data/synonyms.txt \
        --nltk nltk [--captions 100000]

The released CHAIR code (github.com/LisaAnne/Hallucination, utils/chair.py) singularises every word of a
caption with ``pattern.en.singularize`` (Pattern 3.6, as its requirements.txt pins). The project does not
depend on ``pattern``: what CHAIR needs of it is the singular of each word whose singular, or which
itself, is a word CHAIR looks up (a synonym, a word of a two-word compound, "toilet" or "seat"); any other
word is no object whatever its singular. This tool runs Pattern 3.6's ``singularize`` (its source,
executed alone: the function and the tables it reads) on every candidate plural of those words and writes
the pairs whose singular differs from the word.

Candidates: each looked-up word r split as r = P + L at every point, then P + S for every ending S that one
of pattern's rules or irregular plurals takes off (``singular_rules``' literal tails, the
``singular_irregular`` keys), plus "oxen" + the rest for words that start with "ox" (the one rule not at
the word's end). Every rule keeps a prefix of the word and swaps a literal ending, so this covers every
word that ``singularize`` maps to r. ``--check-words`` runs ``singularize`` on every word of a word list
and fails if one of them would change the table.

``--released``: the released ``CHAIR.__init__`` and ``caption_to_words`` (their source, executed with
pattern's ``singularize`` and nltk 3.2.5's Treebank tokenizer) against :func:`caption_objects` on random
captions built of the looked-up words, their plurals, compounds, punctuation and other words. nltk's punkt
sentence splitter needs a data download, so both sides split sentences with metrics/chair.py's
``sentences``.
"""

from __future__ import annotations

import argparse
import gzip
import random
import re
import sys
import types
from pathlib import Path

PATTERN_SOURCE = (
    "github.com/clips/pattern (Pattern 3.6), pattern/text/en/inflect.py at commit "
    "d25511f9ca7ed9356b801d8663b8b5168464e68f (BSD 3-Clause; its singularize is adapted from Bermi "
    "Ferrer's Inflector, MIT-style)"
)
OUT = Path(__file__).resolve().parents[2] / "captioning" / "metrics" / "data" / "chair_singulars.txt"


def load_singularize(inflect: str):
    """Pattern's ``singularize`` from its inflect.py: the ``plural_prepositions`` table and the section from
    ``singular_rules`` to the end of ``singularize``, executed alone."""
    source = Path(inflect).read_text(encoding="utf-8")
    start = source.index("plural_prepositions = set((")
    prepositions = source[start : source.index("))", start) + 2]
    start = source.index("singular_rules = [")
    section = source[start : source.index("#### VERB CONJUGATION", start)]
    namespace = {"re": re, "NOUN": "NN"}
    exec(compile(prepositions + "\n" + section, inflect, "exec"), namespace)  # noqa: S102 - pattern's own source
    return namespace["singularize"], namespace


def looked_up_words() -> set[str]:
    """Every word CHAIR compares a singularised caption word with (metrics/chair.py's procedure)."""
    from captioning.metrics import chair

    words = {"toilet", "seat"}
    for entry in chair.coco_objects():
        words.update(entry.split())
    for pair in chair.double_words():
        words.update(pair.split())
    return {w for w in words if w == w.lower()}  # captions are lower-cased: "iPhone" is never met


def candidate_endings(namespace: dict) -> set[str]:
    endings = {""} | set(namespace["singular_irregular"])
    for rule, _ in namespace["singular_rules"]:
        tail = re.sub(r"^\(\?i\)", "", rule.pattern).rstrip("$").lstrip("^")
        tail = tail[tail.rfind(")") + 1 :]  # the literal after the last group
        endings.update(tail[k:] for k in range(len(tail) + 1))
        for group in re.findall(r"\(([a-z|]+)\)", rule.pattern):  # a group of literal alternatives, then the tail
            endings.update(alternative + tail for alternative in group.split("|"))
    return endings


def derive(singularize, namespace: dict, words: set[str]) -> dict[str, str]:
    endings = candidate_endings(namespace)
    candidates = set(words)
    for r in words:
        for k in range(len(r) + 1):
            candidates.update(r[:k] + ending for ending in endings)
        if r.startswith("ox"):
            candidates.add("oxen" + r[2:])
    table = {}
    for t in sorted(candidates):
        s = singularize(t)
        if (s in words or t in words) and s != t:
            table[t] = s
    return table


def read_words(path: str) -> set[str]:
    opener = gzip.open if path.endswith(".gz") else open
    found = set()
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            found.update(w for w in line.lower().split() if w.isalpha() and w.isascii())
    return found


def released_caption_to_words(chair_py: str, synonyms: str, nltk_root: str, singularize):
    """The released ``CHAIR(...).caption_to_words``: its ``__init__`` and that method, executed with
    pattern's ``singularize`` and nltk 3.2.5's Treebank tokenizer (with word_tokenize's additions)."""
    from captioning.metrics.chair import sentences

    treebank = Path(nltk_root, "nltk", "tokenize", "treebank.py").read_text(encoding="utf-8")
    treebank = treebank.replace("from nltk.tokenize.api import TokenizerI", "TokenizerI = object")
    treebank = treebank.replace("from nltk.tokenize.util import align_tokens", "align_tokens = None")
    ns: dict = {}
    exec(compile(treebank, "treebank.py", "exec"), ns)  # noqa: S102 - nltk 3.2.5's own source
    init = Path(nltk_root, "nltk", "tokenize", "__init__.py").read_text(encoding="utf-8")
    additions = init[init.index("improved_open_quote_regex") : init.index("def word_tokenize")]
    tokenizer = ns["TreebankWordTokenizer"]()
    exec(compile(additions, "__init__.py", "exec"), {"re": re, "_treebank_word_tokenizer": tokenizer})  # noqa: S102

    def word_tokenize(text):
        return [token for sentence in sentences(text) for token in tokenizer.tokenize(sentence)]

    source = Path(chair_py).read_text(encoding="utf-8")
    body = source[
        source.index("class CHAIR(object):") : source.index("    def _load_generated_captions_into_evaluator")
    ]
    method = source[source.index("    def caption_to_words") : source.index("    def get_annotations_from_segments")]
    body = body.replace("open('data/synonyms.txt')", f"open({synonyms!r})")
    ns = {"nltk": types.SimpleNamespace(word_tokenize=word_tokenize), "singularize": singularize}
    exec(compile(body + method, chair_py, "exec"), ns)  # noqa: S102 - the released code's own source
    return ns["CHAIR"]([], None).caption_to_words


def random_captions(words: set[str], table: dict[str, str], n: int, seed: int = 0) -> list[str]:
    from captioning.metrics.chair import double_words

    rng = random.Random(seed)
    pool = sorted(words) + sorted(table) + [p for p in double_words() if p.count(" ") == 1]
    pool += [pair.replace(" ", "-") for pair in double_words()] + ["bu", "glas", "ty", "ties", "tennis racket"]
    filler = "a an the of on in with and two three is are next to near his her their some".split()
    punctuation = [".", ",", "'s", "!", "?", '"', "(", ")", "...", "--", ":", ";", "'"]
    captions = []
    for _ in range(n):
        tokens = []
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            word = rng.choice(pool) if r < 0.5 else rng.choice(filler) if r < 0.85 else rng.choice(punctuation)
            if rng.random() < 0.1:
                word = word.capitalize()
            glue = "" if rng.random() < 0.3 else " "
            tokens.append(glue + word)
        captions.append("".join(tokens).strip())
    return captions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dev.chair_reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--inflect", required=True, help="pattern/text/en/inflect.py of Pattern 3.6")
    p.add_argument("--check-words", default=None, metavar="FILE", help="a word list (.gz too) to check the table on")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--no-write", action="store_true", help="derive and check, write nothing")
    p.add_argument("--released", default=None, metavar="CHAIR_PY", help="Hallucination's utils/chair.py")
    p.add_argument("--released-synonyms", default=None, metavar="FILE", help="Hallucination's data/synonyms.txt")
    p.add_argument("--nltk", default=None, metavar="DIR", help="a checkout of nltk 3.2.5 (for --released)")
    p.add_argument("--captions", type=int, default=100_000, help="random captions for --released")
    args = p.parse_args(argv)
    singularize, namespace = load_singularize(args.inflect)
    words = looked_up_words()
    table = derive(singularize, namespace, words)
    failed = False
    if args.check_words:
        listed = read_words(args.check_words)
        missed = {}
        for t in listed:
            s = singularize(t)
            if (s in words or t in words) and s != t and table.get(t) != s:
                missed[t] = s
        print(
            f"checked {len(listed)} words of {args.check_words}: {len(missed)} missing from the table", file=sys.stderr
        )
        if missed:
            print("  " + ", ".join(f"{t} -> {s}" for t, s in sorted(missed.items())[:50]), file=sys.stderr)
            failed = True
    if args.released:
        if not (args.released_synonyms and args.nltk):
            p.error("--released needs --released-synonyms and --nltk")
        from captioning.metrics.chair import caption_objects

        released = released_caption_to_words(args.released, args.released_synonyms, args.nltk, singularize)
        differ = []
        captions = random_captions(words, table, args.captions)
        for caption in captions:
            got_words, got_nodes, _, _ = released(caption)
            if list(zip(got_words, got_nodes)) != caption_objects(caption):
                differ.append(caption)
        mentions = sum(len(released(c)[0]) for c in captions[:10000])
        print(
            f"released caption_to_words against caption_objects: {len(differ)} of {len(captions)} random captions "
            f"differ ({mentions} mentions in the first 10,000)",
            file=sys.stderr,
        )
        for caption in differ[:10]:
            print(f"  {caption!r}: released {released(caption)[:2]}, ours {caption_objects(caption)}", file=sys.stderr)
        failed = failed or bool(differ)
    if not args.no_write:
        header = [
            "# CHAIR's singular forms: pattern.en.singularize (Pattern 3.6), which the released CHAIR code",
            "# (github.com/LisaAnne/Hallucination, utils/chair.py) applies to every caption word, on the words whose",
            "# singular, or which themselves, CHAIR looks up (metrics/chair.py); a word not listed is its own",
            "# singular there (or no object either way). Derived by tools/dev/chair_reference.py from",
            f"# {PATTERN_SOURCE}.",
            "# word<TAB>singular",
        ]
        lines = header + [f"{t}\t{s}" for t, s in sorted(table.items())]
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {len(table)} words to {args.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
