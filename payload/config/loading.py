"""The run config from its YAML file, and every problem in it worded for people.

    config = load_config("tpuctl.yaml", engine="jax")      # --engine over the file's
    config = parse_config(raw, base_dir=Path("."), source="tpuctl.yaml")
    text = dump_config(config)                             # what actually ran, defaults in

A key given twice is refused (plain YAML keeps the last); relative local paths are resolved
against the file's folder; pydantic's errors become the project's one-line problems, the most
fundamental first, and the checks across sections run on the valid sections even when another
section failed, so nothing is left for a second round.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from payload.config.base import UNPARSED, EngineName, Problems, Section, partial
from payload.config.clusters import CLUSTERS
from payload.config.run import RunConfig
from payload.config.sections import CORPUS_TAGS, HubConfig
from payload.core import reading
from payload.core.errors import UserError, UserErrors


def _unreached(raw: dict, errors: list[dict]) -> list[dict]:
    """What the checks pydantic did not reach find, as errors located as its own are: a key
    that failed leaves its section's checks and those across sections unrun, so each failed
    section is rebuilt from the keys that parsed (payload.config.base.partial) and its checks
    run, then the checks across sections on the config they make."""
    context = _context(raw)
    failed: dict[str, set[str]] = {}
    for error in errors:
        key, *inner = error["loc"]
        keys = [p for p in inner if not (isinstance(p, str) and ("[" in p or p in CLUSTERS))]
        failed.setdefault(key, set()).update(keys[:1] if keys and isinstance(keys[0], str)
                                             else ())
    found, values = [], {}
    for key, keys in failed.items():
        kind = _section_kind(key, raw)
        section = (partial(kind, raw[key], keys, context)
                   if kind is not None and isinstance(raw.get(key), dict) else None)
        values[key] = UNPARSED if section is None else section
        if section is not None and keys:  # its checks did not run: a key of it failed
            found += [_located((key,), line) for line in section.problems()]
    config = partial(RunConfig, {**raw, **values}, set(), context)
    if config is not None:
        found += [_located((), line) for line in config.problems()]
    return found


def _section_kind(key: str, raw: dict) -> type[Section] | None:
    """The section class of a top-level key (the provider's, for cluster); None for a plain
    key or a provider that is not one."""
    if key == "cluster":
        cluster = raw.get("cluster")
        provider = cluster.get("provider") if isinstance(cluster, dict) else None
        return CLUSTERS.get(provider) if isinstance(provider, str) else None
    info = RunConfig.model_fields.get(key)
    kind = info.annotation if info is not None else None
    return kind if isinstance(kind, type) and issubclass(kind, Section) else None


def _located(loc: tuple, line: str) -> dict:
    return {"type": "value_error", "loc": loc, "msg": line, "input": None}


def _field_name(loc: tuple) -> str:
    # Drop pydantic's union tags (e.g. "local", "function-after[...]") from the location.
    parts = [str(p) for p in loc if not (isinstance(p, str) and (
        "[" in p or p in CLUSTERS or p in CORPUS_TAGS))]
    return ".".join(parts)


def _bound(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


# Pydantic's own wording ("Input should be greater than 0") in the project's words.
_WORDING = {
    "greater_than": lambda c: (f"at least {c['gt'] + 1}" if isinstance(c["gt"], int)
                               else f"more than {c['gt']}"),
    "greater_than_equal": lambda c: f"at least {_bound(c['ge'])}",
    "less_than": lambda c: f"less than {_bound(c['lt'])}",
    "less_than_equal": lambda c: f"at most {_bound(c['le'])}",
    "int_parsing": lambda c: "a whole number (an integer)",
    "int_type": lambda c: "a whole number (an integer)",
    "int_from_float": lambda c: "a whole number (an integer)",
    "float_parsing": lambda c: "a number",
    "float_type": lambda c: "a number",
    "bool_parsing": lambda c: "true or false",
    "bool_type": lambda c: "true or false",
    "string_type": lambda c: "text",
    "literal_error": lambda c: f"one of {c.get('expected', '')}",
    "list_type": lambda c: "a list",
    "too_short": lambda c: (f"a list of at least {c.get('min_length', 1)} entries"
                            if c.get("min_length", 1) != 1 else "a list of at least one entry"),
    "too_long": lambda c: f"a list of at most {c.get('max_length', '?')} entries",
    "model_type": lambda c: "a mapping of keys (a section)",
    "model_attributes_type": lambda c: "a mapping of keys (a section)",
    "dict_type": lambda c: "a mapping of keys",
}


def _describe(error: dict, model: type[BaseModel]) -> str:
    where = _field_name(error["loc"])
    kind = error["type"]
    message = error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        section = _section_for(model, error["loc"][:-1])
        fields = list(section.model_fields) if section else []
        close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1, cutoff=0.75)
        home = None if close else _home_of(str(error["loc"][-1]), model)
        key = error["loc"][-1]
        belongs = (f"{key} belongs in {home.split('.')[0]}" if home and "." in home
                   else f"{key} is a top-level key")
        guess = (f"did you mean '{close[0]}'? " if close
                 else f"{belongs}: did you mean '{home}'? " if home else "")
        allowed = f"allowed here: {', '.join(fields)}" if fields else ""
        return f"unknown key '{where}'" + (f" ({guess}{allowed})" if guess or allowed else "")
    if kind == "finite_number":
        return f"{where}: must be a finite number (got {error.get('input')!r})"
    if kind == "missing":
        return f"missing required key '{where}'"
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return f"'{where or 'cluster'}.provider' must be one of: {', '.join(CLUSTERS)}"
    if kind in _WORDING:
        got = error.get("input")
        shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
        return f"{where or 'the config'} must be {_WORDING[kind](error.get('ctx') or {})}{shown}"
    if where and not message.startswith(where.split(".")[0] + "."):
        got = error.get("input")
        shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) else ""
        joint = " " if message.startswith("must ") else ": "  # "train.steps must be ..."
        return f"{where}{joint}{message}{shown}"
    return message


def _home_of(key: str, model: type[BaseModel]) -> str | None:
    """Where a key written in the wrong section belongs ("engine" -> "train.engine"): the one
    top-level key or section key of that name (any provider's, for cluster); None if none is."""
    homes = [key] if key in model.model_fields else []
    for name, info in model.model_fields.items():
        sections = (CLUSTERS.values() if name == "cluster"
                    else [a for a in getattr(info.annotation, "__args__", (info.annotation,))
                          if isinstance(a, type) and issubclass(a, BaseModel)])
        if any(key in section.model_fields for section in sections):
            homes.append(f"{name}.{key}")
    return homes[0] if len(homes) == 1 else None


def _section_for(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(part, str) and part in CLUSTERS:
            current = CLUSTERS[part]
            continue
        if part in CORPUS_TAGS:
            current = CORPUS_TAGS[part]
            continue
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return current if isinstance(current, type) else None
        annotation = fields[part].annotation
        current = next((a for a in getattr(annotation, "__args__", (annotation,))
                        if isinstance(a, type) and issubclass(a, BaseModel)), annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


_LOCAL_PATH_KEYS = {
    ("tokenizer", "path"), ("model", "config"), ("model", "init_from"), ("cluster", "identity_file"),
    ("cluster", "known_hosts"), ("cluster", "wheelhouse"),
}


def _is_remote(path: str) -> bool:
    # gs: without // too: left as written, so that validation refuses it as a broken URL
    # instead of it becoming a local folder named gs:.
    return "://" in path or path.startswith(("hf:", "gs:"))


def _resolve_paths(raw: dict, base: Path) -> dict:
    """Make relative local paths absolute against the config file's folder."""

    def resolve(value: Any) -> Any:
        if not isinstance(value, str) or _is_remote(value):
            return value
        expanded = os.path.expanduser(value)
        return os.path.normpath(expanded if os.path.isabs(expanded) else str(base / expanded))

    out = dict(raw)
    if isinstance(out.get("output_dir"), str):
        out["output_dir"] = resolve(out["output_dir"])
    data = out.get("data")
    if isinstance(data, dict) and "corpus" in data:
        corpus = data["corpus"]
        data = dict(data)
        entries = corpus if isinstance(corpus, list) else [corpus]
        resolved = [_resolve_entry(c, resolve) for c in entries]
        data["corpus"] = resolved if isinstance(corpus, list) else resolved[0]
        names = {after: before for before, after in zip(map(_entry_text, entries),
                                                         map(_entry_text, resolved), strict=True)
                 if isinstance(before, str) and after != before}
        given = data.get("corpus_names", {})
        if names and isinstance(given, dict):  # what a config gives (the workers' copy) stays;
            data["corpus_names"] = {**names, **given}  # anything else is left to validation
        out["data"] = data
    for section, key in _LOCAL_PATH_KEYS:
        block = out.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            out[section] = {**block, key: resolve(block[key])}
    return out


def _entry_text(entry: Any) -> Any:
    """A raw corpus entry's path text: a plain one itself, a weighted one's `path`."""
    return entry.get("path") if isinstance(entry, dict) else entry


def _resolve_entry(entry: Any, resolve) -> Any:
    """A corpus entry with its path resolved: a plain one, or a weighted one's `path`."""
    if isinstance(entry, dict) and "path" in entry:
        return {**entry, "path": resolve(entry["path"])}
    return resolve(entry)


def _context(raw: dict) -> dict:
    """What sections are validated with beside their own keys: the run's train.engine, which
    decides what the cluster's TPU boots and installs (GcpCluster)."""
    train = raw.get("train")
    return {"engine": train.get("engine") if isinstance(train, dict) else None}


def parse_config(raw: Any, *, base_dir: Path | None = None, source: str = "config") -> RunConfig:
    """Validate a parsed YAML mapping; every problem becomes a line of one `UserErrors` (a
    single problem: a one-line `UserError`), the most fundamental first."""
    if raw is None:
        raise UserError(f"{source} is empty", hint="run `tpuctl init` for a starting point")
    if not isinstance(raw, dict):
        raise UserError(f"{source} must be a mapping of sections (name, cluster, data, ...)")
    if base_dir is not None:
        raw = _resolve_paths(raw, base_dir)
    try:
        return RunConfig.model_validate(raw, context=_context(raw))
    except ValidationError as exc:
        errors = exc.errors()
        if not any(not e["loc"] for e in errors):
            # A key failed, so checks were left unrun: run those the keys that parsed allow,
            # so that nothing is left for a second round.
            errors += _unreached(raw, errors)
        problems = _problems(errors)
    problems = [f"{source}: {p}" for p in problems]
    raise (UserError(problems[0]) if len(problems) == 1 else UserErrors(problems)) from None


# The order problems are shown in: what the file is made of (unknown and missing keys, the
# provider) first; then section by section in the file's order (the cluster before what runs
# on it), each key's own value before what is wrong between a section's keys; what is wrong
# between sections last.
def _rank(error: dict) -> tuple[int, int, int]:
    kind, loc = error["type"], error["loc"]
    structure = ("extra_forbidden", "missing", "union_tag_invalid", "union_tag_not_found")
    if kind in structure:
        return (0, structure.index(kind), 0)
    if not loc:
        return (2, 0, 0)
    sections = list(RunConfig.model_fields)
    where = sections.index(loc[0]) if loc[0] in sections else len(sections)
    return (1, where, 1 if _last_is_section(loc) else 0)


def _last_is_section(loc: tuple) -> bool:
    """Whether the location ends at a section (a section's own validator), not at a key."""
    current: Any = RunConfig
    for part in loc:
        if isinstance(part, str) and part in CLUSTERS:
            continue
        fields = getattr(current, "model_fields", {})
        if isinstance(part, int) or part not in fields:
            return False
        annotation = fields[part].annotation
        current = next((a for a in getattr(annotation, "__args__", (annotation,))
                        if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return False
    return True


def _problems(errors: list[dict]) -> list[str]:
    """One line per problem, in _rank's order, without the gaps a mistyped key leaves."""
    mistyped = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            section = _section_for(RunConfig, error["loc"][:-1])
            fields = list(section.model_fields) if section else []
            close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1, cutoff=0.75)
            if close:
                mistyped.add(_field_name((*error["loc"][:-1], close[0])))
            elif _home_of(str(error["loc"][-1]), RunConfig):  # in the wrong section
                mistyped.add(_home_of(str(error["loc"][-1]), RunConfig))
    lines = []
    for error in sorted(errors, key=_rank):
        if error["type"] == "missing" and _field_name(error["loc"]) in mistyped:
            continue  # a mistyped key also leaves the key it meant missing: name the mistake
        raised = (error.get("ctx") or {}).get("error")
        parts = (raised.problems if isinstance(raised, Problems)
                 else [error["msg"].removeprefix("Value error, ")])
        for part in parts:
            line = _describe({**error, "msg": part}, RunConfig)
            if line not in lines:
                lines.append(line)
    return lines


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


# How deep a config's values may nest: a real one is four levels deep (cluster, its ranges);
# a deeper document is not a config, and PyYAML would compose it by recursion.
MAX_NESTING = 32


class _TooDeep(Exception):
    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


class _StrictLoader(yaml.SafeLoader):
    """YAML without silent overrides: a key given twice in one mapping is an error (plain
    YAML keeps the last one, so a second `train:` section would quietly replace the first).
    Nesting deeper than MAX_NESTING is refused as the composer reaches it."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep=False):
    seen: dict[Any, int] = {}
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        except TypeError:  # an unhashable key; SafeLoader reports it
            pass
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)


def load_config(path: str | os.PathLike, *, engine: str | None = None) -> RunConfig:
    """The run config in the file at `path`; `engine` (`tpuctl train --engine NAME`) in place
    of the file's train.engine, validated as if the file said so: the cluster's route (image,
    packages) follows the engine, so a v6e config written for tensorflow loads for jax."""
    engines = get_args(EngineName)
    if engine is not None and engine not in engines:
        raise UserError(f"--engine {engine!r} is not an engine",
                        hint=f"use one of {', '.join(engines)}")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a config file",
                        hint=f"pass -c {path / 'tpuctl.yaml'}, or run `tpuctl init {path}`")
    if not path.exists():
        raise UserError(
            f"no config file at {path}", hint="pass -c PATH, or run `tpuctl init` to write one"
        )
    # A named pipe or a device is refused (never waited on), a huge file too.
    text = reading.read_file(str(path), what=f"the config {path}", limit=reading.CONFIG_LIMIT)
    try:
        raw = yaml.load(text.decode("utf-8"), Loader=_StrictLoader)  # a SafeLoader
    except _DuplicateKey as dup:
        raise UserError(f"{path} line {dup.line}: duplicate key '{dup.key}' (first at line "
                        f"{dup.first})", hint="keep one of them") from None
    except _TooDeep as deep:
        raise UserError(f"{path} line {deep.line}: values nested more than {MAX_NESTING} "
                        "levels deep", hint="a tpuctl config is a few levels deep (sections, "
                        "their keys, lists); check the file is the config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise UserError(f"{path}{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    source = str(path)
    if engine is not None and isinstance(raw, dict) and isinstance(raw.get("train"), dict):
        raw = {**raw, "train": {**raw["train"], "engine": engine}}
        source = f"{path} with --engine {engine}"
    return parse_config(raw, base_dir=path.resolve().parent, source=source)


def check_stages(config: RunConfig, stages) -> None:
    """What the config cannot do for a job of these stages (names), refused before it starts."""
    if "train" in {str(getattr(s, "value", s)) for s in stages} and (
            config.data.validation_fraction == 0):
        raise UserError("data.validation_fraction is 0: nothing is held out, so training "
                        "would have no evaluation",
                        hint="use a small share such as 0.01")


def with_hub_repo(config: RunConfig, repo: str) -> RunConfig:
    """The config with `hub.repo` set (what `--push-to-hub OWNER/NAME` does)."""
    try:
        hub = HubConfig(repo=repo, private=config.hub.private)
    except ValidationError as exc:
        raise UserError(f"--push-to-hub: {_describe(exc.errors()[0], HubConfig)}") from None
    return config.model_copy(update={"hub": hub})


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, defaults included: what actually ran."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
