"""The publish stage: model/ and a generated model card to a Hugging Face model repository.

    python -m payload publish --config run.yaml      # worker 0, after export; HF_TOKEN set
    card = model_card(config, metrics, manifest)      # README.md text, pure

Runs once model/ is complete (the export's completeness marker), creates the repository if
needed (`hub.private` applies to a new one), and uploads every file of model/ plus README.md in
one commit with `huggingface_hub` (weights go through the LFS batch and upload the Hub asks
for). The token comes from the environment the launcher's agent gives this stage alone; it is
passed to the client and nowhere else.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile

import yaml

from payload.core import folders, layout, storage
from payload.core.engines import TENSORFLOW
from payload.core.errors import UserError
from payload.core.families import FAMILIES

log = logging.getLogger(__name__)
CARD = "README.md"


# huggingface_hub's switch off the network (its constants.HF_HUB_OFFLINE, read as it reads it):
# set, every call to the Hub fails with a word about connections, not about the switch.
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = ("1", "ON", "YES", "TRUE")


def check_online(environ=os.environ) -> None:
    """Refuse to publish where huggingface_hub is switched offline, naming the switch (the
    launcher's check before a job, and the publish stage's on worker 0)."""
    name = next((n for n in OFFLINE_ENV if environ.get(n)), None)
    if name and environ[name].strip().upper() in _TRUE:
        raise UserError(f"--push-to-hub publishes to the Hugging Face Hub, and {name}="
                        f"{environ[name]} keeps huggingface_hub offline",
                        hint=f"unset {name} for this run, or leave out --push-to-hub and "
                        "publish later")


def model_is_complete(folder: str) -> bool:
    """Whether export finished writing `folder` (its completeness marker, written last);
    publishing never reads a folder that fails this."""
    return folders.is_complete(folder)


def run_publish(config) -> None:
    from huggingface_hub import CommitOperationAdd, HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # the log is read line by line, not as a terminal

    repo = config.hub.repo
    if not repo:
        raise UserError("nothing to publish to: hub.repo is not set",
                        hint="pass --push-to-hub OWNER/NAME or set hub.repo")
    check_online()
    folders.check_exported(config.output_dir)
    model_dir = layout.model_dir(config.output_dir)
    token = get_token()
    if not token:
        raise UserError("no Hugging Face token reached the publish stage",
                        hint="run it through `tpuctl train --push-to-hub`, which hands worker 0 "
                        "the launcher's token, or set HF_TOKEN")
    card = model_card(config, _read_json(layout.metrics_path(config.output_dir)),
                      _read_json(layout.manifest_path(config.output_dir)))
    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint, token=token)
    local, names = _local_copy(model_dir)
    try:
        operations = [CommitOperationAdd(path_in_repo=name,
                                         path_or_fileobj=os.path.join(local, name))
                      for name in names if name != CARD]
        operations.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=card.encode()))
        try:
            url = api.create_repo(repo, private=config.hub.private, exist_ok=True)
            log.info("publishing %d files of %s to %s", len(operations), model_dir, url)
            info = api.create_commit(
                repo, operations=operations,
                commit_message=f"tpuctl: {config.name}, {config.model.family} model",
                commit_description="Published by tpuctl after export.")
        except HfHubHTTPError as exc:
            status = getattr(exc.response, "status_code", "?")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"publishing to {repo} failed ({status}): {first}",
                            hint="check the token's write access and the repository name"
                            ) from None
    finally:
        if local != model_dir:
            shutil.rmtree(local, ignore_errors=True)
    log.info("published to %s (commit %s)", info.commit_url, info.oid)


def _local_copy(model_dir: str) -> tuple[str, list[str]]:
    """(a local folder holding model/, the file names in it): model/ itself when local."""
    files = list(storage.walk_files(model_dir))
    prefix = model_dir.rstrip("/") + "/"
    names = [f[len(prefix):] if storage.is_gcs(f) else os.path.relpath(f, model_dir)
             for f in files]
    if not storage.is_gcs(model_dir):
        return model_dir, names
    local = tempfile.mkdtemp(prefix="tpuctl-publish-")
    for path, name in zip(files, names, strict=True):
        target = os.path.join(local, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with storage.open_read(path) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    return local, names


def _read_json(path: str) -> dict:
    try:
        return json.loads(storage.read_text(path)) if storage.exists(path) else {}
    except ValueError:
        return {}


# What Markdown reads as syntax inside a line (code, emphasis, links and images, HTML, entities,
# tables, strike-through): backslash-escaped, as CommonMark allows for any punctuation.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>&|~#])")
# The config sections that describe the model; the rest (cluster: project, address ranges,
# key files, bucket; hub; output_dir) describe the user's infrastructure and stay private.
CARD_SECTIONS = ("data", "tokenizer", "model", "train")
# Keys of those sections holding a path on the user's machines: only its last name is shown.
_PATH_KEYS = {"data": ("corpus",), "tokenizer": ("path",), "model": ("config", "init_from")}


def _text(value) -> str:
    """A value as plain Markdown text: nothing in it is read as syntax, on one line."""
    return _MARKDOWN.sub(r"\\\1", " ".join(str(value).split()))


def _code(value) -> str:
    """A value as an inline code span that nothing in it can end: the fence is longer than any
    run of backticks inside (CommonMark), padded where the value starts or ends with one."""
    text = " ".join(str(value).split())
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fence(text: str) -> str:
    """A code-block fence that no line of `text` can close."""
    return "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)


def data_name(path: str) -> str:
    """What the card calls an input: a Hub dataset by its name, a file or folder by its last
    name (its folders, bucket or home on the user's machines are not the model's business)."""
    from payload.data.corpus import HF_PREFIX

    if path.startswith(HF_PREFIX):
        return path
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def public_config(config) -> dict:
    """The parts of the resolved config that describe the model, paths by their last name."""
    raw = config.model_dump(mode="json")
    shown = {name: raw[name] for name in CARD_SECTIONS}
    for section, keys in _PATH_KEYS.items():
        for key in keys:
            value = shown[section].get(key)
            if isinstance(value, list):  # data.corpus: plain entries, or {path, weight}
                shown[section][key] = [{**v, "path": data_name(v["path"])} if isinstance(v, dict)
                                       else data_name(v) for v in value]
            elif isinstance(value, str):
                shown[section][key] = data_name(value)
    return shown


def model_card(config, metrics: dict, manifest: dict) -> str:
    """README.md for the repository: what the model is, what it was trained on and how, the
    final evaluation, and the config sections that describe the model (never the cluster,
    bucket or key files). Every value from the config or the run is escaped for Markdown."""
    from payload.training.runplan import describe_model

    family = config.model.family
    try:
        architecture = _text(describe_model(config))
    except UserError:
        architecture = family
    front = {"library_name": "transformers", "pipeline_tag": FAMILIES[family].pipeline_tag,
             "tags": ["tpuctl", family, "pretraining"]}
    final = metrics.get("final") or {}
    evaluation = final.get("eval") or {}
    steps_done = final.get("step", metrics.get("step"))
    splits = manifest.get("splits", {})
    train_split, validation = splits.get("train", {}), splits.get("validation", {})
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
        f"# {_text(config.hub.repo.split('/', 1)[1])}", "",
        f"A {family} model pretrained with tpuctl (its {config.train.engine} engine, on Cloud "
        "TPUs or CPUs) "
        + (f"from {_code(data_name(config.model.init_from))}, continuing its pretraining."
           if config.model.init_from else "from scratch."),
        "", "## Model", "", f"- {architecture}",
        f"- objective: {_objective(family)}",
        f"- loads as `{FAMILIES[family].architecture}` in "
        + ("PyTorch and TensorFlow" if TENSORFLOW in FAMILIES[family].engines else
           f"PyTorch (transformers has no TensorFlow {FAMILIES[family].title})"),
        "", "## Data", "",
        "- corpus: " + ", ".join(_code(data_name(c)) for c in config.data.paths),
    ]
    if manifest:
        lines += [
            f"- {manifest.get('documents', 0):,} documents; rows of "
            f"{_text(manifest.get('seq_len'))} "
            f"tokens: {train_split.get('records', 0):,} for training "
            f"({train_split.get('tokens', 0):,} tokens), {validation.get('records', 0):,} "
            "held out for evaluation",
        ]
    tokenizer = config.tokenizer
    source = (f"reused from {_code(data_name(tokenizer.path))}" if tokenizer.path else
              "the model's own" if config.model.init_from else
              f"{tokenizer.kind}, trained on the corpus")
    vocab = manifest.get("vocab_size") or tokenizer.vocab_size
    lines += ["", "## Tokenizer", "", f"- {source}; vocabulary {vocab:,}", "",
              "## Training", "",
              "- steps: "
              f"{_text(steps_done) if steps_done is not None else '?'} of "
              f"{config.train.steps} (batch {config.train.batch_size} x "
              f"{config.data.seq_len} tokens, learning rate {config.train.learning_rate}, "
              f"{config.train.optimizer}{', bf16' if config.train.bf16 else ''})"]
    if metrics.get("strategy"):
        lines.append(f"- distribution: {_text(metrics['strategy'])}, "
                     f"{_text(metrics.get('replicas'))} replicas")
    if evaluation:
        shown = ", ".join(f"{_text(k)} {v:.4f}" if isinstance(v, int | float) else
                          f"{_text(k)} {_text(v)}" for k, v in evaluation.items() if k != "step")
        lines.append(f"- final evaluation (step {_text(evaluation.get('step'))}): {shown}")
    else:
        lines.append("- final evaluation: none (the validation split was smaller than a batch)")
    if final.get("stopped"):
        lines.append(f"- stopped early: {_text(final['stopped'])}")
    lines += ["", "## Use", "", "```python",
              f"from transformers import AutoTokenizer, {FAMILIES[family].auto_class}",
              f'tokenizer = AutoTokenizer.from_pretrained("{config.hub.repo}")',
              f'model = {FAMILIES[family].auto_class}.from_pretrained("{config.hub.repo}")',
              "```", "",
              "## Config", "", "The run config's model, data and training settings "
              "(`tpuctl.yaml`, resolved):", ""]
    settings = yaml.safe_dump(public_config(config), sort_keys=False).rstrip()
    fence = _fence(settings)
    lines += [fence + "yaml", settings, fence, ""]
    return "\n".join(lines)


def _objective(family: str) -> str:
    return {"mlm": "masked language modelling", "clm": "causal language modelling",
            "span": "span corruption (T5 v1.1)"}[FAMILIES[family].objective]
