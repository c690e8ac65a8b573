"""The README reads in five minutes and the documentation is one site with no broken link (issue #33 item 5).

The README keeps what the tool is, the two commands, the three everyday commands and a map of docs/; each
topic lives on its page in docs/, which `mkdocs build --strict` builds (mkdocs.yml: a broken link, a
missing anchor or a page left out of the nav is a warning, and strict mode fails on a warning).
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: The quick start: install and run the demo; install and run the tests (.ci/run runs the second as CI).
DEMO = "python3 -m venv .venv && . .venv/bin/activate && pip install . && servecal demo"
TESTS = "python3 -m venv .venv && . .venv/bin/activate && pip install '.[test,ray]' && python -m pytest -q"


def _links(text: str) -> list[str]:
    """The targets of the Markdown links of ``text`` outside code blocks and code spans."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return re.findall(r"\]\(([^)\s]+)\)", prose)


def _github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_site_builds_with_no_warning(tmp_path):
    build = ["build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")]
    res = subprocess.run([sys.executable, "-m", "mkdocs", *build], capture_output=True, text=True, cwd=ROOT)
    output = res.stdout + res.stderr
    assert "No module named mkdocs" not in output, "mkdocs is a test dependency: pip install '.[test]'"
    assert res.returncode == 0 and "WARNING" not in output, output
    for page in ("index.html", "commands/index.html", "importers/index.html", "bands/index.html"):
        assert (tmp_path / "site" / page).exists(), page


def test_the_readme_is_under_250_lines():
    assert len(README.read_text().splitlines()) < 250


def test_the_readme_opens_with_the_two_commands_ci_runs():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    assert first_block.splitlines() == [DEMO, TESTS]
    assert TESTS.replace("pip install ", "pip install -q ") in (ROOT / ".ci" / "run").read_text()


def test_every_relative_link_of_the_readme_points_at_a_file_and_heading():
    links = [t for t in _links(README.read_text()) if not re.match(r"[a-z]+:", t)]
    assert len(links) >= 15
    for target in links:
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        assert file.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
            assert anchor in {_github_anchor(h) for h in headings}, target


def test_the_readme_maps_every_page_of_the_docs():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(README.read_text())}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages and [p.name for p in pages if p.resolve() not in linked] == []
