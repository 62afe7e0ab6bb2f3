"""The ``words`` tokenizer's tokens on captions in eight scripts, before and after: the table of
docs/LANGUAGES.md (the words tokenizer's versions).

    python -m tools.dev.tokens_table

Columns: nltk up to 3.10.2 (``RegexpTokenizer`` on the standard library's ``re``), version 1 (nltk
3.10.3-3.10.4: the ``regex`` engine's word characters; vocabularies that record no version), version
2 (vocabularies written now). Tokens are separated by " · ".
"""

from __future__ import annotations

import re
import sys
import unicodedata

from captioning.tokenizers import tokenize

#: (script, caption): "a black dog runs on the grass" and its like, plus numbers and a zero-width non-joiner
CAPTIONS = (
    ("Latin (English)", "A black dog's ball on the grass"),
    ("Cyrillic (Russian)", "Чёрная собака бежит по траве"),
    ("Greek", "Ένας μαύρος σκύλος τρέχει στο γρασίδι"),
    ("Arabic (vowel marks)", "كلبٌ أسودُ يجري على العشب"),
    ("Hebrew (niqqud)", "כֶּלֶב שָׁחוֹר רָץ עַל הַדֶּשֶׁא"),
    ("Devanagari (Hindi)", "एक काला कुत्ता घास पर दौड़ता है"),
    ("Tamil", "ஒரு கருப்பு நாய் புல்லில் ஓடுகிறது"),
    ("Thai (no spaces)", "สุนัขสีดำวิ่งบนหญ้า"),
    ("numbers", "2½ pizzas, 10² tiles, chapter Ⅷ, ① sign"),
    ("Persian (ZWNJ)", "سگ سیاه روی چمن می\u200cدود"),
)
# nltk up to 3.10.2: RegexpTokenizer compiled its pattern with the standard library's re
_STDLIB = re.compile(r"\w+(?:['\-]\w+)*")


def _show(tokens: list[str]) -> str:
    shown = " · ".join(t.replace("\u200c", "\\u200c").replace("\u200d", "\\u200d") for t in tokens)
    return f"{len(tokens)}: {shown}".replace("|", "\\|")


def table() -> str:
    rows = [
        "| script | caption | nltk <= 3.10.2 (`re`) | version 1 (nltk 3.10.3-3.10.4) | version 2 |",
        "|---|---|---|---|---|",
    ]
    for script, caption in CAPTIONS:
        text = unicodedata.normalize("NFC", caption).lower()
        shown = caption.replace("\u200c", "\\u200c")
        cells = [_show(_STDLIB.findall(text)), _show(tokenize(caption, 1)), _show(tokenize(caption, 2))]
        rows.append(f"| {script} | {shown} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    print(f"<!-- python -m tools.dev.tokens_table (Python {sys.version.split()[0]}) -->")
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
