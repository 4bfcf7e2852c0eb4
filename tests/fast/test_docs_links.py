"""The README and docs/ hold together: every relative link reaches a file or folder of the
checkout, every #anchor a heading of its page, and the README links every docs/ page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

DOCS = REPO / "docs"
PAGES = sorted([REPO / "README.md", *DOCS.glob("*.md"), *(REPO / "infra").rglob("README.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The page without its code blocks: what a reader sees as text, where links are links."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """The #anchors GitHub gives the page's headings: lowercase, punctuation dropped (backticks
    too), spaces as dashes, a repeated one numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(_prose(page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", _prose(page.read_text(encoding="utf-8")))
    return [target for target in LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto:


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The page's relative links that reach no file or folder under `root`, or no heading."""
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or root.resolve() not in (dest, *dest.parents):
            broken.append(f"{target}: no such file in the checkout")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


def test_the_slugs_are_githubs():
    assert "train---down-the-tpu-deletes-itself" in anchors(DOCS / "google-cloud.md")
    assert "data-on-gs" in anchors(DOCS / "google-cloud.md")  # "Data on `gs://`"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_links_every_docs_page():
    linked = {(REPO / target.partition("#")[0]).resolve() for target in links(REPO / "README.md")}
    missing = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not missing, f"README.md's 'Where to read more' does not link {missing}"


def test_a_link_to_a_missing_page_or_heading_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `tpuctl` heading\n\n[ok](#a-tpuctl-heading) [gone](#nowhere) "
                    "[file](missing.md) `[not a link](x.md)`\n\n```\n[nor](y.md)\n```\n")
    assert links(page) == ["#a-tpuctl-heading", "#nowhere", "missing.md"]
    assert anchors(page) == {"a-tpuctl-heading"}
    assert broken_links(page, root=tmp_path) == [
        "#nowhere: no heading #nowhere in page.md", "missing.md: no such file in the checkout"]
