"""The course's home: the one setting behind every badge, link and clone cell.

``REPO`` is the GitHub repository the course is published under and ``REF`` the version the
notebooks of this checkout belong to: a tag (``v`` + the version in pyproject.toml) that the
chapters' first cells clone and that their Colab badges open. (Pictures depend on no home: each
notebook carries its own, written in by scripts/sync_notebooks.py from chapters/img/.)

The course has no published home yet: ``memlab-course/memlab`` is a placeholder, so until it is
published the badges and the Colab clone point at a repository that does not exist.
To publish under OWNER/NAME:

    python scripts/set_home.py OWNER/NAME   # rewrites this file, both READMEs and every chapter
    git commit -am "course home: OWNER/NAME"
    git tag v0.1.0 && git push origin main v0.1.0   # the tag REF names must exist on the home

After a version bump in pyproject.toml, ``python scripts/set_home.py`` (no argument)
moves REF to the new tag. tests/repo/test_home.py checks that every badge, link and
clone cell agrees with this file.
"""

from __future__ import annotations

REPO = "memlab-course/memlab"
REF = "v0.1.0"
PUBLISHED = False  # True once REPO exists and REF is pushed there


def colab_url(path: str, repo: str = REPO, ref: str = REF) -> str:
    """Colab's 'open from GitHub' address of a notebook at ``path`` in the repository."""
    return f"https://colab.research.google.com/github/{repo}/blob/{ref}/{path}"


def github_url(path: str, repo: str = REPO, ref: str = REF) -> str:
    """GitHub's page of a file of version ``ref`` (in Colab, the glossary opens from there)."""
    return f"https://github.com/{repo}/blob/{ref}/{path}"


def clone_folder(ref: str = REF) -> str:
    """The folder a chapter's first cell clones into (next to the notebook, e.g. Colab's /content):
    one per version, so a clone of another version is never reused."""
    return f"memlab-{ref}"
