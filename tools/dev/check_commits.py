"""Commit subjects of at most 72 characters (docs/CONTRIBUTING.md): the details go in the body.

    python -m tools.dev.check_commits [--since REV]

Checks every commit reachable from HEAD and not from ``--since`` (default: the last commit before the
rule was adopted, so history written before it is left as it is). Exit 1 listing the long subjects; exit 0
with a note where the repository or the base commit is not there (an export, a shallow clone).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

#: The last commit written before subjects were kept to 72 characters.
RULE_BASE = "651221d"
LIMIT = 72


def long_subjects(since: str = RULE_BASE, limit: int = LIMIT) -> list[str] | None:
    """``"<hash> <subject>"`` of each commit after ``since`` whose subject is longer than ``limit``; None
    where git or the base commit is not available."""
    try:
        known = subprocess.run(["git", "cat-file", "-e", f"{since}^{{commit}}"], capture_output=True)
        if known.returncode != 0:
            return None
        log = subprocess.run(
            ["git", "log", "--format=%H %h %s", f"{since}..HEAD"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    commits = [line.split(" ", 2) for line in log.splitlines()]
    return [f"{short} {subject}" for full, short, subject in commits if len(subject) > limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dev.check_commits", description=__doc__.split("\n\n")[0])
    p.add_argument("--since", default=RULE_BASE, help="check the commits after this one (default: %(default)s)")
    args = p.parse_args(argv)
    found = long_subjects(args.since)
    if found is None:
        print(f"check_commits: no git history with {args.since} here: nothing checked")
        return 0
    for line in found:
        print(f"subject over {LIMIT} characters: {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
