"""The launcher's bad-input catalogue: every row ends with exactly one `error:` line naming the
key or value, exit status 2, no traceback, and nothing created or started (no state folder, no
output_dir, no new file anywhere in the run's folder), through the real `tpuctl` entry point (in this process: every refusal comes before any
framework loads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.crafted import CRAFTED
from tests.support.keys import ed25519_key
from tests.support.runners import tpuctl

BLACKHOLE = "192.0.2.1"  # TEST-NET-1: nothing answers; no row may get as far as connecting


def _config(box: Path, **over) -> dict:
    raw = {
        "name": "t",
        "output_dir": str(box / "out"),
        "cluster": {"provider": "local", "workers": 2},
        "data": {"corpus": str(box / "corpus.txt")},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2},
        "train": {"steps": 4, "batch_size": 4, "learning_rate": 1e-3},
    }
    raw.update(over)
    return raw


def _write(box: Path, name: str, raw) -> str:
    path = box / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return str(path)


def _ssh(box: Path, **cluster) -> str:
    """An ssh config whose key files are good unless a row says otherwise."""
    spec = {"provider": "ssh", "hosts": [BLACKHOLE], "user": "me",
            "identity_file": str(box / "key"), "known_hosts": str(box / "known_hosts"),
            **cluster}
    return _write(box, "ssh.yaml", _config(box, cluster=spec))


def _gcp(box: Path, **cluster) -> str:
    """A gcp config, good unless a row says otherwise (it never gets as far as the cloud)."""
    spec = {"provider": "gcp", "project": "my-project", "zone": "us-central2-b",
            "accelerator_type": "v4-8", "ssh_source_ranges": ["203.0.113.7/32"], **cluster}
    return _write(box, "gcp.yaml", _config(box, cluster=spec))


def _gcp_run(box: Path, *, train: dict, model: dict | None = None, **cluster) -> str:
    """A gcp config with train (and model) keys changed, good unless a row says otherwise."""
    spec = {"provider": "gcp", "project": "my-project", "zone": "us-central2-b",
            "accelerator_type": "v4-8", "ssh_source_ranges": ["203.0.113.7/32"], **cluster}
    raw = _config(box, cluster=spec)
    raw["train"] = {**raw["train"], **train}
    if model is not None:
        raw["model"] = model
    return _write(box, "gcp-run.yaml", raw)


def _gce(box: Path, name: str = "t", **cluster) -> str:
    """A gce config (a JAX run), good unless a row says otherwise."""
    spec = {"provider": "gce", "project": "my-project", "zone": "us-east5-b",
            "machine_type": "ct6e-standard-4t", "topology": "2x4",
            "ssh_source_ranges": ["203.0.113.7/32"], **cluster}
    raw = _config(box, name=name, cluster=spec)
    raw["train"] = {**raw["train"], "engine": "jax"}
    return _write(box, "gce.yaml", raw)


def _with(box: Path, section: str, **values) -> str:
    """The run folder's config with some keys of one section changed."""
    raw = _config(box)
    raw[section] = {**raw[section], **values}
    return _write(box, f"{section}.yaml", raw)


def _one_line_corpus(box: Path) -> str:
    _file(box, "one.txt", b"a corpus of a single document\n")
    return _write(box, "one.yaml", _config(box, data={"corpus": str(box / "one.txt")}))


def _file(box: Path, name: str, data: bytes, mode: int = 0o600) -> str:
    path = box / name
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def _key(box: Path, name: str, passphrase: str = "") -> str:
    return ed25519_key(box / name, passphrase)


def _init_from(box: Path, folder: Path) -> str:
    raw = _config(box, model={"family": "gpt2", "init_from": str(folder)})
    del raw["tokenizer"]  # the folder brings it
    return _write(box, "init-from.yaml", raw)


def _init_from_gpt2(box: Path) -> str:
    """A jax run of roberta continuing from a folder whose config says roberta but whose
    model.safetensors holds GPT-2's weights (tests/test_payload_bad_inputs.py builds it)."""
    from tests.support.configs import init_from_config

    folder = box / "init"
    folder.mkdir()
    raw = yaml.safe_load(init_from_config(folder, "gpt2", engine="jax").read_text())
    raw["output_dir"] = str(box / "out")
    return _write(box, "init-from.yaml", raw)


def _crafted(box: Path, change) -> str:
    """A run continuing from a model folder crafted to break a reader (tests/support/crafted),
    rows of 32 tokens."""
    from tests.support.crafted import crafted_folder

    raw = _config(box, model={"family": "roberta", "init_from": str(crafted_folder(box, change))},
                  data={"corpus": str(box / "corpus.txt"), "seq_len": 32})
    del raw["tokenizer"]  # the folder's own
    return _write(box, "crafted.yaml", raw)


# (id, arguments or a function of the run folder giving them, environment, needles)
ROWS = [
    ("workers-not-a-number", ["train", "--local", "--workers", "abc"], {}, ["'--workers'"]),
    ("workers-too-many", ["train", "--local", "--workers", "100000"], {}, ["--workers 100000"]),
    ("workers-zero", ["train", "--local", "--workers", "0"], {}, ["--workers 0"]),
    ("workers-negative", ["train", "--local", "--workers", "-3"], {}, ["--workers -3"]),
    ("worker-negative", ["logs", "--worker", "-1"], {}, ["'--worker'"]),
    ("worker-without-value", ["logs", "--worker"], {}, ["'--worker'"]),
    ("worker-out-of-range", ["ssh", "--worker", "5", "--", "true"], {}, ["--worker 5"]),
    ("shell-without-worker", ["ssh"], {}, ["a shell needs one worker", "--worker N"]),
    ("resume-and-overwrite", ["train", "--local", "--resume", "--overwrite"], {},
     ["--resume and --overwrite"]),
    ("down-without-a-cloud", ["train", "--local", "--down"], {},
     ["--down deletes a cloud TPU", "local workers have none"]),
    ("auto-resume-negative", ["train", "--local", "--auto-resume", "-1"], {},
     ["'--auto-resume'"]),
    ("max-cost-without-a-price", ["train", "--local", "--max-cost", "5"], {},
     ["train.max_cost needs a price"]),
    ("max-hours-not-positive", ["train", "--local", "--max-hours", "0"], {},
     ["train.max_hours"]),
    ("download-into-a-file", ["train", "--local", "--download", "corpus.txt"], {},
     ["--download", "is a file"]),
    ("stages-empty", ["train", "--local", "--stages", ""], {}, ["--stages ''"]),
    ("stages-only-commas", ["train", "--local", "--stages", ","], {}, ["--stages ','"]),
    ("stages-unknown", ["train", "--local", "--stages", "train,bogus"], {}, ["'bogus'"]),
    ("unknown-command", ["trian"], {}, ["'trian'"]),
    ("unknown-option", ["train", "--bogus"], {}, ["--bogus"]),
    ("config-missing", lambda b: ["train", "-c", str(b / "nothere.yaml")], {},
     ["nothere.yaml"]),
    ("config-a-folder", lambda b: ["train", "-c", str(b)], {}, ["is a folder"]),
    ("config-not-yaml", lambda b: ["train", "-c", _write(b, "bad.yaml", "name: t\n  x: [\n")],
     {}, ["bad.yaml line 2"]),
    ("config-binary", lambda b: ["train", "-c", _file(b, "bin.yaml", bytes(range(256)))], {},
     ["bin.yaml is not UTF-8"]),
    ("config-empty", lambda b: ["train", "-c", _write(b, "empty.yaml", "")], {},
     ["empty.yaml is empty"]),
    ("config-unknown-key",
     lambda b: ["train", "-c", _write(b, "x.yaml", {**_config(b), "extra": 1})], {},
     ["unknown key 'extra'"]),
    ("peer-timeout-not-a-number", ["train", "--local"], {"TPUCTL_PEER_TIMEOUT_S": "abc"},
     ["TPUCTL_PEER_TIMEOUT_S='abc'"]),
    ("peer-timeout-zero", ["train", "--local"], {"TPUCTL_PEER_TIMEOUT_S": "0"},
     ["TPUCTL_PEER_TIMEOUT_S='0'"]),
    ("peer-timeout-infinite", ["train", "--local"], {"TPUCTL_PEER_TIMEOUT_S": "inf"},
     ["TPUCTL_PEER_TIMEOUT_S='inf'"]),
    ("peer-timeout-nan", ["train", "--local"], {"TPUCTL_PEER_TIMEOUT_S": "nan"},
     ["TPUCTL_PEER_TIMEOUT_S='nan'"]),
    ("state-folder-is-a-file", lambda b: ["train", "--local"],
     {"TPUCTL_HOME": "{box}/afile"}, ["TPUCTL_HOME", "afile"]),
    ("job-a-relative-path", ["logs", "--job", "../x"], {}, ["--job '../x'"]),
    ("job-an-absolute-path", ["stop", "--job", "/etc"], {}, ["--job '/etc'"]),
    ("job-empty", ["status", "--job", ""], {}, ["--job ''"]),
    ("logs-without-a-job", ["logs"], {}, ["no job of run 't'"]),
    ("stop-without-a-job", ["stop"], {}, ["no job of run 't'"]),
    ("init-into-a-file", lambda b: ["init", str(b / "corpus.txt")], {}, ["corpus.txt is a file"]),
    ("init-over-a-config", lambda b: ["init", str(b)], {}, ["tpuctl.yaml already exists"]),
    ("ssh-with-workers", lambda b: ["train", "--workers", "2", "-c", _ssh(b)], {},
     ["--workers only applies with --local"]),
    ("host-with-user", lambda b: ["train", "-c", _ssh(b, hosts=["root@10.0.0.2"])], {},
     ["cluster.hosts", "'root@10.0.0.2'", "cluster.user"]),
    ("host-with-port", lambda b: ["train", "-c", _ssh(b, hosts=["10.0.0.2:2222"])], {},
     ["cluster.hosts", "'10.0.0.2:2222'", "cluster.port"]),
    ("host-bracketed", lambda b: ["train", "-c", _ssh(b, hosts=["[::1]:22"])], {},
     ["'[::1]:22'", "cluster.port"]),
    ("host-twice", lambda b: ["train", "-c", _ssh(b, hosts=["w1", "w2", "W1"])], {},
     ["cluster.hosts", "'W1' is listed twice"]),
    ("host-empty", lambda b: ["train", "-c", _ssh(b, hosts=[""])], {},
     ["cluster.hosts", "'' is not a host"]),
    ("host-an-option", lambda b: ["train", "-c", _ssh(b, hosts=["-oProxyCommand=x"])], {},
     ["'-oProxyCommand=x' is not a host"]),
    ("known-hosts-missing", lambda b: ["train", "-c", _ssh(b, known_hosts=str(b / "none"))],
     {}, ["cluster.known_hosts: no file at", "none"]),
    ("known-hosts-a-folder", lambda b: ["train", "-c", _ssh(b, known_hosts=str(b))], {},
     ["cluster.known_hosts: no file at"]),
    ("known-hosts-binary", lambda b: ["train", "-c", _ssh(
        b, known_hosts=_file(b, "kh.bin", bytes(range(255, -1, -1)) * 4))], {},
     ["cluster.known_hosts", "kh.bin", "not text"]),
    ("known-hosts-malformed", lambda b: ["train", "-c", _ssh(b, known_hosts=_file(
        b, "kh.bad", b"# ok\n10.0.0.2 ssh-ed25519 AAAA!!!notbase64\n"))], {},
     ["cluster.known_hosts", "kh.bad line 2"]),
    ("identity-missing", lambda b: ["train", "-c", _ssh(b, identity_file=str(b / "nokey"))],
     {}, ["cluster.identity_file: no file at", "nokey"]),
    ("identity-not-a-key", lambda b: ["train", "-c", _ssh(
        b, identity_file=_file(b, "notakey", b"hello\n"))], {},
     ["cluster.identity_file", "notakey", "is not a private key"]),
    ("identity-with-passphrase", lambda b: ["train", "-c", _ssh(
        b, identity_file=_key(b, "locked", passphrase="secret words"))], {},
     ["cluster.identity_file", "locked", "passphrase", "ssh-keygen"]),
    # Issue 16, point 12: each was accepted without a word, to fail later (or never).
    ("ssh-ranges-all-of-ipv4", lambda b: ["train", "-c", _gcp(
        b, ssh_source_ranges=["0.0.0.0/1", "128.0.0.0/1"])], {},
     ["cluster.ssh_source_ranges", "0.0.0.0/1, 128.0.0.0/1", "whole internet"]),
    ("ssh-range-a-bare-address", lambda b: ["train", "-c", _gcp(
        b, ssh_source_ranges=["203.0.113.7"])], {},
     ["cluster.ssh_source_ranges", "'203.0.113.7' is an address", "203.0.113.7/32"]),
    ("bucket-an-ip-address", lambda b: ["train", "-c", _gcp(b, bucket="192.168.5.4")], {},
     ["cluster.bucket", "'192.168.5.4' is an IP address"]),
    ("zone-no-such-letter", lambda b: ["train", "-c", _gcp(b, zone="us-central2-z")], {},
     ["cluster.zone", "'us-central2-z' is not a Google Cloud zone"]),
    ("network-free-text", lambda b: ["train", "-c", _gcp(b, network="the office LAN")], {},
     ["cluster.network", "'the office LAN' is not a VPC network"]),
    ("corpus-gs-one-slash", lambda b: ["train", "--local", "-c", _with(
        b, "data", corpus="gs:/bucket/corpus.txt")], {},
     ["data.corpus", "'gs:/bucket/corpus.txt' is not a gs:// URL"]),
    ("output-dir-gs-one-slash", lambda b: ["train", "--local", "-c", _write(
        b, "o.yaml", _config(b, output_dir="gs:/bucket/run"))], {},
     ["output_dir", "'gs:/bucket/run' is not a gs:// URL"]),
    ("steps-1e30", lambda b: ["train", "--local", "-c", _with(b, "train", steps=1e30)], {},
     ["train.steps must be at most 1,000,000,000 (got 1e+30)"]),
    ("steps-1e20", lambda b: ["train", "--local", "-c", _with(b, "train", steps=10**20)], {},
     ["train.steps must be at most 1,000,000,000"]),
    ("learning-rate-1e308", lambda b: ["train", "--local", "-c", _with(
        b, "train", learning_rate=1e308)], {}, ["train.learning_rate must be at most 1.0"]),
    ("validation-fraction-0", lambda b: ["train", "--local", "-c", _with(
        b, "data", validation_fraction=0)], {},
     ["data.validation_fraction", "no evaluation"]),
    ("one-line-corpus-on-2-workers", lambda b: ["train", "--local", "--workers", "2", "-c",
                                                _one_line_corpus(b)], {},
     ["worker 1 of 2 would have no documents", "fewer documents than workers"]),
    ("one-line-corpus-on-2-workers-dry-run", lambda b: [
        "train", "--local", "--workers", "2", "--dry-run", "-c", _one_line_corpus(b)], {},
     ["worker 1 of 2 would have no documents"]),
    # Issue 19: the engine's TPU route and what the chips hold, refused at load.
    ("tensorflow-on-v6e-train-dry-run", lambda b: ['train', '--dry-run', "-c", _gcp(
        b, zone="us-east5-b", accelerator_type="v6e-8")], {},
     ["cluster.accelerator_type", "v6e-8", "set train.engine: jax"]),
    ("fsdp-gpt2-xl-on-v5litepod-1-train-dry-run", lambda b: ['train', '--dry-run', "-c", _gcp_run(
        b, zone="us-central1-a", accelerator_type="v5litepod-1", train={"engine": "jax"},
        model={"family": "gpt2", "size": "xl"})], {},
     ["model.size xl", "GiB of training state", "v5litepod-1", "a device has 16 GiB"]),
    ("tensorflow-on-v6e-up-dry-run", lambda b: ['up', '--dry-run', "-c", _gcp(
        b, zone="us-east5-b", accelerator_type="v6e-8")], {},
     ["cluster.accelerator_type", "v6e-8", "set train.engine: jax"]),
    ("fsdp-gpt2-xl-on-v5litepod-1-up-dry-run", lambda b: ['up', '--dry-run', "-c", _gcp_run(
        b, zone="us-central1-a", accelerator_type="v5litepod-1", train={"engine": "jax"},
        model={"family": "gpt2", "size": "xl"})], {},
     ["model.size xl", "GiB of training state", "v5litepod-1", "a device has 16 GiB"]),
    ("tensorflow-on-v6e-doctor", lambda b: ['doctor', "-c", _gcp(
        b, zone="us-east5-b", accelerator_type="v6e-8")], {},
     ["cluster.accelerator_type", "v6e-8", "set train.engine: jax"]),
    ("fsdp-gpt2-xl-on-v5litepod-1-doctor", lambda b: ['doctor', "-c", _gcp_run(
        b, zone="us-central1-a", accelerator_type="v5litepod-1", train={"engine": "jax"},
        model={"family": "gpt2", "size": "xl"})], {},
     ["model.size xl", "GiB of training state", "v5litepod-1", "a device has 16 GiB"]),
    # `tpuctl train --engine NAME` sets train.engine for the run, checked as the file would be.
    ("unknown-engine-option", ["train", "--local", "--engine", "pytorch"], {},
     ["--engine 'pytorch' is not an engine", "use one of tensorflow, jax"]),
    ("unknown-engine-option-dry-run", ["train", "--dry-run", "--engine", "JAX"], {},
     ["--engine 'JAX' is not an engine", "use one of tensorflow, jax"]),
    ("engine-option-tensorflow-on-v6e", lambda b: ['train', '--dry-run', '--engine', 'tensorflow',
                                                   "-c", _gcp_run(b, zone="us-east5-b",
                                                                  accelerator_type="v6e-8",
                                                                  train={"engine": "jax"})], {},
     ["with --engine tensorflow", "cluster.accelerator_type", "set train.engine: jax"]),
    ("engine-unknown", lambda b: ["train", "--local", "-c", _with(b, "train", engine="pytorch")],
     {}, ["train.engine must be one of 'tensorflow' or 'jax' (got 'pytorch')"]),
    ("init-from-other-family-on-jax", lambda b: ["train", "--local", "-c", _init_from_gpt2(b)],
     {}, ["model.init_from", "holds no roberta weights", "transformer.wte.weight"]),
    # Issue 38, item 8: a folder that is not there is said to be missing, not to lack a file.
    ("init-from-missing", lambda b: ["train", "--local", "-c", _init_from(b, b / "nowhere")],
     {}, ["model.init_from", "nowhere does not exist"]),
    ("init-from-a-file", lambda b: ["train", "--local", "-c", _init_from(b, b / "corpus.txt")],
     {}, ["model.init_from", "corpus.txt is a file, not a folder"]),
    # Issue 27, item 6: each gce value checked as Compute Engine would check it, at load.
    ("gce-run-limit-of-a-microsecond", lambda b: ["up", "--dry-run", "-c", _gce(
        b, max_run_hours=0.000001)], {},
     ["cluster.max_run_hours", "0 seconds", "shortest run limit is 30 seconds", "0.0084"]),
    ("gce-run-limit-true", lambda b: ["up", "--dry-run", "-c", _gce(b, max_run_hours=True)],
     {}, ["cluster.max_run_hours must be a number (got True)"]),
    ("gce-run-limit-text", lambda b: ["up", "--dry-run", "-c", _gce(b, max_run_hours="2")],
     {}, ["cluster.max_run_hours must be a number (got '2')"]),
    ("gce-image-empty", lambda b: ["up", "--dry-run", "-c", _gce(b, image="")], {},
     ["cluster.image", "'' is not a Compute Engine image", "projects/PROJECT/global/images/"]),
    ("gce-image-free-text", lambda b: ["up", "--dry-run", "-c", _gce(
        b, image="../../../etc/passwd")], {},
     ["cluster.image", "'../../../etc/passwd' is not a Compute Engine image"]),
    ("gce-image-a-url", lambda b: ["up", "--dry-run", "-c", _gce(
        b, image="https://example.com/disk.img")], {},
     ["cluster.image", "is a URL", "by its path"]),
    ("gce-project-ends-in-a-newline", lambda b: ["up", "--dry-run", "-c", _gce(
        b, project="my-project\n")], {},
     ["cluster.project", "is not a Google Cloud project id", "'my-project\\n'"]),
    ("gce-zone-ends-in-a-newline", lambda b: ["up", "--dry-run", "-c", _gce(
        b, zone="us-east5-b\n")], {}, ["cluster.zone", "is not a Google Cloud zone"]),
    ("gce-network-ends-in-a-newline", lambda b: ["up", "--dry-run", "-c", _gce(
        b, network="default\n")], {}, ["cluster.network", "is not a VPC network"]),
    ("gce-reservation-ends-in-a-newline", lambda b: ["up", "--dry-run", "-c", _gce(
        b, reservation="mine\n")], {},
     ["cluster.reservation", "is not a Compute Engine reservation"]),
    ("gce-name-ends-in-a-newline", lambda b: ["up", "--dry-run", "-c", _gce(b, name="t\n")],
     {}, ["name: 't ' must be 1-63 lowercase letters"]),
    ("gce-name-too-long-for-its-slice", lambda b: ["up", "--dry-run", "-c", _gce(
        b, name="a" * 55)], {}, ["name:", "is 55 characters", "use at most 53"]),
    ("gcp-tpu-name-ends-in-a-newline", lambda b: ["train", "-c", _gcp(b, tpu_name="tpu\n")],
     {}, ["cluster.tpu_name", "is not a TPU name"]),
    ("gcp-bucket-ends-in-a-newline", lambda b: ["train", "-c", _gcp(b, bucket="my-bucket\n")],
     {}, ["cluster.bucket", "is not a bucket name"]),
    # Issue 32: `train --dry-run` of each crafted model folder.
    *[(f"init-from-{name}-dry-run", lambda b, c=change: [
        "train", "--local", "--dry-run", "-c", _crafted(b, c)], {}, needles)
      for name, change, needles in CRAFTED],
    ("ssh-cluster-bad-key-on-ssh", lambda b: ["ssh", "-c", _ssh(
        b, identity_file=_key(b, "locked2", passphrase="x" * 8)), "--", "true"], {},
     ["passphrase"]),
    # Issue 32, item 5: true is no number, a user name is one line of ssh-keys, a path one line.
    ("workers-true", lambda b: ["train", "--local", "-c", _write(b, "w.yaml", _config(
        b, cluster={"provider": "local", "workers": True}))], {},
     ["cluster.workers must be a whole number (an integer) (got True)"]),
    ("ssh-port-true", lambda b: ["train", "-c", _ssh(b, port=True)], {},
     ["cluster.port must be a whole number (an integer) (got True)"]),
    ("batch-size-true", lambda b: ["train", "--local", "-c", _with(b, "train", batch_size=True)],
     {}, ["train.batch_size must be a whole number (an integer) (got True)"]),
    ("learning-rate-false", lambda b: ["train", "--local", "-c", _with(
        b, "train", learning_rate=False)], {}, ["train.learning_rate must be a number (got False)"]),
    ("gcp-queue-hours-true", lambda b: ["train", "-c", _gcp(b, queued=True, queue_hours=True)],
     {}, ["cluster.queue_hours must be a number (got True)"]),
    ("ssh-user-with-a-newline", lambda b: ["train", "-c", _ssh(b, user="me\nroot")], {},
     ["cluster.user", "'me\\nroot' is not a user name"]),
    ("ssh-user-empty", lambda b: ["train", "-c", _ssh(b, user="")], {},
     ["cluster.user", "'' is not a user name"]),
    ("ssh-user-an-option", lambda b: ["train", "-c", _ssh(b, user="-oProxyCommand=x")], {},
     ["cluster.user", "is not a user name"]),
    ("gce-user-with-a-space", lambda b: ["up", "--dry-run", "-c", _gce(b, user="me you")], {},
     ["cluster.user", "'me you' is not a user name", "ssh-keys"]),
    ("gce-user-with-a-colon", lambda b: ["up", "--dry-run", "-c", _gce(b, user="me:x")], {},
     ["cluster.user", "'me:x' is not a user name"]),
    ("gcp-user-with-a-newline", lambda b: ["train", "-c", _gcp(b, user="me\nroot:ssh-ed25519")],
     {}, ["cluster.user", "is not a user name"]),
    ("ssh-identity-file-with-a-newline", lambda b: ["train", "-c", _ssh(
        b, identity_file=str(b / "key") + "\nProxyCommand x")], {},
     ["cluster.identity_file", "holds a line break or a NUL byte"]),
    ("gce-identity-file-with-a-nul", lambda b: ["up", "--dry-run", "-c", _gce(
        b, identity_file="/tmp/key\0x")], {},
     ["cluster.identity_file", "holds a line break or a NUL byte"]),
    ("known-hosts-with-a-newline", lambda b: ["train", "-c", _ssh(
        b, known_hosts=str(b / "known_hosts") + "\n")], {},
     ["cluster.known_hosts", "holds a line break"]),
    ("corpus-walks-the-root", lambda b: ["train", "--local", "--dry-run", "-c", _with(
        b, "data", corpus="/**")], {}, ["data.corpus", "'/**' would walk the whole filesystem"]),
    ("corpus-walks-the-root-below-a-wildcard", lambda b: ["train", "--local", "-c", _with(
        b, "data", corpus=["corpus.txt", "/*/**/*.txt"])], {},
     ["data.corpus", "'/*/**/*.txt' would walk the whole filesystem"]),
    ("corpus-the-root-folder", lambda b: ["train", "--local", "-c", _with(
        b, "data", corpus="/")], {}, ["data.corpus", "'/' would walk the whole filesystem"]),
    ("config-nested-5000-deep", lambda b: ["train", "--local", "-c", _write(
        b, "deep.yaml", "name: " + "[" * 5000 + "]" * 5000 + "\n")], {},
     ["deep.yaml line 1", "nested more than 32 levels deep"]),
    ("config-mappings-nested-5000-deep", lambda b: ["up", "--dry-run", "-c", _write(
        b, "deep.yaml", "name: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")], {},
     ["nested more than 32 levels deep"]),
    # Issue 38, item 9: the switch that keeps huggingface_hub offline is named, not a connection.
    ("push-to-hub-offline", ["train", "--local", "--push-to-hub", "lab/model"],
     {"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_x"}, ["--push-to-hub", "HF_HUB_OFFLINE=1",
                                                   "unset HF_HUB_OFFLINE"]),
    ("push-to-hub-transformers-offline", ["train", "--local", "--push-to-hub", "lab/model"],
     {"TRANSFORMERS_OFFLINE": "yes", "HF_TOKEN": "hf_x"}, ["TRANSFORMERS_OFFLINE=yes"]),
]


@pytest.fixture
def box(tmp_path):
    """A run folder: a corpus, a local tpuctl.yaml, good key files for ssh rows."""
    # Documents for every worker: a corpus too small for two is a row of its own.
    (tmp_path / "corpus.txt").write_text("".join(f"line {i} of the corpus\n" for i in range(8)))
    _write(tmp_path, "tpuctl.yaml", _config(tmp_path))
    _key(tmp_path, "key")
    host_key = (tmp_path / "key.pub").read_text().split()
    (tmp_path / "known_hosts").write_text(f"{BLACKHOLE} {host_key[0]} {host_key[1]}\n")
    (tmp_path / "afile").write_text("a file where the state folder would go\n")
    return tmp_path


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")}


def run_row(box: Path, argv: list[str], env: dict):
    """`tpuctl ARGV` in the run folder, in this process, as the console entry point runs it."""
    environment = {"TPUCTL_HOME": str(box / "home")}
    environment.update({k: v.format(box=box) for k, v in env.items()})
    return tpuctl(*argv, env=environment, cwd=box)


@pytest.mark.parametrize(("args", "env", "needles"), [row[1:] for row in ROWS],
                         ids=[row[0] for row in ROWS])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(box, args, env, needles):
    argv = args(box) if callable(args) else args  # a row may write its own files first
    before = _snapshot(box)
    result = run_row(box, argv, env)
    err = result.stderr
    assert result.returncode == 2, f"exit {result.returncode}: {err}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert result.stdout == "", result.stdout
    assert not (box / "home").exists(), "a state folder was made"
    assert not (box / "out").exists(), "output_dir was made"
    assert _snapshot(box) == before, "files changed in the run folder"


@pytest.mark.parametrize("command", [["train", "--dry-run"], ["up", "--dry-run"], ["doctor"]])
def test_every_problem_of_a_config_is_one_line_in_one_round(box, command):
    """Issue 18: a v6e-8 in us-central2-b is refused for its zone and its route together, one
    `error:` line each, the route first; exit 2, nothing made."""
    config = _gcp(box, zone="us-central2-b", accelerator_type="v6e-8")
    before = _snapshot(box)
    result = run_row(box, [*command, "-c", config], {})
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), result.stderr
    assert "cluster.accelerator_type" in lines[0] and "no working route on TPU v6e" in lines[0]
    assert "cluster.zone" in lines[1] and "us-central2-b does not offer v6e-8" in lines[1]
    assert result.stdout == ""
    assert not (box / "home").exists() and _snapshot(box) == before


def test_what_the_plan_and_the_stages_refuse_comes_in_one_round(box):
    """Issue 18: past the config, a batch the workers cannot split, a job that would train with
    nothing held out and a missing corpus file are refused together, one line each."""
    raw = _config(box, cluster={"provider": "local", "workers": 3})
    raw["data"] = {"corpus": str(box / "nothere.txt"), "validation_fraction": 0}
    config = _write(box, "three.yaml", raw)
    before = _snapshot(box)
    result = run_row(box, ["train", "--local", "--dry-run", "-c", config], {})
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and all(line.startswith("error: ") for line in lines), lines
    assert len(lines) == 3, lines
    assert "batch_size=4 does not split over the 3 replicas" in lines[0]
    assert "data.validation_fraction is 0" in lines[1]
    assert "data.corpus: no such file" in lines[2] and "nothere.txt" in lines[2]
    assert result.stdout == "" and not (box / "home").exists() and _snapshot(box) == before


def _checkpoints_of(out: Path, engine: str) -> None:
    """checkpoints/ as a finished run of `engine` leaves it: the engine's file layout (an Orbax
    step folder, or TensorFlow's index and ckpt-N files), run.json naming it, the marker."""
    from payload.core import folders, ownership

    ownership.claim_output_dir(str(out))
    files = ({"20/commit_success.txt": "", "20/default/manifest.ocdbt": "x"} if engine == "jax"
             else {"checkpoint": 'model_checkpoint_path: "ckpt-20"\n', "ckpt-20.index": "x",
                   "ckpt-20.data-00000-of-00001": "x"})
    files["run.json"] = json.dumps({"engine": engine})
    for name, text in files.items():
        path = out / "checkpoints" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    folders.mark_complete(str(out / "checkpoints"), {})


@pytest.mark.parametrize(("written_by", "engine"), [("tensorflow", "jax"), ("jax", "tensorflow")])
def test_a_resume_across_engines_is_one_line_and_touches_nothing(box, written_by, engine):
    """Issue 19: `tpuctl train --local --resume` over the other engine's checkpoints is refused
    before anything starts, naming both engines; the checkpoints are left as they were."""
    _checkpoints_of(box / "out", written_by)
    config = _with(box, "train", engine=engine)
    before = _snapshot(box)
    result = run_row(box, ["train", "--local", "--resume", "-c", config], {})
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: --resume") and "Traceback" not in result.stderr
    assert f"written by the {written_by} engine, but train.engine is {engine}" in lines[0]
    assert f"set train.engine: {written_by}" in lines[0]
    assert result.stdout == "" and not (box / "home").exists()
    assert _snapshot(box) == before, "files changed in the run folder"


@pytest.mark.parametrize("command", [["up", "--dry-run"], ["train", "--dry-run"], ["doctor"]])
def test_a_gce_file_with_a_mistake_of_every_kind_is_refused_in_one_round(box, command):
    """Issue 38, item 2: a key's own value, what is wrong inside a section, the slice's
    topology, its zone, the run's name as the slice's names and what is wrong between sections
    come in one report, though keys of the same sections failed (they took four rounds)."""
    raw = _config(box, name="a" * 60, data={"corpus": str(box / "corpus.txt"), "seq_len": 8},
                  model={"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 3})
    raw["cluster"] = {"provider": "gce", "project": "My_Project", "zone": "europe-west9-b",
                      "machine_type": "ct6e-standard-4t", "topology": "3x3",
                      "provisioning": "flex_start", "user": "me you",
                      "ssh_source_ranges": ["203.0.113.7/32"]}
    raw["train"] = {**raw["train"], "batch_size": True, "warmup_steps": 10}
    config = _write(box, "gce-all.yaml", raw)
    before = _snapshot(box)
    result = run_row(box, [*command, "-c", config], {})
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and all(line.startswith("error: ") for line in lines), lines
    expected = [
        "cluster.project: 'My_Project' is not a Google Cloud project id",  # a key's value
        "cluster.user: 'me you' is not a user name",
        "cluster.topology: topology '3x3' does not exist for ct6e-standard-4t",  # the slice
        "cluster.zone: zone europe-west9-b does not offer ct6e-standard-4t",  # where
        "cluster.provisioning: flex_start needs cluster.max_run_hours",  # within the section
        "data.seq_len must be at least 16 (got 8)",
        "model.num_heads=3 does not divide model.hidden_size=32",
        "train.batch_size must be a whole number (an integer) (got True)",
        f"name: '{'a' * 60}' is 60 characters; on provider gce",  # between sections
        "train.engine: tensorflow does not run on provider gce",
        "train.warmup_steps=10 is more than train.steps=4",
    ]
    assert len(lines) == len(expected), "\n".join(lines)
    for line, needle in zip(lines, expected, strict=True):
        assert needle in line, f"{needle!r} not in {line!r}"
    assert result.stdout == "" and not (box / "home").exists() and _snapshot(box) == before
