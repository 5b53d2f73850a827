"""Set the course's home (memlab/course/home.py) and rewrite every badge, link and clone cell.

    python scripts/set_home.py OWNER/NAME [--ref TAG] [--published]   publish under OWNER/NAME
    python scripts/set_home.py                                        REF := v<pyproject version>
    python scripts/set_home.py --check                                exit 1 where anything
                                                                      disagrees

What it rewrites, from memlab/course/home.py's REPO and REF:
- the Colab badges and links in README.md, chapters/README.md and each chapter's first cell
  (``https://colab.research.google.com/github/REPO/blob/REF/chapters/NN_name.ipynb``);
- the links to a file's page on GitHub (``https://github.com/REPO/blob/REF/chapters/...``, the
  glossary for Colab readers);
- the line ``HOME, REF = "REPO", "REF"`` of every chapter's first (setup) cell, which clones REF;
- links to ``https://github.com/REPO`` and any other mention of the old OWNER/NAME;
then rebuilds the notebooks from their twins (scripts/sync_notebooks.py). Pictures name no home:
each notebook carries its own (scripts/sync_notebooks.py writes them in from chapters/img/).

REF must be a tag (or a branch) of the home repository: the setup cell clones it with
``git clone --branch REF``. Tag the commit that carries the new setting with exactly REF.
"""

from __future__ import annotations

import argparse
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HOME_FILE = ROOT / "memlab" / "course" / "home.py"
TEXT_FILES = ("README.md", "chapters/README.md")
REPO_RE = r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+"
REF_RE = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
COLAB = re.compile(
    rf"https://colab\.research\.google\.com/github/({REPO_RE})/blob/({REF_RE}?)/(?=chapters/)"
)
BLOB = re.compile(rf"https://github\.com/({REPO_RE})/blob/({REF_RE}?)/(?=chapters/)")
SETUP = re.compile(r'^HOME, REF = "([^"]*)", "([^"]*)"', re.M)


def setting() -> tuple[str, str, bool]:
    text = HOME_FILE.read_text()
    get = lambda name: re.search(rf"^{name} = (.+?)(?:\s+#.*)?$", text, re.M).group(1)  # noqa: E731
    return get("REPO").strip('"'), get("REF").strip('"'), get("PUBLISHED") == "True"


def version() -> str:
    return re.search(
        r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M
    ).group(1)


def files() -> list[Path]:
    """Every file that names the home: the two READMEs and the chapter twins."""
    return [ROOT / f for f in TEXT_FILES] + sorted(
        (ROOT / "chapters" / "py").glob("[0-9][0-9]_*.py")
    )


def notebooks() -> list[Path]:
    return sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def check_name(repo: str, ref: str) -> None:
    if not re.fullmatch(REPO_RE, repo):
        raise SystemExit(f"set_home: {repo!r} is not OWNER/NAME")
    if (
        not re.fullmatch(REF_RE, ref)
        or ".." in ref
        or ref.endswith((".", "/", ".lock"))
    ):
        raise SystemExit(f"set_home: {ref!r} is not a tag name")
    if re.fullmatch(r"[0-9a-f]{7,40}", ref):
        raise SystemExit(
            f"set_home: {ref!r} looks like a commit id; the setup cell clones a tag "
            "(git clone --branch): tag that commit and pass the tag"
        )


def rewrite(text: str, repo: str, ref: str, old_repo: str) -> str:
    text = COLAB.sub(
        f"https://colab.research.google.com/github/{repo}/blob/{ref}/", text
    )
    text = BLOB.sub(f"https://github.com/{repo}/blob/{ref}/", text)
    text = SETUP.sub(f'HOME, REF = "{repo}", "{ref}"', text)
    # Links to the old home, and the name itself wherever else it is written.
    text = re.sub(
        rf"https://github\.com/{re.escape(old_repo)}(?![\w.-])",
        f"https://github.com/{repo}",
        text,
    )
    return re.sub(rf"(?<![\w./-]){re.escape(old_repo)}(?![\w-])", repo, text)


def problems(repo: str | None = None, ref: str | None = None) -> list[str]:
    """Every place that disagrees with the setting, in words (empty when all agree)."""
    if repo is None:
        repo, ref, _ = setting()
    found = []
    for path in [*files(), *notebooks()]:
        text = path.read_text()
        name = path.relative_to(ROOT)
        for pattern, what in (
            (COLAB, "Colab link"),
            (BLOB, "GitHub link"),
            (SETUP, "setup cell"),
        ):
            for m in pattern.finditer(text):
                if m.groups() != (repo, ref):
                    found.append(
                        f"{name}: {what} names {m.group(1)} at {m.group(2)}, "
                        f"the home is {repo} at {ref}"
                    )
        for m in re.finditer(
            r"https://github\.com/([\w.-]+/[\w.-]+?)(?=[/)\s\"'`]|$)", text
        ):
            if m.group(1).split("/")[1] == repo.split("/")[1] and m.group(1) != repo:
                found.append(f"{name}: links {m.group(0)}, the home is {repo}")
    return found


def write_setting(repo: str, ref: str, published: bool) -> None:
    text = HOME_FILE.read_text()
    text = re.sub(r'^REPO = "[^"]*"', f'REPO = "{repo}"', text, flags=re.M)
    text = re.sub(r'^REF = "[^"]*"', f'REF = "{ref}"', text, flags=re.M)
    text = re.sub(r"^PUBLISHED = \w+", f"PUBLISHED = {published}", text, flags=re.M)
    HOME_FILE.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "repo", nargs="?", help="OWNER/NAME on GitHub (default: keep the current home)"
    )
    p.add_argument(
        "--ref", help="the tag the notebooks clone (default: v + pyproject's version)"
    )
    p.add_argument(
        "--published",
        action="store_true",
        help="mark the home as published (REPO exists, REF pushed)",
    )
    p.add_argument("--check", action="store_true", help="only report disagreements")
    a = p.parse_args(argv)
    old_repo, old_ref, was_published = setting()
    if a.check:
        found = problems()
        for f in found:
            print(f)
        return 1 if found else 0
    repo, ref = a.repo or old_repo, a.ref or f"v{version()}"
    check_name(repo, ref)
    write_setting(repo, ref, a.published or (was_published and repo == old_repo))
    changed = 0
    for path in files():
        text = path.read_text()
        new = rewrite(text, repo, ref, old_repo)
        if new != text:
            path.write_text(new)
            changed += 1
    runpy.run_path(str(ROOT / "scripts" / "sync_notebooks.py"))["main"]([])
    print(f"home {repo} at {ref}: rewrote {changed} files")
    left = problems(repo, ref)
    for f in left:
        print(f)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
