"""The run config: every bad value is one line naming the key; good files load resolved."""

from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app
from payload.config import dump_config, load_config, parse_config
from payload.core.errors import UserError
from tests.support.configs import base_config, write_config
from tests.support.paths import REPO

GOOD = base_config("out", "corpus.txt")


def error_for(mutate) -> str:
    raw = copy.deepcopy(GOOD)
    mutate(raw)
    with pytest.raises(UserError) as info:
        parse_config(raw)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("mutate", "needles"),
    [
        (lambda r: r["data"].update(colour="red"), ["unknown key 'data.colour'", "seq_len"]),
        (lambda r: r.update(extra=1), ["unknown key 'extra'"]),
        (lambda r: r["data"].update(seq_len=8), ["data.seq_len", "16"]),
        (lambda r: r["data"].update(seq_len=4096), ["data.seq_len=4096", "roberta", "512"]),
        (lambda r: r["model"].update(family="gpt2") or r["data"].update(seq_len=2048),
         ["gpt2", "1024"]),
        (lambda r: r["tokenizer"].update(kind="bpe", vocab_size=100), ["vocab_size=100", "261"]),
        (lambda r: r.update(model={**r["model"], "family": "t5"}) or r["tokenizer"].update(
            kind="unigram", vocab_size=120), ["vocab_size=120", "103 special tokens"]),
        (lambda r: r["tokenizer"].update(kind="char"), ["tokenizer.kind", "'unigram'", "'bpe'",
                                                         "'wordpiece'", "'sentencepiece'"]),
        (lambda r: r["data"].update(records_per_shard=0), ["data.records_per_shard",
                                                           "must be at least 1 (got 0)"]),
        (lambda r: r["data"].update(records_per_shard=-5), ["data.records_per_shard"]),
        (lambda r: r["data"].update(validation_fraction=1.0), ["data.validation_fraction"]),
        (lambda r: r["data"].update(document_split="page"), ["data.document_split", "'line'"]),
        (lambda r: r.update(cluster={"provider": "aws"}), ["cluster.provider", "local, ssh, gcp"]),
        (lambda r: r.update(cluster={"provider": "local", "workers": 0}), ["cluster.workers"]),
        (lambda r: r.update(cluster={"provider": "ssh", "hosts": ["a"], "known_hosts": "kh"}),
         ["cluster.user"]),
        (lambda r: r.update(cluster={"provider": "gcp", "project": "my-project",
                                     "zone": "us-central2-b", "accelerator_type": "a100"}),
         ["cluster.accelerator_type", "v4-8"]),
        (lambda r: r["model"].update(num_heads=3), ["num_heads=3", "hidden_size=32"]),
        (lambda r: r["train"].update(steps=0), ["train.steps"]),
        (lambda r: r["train"].update(learning_rate=0), ["train.learning_rate"]),
        (lambda r: r["train"].update(steps="many"), ["train.steps", "integer"]),
        (lambda r: r.update(name="My Run"), ["name", "lowercase"]),
        (lambda r: r.pop("model"), ["missing required key 'model'"]),
        (lambda r: r["train"].update(warmup_steps=50), ["warmup_steps=50", "steps=10"]),
    ],
)
def test_bad_values_are_one_line_naming_the_key(mutate, needles):
    message = error_for(mutate)
    for needle in needles:
        assert needle in message, message


def test_yaml_problems(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndata: [unclosed\n")
    with pytest.raises(UserError, match="line"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(UserError, match="empty"):
        load_config(empty)
    with pytest.raises(UserError, match="no config file"):
        load_config(tmp_path / "missing.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="mapping"):
        load_config(listy)


def test_paths_resolve_against_the_config_folder(tmp_path):
    raw = base_config("runs/out", "texts/*.txt", tokenizer={"path": "tok"})
    raw["data"]["corpus"].append("gs://bucket/more/*.txt")
    raw["data"]["corpus"].append("hf:someone/dataset")
    config = load_config(write_config(tmp_path / "run.yaml", raw))
    assert config.output_dir == str(tmp_path / "runs/out")
    assert config.data.corpus == [str(tmp_path / "texts/*.txt"), "gs://bucket/more/*.txt",
                                  "hf:someone/dataset"]
    assert config.tokenizer.path == str(tmp_path / "tok")
    # The resolved config round-trips: what was written is what ran.
    again = parse_config(yaml.safe_load(dump_config(config)))
    assert again == config


def test_config_is_frozen():
    config = parse_config(copy.deepcopy(GOOD))
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type is internal
        config.data.seq_len = 64  # type: ignore[misc]


def test_t5_records_are_longer_than_inputs():
    raw = copy.deepcopy(GOOD)
    raw["model"]["family"] = "t5"
    raw["tokenizer"]["vocab_size"] = 1000
    config = parse_config(raw)
    assert config.record_len > config.data.seq_len


def test_init_writes_a_starter_that_loads(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["init", str(tmp_path)])
    assert result.exit_code == 0, result.output
    config = load_config(tmp_path / "tpuctl.yaml")
    assert config.cluster.provider == "local"
    assert "#" in (tmp_path / "tpuctl.yaml").read_text()  # commented
    again = runner.invoke(app, ["init", str(tmp_path)])
    assert again.exit_code != 0
    assert isinstance(again.exception, UserError) and "already exists" in str(again.exception)
    assert runner.invoke(app, ["init", str(tmp_path), "--force"]).exit_code == 0


@pytest.mark.parametrize("provider", ["gcp", "gce"])
def test_the_starters_commented_cloud_providers_load(provider):
    """Issue 38, item 8: the starter names every provider; each cloud's commented block, taken
    as it is (the output_dir left to its default, JAX where gce needs it), is a config."""
    import re

    text = (REPO / "launcher" / "templates" / "tpuctl.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  # provider: {provider}"))
    block = []
    for line in lines[start:]:
        if not re.match(r"  # [a-z_]+: ", line) or (block and "provider:" in line):
            break
        block.append(line.removeprefix("  # "))
    raw = yaml.safe_load(text)
    raw["cluster"] = yaml.safe_load("\n".join(block))
    del raw["output_dir"]
    if provider == "gce":
        raw["train"]["engine"] = "jax"
    config = parse_config(raw)
    assert config.cluster.provider == provider and config.output_dir.startswith("gs://")


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_init_never_writes_through_a_link_named_tpuctl_yaml(tmp_path, force):
    folder, elsewhere = tmp_path / "run", tmp_path / "elsewhere.yaml"
    folder.mkdir()
    (folder / "tpuctl.yaml").symlink_to(elsewhere)  # dangling: exists() says False
    result = CliRunner().invoke(app, ["init", str(folder), *force])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError) and "symbolic link" in str(result.exception)
    assert not elsewhere.exists(), "init wrote through the link"
    elsewhere.write_text("the user's own file\n")  # a live link: not overwritten either
    assert CliRunner().invoke(app, ["init", str(folder), *force]).exit_code != 0
    assert elsewhere.read_text() == "the user's own file\n"


def test_demo_config_is_valid():
    config = load_config(REPO / "examples" / "demo.yaml")
    assert config.output_dir.startswith(str(REPO))


def _problems_of(raw: dict) -> list[str]:
    with pytest.raises(UserError) as info:
        parse_config(raw)
    return str(info.value).splitlines()


def test_every_problem_is_reported_at_once_most_fundamental_first():
    """Issue 18: a v6e-8 in us-central2-b is refused for its route and its zone in one round,
    and a bad value elsewhere comes with them; each problem is one line."""
    raw = copy.deepcopy(GOOD)
    raw["cluster"] = {"provider": "gcp", "project": "my-project", "zone": "us-central2-b",
                      "accelerator_type": "v6e-8"}
    raw["train"]["batch_size"] = 0
    lines = _problems_of(raw)
    assert len(lines) == 3, lines
    assert "cluster.accelerator_type" in lines[0] and "no working route on TPU v6e" in lines[0]
    assert "cluster.zone" in lines[1] and "us-central2-b does not offer v6e-8" in lines[1]
    assert lines[2] == "config: train.batch_size must be at least 1 (got 0)"


def test_checks_across_sections_still_run_when_a_section_is_bad():
    raw = copy.deepcopy(GOOD)
    raw["model"]["num_heads"] = 3  # the model section is bad on its own
    raw["train"].update(warmup_steps=50, steps=10)  # and train is wrong with itself
    raw["data"]["colour"] = "red"  # and a key is unknown
    lines = _problems_of(raw)
    assert "unknown key 'data.colour'" in lines[0], lines
    assert any("num_heads=3" in line for line in lines), lines
    assert "warmup_steps=50 is more than train.steps=10" in lines[-1], lines
    assert len(lines) == 3, lines


def test_a_mistyped_key_is_not_also_reported_missing():
    raw = copy.deepcopy(GOOD)
    raw["trian"] = raw.pop("train")
    raw["data"]["seq_len"] = 4
    lines = _problems_of(raw)
    assert "unknown key 'trian'" in lines[0] and "did you mean 'train'" in lines[0], lines
    assert not any("missing required key 'train'" in line for line in lines), lines
    assert any("data.seq_len must be at least 16 (got 4)" in line for line in lines), lines


@pytest.mark.parametrize(("key", "value", "wording"), [
    ("batch_size", 0, "train.batch_size must be at least 1 (got 0)"),
    ("steps", "many", "train.steps must be a whole number (an integer) (got 'many')"),
    ("learning_rate", -1, "train.learning_rate must be more than 0.0 (got -1)"),
    ("bf16", "perhaps", "train.bf16 must be true or false (got 'perhaps')"),
])
def test_values_are_refused_in_the_projects_words(key, value, wording):
    message = error_for(lambda r: r["train"].update({key: value}))
    assert message == f"config: {wording}", message
    assert "Input should" not in message


_CLUSTERS = {
    "local": {"provider": "local"},
    "ssh": {"provider": "ssh", "hosts": ["w1"], "user": "me", "known_hosts": "kh"},
    "gcp": {"provider": "gcp", "project": "my-project", "zone": "us-central2-b",
            "accelerator_type": "v4-8"},
    "gce": {"provider": "gce", "project": "my-project", "zone": "us-east5-b",
            "machine_type": "ct6e-standard-4t", "topology": "2x4"},
}


def _numeric_keys() -> list[tuple[str, str, str]]:
    """(provider, section, key) for every key of every section that takes a number."""
    from typing import get_args

    from payload.config import CLUSTERS, RunConfig

    found = []
    for provider, kind in CLUSTERS.items():
        sections = [("cluster", kind)] + [(name, info.annotation) for name, info in
                                           RunConfig.model_fields.items()
                                           if name not in ("cluster",) and provider == "local"
                                           and hasattr(info.annotation, "model_fields")]
        for section, model in sections:
            for key, info in model.model_fields.items():
                kinds = set(get_args(info.annotation)) or {info.annotation}
                if kinds & {int, float} and bool not in kinds:
                    found.append((provider, section, key))
    return found


@pytest.mark.parametrize(("provider", "section", "key"), _numeric_keys(),
                         ids=lambda part: str(part))
@pytest.mark.parametrize("value", [True, False])
def test_no_key_that_takes_a_number_takes_true_or_false(provider, section, key, value):
    """Issue 32, item 5: YAML's true and false are refused wherever a number is wanted (lax
    parsing took `port: true` as port 1), on every provider's section and every other one."""
    raw = copy.deepcopy(GOOD)
    raw["cluster"] = dict(_CLUSTERS[provider])
    raw["train"]["engine"] = "jax"
    raw[section] = {**raw[section], key: value}
    lines = _problems_of(raw)
    assert any(line.startswith(f"config: {section}.{key} must be a ") and "number" in line
               and line.endswith(f"(got {value})") for line in lines), lines


def test_the_table_of_numeric_keys_is_whole():
    keys = {(section, key) for _, section, key in _numeric_keys()}
    assert {("cluster", "port"), ("cluster", "workers"), ("train", "batch_size"),
            ("cluster", "max_run_hours"), ("data", "seq_len"), ("train", "seed")} <= keys


def _corpus(*entries):
    return lambda r: r["data"].update(corpus=list(entries))


@pytest.mark.parametrize(
    ("mutate", "needles"),
    [
        (_corpus("a.txt", {"path": "b.txt", "weight": -0.5}), ["data.corpus.1.weight", "at least 0"]),
        (_corpus({"path": "b.txt", "weight": 0}), ["data.corpus", "every weight is 0"]),
        (_corpus({"path": "a.txt", "weight": 0}, {"path": "b.txt", "weight": 0.0}),
         ["every weight is 0"]),
        (_corpus({"path": "b.txt", "weight": "0.5"}), ["data.corpus.0.weight", "number"]),
        (_corpus({"path": "b.txt", "weight": "much"}), ["data.corpus.0.weight", "number"]),
        (_corpus({"path": "b.txt", "weight": True}), ["data.corpus.0.weight", "number"]),
        (_corpus({"path": "b.txt", "weight": float("nan")}), ["data.corpus.0.weight", "finite"]),
        (_corpus({"path": "b.txt", "weight": float("inf")}), ["data.corpus.0.weight", "finite"]),
        (_corpus({"path": "b.txt", "weight": 1, "wieght": 2}),
         ["unknown key 'data.corpus.0.wieght'", "path, weight"]),
        (_corpus({"weight": 1}), ["missing required key 'data.corpus.0.path'"]),
        (_corpus({"path": "b.txt"}), ["missing required key 'data.corpus.0.weight'"]),
        (_corpus("a.txt", {"path": "a.txt", "weight": 2}), ["'a.txt' is named twice"]),
        (_corpus({"path": "gs://b/x/*.txt", "weight": 1}, {"path": "gs://b/x/*.txt", "weight": 1}),
         ["named twice"]),
    ],
)
def test_a_bad_weighted_corpus_entry_is_one_line(mutate, needles):
    message = error_for(mutate)
    for needle in needles:
        assert needle in message, message
    assert "plain" not in message and "weighted" not in message  # pydantic's union tags


def test_plain_entries_pool_into_one_source_beside_weighted_ones(tmp_path):
    raw = base_config("out", ["web/*.txt", "books.txt"])
    raw["data"]["corpus"].insert(1, {"path": "code.txt", "weight": 0.25})
    raw["data"]["corpus"].append({"path": "hf:someone/math", "weight": 0})
    config = load_config(write_config(tmp_path / "run.yaml", raw))
    assert [(s.name, s.paths, s.weight) for s in config.data.sources] == [
        ("", (str(tmp_path / "web/*.txt"), str(tmp_path / "books.txt")), 1.0),
        (str(tmp_path / "code.txt"), (str(tmp_path / "code.txt"),), 0.25),
        ("hf:someone/math", ("hf:someone/math",), 0.0)]
    assert config.data.paths == [str(tmp_path / "web/*.txt"), str(tmp_path / "code.txt"),
                                 str(tmp_path / "books.txt"), "hf:someone/math"]
    assert parse_config(yaml.safe_load(dump_config(config))) == config
    single = load_config(write_config(tmp_path / "one.yaml", {
        **raw, "data": {**raw["data"], "corpus": {"path": "code.txt", "weight": 3}}}))
    assert [s.name for s in single.data.sources] == [str(tmp_path / "code.txt")]


def test_the_reports_name_corpus_entries_as_the_config_wrote_them(tmp_path):
    """metrics.json's examples_per_source keys (DataConfig.source_name): relative paths as
    written, also in the copy of the config the workers read (dump_config, loaded again)."""
    raw = base_config("out", ["texts/a.txt", "~/b.txt"])
    raw["data"]["corpus"].append({"path": "texts/code/*.py", "weight": 0.5})
    config = load_config(write_config(tmp_path / "run.yaml", raw))
    assert config.data.paths[0] == str(tmp_path / "texts" / "a.txt")
    assert config.data.source_name("") == "texts/a.txt + ~/b.txt"
    assert config.data.source_name(str(tmp_path / "texts/code/*.py")) == "texts/code/*.py"
    shipped = load_config(write_config(tmp_path / "job" / "config.yaml",
                                       yaml.safe_load(dump_config(config))))
    assert shipped.data.corpus_names == config.data.corpus_names
    assert shipped.data.source_name("") == "texts/a.txt + ~/b.txt"
    raw["data"]["corpus_names"] = "texts"  # not a mapping: refused, not replaced
    with pytest.raises(UserError, match=r"data\.corpus_names must be a mapping"):
        load_config(write_config(tmp_path / "bad.yaml", raw))
