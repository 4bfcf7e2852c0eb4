"""The README and docs/ speak of the project only: what it does and why, never which ticket made
it, and nothing a reader of the checkout cannot open (notes kept outside the repository)."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"),
                *(REPO / "infra").rglob("README.md")])
# A ticket of this project ("issue 28", "issues 27 and 28"); another project's is cited by its
# repository (huggingface/transformers#40028) and stays.
TICKET = re.compile(r"\bissues? \d+", re.IGNORECASE)
OUTSIDE = re.compile(r"/work/|CLOUD-FACTS|FINDINGS\.md")


def offending(text: str) -> list[str]:
    return [m.group(0) for pattern in (TICKET, OUTSIDE) for m in pattern.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_page_names_no_ticket_and_no_note_outside_the_checkout(page):
    assert offending(page.read_text(encoding="utf-8")) == []


def test_what_is_caught():
    assert offending("the gce route (issue 28), as CLOUD-FACTS §8 has it") == [
        "issue 28", "CLOUD-FACTS"]
    assert offending("see huggingface/transformers#40028 and pytorch/xla#5258") == []
