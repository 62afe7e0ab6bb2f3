"""Which names are Hugging Face Hub ids: an explicit hf:// prefix, or owner/name that cannot be a path
here; a mistyped local folder is never a download, a pinned revision is honoured, and only a model
folder's files are fetched."""

import huggingface_hub
import pytest

from captioning.errors import CheckpointError
from captioning.storage.hub import ALLOW_PATTERNS, HubId, parse_hub_id, resolve_folder
from captioning.storage.load import load_model


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """snapshot_download recorded instead of run (nothing leaves this machine)."""
    made = []

    def fake(repo_id, **kwargs):
        made.append((repo_id, kwargs))
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return made


@pytest.mark.parametrize(
    "name, expected",
    [
        ("someone/captioner", HubId("someone/captioner", None)),
        ("someone/captioner@v1.0", HubId("someone/captioner", "v1.0")),
        ("hf://someone/captioner", HubId("someone/captioner", None)),
        ("hf://someone/captioner@0123abcd", HubId("someone/captioner", "0123abcd")),
        ("someone/best.ckpt", None),
        ("./someone", None),
        ("../a", None),
        ("a/b/c", None),
        ("~/x", None),
        ("/abs/path", None),
    ],
)
def test_what_is_a_hub_id(name, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_id(name) == expected


def test_a_name_under_a_local_folder_is_a_path(tmp_path, monkeypatch, calls):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert parse_hub_id("runs/best") is None  # a mistyped local folder
    assert parse_hub_id("hf://runs/best") == HubId("runs/best", None)  # unless said explicitly
    with pytest.raises(CheckpointError, match="no such file"):
        load_model("runs/best")
    assert calls == []


def test_an_explicit_prefix_that_is_not_an_id_is_one_line():
    with pytest.raises(CheckpointError, match="not a Hub id"):
        parse_hub_id("hf://just-a-name")


def test_only_the_model_folder_is_fetched_at_the_pinned_revision(calls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    resolve_folder("someone/captioner@v2", local_files_only=False)
    resolve_folder("hf://someone/captioner", revision="abc123", local_files_only=False)
    (first, a), (second, b) = calls
    assert first == second == "someone/captioner"
    assert a["revision"] == "v2" and b["revision"] == "abc123"
    assert a["allow_patterns"] == b["allow_patterns"] == ALLOW_PATTERNS
    with pytest.raises(CheckpointError, match="names revision 'v2'"):
        resolve_folder("someone/captioner@v2", revision="v3")


def test_a_token_reaches_the_hub_as_huggingface_hub_names_it(calls, tmp_path, monkeypatch):
    """``from_pretrained(..., token=...)`` (huggingface_hub's name) for a private or gated repository;
    without one, huggingface_hub's own (``hf auth login``, HF_TOKEN): None passed on."""
    from captioning.api import Captioner
    from captioning.export.onnx_captioner import OnnxCaptioner

    monkeypatch.chdir(tmp_path)
    for load in (
        lambda: Captioner.from_pretrained("someone/private", token="hf_abc", local_files_only=False),
        lambda: OnnxCaptioner("someone/private-onnx", token="hf_abc", local_files_only=False),
        lambda: Captioner.from_pretrained("someone/public", local_files_only=False),
    ):
        with pytest.raises(CheckpointError):  # the fake snapshot folder holds no model
            load()
    assert [(repo, kwargs["token"]) for repo, kwargs in calls] == [
        ("someone/private", "hf_abc"),
        ("someone/private-onnx", "hf_abc"),
        ("someone/public", None),
    ]
