"""README.md and docs/*.md: every relative link resolves, and the README's validation summary states docs' figures.

The long-form text moved from README.md to docs/ in the eleventh session; the README points into it with
``docs/FILE.md#anchor`` links. An anchor is GitHub's slug of a heading (lower case, every character that is not a
letter, digit, space, hyphen or underscore dropped, spaces turned into hyphens, ``-1``, ``-2`` ... appended to
repeated slugs), so renaming a heading without its links fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"\]\(([^)\s]+)\)")
NUMBER = re.compile(r"\d[\d,.]*\d%?|\d%?")


def _without_code(text: str) -> str:
    """The text outside fenced code blocks (a '# comment' in a bash block is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markdown emphasis and code marks dropped with the punctuation)."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and underscores, any script
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6} +(.+?) *#*$", _without_code(path.read_text()), flags=re.M):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_follows_githubs_rules():
    assert slug("clustersim --help and start-up cost") == "clustersim---help-and-start-up-cost"
    assert slug("Real `torch.distributed` runs") == "real-torchdistributed-runs"
    assert slug("clustersim calibrate, validate-runs and compare") == "clustersim-calibrate-validate-runs-and-compare"
    assert slug("Convolutional networks (`cnn_dle`, `cnn_lambda`)") == "convolutional-networks-cnn_dle-cnn_lambda"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert DOCS, "docs/*.md is missing"
    broken = []
    for target in LINK.findall(_without_code(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no file {path.relative_to(ROOT)}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, broken


def test_the_readme_points_into_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert [d.name for d in DOCS if f"docs/{d.name}" not in readme] == []


def test_readme_validation_summary_states_docs_figures():
    # the README's "How far off it is" is a summary of docs/validation.md: a figure there that docs no longer
    # gives (it moved and the summary did not) fails here
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## How far off it is\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| validation set")]
    assert len(rows) >= 15, "the README's validation summary table is missing"
    lines = (ROOT / "docs" / "validation.md").read_text().splitlines()
    missing = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        # the held-out count and the error cell: every number of both on one line of docs/validation.md (the
        # table row or sentence that states them), so one figure changed there and not here fails
        figures = NUMBER.findall(cells[1]) + NUMBER.findall(cells[2])
        assert figures, row
        if not any(all(re.search(rf"(?<![\d.,]){re.escape(f)}(?!\d|[.,]\d)", line) for f in figures)
                   for line in lines):
            missing.append((cells[0], figures))
    assert not missing, missing


def test_readme_quickstart_is_the_default_runs_output():
    # the README shows `clustersim simulate`'s output as printed: a change to the default or to its figures that
    # leaves the README behind fails here
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```text\n\$ clustersim simulate\n(.+?)\n```", readme, re.S)
    assert block, "the README's quickstart output block is missing"
    shown = block.group(1).splitlines()
    done = subprocess.run([sys.executable, "-m", "simulator", "simulate"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert len(shown) >= 30 and printed[:len(shown)] == shown
    assert printed[len(shown)].startswith("  WARNING:")  # what the README says it cut
