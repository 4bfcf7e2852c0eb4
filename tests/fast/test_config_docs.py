"""docs/config.md names every key the run config takes, in its section's part of the page, and
the README's guide names the engine key: a key the schema gains is a key a user can find."""

from __future__ import annotations

import re

from payload.config import CLUSTERS, RunConfig
from tests.support.paths import REPO

CONFIG_DOC = REPO / "docs" / "config.md"


def parts() -> dict[str, str]:
    """docs/config.md by its `## ` headings: the heading's first code span (a section's name)
    or its words, to the text under it."""
    out = {}
    for chunk in re.split(r"^## ", CONFIG_DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
        heading, _, body = chunk.partition("\n")
        name = re.search(r"`([^`]+)`", heading)
        out[name.group(1) if name else heading.strip()] = body
    return out


def undocumented() -> list[str]:
    doc = parts()
    sections = {name: field.annotation for name, field in RunConfig.model_fields.items()
                if name != "cluster" and hasattr(field.annotation, "model_fields")}
    missing = [f"{name} (top level)" for name in RunConfig.model_fields
               if f"`{name}`" not in doc["Top level"]]
    for section, model in sections.items():
        missing += [f"{section}.{key}" for key in model.model_fields
                    if f"`{key}`" not in doc.get(section, "")]
    for provider, model in CLUSTERS.items():
        if f"`{provider}`" not in doc["cluster"]:
            missing.append(f"cluster.provider: {provider}")
        missing += [f"cluster.{key} ({provider})" for key in model.model_fields
                    if f"`{key}`" not in doc["cluster"]]
    return missing


def test_every_config_key_is_in_docs_config_md_under_its_section():
    assert undocumented() == [], "add these keys to docs/config.md"


def test_the_engine_is_as_visible_as_the_family():
    doc = parts()
    assert "`engine`" in doc["train"] and "`family`" in doc["model"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    # The pipeline summary at the top names both engines; choosing one is a section of the
    # guide, not a chapter at the end of a reference; the reference lives in docs/.
    assert "TensorFlow" in readme[:1500] and "JAX" in readme[:1500]
    assert "`train.engine`" in readme
    assert readme[:readme.index("## Choosing an engine")].count("\n") < 150
    assert readme.count("\n") <= 300, "README.md is the guide: move reference to docs/"
    layout = (REPO / "docs" / "output-layout.md").read_text(encoding="utf-8")
    assert "ckpt-<step>.index" in layout and "Orbax step folders" in layout


def test_a_key_missing_from_the_page_is_named(monkeypatch, tmp_path):
    page = tmp_path / "config.md"
    page.write_text(CONFIG_DOC.read_text(encoding="utf-8").replace("| `eval_batches` |", "| |"))
    monkeypatch.setattr("tests.fast.test_config_docs.CONFIG_DOC", page)
    assert undocumented() == ["train.eval_batches"]
