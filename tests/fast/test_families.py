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


def test_the_tensorflow_engine_refuses_llama_in_one_line_and_starts_nothing(tmp_path,
                                                                             tpuctl_home):
    """transformers has no TensorFlow Llama: the config check names the JAX engine before
    anything runs; with the JAX engine the same config plans a run."""
    import yaml
    from typer.testing import CliRunner

    from launcher.cli import app

    (tmp_path / "corpus.txt").write_text("".join(f"line {i} of the corpus\n" for i in range(8)))
    raw = {"name": "t", "output_dir": str(tmp_path / "out"),
           "cluster": {"provider": "local", "workers": 2},
           "data": {"corpus": str(tmp_path / "corpus.txt")},
           "tokenizer": {"kind": "bpe", "vocab_size": 300},
           "model": {"family": "llama", "size": "tiny"},
           "train": {"engine": "tensorflow", "steps": 4, "batch_size": 4, "learning_rate": 1e-3}}
    config = tmp_path / "tpuctl.yaml"
    config.write_text(yaml.safe_dump(raw))
    refused = CliRunner().invoke(app, ["train", "--local", "-c", str(config)])
    # (The real entry point makes this one line, exit 2: tests/fast/test_bad_inputs.py.)
    message = str(refused.exception)
    assert "model.family: llama trains on the jax engine only" in message, refused.output
    assert "set train.engine: jax" in message and "\n" not in message.strip()
    assert not (tmp_path / "out").exists()
    planned = CliRunner().invoke(app, ["train", "--local", "--dry-run", "--engine", "jax",
                                       "-c", str(config)])
    assert planned.exit_code == 0, planned.output
    assert "engine: jax" in planned.output.splitlines()


def test_llama_shape_keys_take_grouped_heads_and_other_families_refuse_them():
    from payload.config import ModelConfig, parse_config
    from payload.core.errors import UserError

    model = ModelConfig(family="llama", hidden_size=64, num_heads=4, num_kv_heads=1,
                        tie_embeddings=False)
    arch = FAMILIES["llama"].transformers_config(model, vocab_size=100, seq_len=64)
    assert (arch["num_attention_heads"], arch["num_key_value_heads"]) == (4, 1)
    assert arch["tie_word_embeddings"] is False
    # q and o 64x64, k and v 64x16, SwiGLU 3 x 64x1024, two norms; final norm; 2 x 100x64.
    assert FAMILIES["llama"].count(arch).total == (
        4 * (2 * 64 * 64 + 2 * 64 * 16 + 3 * 64 * 1024 + 2 * 64) + 64 + 2 * 100 * 64)
    raw = {"name": "t", "output_dir": "out", "cluster": {"provider": "local"},
           "data": {"corpus": "c.txt"}, "tokenizer": {"kind": "bpe", "vocab_size": 300},
           "train": {"engine": "jax", "steps": 4, "batch_size": 4, "learning_rate": 1e-3}}
    with pytest.raises(UserError, match=r"num_kv_heads=3 does not divide model.num_heads=4"):
        parse_config({**raw, "model": {"family": "llama", "num_kv_heads": 3}})
    with pytest.raises(UserError, match=r"model.num_kv_heads is a setting of family llama, "
                                        r"not gpt2"):
        parse_config({**raw, "model": {"family": "gpt2", "num_kv_heads": 2}})
    with pytest.raises(UserError, match=r"model.size and model.num_kv_heads both describe"):
        parse_config({**raw, "model": {"family": "llama", "size": "tiny", "num_kv_heads": 2}})
