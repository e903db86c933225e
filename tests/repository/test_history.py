"""The history's rules from the commit on which they hold (SINCE) onwards: a subject of at
most 72 characters (details go in the body, where `git log --oneline`, a changelog
generator and every code host's list keep them out of the way), and no merge commit: a
branch is fast-forwarded or squashed onto main, so the history reads as the changes
themselves, never as the branches they were made on. The commits before SINCE stay as
they were written.

Read from git in the checkout; a copy without git or with a history too shallow to hold
SINCE skips, naming why.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The last commit before the rules held: every commit after it keeps them.
SINCE = "b444f068cc49094ac3e8bde2456feb7aa1a87a8c"
SUBJECT_LIMIT = 72


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: int
    subject: str


def problems(commits: list[Commit]) -> list[str]:
    """Each commit that breaks a rule, as `sha: what`."""
    found = []
    for commit in commits:
        if len(commit.subject) > SUBJECT_LIMIT:
            found.append(
                f"{commit.sha[:10]}: subject of {len(commit.subject)} characters (at most {SUBJECT_LIMIT}; "
                f"details in the body): {commit.subject[:80]}"
            )
        if commit.parents > 1:
            found.append(f"{commit.sha[:10]}: a merge commit ({commit.subject[:60]}): fast-forward or squash instead")
    return found


def commits_since(since: str) -> list[Commit]:
    log = subprocess.run(
        ["git", "log", "--format=%H%x00%P%x00%s", f"{since}..HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("\0") for line in log.stdout.splitlines()]
    return [Commit(sha, len(parents.split()), subject) for sha, parents, subject in rows]


def _history_holds(since: str) -> str | None:
    """Why the history cannot be read here, or None."""
    if shutil.which("git") is None:
        return "git is not installed"
    if not (ROOT / ".git").exists():
        return "not a git checkout"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        return f"a shallow clone may not hold {since[:10]} (git fetch --unshallow)"
    return None  # a full history without SINCE fails in git log, as it should


def test_every_commit_since_the_rules_keeps_them() -> None:
    why = _history_holds(SINCE)
    if why is not None:
        pytest.skip(why)
    assert problems(commits_since(SINCE)) == []


@pytest.mark.parametrize(
    "commit,expected",
    [
        (Commit("a" * 40, 1, "x" * 73), "subject of 73 characters"),
        (Commit("b" * 40, 2, "Merge branch 'feature'"), "a merge commit"),
    ],
    ids=["long-subject", "merge"],
)
def test_a_planted_break_of_a_rule_is_found(commit: Commit, expected: str) -> None:
    assert any(expected in problem for problem in problems([commit]))
    assert problems([Commit("c" * 40, 1, "x" * 72)]) == []  # at the limit: kept
