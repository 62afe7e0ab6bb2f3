"""A shard's tar headers are checked before a member is read or skipped, and a brace pattern is
counted before it is expanded: a forged size, a sparse member, a member over the bound or a pattern
of a billion names is one line naming the shard (and member), never a traceback, a read that fills
memory or wrong bytes. The shards here are built by hand (tarfile, then header bytes patched)."""

import io
import json
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from captioning.data.formats import webdataset
from captioning.data.formats.webdataset import count_expansion, read_index, shard_paths
from captioning.errors import AnnotationError

braceexpand = pytest.importorskip("braceexpand", reason="the ecosystem extra: pip install -e '.[ecosystem]'")


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 99, 199)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_shard(path, members, fmt=tarfile.USTAR_FORMAT) -> bytes:
    """A tar of ``members`` ((name, bytes), in order); its bytes."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


def header_at(data: bytes, name: str) -> int:
    """The offset of the header block of member ``name``."""
    offset = 0
    while offset < len(data):
        if data[offset : offset + 100].rstrip(b"\0") == name.encode():
            return offset
        size = int(data[offset + 124 : offset + 136].rstrip(b"\0 ") or b"0", 8)
        offset += 512 + -(-size // 512) * 512
    raise KeyError(name)


def patch(path, name: str, fields: dict) -> None:
    """Overwrite header fields of member ``name`` ({offset in the header: bytes}), then its checksum."""
    data = bytearray(path.read_bytes())
    at = header_at(bytes(data), name)
    for offset, value in fields.items():
        data[at + offset : at + offset + len(value)] = value
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])
    path.write_bytes(bytes(data))


def base256(value: int, width: int = 12) -> bytes:
    """A tar number field in GNU's base-256 form (first byte 0x80, or 0xff for a negative value)."""
    if value < 0:
        return b"\xff" + (value % 256 ** (width - 1)).to_bytes(width - 1, "big")
    return b"\x80" + value.to_bytes(width - 1, "big")


def sample(key="s0", **meta) -> list:
    return [(f"{key}.png", png()), (f"{key}.json", json.dumps({"captions": ["a blue square"], **meta}).encode())]


def one_line(call) -> str:
    with pytest.raises(AnnotationError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_plain_shard_is_read(tmp_path):
    write_shard(tmp_path / "a.tar", sample("s0") + sample("s1", image_id=2**63 - 1))
    index = read_index(str(tmp_path / "a.tar"))
    assert [r.image_id for r in index.records] == [0, 2**63 - 1]
    assert index.members[0].read() == png()


@pytest.mark.parametrize("member", ["s1.png", "s1.json", "s1.cls"])
@pytest.mark.parametrize("size", [2**64, 2**80, 10**9])
def test_a_size_past_the_end_of_the_shard(tmp_path, member, size):
    shard = tmp_path / "a.tar"
    write_shard(shard, sample("s0") + sample("s1") + [("s1.cls", b"3")] + sample("s2"))
    patch(shard, member, {124: base256(size)})
    message = one_line(lambda: read_index(str(shard)))
    assert message.startswith(f"{shard}: member '{member}': its header declares {size:,} bytes, past the end")


def test_a_negative_size(tmp_path):
    shard = tmp_path / "a.tar"
    write_shard(shard, sample("s0") + sample("s1"))
    patch(shard, "s1.png", {124: base256(-5)})
    message = one_line(lambda: read_index(str(shard)))
    assert message.startswith(f"{shard}: ") and ("s1.png" in message or "damaged tar file" in message)


@pytest.mark.parametrize("member, real_size", [("s1.png", 2**33), ("s1.json", 1 << 20)])
def test_a_sparse_member_is_refused(tmp_path, member, real_size):
    """A GNU sparse member stores some blocks of a file that tarfile reads back padded with zeros:
    its declared size may be gigabytes for a few stored bytes, and its bytes are not those stored."""
    shard = tmp_path / "a.tar"
    write_shard(shard, sample("s0") + sample("s1"), fmt=tarfile.GNU_FORMAT)
    stored = len(png()) if member.endswith(".png") else len(dict(sample("s1"))["s1.json"])
    patch(shard, member, {156: b"S", 386: b"%011o\0" % 0 + b"%011o\0" % stored, 483: base256(real_size)})
    info = tarfile.open(shard).getmember(member)
    assert info.issparse() and info.isfile() and info.size == real_size  # what the reader is given
    message = one_line(lambda: read_index(str(shard)))
    assert message.startswith(f"{shard}: member '{member}': a sparse file")


def test_a_member_over_the_bound(tmp_path, monkeypatch):
    shard = tmp_path / "a.tar"
    write_shard(shard, sample("s0", note="x" * 4000))
    monkeypatch.setattr(webdataset, "MAX_TEXT_MEMBER", 1024)
    assert "more than the 1,024 a member of its kind may hold" in one_line(lambda: read_index(str(shard)))
    monkeypatch.setattr(webdataset, "MAX_TEXT_MEMBER", 1 << 20)
    monkeypatch.setattr(webdataset, "MAX_IMAGE_MEMBER", 16)
    assert "member 's0.png'" in one_line(lambda: read_index(str(shard)))


def test_a_cut_shard_is_one_line(tmp_path):
    shard = tmp_path / "a.tar"
    data = write_shard(shard, sample("s0") + sample("s1"))
    shard.write_bytes(data[:700])
    assert one_line(lambda: read_index(str(shard))).startswith(f"{shard}: ")


# ------------------------------------------------------------------------------------- brace patterns
def test_a_pattern_of_a_billion_names_is_counted_not_expanded(tmp_path, monkeypatch):
    import braceexpand

    write_shard(tmp_path / "a-000000000.tar", sample())
    expanded = []
    monkeypatch.setattr(braceexpand, "braceexpand", lambda pattern, *a, **kw: expanded.append(pattern) or iter(()))
    message = one_line(lambda: shard_paths(str(tmp_path / "a-{000000000..999999999}.tar")))
    assert not expanded  # refused on the count alone: no name was generated
    assert "names 1,000,000,000 shard files, more than the 1,000,000" in message
    assert "names 10,000,000,000" in one_line(lambda: shard_paths(str(tmp_path / "{0..99999}{0..99999}.tar")))


def test_patterns_under_the_bound_are_expanded_and_checked(tmp_path):
    for n in range(3):
        write_shard(tmp_path / f"a-{n:06d}.tar", sample(f"k{n}"))
    assert shard_paths(str(tmp_path / "a-{000000..000002}.tar")) == [str(tmp_path / f"a-{n:06d}.tar") for n in range(3)]
    assert one_line(lambda: shard_paths(str(tmp_path / "a-{000000..000003}.tar"))).endswith(
        "a-000003.tar: no such shard file"
    )
    assert "unbalanced braces" in one_line(lambda: shard_paths(str(tmp_path / "a-{0..2.tar}}")))


PATTERN = st.text(alphabet="{},..12a-Z\\x", max_size=14)


@settings(max_examples=300, deadline=None)
@given(pattern=PATTERN)
def test_the_count_is_that_of_braceexpand(pattern):
    try:
        expected = len(list(braceexpand.braceexpand(pattern)))
    except braceexpand.UnbalancedBracesError:
        with pytest.raises(braceexpand.UnbalancedBracesError):
            count_expansion(pattern)
        return
    assert count_expansion(pattern) == expected


# ------------------------------------------------------------------------------------- sample values
@pytest.mark.parametrize(
    "meta, expected",
    [
        ({"image_id": 2**63}, ".json image_id: 9223372036854775808 is outside the 64-bit"),
        ({"image_id": -(2**63) - 1}, "is outside the 64-bit"),
        ({"captions": ["a \ud800 square"]}, ".json captions: a lone surrogate"),
        ({"tokens": [["a", "\udfff"]]}, ".json tokens: a lone surrogate"),
        ({"objects": [{"shape": "square"}]}, ".json objects[0]: expected 'words'"),
        ({"objects": [{"words": ["a", 2]}]}, ".json objects[0].words"),
        ({"width": 0, "height": 4}, ".json.width: expected a positive integer"),
    ],
)
def test_sample_values_no_later_step_can_use(tmp_path, meta, expected):
    shard = tmp_path / "a.tar"
    write_shard(shard, sample("s0") + sample("s1", **meta))
    assert expected in one_line(lambda: read_index(str(shard)))
    problems = []
    assert len(read_index(str(shard), problems=problems).records) == 1 and len(problems) == 1


def test_a_json_member_of_too_many_digits(tmp_path):
    shard = tmp_path / "a.tar"
    write_shard(shard, sample("s0") + [("s1.png", png()), ("s1.json", b'{"image_id": ' + b"7" * 5000 + b"}")])
    assert "s1: .json: unreadable JSON" in one_line(lambda: read_index(str(shard)))
