"""The project's own papers agree: the licence pyproject.toml names is the LICENSE file's, and the
version of pyproject.toml is CITATION.cff's, with a section in CHANGELOG.md (tags: vX.Y.Z)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def pyproject_field(name: str) -> str:
    match = re.search(rf'^{name} = (?:\{{ text = )?"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match, name
    return match.group(1)


def test_the_license_file_is_the_one_pyproject_names():
    assert pyproject_field("license") == "MIT"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text


def test_the_citation_names_this_version_and_the_paper():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    assert citation["version"] == pyproject_field("version") and citation["license"] == "MIT"
    paper = citation["preferred-citation"]
    assert paper["title"].startswith("Show, Attend and Tell") and paper["year"] == 2015
    assert [a["family-names"] for a in paper["authors"]][:2] == ["Xu", "Ba"]


def test_the_changelog_has_this_versions_section():
    version = pyproject_field("version")
    text = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{version}]" in text and "## [Unreleased]" in text and "vMAJOR.MINOR.PATCH" in text
