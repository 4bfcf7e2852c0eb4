"""A family is one module (payload.core.families.<name>): read from the AST of every module of
payload/ and launcher/, nothing outside the families' own modules and the engines' model files
compares a family's name or keeps a table keyed by one; and every family's module gives what
the rest of tpuctl asks of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from payload.core.families import FAMILIES, family_of
from tests.support.paths import REPO

# Where a family's name may be branched on: its own module, and each engine's model files.
OWN = ("payload/core/families/", "payload/engines/jax/models/", "payload/engines/tensorflow/model.py")
NAMES = set(FAMILIES)


def _names_in(node: ast.AST) -> set[str]:
    """The family names a node spells out: a string, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def family_branches(source: str) -> list[tuple[int, str]]:
    """(line, family names) of each comparison with a family's name, and each dict literal
    keyed by one, in a module's source.

    >>> family_branches('if kind in ("bert", "gpt2"): pass')
    [(1, 'bert, gpt2')]
    >>> family_branches('table = {"t5": 1}; ok = spec.objective == "clm"')
    [(1, 't5')]
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        spelled: set[str] = set()
        if isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            for side in (node.left, *node.comparators):
                spelled |= _names_in(side)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if key is not None:
                    spelled |= _names_in(key)
        if spelled:
            found.append((node.lineno, ", ".join(sorted(spelled))))
    return found


def _modules() -> list[Path]:
    return sorted([*(REPO / "payload").rglob("*.py"), *(REPO / "launcher").rglob("*.py")])


def test_no_module_outside_a_family_branches_on_its_name():
    found = []
    for path in _modules():
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(OWN):
            continue
        found += [f"{relative}:{line}: {names}"
                  for line, names in family_branches(path.read_text("utf-8"))]
    assert not found, ("branch on a family's name outside payload/core/families/ (ask the "
                       "family's spec instead):\n" + "\n".join(found))


@pytest.mark.parametrize("source, expected", [
    ('if family == "t5": pass', [(1, "t5")]),
    ('if c["model_type"] != "gpt2": pass', [(1, "gpt2")]),
    ('x = kind not in ["bert", "roberta"]', [(1, "bert, roberta")]),
    ('_SAME_AS = {"roberta": "bert"}', [(1, "roberta")]),
    ('if objective == "mlm": pass', []),
    ('spec = FAMILIES["gpt2"]', []),  # a look-up in the registry is asking it
])
def test_the_rule_sees_comparisons_and_tables(source, expected):
    assert family_branches(source) == expected


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_gives_what_is_asked_of_it(name):
    spec = FAMILIES[name]
    assert spec.name == name and spec.sizes and spec.engines
    for size, shape in spec.sizes.items():
        model = _Model(family=name, size=size)
        arch = spec.transformers_config(model, vocab_size=1000, seq_len=128)
        assert family_of(arch) is spec
        count = spec.count(arch)
        assert count.total > count.embeddings > 0
        assert spec.dims(arch).width == shape.hidden_size
        target = spec.target_len(model, 128)
        assert spec.flops(arch, 128, spec.predicted_len(128, target_len=target)).total > 0
        assert spec.attention_sites(arch, 128, target)
        assert spec.record_len(model, 128) >= 128
        spec.shape_check(spec, arch, seq_len=128, what="x")


class _Model:
    """The model section's keys a family reads, at their defaults."""

    def __init__(self, **keys):
        self.__dict__.update(dict(
            size=None, dropout=0.1, attention_dropout=None, mlm_probability=0.15,
            noise_density=0.15, mean_noise_span_length=3.0, num_kv_heads=None,
            tie_embeddings=None, hidden_size=None, num_layers=None, num_heads=None,
            intermediate_size=None), **keys)
