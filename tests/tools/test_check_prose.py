"""tools/dev/check_prose.py: what it counts as a sentence, and what it reports."""

from pathlib import Path

from tools.dev.check_prose import check, main, sentences


def words(n: int, word: str = "word") -> str:
    return " ".join([word] * n)


def counts(doc: str) -> list[int]:
    return [s.words for s in sentences(doc)]


def write(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "module.py"
    path.write_text(source, encoding="utf-8")
    return path


def test_sentence_ends():
    assert counts(f"One {words(3)}. Two {words(4)}! Three {words(5)}? Four.") == [4, 5, 6, 1]
    # a colon or semicolon ends nothing
    assert counts(f"One {words(3)}: two {words(4)}; three.") == [10]


def test_periods_that_end_nothing():
    # numbers, dotted and file names, e.g./i.e./etc., a lower-case word after the period
    doc = "Scores 0.5 from models.decoder in decoder.py, e.g. Adam, i.e. One, cf. Two and so on. Next one."
    assert counts(doc) == [15, 2]
    assert counts("A sentence, etc. and more.") == [5]


def test_code_spans_are_one_word_and_end_nothing():
    assert counts("Call ``model. Generate(x, y)`` now. Then `a. B c` too.") == [3, 3]


def test_paragraphs_and_list_items_end_sentences():
    doc = (
        f"Intro {words(3)}\n\n{words(5)}\n- item {words(2)}\n* star {words(2)}\n1. first {words(2)}\n   more {words(2)}"
    )
    assert counts(doc) == [4, 5, 3, 3, 6]


def test_args_sections():
    doc = "Summary.\n\nArgs:\n    x: the x of\n        the y.\n    y: the y\n    z: the z:\n        of x.\n    w: w."
    assert counts(doc) == [1, 1, 6, 3, 3, 2, 2]


def test_code_blocks_are_skipped():
    doc = (
        f"Use it so::\n\n    {words(80, 'code')}\n    {words(80, 'code')}\n\nThen this.\n\n"
        f"Usage:\n\n  python -m x {words(80)}\n\n>>> {words(80)}\n{words(80)}\n\nAs so.\n\n    {words(80)}\n"
        f"```\n{words(80)}\n```\n"
        f"===== =====\n{words(80)}\n===== =====\n\nEnd."
    )
    assert counts(doc) == [3, 2, 1, 2, 1]


def test_sentence_lines(tmp_path):
    source = f'"""Top.\n\nSecond {words(70)}.\n"""\n\n\ndef f():\n    """One.\n\n    Two {words(3)}\n    {words(60)}. Three."""\n'
    report = check([write(tmp_path, source)])
    assert [p.split(": ", 1)[0].rsplit(":", 1)[1] for p in report.problems] == ["3", "10"]
    assert "a sentence of 71 words (at most 60)" in report.problems[0]
    assert report.problems[1].endswith(f'a sentence of 64 words (at most 60): "Two {words(11)}..."')


def test_long_module_docstring(tmp_path, capsys):
    short = write(tmp_path, '"""' + "\n".join(f"Line {i}." for i in range(20)) + '\n"""\n')
    assert main([str(short)]) == 0
    long = write(tmp_path, '"""' + "\n".join(f"Line {i}." for i in range(21)) + '\n"""\n')
    assert main([str(long)]) == 1
    assert capsys.readouterr().out.strip() == f"{long}:1: module docstring of 21 lines (at most 20)"
    # a class's or function's long docstring is not a module docstring
    assert main([str(write(tmp_path, 'class A:\n    """' + "\n".join(f"L {i}." for i in range(30)) + '"""\n'))]) == 0


def test_stats_and_missing_path(tmp_path, capsys):
    path = write(tmp_path, '"""Doc.\n\nMore.\n"""\n\nx = 1\n')
    assert main(["--stats", str(path)]) == 0
    assert "1 files, 6 lines, 4 in docstrings (66.7%)" in capsys.readouterr().out
    assert main([str(tmp_path / "absent.py")]) == 2
