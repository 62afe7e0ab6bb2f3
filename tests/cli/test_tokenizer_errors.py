"""The tokenizers' bad input at the commands: an unknown name, bpe without a size, a vocabulary of one
tokenizer given with another named, a caption file that is not UTF-8: one error line naming the
option or the file, a non-zero exit, no vocabulary written."""

import json

import pytest

from captioning.cli.main import main
from tests.helpers import fit_args


def run(args, capsys) -> tuple[int, list[str]]:
    try:
        code = main(args)
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in err if line.startswith("error")]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--tokenizer", "bp"], "error: --tokenizer: unknown tokenizer 'bp'; expected one of words, chars, jieba, bpe"),
        (["--tokenizer", "bpe"], "error: --vocab-size: the 'bpe' tokenizer learns a vocabulary of a given size"),
        (["--tokenizer", "chars", "--vocab-size", "50"], "error: --vocab-size: only a trained tokenizer"),
    ],
)
def test_prepare_refuses_bad_tokenizer_options_in_one_line(flags, expected, tiny_shapes, tmp_path, capsys):
    out = tmp_path / "vocab.json"
    code, errors = run(["prepare", "--annotations", str(tiny_shapes), "--out", str(out), *flags], capsys)
    assert code != 0 and len(errors) == 1 and errors[0].startswith(expected), errors
    assert not out.exists()


def test_prepare_refuses_a_caption_file_that_is_not_utf8(tiny_shapes, tmp_path, capsys):
    data = json.loads(tiny_shapes.read_text(encoding="utf-8"))
    data["images"][0]["sentences"][0]["raw"] = "un café au lait"
    latin = tmp_path / "latin1.json"
    latin.write_bytes(json.dumps(data, ensure_ascii=False).encode("latin-1"))
    out = tmp_path / "vocab.json"
    code, errors = run(["prepare", "--annotations", str(latin), "--out", str(out)], capsys)
    assert code != 0 and errors == [f"error: {latin}: not UTF-8 text (is it really a JSON annotation file?)"]
    assert not out.exists()


def test_fit_refuses_a_vocabulary_of_another_tokenizer(tiny_shapes, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    vocab = tmp_path / "bpe.json"
    args = ["prepare", "--annotations", str(tiny_shapes), "--tokenizer", "bpe", "--vocab-size", "40"]
    assert main([*args, "--min-word-freq", "1", "--out", str(vocab)]) == 0
    capsys.readouterr()
    extra = ["--data.vocabulary", str(vocab), "--data.tokenizer", "chars"]
    code, errors = run(fit_args(tiny_shapes, tmp_path / "run", extra=extra), capsys)
    assert code != 0 and len(errors) == 1, errors
    assert errors[0] == (
        f"error: data.tokenizer: 'chars', but {vocab} was built with the 'bpe' tokenizer; "
        "set data.tokenizer: bpe or leave it out"
    )
    assert not list((tmp_path / "run").rglob("*.ckpt"))
