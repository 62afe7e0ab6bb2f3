"""pycocoevalcap's PTB tokenisation of captions in pure Python: the same tokens as its Java PTBTokenizer.

pycocoevalcap tokenises every caption before scoring: it writes the captions one per line (a
``"\\n"`` inside a caption becomes a space) to a file, runs Stanford CoreNLP 3.4.1's
``edu.stanford.nlp.process.PTBTokenizer -preserveLines -lowerCase`` on it, and drops the tokens in
its ``PUNCTUATIONS`` list. This module gives the same strings without Java:

* :func:`ptb_tokenize`: one caption -> its tokens joined by single spaces (the next caption is an
  argument: Java looks past the end of a line in a few places).
* :func:`tokenize_corpus`: pycocoevalcap's ``PTBTokenizer().tokenize``, ``{id: [caption, ...]}``
  (or pycocoevalcap's ``[{"caption": caption}, ...]``) -> ``{id: [tokens, ...]}``, each caption
  tokenised followed by the next one, as Java does.

How: Java's tokenizer is a JFlex scanner, and :data:`_RULES` is its rules in its order, as Python
regular expressions (JFlex's case-insensitive literals made explicit by :func:`_jflex`), all tried at
once by one regular expression of optional lookaheads (:func:`_compile_rules`).
``tests/metrics/test_python_scorers.py`` compares with Java (identical output).

What the tokenisation does, how the rules match, and the known differences from pycocoevalcap with
Java: docs/EVALUATION.md, "The PTB tokenizer, in Python".
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import NamedTuple

__all__ = ["PUNCTUATIONS", "ptb_tokenize", "tokenize_corpus"]

#: pycocoevalcap's tokens removed after tokenising (compared after lower-casing, so the
#: upper-case bracket names never match).
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)


# --------------------------------------------------------------------------- character classes
def _class_body(predicate: Callable[[str], bool]) -> str:
    """Regex character-class body (no brackets) of the BMP characters satisfying ``predicate``."""
    parts, start = [], None
    for code in range(0x10000 + 1):
        inside = code < 0x10000 and predicate(chr(code))
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            end = code - 1
            parts.append(f"\\u{start:04x}" if start == end else f"\\u{start:04x}-\\u{end:04x}")
            start = None
    return "".join(parts)


# The scanner's letters, digits and capitals are Java's (isLetter, isDigit, isUpperCase) of Unicode
# 6.2, the Unicode of the Java that generated it: Python's, less the BMP characters that Unicode has
# made letters, digits or capitals since (which the scanner drops as untokenisable), plus two
# Mongolian letters that have become marks.
_NEWER_LETTERS_AND_DIGITS = re.compile(
    "[\u037f\u0528-\u052f\u0560\u0588\u05ef\u0860-\u086a\u0870-\u0887\u0889-\u088e\u08a1\u08ad-\u08c9"
    "\u0978\u0980\u09fc\u0af9\u0c34\u0c5a\u0c5d\u0c80\u0cdd\u0d04\u0d54-\u0d56\u0d5f\u0de6-\u0def\u0e86"
    "\u0e89\u0e8c\u0e8e-\u0e93\u0e98\u0ea0\u0ea8-\u0ea9\u0eac\u13f5\u13f8-\u13fd\u16f1-\u16f8\u170d\u171f"
    "\u1878\u191d-\u191e\u19b0-\u19c0\u19c8-\u19c9\u1b4c\u1c80-\u1c88\u1c90-\u1cba\u1cbd-\u1cbf\u1cf2-\u1cf3"
    "\u1cfa\u2c2f\u2c5f\u312e-\u312f\u31bb-\u31bf\u4db6-\u4dbf\u9fcd-\u9fff\ua698-\ua69d\ua78f\ua794-\ua79f"
    "\ua7ab-\ua7ca\ua7d0-\ua7d1\ua7d3\ua7d5-\ua7d9\ua7f2-\ua7f7\ua8fd-\ua8fe\ua9e0-\ua9e4\ua9e6-\ua9fe"
    "\uaa7e-\uaa7f\uab30-\uab5a\uab5c-\uab69\uab70-\uabbf]"
).fullmatch
_FORMER_LETTERS = "\u1885\u1886"
_NEWER_CAPITALS = re.compile(  # Cherokee capitals were plain letters until Unicode 8
    "[\u037f\u0528\u052a\u052c\u052e\u13a0-\u13f5\u1c90-\u1cba\u1cbd-\u1cbf\u2c2f\ua698\ua69a\ua796\ua798"
    "\ua79a\ua79c\ua79e\ua7ab-\ua7ae\ua7b0-\ua7b4\ua7b6\ua7b8\ua7ba\ua7bc\ua7be\ua7c0\ua7c2\ua7c4-\ua7c7"
    "\ua7c9\ua7d0\ua7d6\ua7d8\ua7f5]"
).fullmatch
_LETTERS = _class_body(
    lambda c: (unicodedata.category(c).startswith("L") and not _NEWER_LETTERS_AND_DIGITS(c)) or c in _FORMER_LETTERS
)
_DIGITS = _class_body(lambda c: unicodedata.category(c) == "Nd" and not _NEWER_LETTERS_AND_DIGITS(c))
_UPPERS = _class_body(lambda c: c.isupper() and not _NEWER_CAPITALS(c))


_OTHER_CASES = {"i": "\u0130\u0131", "k": "\u212a", "s": "\u017f"}  # İ ı, Kelvin sign, long s


def _jflex(pattern: str) -> str:
    """The scanner's case-insensitivity: letters outside ``[...]`` classes match either case.

    ``pattern`` is a Python regex using only ``(?:``/``(?=`` groups; escapes (``\\u00a0``,
    ``\\.``) and classes are copied as they are, since the scanner keeps classes case-sensitive.
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            width = {"u": 6, "x": 4}.get(pattern[i + 1], 2)
            out.append(pattern[i : i + width])
            i += width
        elif c == "[":
            end = i + 1
            while pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            caseless = c.isascii() and c.isalpha()
            out.append(f"[{c.lower()}{c.upper()}{_OTHER_CASES.get(c.lower(), '')}]" if caseless else c)
            i += 1
    return "".join(out)


# Macros, in the scanner's notation (literal letters are made caseless by _jflex when the rules
# are compiled). Classes: LETTER/DIGIT/ALNUM are Unicode letters/decimal digits of the BMP.
LETTER = f"[{_LETTERS}]"
DIGIT = f"[{_DIGITS}]"
ALNUM = f"[{_LETTERS}{_DIGITS}]"
UPPER = f"[{_UPPERS}]"
# Soft hyphen, combining marks and other letter-like characters the scanner accepts in words
_WORD_EXTRA = (
    "\\u00ad\\u0237-\\u024f\\u02c2-\\u02c5\\u02d2-\\u02df\\u02e5-\\u02ff\\u0300-\\u036f"
    "\\u0370-\\u037d\\u0384\\u0385\\u03cf\\u03f6\\u03fc-\\u03ff\\u0483-\\u0487\\u04cf"
    "\\u04f6-\\u04ff\\u0510-\\u0525\\u055a-\\u055f\\u0591-\\u05bd\\u05bf\\u05c1\\u05c2\\u05c4"
    "\\u05c5\\u05c7\\u0615-\\u061a\\u063b-\\u063f\\u064b-\\u065e\\u0670\\u06d6-\\u06ef"
    "\\u06fa-\\u06ff\\u070f\\u0711\\u0730-\\u074f\\u0750-\\u077f\\u07a6-\\u07b1\\u07ca-\\u07f5"
    "\\u07fa\\u0900-\\u0903\\u093c\\u093e-\\u094e\\u0951-\\u0955\\u0962-\\u0963\\u0981-\\u0983"
    "\\u09bc-\\u09c4\\u09c7\\u09c8\\u09cb-\\u09cd\\u09d7\\u09e2\\u09e3\\u0a01-\\u0a03\\u0a3c"
    "\\u0a3e-\\u0a4f\\u0a81-\\u0a83\\u0abc-\\u0acf\\u0b82\\u0bbe-\\u0bc2\\u0bc6-\\u0bc8"
    "\\u0bca-\\u0bcd\\u0c01-\\u0c03\\u0c3e-\\u0c56\\u0d3e-\\u0d44\\u0d46-\\u0d48\\u0e30-\\u0e3a"
    "\\u0e47-\\u0e4e\\u0eb1-\\u0ebc\\u0ec8-\\u0ecd"
)
SPLET = "&[aeiouAEIOU](?:acute|grave|uml);"  # HTML entity of an accented vowel, inside words
WORD_LETTER = f"(?:[{_LETTERS}{_WORD_EXTRA}]|{SPLET})"
# Letters then letters or digits; also "p.m.clock", "yahoo!com": parts joined by [.!?]
WORD = f"{WORD_LETTER}(?:{WORD_LETTER}|{DIGIT})*(?:[.!?]{WORD_LETTER}(?:{WORD_LETTER}|{DIGIT})*)*"

SPACE = "[ \\t\\u00a0\\u2000-\\u200a\\u3000]"
SPACES = SPACE + "+"
NEWLINE = "(?:\\r\\n|[\\n\\r\\u2028\\u2029\\x0b\\x0c\\x85])"
SPACENL = f"(?:{SPACE}|{NEWLINE})"
_SGML_NAME = "[A-Za-z][A-Za-z0-9_:.-]*"
SGML = (
    "<(?:[!?][A-Za-z-][^>\\r\\n]*"  # <!-- ... -->, <?xml ...>
    f"|{_SGML_NAME}(?:[ ]+(?:{_SGML_NAME}[ ]*=[ ]*(?:'[^'\\r\\n]*'|\"[^\"\\r\\n]*\")|{_SGML_NAME}))*[ ]*\\/?"
    f"|\\/{_SGML_NAME})[ ]*>"
)
SENTEND = f"{SPACENL}(?:{SPACENL}|{UPPER}|{SGML})"

APOS = "(?:['\\u0092\\u2019]|&apos;)"
APOSETC = f"(?:{APOS}|[`\\u0091\\u2018\\u201b])"
REDAUX = f"{APOS}(?:[msdMSD]|re|ve|ll)"
SWORD = "[A-Za-z\\u00ad]*[A-MO-Za-mo-z]\\u00ad*"  # a word that can take n't: not ending in n
SREDAUX = f"n{APOSETC}t"

NUM = f"{DIGIT}*(?:[.:,\\u00ad\\u066b\\u066c]{DIGIT}+)+|{DIGIT}+"
HYPHEN = "[-_\\u058a\\u2010\\u2011]"
INSENTP = "[,;:\\u3001]"
ACRO_SPECIAL = "(?:canada|sino|korean|eu|japan|non)-u\\.s|u\\.s\\.-(?:u\\.k|u\\.s\\.s\\.r)"
ACRO = f"[A-Za-z](?:\\.[A-Za-z])*|{ACRO_SPECIAL}"  # a single letter too
ACRO2 = f"[A-Za-z](?:\\.[A-Za-z])+|{ACRO_SPECIAL}"
THING_PART = f"(?:[dDoOlL]{APOSETC}{ALNUM})?{ALNUM}+"  # d'Avignon, o'clock, l'amour, plain alphanumerics
HTHING = f"[A-Za-z0-9][A-Za-z0-9.,\\u00ad]*(?:-(?:(?:{ACRO2})\\.|[A-Za-z0-9\\u00ad]+))+"
THINGA = "[A-Z]+(?:(?:&amp;|[+&])[A-Z]+)+"

# Abbreviations: ABBREV1 usually precede lower-case words (an upper-case word after them also
# starts a new sentence, and the period is repeated as a token of its own); the ABBREV2 stems
# usually precede names; ABBREV3 only count before numbers.
ABBREV1 = (
    "(?:(?:ed|ph)\\.d|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|mon|tue|tues|wed|thu|thurs|fri|"
    "ala|ariz|[A]z|[A]rk|calif|colo|conn|ct|dak|[D]el|fla|ga|[I]ll|ind|kans?|ky|[L]a|[M]ass|md|mich|minn|"
    "[M]iss|mo|mont|neb|nev|okla|[O]re|[P]a|penn|tenn|[T]ex|va|vt|[W]ash|wisc?|wyo|"
    "inc|cos?|corp|pp?t[ye]s?|ltd|plc|rt|bancorp|bhd|assn|univ|intl|sys|tel|est|ext|sq|"
    "jr|sr|bros|blvd|rd|esq|etc|al|seq|bldg)\\."
)
ABBREV2_STEMS = (
    ACRO,
    "mr|mrs|ms|[M]iss|drs?|profs?|sens?|reps?|attys?|lt|col|gen|messrs|govs?|adm|rev|maj|sgt|"
    "cpl|pvt|mt|capt|ste?|ave|pres|lieut|hon|brig|co?mdr|pfc|spc|supts?|det|adj|adv|asst|"
    "assoc|ens|insp|mlle|mme|msgr|sfc|ft|ph|vs|alex|wm|jos|cie|a\\.k\\.a|cf|treas|"
    "invt|elec|natl|m[ft]g|dept",
)
ABBREV3 = "(?:ca|figs?|prop|nos?|art|pp|op)\\."
# Capitalised words after which an acronym's period also ends the sentence
SENTENCE_START = (
    "|".join(
        f"[{w[0]}]{w[1:]}"
        for w in (
            "About According Additionally After An A As At But Earlier He Her Here However If In It Last Many "
            "More Mr\\. Ms\\. Now Once One Other Our She Since So Some Such That The Their Then There These "
            "They This We When While What Yet You"
        ).split()
    )
    + "|"
    + SGML
)

PHONE = (
    "\\([0-9]{2,3}\\)[ \\u00a0]?[0-9]{3,4}[- \\u00a0]?[0-9]{3,5}",
    "(?:\\+\\+?)?(?:[0-9]{2,4}[- \\u00a0])?[0-9]{2,4}[- \\u00a0][0-9]{3,4}[- \\u00a0]?[0-9]{3,5}",
    "(?:(?:\\+\\+?)?[0-9]{2,4}\\.)?[0-9]{2,4}\\.[0-9]{3,4}\\.[0-9]{3,5}",
)
QUOTE_CHARS = (
    "`\\u2018\\u2019\\u201a\\u201b\\u201c\\u201d\\u0091\\u0092\\u0093\\u0094\\u201e\\u201f\\u2039\\u203a\\u00ab\\u00bb"
)
MISCSYMBOL = (
    "[+%&~^|\\\\\\u00a6-\\u00a9\\u00ac\\u00ae\\u00af\\u00b0-\\u00ba\\u00d7\\u00f7\\u0387\\u05be"
    "\\u05c0\\u05c3\\u05c6\\u05f3\\u05f4\\u0600-\\u0603\\u0606-\\u060a\\u060c\\u0614\\u061b\\u061e"
    "\\u066a\\u066d\\u0703-\\u070d\\u07f6-\\u07f8\\u0964\\u0965\\u0e4f\\u1fbd\\u2016\\u2017"
    "\\u2020-\\u2023\\u2030-\\u2038\\u203b\\u203e-\\u2042\\u2044\\u207a-\\u207f\\u208a-\\u208e"
    "\\u2100-\\u214f\\u2190-\\u21ff\\u2200-\\u2bff\\u3012\\u30fb\\uff01-\\uff0f\\uff1a-\\uff20"
    "\\uff3b-\\uff40\\uff5b-\\uff65]"
)
SMILEY = "[<>]?[:;=][-o*']?[()DPdpO\\\\{@|\\[\\]]"
ASIAN_SMILEY = ("[-^x=~<>']_[-^x=~<>']", "\\([-^x=~<>'][_.]?[-^x=~<>']\\)", "\\([\\^x=~<>']-[\\^x=~<>'`]\\)")
FILE_EXTENSIONS = (
    "bat|bmp|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm|html|jar|java|jpeg|jpg|mov|mp3|pdf|php|pl|"
    "png|ppt|ps|py|sql|tar|txt|wav|x|xml|zip"
)
FILE_NAME_PART = f"(?:{WORD_LETTER}|{DIGIT})+"
NOT_SPACE = "[^ \\t\\n\\f\\r]*"  # the most a URL or e-mail address can span
PHONE_EXTENT = "[0-9 \\u00a0().+-]{0,22}"  # the most a phone number can span
URL_END = '[^ \\t\\n\\f\\r"<>|.!?(){},-]'


# --------------------------------------------------------------------------- token normalisation
def _latex_quotes(token: str, probably_left: bool) -> str:
    """Quotes as PTB's `` ` ' '' (a straight quote becomes an opening one when probably_left)."""
    if probably_left:
        token = re.sub("&apos;|'", "`", token)
        token = re.sub('"|&quot;', "``", token)
    else:
        token = token.replace("&apos;", "'")
        token = re.sub('"|&quot;', "''", token)
    token = re.sub("[\u0091\u2018\u201b\u2039]", "`", token)
    token = re.sub("[\u0092\u2019\u203a]", "'", token)
    token = re.sub("[\u0093\u201c\u00ab]", "``", token)
    return re.sub("[\u0094\u201d\u00bb]", "''", token)


def _closing_quotes(token: str) -> str:
    return _latex_quotes(token, False)


def _opening_quotes(token: str) -> str:
    return _latex_quotes(token, True)


def _remove_soft_hyphens(token: str) -> str:
    return token.replace("\u00ad", "") or "-"


def _round_brackets(token: str) -> str:
    return token.replace("(", "-LRB-").replace(")", "-RRB-")


def _no_spaces(token: str) -> str:
    return token.replace(" ", "\u00a0")


def _ampersands(token: str) -> str:
    return re.sub("&amp;", "&", token, flags=re.IGNORECASE)


_FRACTIONS = {"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"}
_CURRENCIES = {"\u00a2": "cents", "\u00a3": "#", "\u0080": "$", "\u00a4": "$", "\u20a0": "$", "\u20ac": "$"}


# --------------------------------------------------------------------------- rules
class _Rule(NamedTuple):
    """A scanner rule.

    ``alternatives``: (pattern, trailing context or None) pairs of Python regular expressions; the
    context counts towards the match length but is not consumed. ``action(text)`` gives (token or
    None, number of characters consumed, at most ``len(text)``). ``extent``, for the few rules
    whose first match can be shorter than their longest one (nested repetitions), matches the most
    text a match could span; every end within it is then tried.
    """

    name: str
    alternatives: tuple
    action: Callable[[str], tuple]
    extent: re.Pattern | None = None


def _rule(
    name: str, action: Callable[[str], tuple], *alternatives: str, ctx: str | None = None, extent: str | None = None
) -> _Rule:
    """A rule from patterns in the scanner's notation (see :func:`_jflex`)."""
    context = _jflex(ctx) if ctx is not None else None
    return _Rule(
        name,
        tuple((_jflex(alt), context) for alt in alternatives),
        action,
        re.compile(extent) if extent is not None else None,
    )


def _emit(normalise: Callable[[str], str] = str) -> Callable[[str], tuple]:
    """The whole match, normalised, is one token."""
    return lambda text: (normalise(text), len(text))


def _emit_as(token: str) -> Callable[[str], tuple]:
    return lambda text: (token, len(text))


def _skip(text: str) -> tuple:
    return None, len(text)


def _split_off(n: int) -> Callable[[str], tuple]:
    """All but the last ``n`` characters; those are scanned again ("gonna" -> "gon" + "na")."""
    return lambda text: (text[:-n], len(text) - n)


def _period_again(text: str) -> tuple:
    """An abbreviation ending a sentence keeps its period, which is scanned again as a token."""
    return text, len(text) - 1


def _acronym_ending_sentence(text: str) -> tuple:
    """As _period_again, but a single letter ("A.") loses its period instead."""
    return (text[0], 1) if len(text) == 2 else _period_again(text)


_RULES = (
    _rule("assimilation3", _split_off(3), "cannot", "'twas"),
    _rule("assimilation2", _split_off(2), "gonna|gotta|lemme|gimme|wanna", "'tis"),
    _rule("programming_language", _emit(), "c\\+\\+|[cCfF]#"),
    _rule("sgml", _emit(_no_spaces), SGML),
    _rule("dash", _emit_as("--"), "&(?:md|mdash|ndash);", "[\\u0096\\u0097\\u2013\\u2014\\u2015]"),
    _rule("ampersand", _emit_as("&"), "&amp;"),
    _rule("entity_punctuation", _emit(), "&(?:ht|tl|ur|lr|qc|ql|qr|odq|cdq|#[0-9]+);"),
    _rule("word_before_aux", _emit(_remove_soft_hyphens), WORD, ctx=REDAUX),
    _rule("word_before_nt", _emit(_remove_soft_hyphens), SWORD, ctx=SREDAUX),
    _rule("word", _emit(_remove_soft_hyphens), WORD),
    _rule(
        "apostrophe_word",
        _emit(),
        f"{APOS}n{APOS}?",
        f"[lLdDjJ]{APOS}",
        f"dunkin{APOS}",
        f"somethin{APOS}",
        f"ol{APOS}",
        f"{APOS}em",
        f"[A-HJ-XZn]{APOSETC}{LETTER}{{2,}}",
        f"{APOS}[2-9]0s",
        f"{APOS}till?",
        f"{LETTER}+[aeiouyAEIOUY]{APOSETC}[aeiouA-Z]{LETTER}*",
        f"{APOS}cause",
        f"o{APOSETC}o",
        "cont'd\\.?|nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l",
    ),
    _rule("y_apostrophe", _emit(), f"y{APOS}", ctx=LETTER),
    _rule("full_url", _emit(), f'https?:\\/\\/[^ \\t\\n\\f\\r"<>|(){{}}]+{URL_END}'),
    _rule(
        "likely_url",
        _emit(),
        '(?:www\\.(?:[^ \\t\\n\\f\\r"<>|.!?(){},]+\\.)+[a-zA-Z]{2,4}'
        "|(?:[^ \\t\\n\\f\\r\"`'<>|.!?(){},-_$]+\\.)+(?:com|net|org|edu))"
        f'(?:\\/[^ \\t\\n\\f\\r"<>|()]+{URL_END})?',
        extent=NOT_SPACE,
    ),
    _rule(
        "email",
        _emit(),
        '(?:&lt;|<)?[a-zA-Z0-9][^ \\t\\n\\f\\r"<>|(){}\\u00a0]*@'
        '(?:[^ \\t\\n\\f\\r"<>|(){}.\\u00a0]+\\.)*[^ \\t\\n\\f\\r"<>|(){}.\\u00a0]+(?:&gt;|>)?',
        extent=NOT_SPACE,
    ),
    _rule("twitter", _emit(), "@[a-zA-Z_][a-zA-Z_0-9]*", f"#{WORD_LETTER}+"),
    _rule("aux_before_nonletter", _emit(_closing_quotes), REDAUX, ctx="[^A-Za-z]"),
    _rule("nt_before_nonletter", _emit(_closing_quotes), SREDAUX, ctx="[^A-Za-z]"),
    _rule("date", _emit(), f"{DIGIT}{{1,2}}[-\\/]{DIGIT}{{1,2}}[-\\/]{DIGIT}{{2,4}}"),
    _rule("number", _emit(_remove_soft_hyphens), f"[-+]?(?:{NUM})"),
    _rule(
        "sub_superscript_number",
        _emit(),
        "[\\u207a\\u207b\\u208a\\u208b]?(?:[\\u2070\\u00b9\\u00b2\\u00b3\\u2074-\\u2079]+|[\\u2080-\\u2089]+)",
    ),
    _rule(
        "fraction", _emit(_no_spaces), f"(?:{DIGIT}{{1,4}}[- \\u00a0])?{DIGIT}{{1,4}}(?:\\\\?\\/|\\u2044){DIGIT}{{1,4}}"
    ),
    _rule("fraction_character", _emit(lambda t: _FRACTIONS.get(t, t)), "[\\u00bc\\u00bd\\u00be\\u2153-\\u215e]"),
    _rule(
        "treebank_special",
        _emit(_ampersands),
        "-(?:rrb|lrb|rcb|lcb|rsb|lsb)-",
        "c\\.d\\.s|pro-|anti-",
        "s(?:&|&amp;)p-500|s(?:&|&amp;)ls",
        f"cap{APOS}n",
        f"c{APOS}est",
    ),
    _rule("slashed_words", _emit(), "[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\\\?\\/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}"),
    _rule("dollar", _emit(), "[A-Z]*\\$|#"),
    _rule(
        "currency",
        _emit(lambda t: _CURRENCIES.get(t, t)),
        "[\\u00a2-\\u00a5\\u0080\\u20a0\\u20ac\\u060b\\u0e3f\\u20a4\\uffe0\\uffe1\\uffe5\\uffe6]",
    ),
    _rule(
        "acronym_ending_sentence",
        _acronym_ending_sentence,
        f"(?:{ACRO})\\.",
        ctx=f"{SPACENL}+(?:{SENTENCE_START}){SPACENL}",
    ),
    _rule("abbreviation_ending_sentence", _period_again, ABBREV1, ctx=SENTEND),
    _rule("abbreviation_in_sentence", _emit(), ABBREV1, ctx="[\\s\\S]{2}"),
    _rule("abbreviation_at_end", _period_again, ABBREV1),
    _rule("abbreviation_before_number", _emit(), ABBREV3, ctx=f"{SPACENL}?{DIGIT}"),
    _rule("abbreviation", _emit(), *(f"(?:{stem})\\." for stem in ABBREV2_STEMS)),
    _rule("abbreviation_no_period", _emit(), *ABBREV2_STEMS, ctx=SPACE),
    _rule("acronym_no_period", _emit(), ACRO, ctx=SPACENL),
    _rule(
        "file_name",
        _emit(),
        f"{FILE_NAME_PART}(?:\\.{FILE_NAME_PART})*\\.(?:{FILE_EXTENSIONS})",
        ctx=f"{SPACENL}|[.?!,]",
    ),
    _rule("year", _emit(), f"{APOS}[0-9][0-9]", ctx=SPACENL),
    _rule("word_period", _emit(_remove_soft_hyphens), f"{WORD}\\.", ctx=INSENTP),
    _rule("phone", _emit(lambda t: _round_brackets(_no_spaces(t))), *PHONE, extent=PHONE_EXTENT),
    _rule("opening_double_quote", _emit(_opening_quotes), '"|&quot;', ctx="[A-Za-z0-9$]"),
    _rule("double_quote", _emit(_closing_quotes), '"|&quot;'),
    _rule("delete", _skip, "\\x7f"),
    _rule("less_than", _emit_as("<"), "<|&lt;"),
    _rule("greater_than", _emit_as(">"), ">|&gt;"),
    _rule("opening_square", _emit_as("-LSB-"), "\\["),
    _rule("closing_square", _emit_as("-RSB-"), "\\]"),
    _rule("opening_curly", _emit_as("-LCB-"), "\\{"),
    _rule("closing_curly", _emit_as("-RCB-"), "\\}"),
    _rule("opening_round", _emit_as("-LRB-"), "\\("),
    _rule("closing_round", _emit_as("-RRB-"), "\\)"),
    _rule("hyphens", _emit(lambda t: "--" if 3 <= len(t) <= 4 else t), "-+"),
    _rule("ellipsis", _emit_as("..."), "\\.{3,5}|(?:\\.[ \\u00a0]){2,4}\\.|[\\u0085\\u2026]"),
    _rule("footnote_marks", _emit(), "@+", "#+", "_+"),
    _rule("asterisks", _emit(), "\\*+", "(?:\\\\\\*){1,3}"),
    _rule("sentence_internal", _emit(), INSENTP),
    _rule("exclamation", _emit(), "[?!]+"),
    _rule("sentence_end", _emit(), "[.\\u00a1\\u00bf\\u037e\\u0589\\u061f\\u06d4\\u0700-\\u0702\\u07fa\\u3002]"),
    _rule("equals", _emit(), "="),
    _rule("slash", _emit(), "\\/"),
    _rule("hyphenated_period", _emit(_remove_soft_hyphens), f"{HTHING}\\.", ctx=INSENTP),
    _rule("hyphenated", _emit(_remove_soft_hyphens), HTHING),
    _rule("thing_period", _emit(), f"{THING_PART}(?:{HYPHEN}{THING_PART})*\\.", ctx=INSENTP),
    _rule("thing", _emit(), f"{THING_PART}(?:{HYPHEN}{THING_PART})*"),
    _rule("capitals_period", _emit(_ampersands), f"{THINGA}\\.", ctx=INSENTP),
    _rule("capitals", _emit(_ampersands), THINGA),
    _rule("smiley", _emit(_round_brackets), SMILEY, ctx="[^A-Za-z0-9]"),
    _rule("asian_smiley", _emit(_round_brackets), *ASIAN_SMILEY),
    _rule("opening_single_quote", _emit(_opening_quotes), "'", ctx="[A-Za-z][^ \\t\\n\\r\\u00a0]"),
    _rule("aux", _emit(_closing_quotes), REDAUX),
    _rule("nt", _emit(_closing_quotes), SREDAUX),
    _rule("quotes", _emit(_closing_quotes), APOS, "''", f"[{QUOTE_CHARS}]{{1,2}}"),
    _rule("duck_feet", _emit(), "<<|>>"),
    _rule("symbol", _emit(), MISCSYMBOL),
    _rule("space", _skip, "\\x00", SPACES, "[\\u200b\\u200e\\u200f\\ufeff]", NEWLINE, "&nbsp;"),
    _rule("untokenizable", _skip, "[\\s\\S]"),
)

# Plain ASCII words followed by a space (most of a caption) are always one token as they stand,
# except the few the scanner splits; spaces are always skipped.
_PLAIN_WORD = re.compile(r"[ \t]+|[A-Za-z]+(?=[ \t\n]|\Z)")
_SPLIT_WORDS = frozenset(["cannot", "gonna", "gotta", "lemme", "gimme", "wanna"])
# Java's line ends, which pycocoevalcap leaves inside a caption (see the module docstring)
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\u2028\u2029]")


class _Alternative(NamedTuple):
    rule: _Rule
    group: int  # its group in the combined pattern
    context_group: int  # 0 if it has no trailing context
    pattern: re.Pattern | None  # the alternative alone, for rules with an extent


@functools.cache
def _compile_rules() -> tuple:
    """One regular expression trying every alternative at a position: each is an optional
    lookahead capturing its match, so one ``match`` call gives all their (first) matches."""
    parts, alternatives = [], []
    for rule in _RULES:
        for pattern, context in rule.alternatives:
            k = len(alternatives)
            tail = f"(?=(?P<c{k}>{context}))" if context is not None else ""
            parts.append(f"(?:(?=(?P<m{k}>{pattern}){tail}))?")
            alternatives.append((rule, pattern, context))
    combined = re.compile("".join(parts))
    return combined, tuple(
        _Alternative(
            rule,
            combined.groupindex[f"m{k}"],
            combined.groupindex.get(f"c{k}", 0),
            re.compile(pattern) if rule.extent is not None else None,
        )
        for k, (rule, pattern, context) in enumerate(alternatives)
    )


def _longest_match(text: str, i: int) -> tuple:
    """The scanner's choice at ``text[i]``: (rule, matched text without context, match length
    with context); the longest match wins, the first rule on a tie."""
    all_rules, alternatives = _compile_rules()
    spans = all_rules.match(text, i).regs
    best, best_end, best_length = None, i, 0
    for alternative in alternatives:
        start, end = spans[alternative.group]
        if start < 0:
            continue
        if alternative.pattern is not None:
            limit = alternative.rule.extent.match(text, i).end()
            end = next((e for e in range(limit, end, -1) if alternative.pattern.fullmatch(text, i, e)), end)
        length = (spans[alternative.context_group][1] if alternative.context_group else end) - i
        if length > best_length:
            best, best_end, best_length = alternative.rule, end, length
    return best, text[i:best_end], best_length


def _scan(text: str, end: int) -> list:
    """The scanner's tokens (before lower-casing) of the line ``text[:end]``.

    ``text[end:]`` is what follows the line ("\\n" and the next line, or nothing at the end of the
    input); rules look at it as trailing context only.
    """
    tokens, i = [], 0
    while i < end:
        plain = _PLAIN_WORD.match(text, i)
        if plain is not None and plain.group().lower() not in _SPLIT_WORDS:
            if text[i] not in " \t":
                tokens.append(plain.group())
            i = plain.end()
            continue
        rule, matched, _ = _longest_match(text, i)
        token, consumed = rule.action(matched)
        if token is not None:
            tokens.append(token)
        i += consumed
    return tokens


def _is_cased(c: str) -> bool:
    return c.islower() or c.isupper() or c.istitle()


def _word_character(c: str) -> bool:
    return (c.isalnum() or unicodedata.category(c) == "Pc") and unicodedata.east_asian_width(c) not in ("W", "F")


# Characters Java's word breaking keeps inside a word between two letters
_MID_WORD = frozenset("-\u2010\u2011\u2012\u2013\u2014\u2015\u00ad\u2027'\".\u2019")


def _cased_in_word(token: str, i: int, step: int) -> bool:
    """Whether a cased letter follows (step 1) or precedes (step -1) ``token[i]`` in its word."""
    j = i + step
    while 0 <= j < len(token):
        c = token[j]
        if _is_cased(c):
            return True
        if not (
            _word_character(c)
            or (
                c in _MID_WORD
                and token[j - step].isalpha()
                and 0 <= j + step < len(token)
                and token[j + step].isalpha()
            )
        ):
            return False
        j += step
    return False


def _lower(token: str) -> str:
    """Java's ``toLowerCase(Locale.ENGLISH)``: Python's ``str.lower`` but for a capital sigma.

    Both make a capital sigma that ends a word final (U+03C2), but Java's words (its
    BreakIterator's) run on over dashes, apostrophes, quotes and periods between letters and stop
    at ideographs: "ΟΔΟΣ-ORANGE" -> "οδοσ-orange", "ΑΣ日" -> "ας日".
    """
    if "\u03a3" not in token:
        return token.lower()
    return "".join(
        ("\u03c2" if _cased_in_word(token, i, -1) and not _cased_in_word(token, i, 1) else "\u03c3")
        if c == "\u03a3"
        else c.lower()
        for i, c in enumerate(token)
    )


def _tokenize_line(caption: str, following: str | None) -> str:
    """``caption`` as pycocoevalcap tokenises it on a line of its file followed by the lines
    ``following`` (None: the end of the file)."""
    line = _LINE_BREAKS.sub(" ", caption)
    text = line if following is None else line + "\n" + _LINE_BREAKS.sub(" ", following)
    java_line = " ".join(map(_lower, _scan(text, len(line))))
    # pycocoevalcap's own clean-up (its rstrip also trims a no-break space ending a URL, say)
    return " ".join(token for token in java_line.rstrip().split(" ") if token not in PUNCTUATIONS)


# Java's spaces: a line of only these is blank to the rules that look past a line's end
_BLANK = re.compile("[ \t\u00a0\u2000-\u200a\u3000]*")


def ptb_tokenize(text: str, next_caption: str | None = "") -> str:
    """pycocoevalcap's tokenisation of one caption: lower-cased PTB tokens, punctuation removed.

    Args:
        text: the caption.
        next_caption: the caption on the next line of pycocoevalcap's file, or None when ``text``
            is the last line. Java peeks across the line end in a few places: a single-letter
            acronym ending the caption ("vitamin C.") keeps its period unless the next line
            starts with a word like "A" or "The", and a smiley ``:)`` or ``'90`` at the very end of
            the file is split. The default (an empty next line) is right for all other captions.

    Returns the tokens joined by single spaces ("" when none are left), e.g.
    ``ptb_tokenize("A dog's (big) ball.") == "a dog 's -lrb- big -rrb- ball"``.
    """
    if not isinstance(text, str):
        raise TypeError(f"caption must be a str, got {type(text).__name__}")
    return _tokenize_line(text, next_caption)


Captions = Sequence[str] | Sequence[Mapping[str, str]]


def tokenize_corpus(captions_for_image: Mapping[Hashable, Captions]) -> dict:
    """pycocoevalcap's ``PTBTokenizer().tokenize`` without Java.

    ``captions_for_image``: ``{id: [caption, ...]}``, each caption a str or a ``{"caption": str}``
    dict (pycocoevalcap's own input form). Returns ``{id: [tokenised caption, ...]}`` in the same
    order. The captions are tokenised as the lines of pycocoevalcap's file, each followed by the
    next one (see :func:`ptb_tokenize`), so the result is the same as Java's.
    """
    keys, captions = [], []
    for key, image_captions in captions_for_image.items():
        for caption in image_captions:
            caption = caption["caption"] if isinstance(caption, Mapping) else caption
            if not isinstance(caption, str):
                raise TypeError(f"captions must be str, got {type(caption).__name__} for id {key!r}")
            keys.append(key)
            captions.append(caption)
    result: dict = {key: [] for key in captions_for_image}
    for k, (key, caption) in enumerate(zip(keys, captions)):
        # what Java's rules can see after the line: up to the line after the first non-blank one
        following = k + 1
        while following < len(captions) - 1 and _BLANK.fullmatch(captions[following]):
            following += 1
        context = "\n".join(captions[k + 1 : following + 2]) if k + 1 < len(captions) else None
        result[key].append(_tokenize_line(caption, context))
    return result
