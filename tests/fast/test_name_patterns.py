"""Every pattern that checks a whole name (a config value, a file tpuctl wrote) ends where the text
ends (issue 27, item 6): Python's `$` also matches before a final newline, so `my-project\\n`
passed as a project id and `ckpt-1.index\\n` as a checkpoint file of tpuctl's own. In process:
the patterns themselves, and a read of the source for any that ends in `$`."""

from __future__ import annotations

import ast

import pytest

from payload.config import clusters, run, sections
from payload.core import ownership
from payload.core.engines import JaxSpec, TensorFlowSpec
from payload.data import shards
from payload.training import checkpoints
from tests.support.paths import REPO

SOURCES = ("launcher", "payload", "scripts", "bench")


PATTERNS = [
    (clusters._PROJECT, "my-project"), (clusters._ZONE, "us-east5-b"),
    (clusters._NETWORK, "default"), (clusters._SUBNETWORK, "my-subnet"),
    (clusters.TPU_NAME, "tpu"), (clusters._BUCKET, "my-bucket"), (run.RUN_NAME, "t"),
    (clusters._HOST, "10.0.0.2"), (sections.HUB_REPO, "me/model"),
    (clusters._COMPUTE_RESERVATION, "mine"), (clusters._IMAGE, "global/images/family/mine"),
    (clusters._RESERVATION, "projects/my-project/locations/us-east5-b/reservations/r"),
    (ownership._WORKER_LOG, "worker-0.log"), (shards._PREPARED, "parts/worker-00000of00002.json"),
    (JaxSpec._STEP, "12"), (JaxSpec._WRITTEN, "12/default/manifest.ocdbt"),
    (TensorFlowSpec._WRITTEN, "ckpt-1.index"), (checkpoints._OWN, "run.json"),
]


@pytest.mark.parametrize(("pattern", "name"), PATTERNS, ids=[name for _, name in PATTERNS])
def test_a_name_with_a_newline_at_its_end_is_another_name(pattern, name):
    assert pattern.match(name)
    assert not pattern.match(name + "\n")


def _tail(node: ast.expr) -> str | None:
    """The literal text a pattern expression ends with, where the source shows it."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _tail(node.values[-1])
    if isinstance(node, ast.BinOp):
        return _tail(node.right)
    return None


def test_no_pattern_in_the_code_ends_in_a_dollar():
    found = []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                        and node.func.attr in ("compile", "match", "search") and node.args):
                    tail = _tail(node.args[0])
                    if tail is not None and tail.endswith("$"):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == [], "use \\Z or fullmatch: " + ", ".join(found)
