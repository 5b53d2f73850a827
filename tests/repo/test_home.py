"""The course's home is one setting (memlab/course/home.py): every badge, link and clone cell agrees
with it, and scripts/set_home.py moves all of them to a new home in one go. Pictures depend on no
home (each notebook carries its own): moving the home leaves them inside the notebooks."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib


from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[2]
set_home = load_file("scripts/set_home.py")

from memlab.course import home


def test_every_badge_link_and_clone_cell_agrees_with_the_setting():
    assert set_home.setting() == (home.REPO, home.REF, home.PUBLISHED)
    assert set_home.problems() == []


def test_the_notebooks_belong_to_this_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert home.REF == f"v{version}", "after a version bump: python scripts/set_home.py"


def test_the_check_catches_a_stray_link(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(
        f"[x]({home.colab_url('chapters/00_orientation.ipynb', ref='main')})\n"
        f"[y]({home.colab_url('chapters/01_request_table.ipynb', repo='someone/memlab')})\n"
        f"clone https://github.com/old-owner/{home.REPO.split('/')[1]}\n"
        f"[g]({home.github_url('chapters/glossary.md', ref='v0.0.1')})\n"
    )
    monkeypatch.setattr(set_home, "files", lambda: [readme])
    monkeypatch.setattr(set_home, "notebooks", lambda: [])
    monkeypatch.setattr(set_home, "ROOT", tmp_path)
    found = set_home.problems()
    assert len(found) == 4, found
    assert (
        "at main" in found[0]
        and "someone/memlab" in found[1]
        and "GitHub link" in found[2]
        and "v0.0.1" in found[2]
    )
    assert "old-owner" in found[3]


def test_rewrite_moves_links_and_mentions_but_not_other_repositories():
    old = (
        f"see https://github.com/{home.REPO} or `{home.REPO}`; "
        f"not https://github.com/{home.REPO}-extra nor x{home.REPO}"
    )
    new = set_home.rewrite(old, "alice/kv", "v1", home.REPO)
    assert (
        new == "see https://github.com/alice/kv or `alice/kv`; "
        f"not https://github.com/{home.REPO}-extra nor x{home.REPO}"
    )


def test_publishing_under_a_new_home_rewrites_everything(tmp_path):
    # A copy of what the script touches, so the script runs on it as on the real checkout.
    for rel in (
        "memlab/course/home.py",
        "README.md",
        "chapters/README.md",
        "pyproject.toml",
        "scripts/set_home.py",
        "scripts/sync_notebooks.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copytree(ROOT / "chapters" / "py", tmp_path / "chapters" / "py")
    # the notebooks carry them
    shutil.copytree(ROOT / "chapters" / "img", tmp_path / "chapters" / "img")
    for nb in (ROOT / "chapters").glob("*.ipynb"):
        shutil.copy(nb, tmp_path / "chapters" / nb.name)
    script = tmp_path / "scripts" / "set_home.py"

    def run(*args):
        return subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = run("alice/kv-course", "--ref", "v9.9", "--published")
    assert r.returncode == 0, r.stdout + r.stderr
    assert run("--check").returncode == 0
    touched = [
        tmp_path / "README.md",
        tmp_path / "chapters" / "README.md",
        *(tmp_path / "chapters").glob("*.ipynb"),
        *(tmp_path / "chapters" / "py").glob("*.py"),
    ]
    for f in touched:
        text = f.read_text()
        assert home.REPO not in text and f"/{home.REF}/" not in text, (
            f"{f.name} still names the old home"
        )
    nb = (tmp_path / "chapters" / "04_alloc_extend.ipynb").read_text()
    assert (
        "https://colab.research.google.com/github/alice/kv-course/blob/v9.9/chapters/04_alloc_extend.ipynb"
        in nb
    )
    # pictures stay inside
    assert "raw.githubusercontent.com" not in nb and "](data:image/png;base64," in nb
    ch00 = (tmp_path / "chapters" / "py" / "00_orientation.py").read_text()
    # Colab's glossary link
    assert "https://github.com/alice/kv-course/blob/v9.9/chapters/glossary.md" in ch00
    assert 'HOME, REF = \\"alice/kv-course\\", \\"v9.9\\"' in nb
    setting = (tmp_path / "memlab" / "course" / "home.py").read_text()
    assert (
        re.search(r'^REPO = "alice/kv-course"$', setting, re.M)
        and 'REF = "v9.9"' in setting
    )
    assert "PUBLISHED = True" in setting
    bad = run("alice/kv-course", "--ref", "0123456789abcdef0123456789abcdef01234567")
    assert bad.returncode != 0 and "looks like a commit id" in bad.stderr
    assert run("not a repo").returncode != 0
