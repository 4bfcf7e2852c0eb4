"""The one place that runs Terraform and reads what it made: variables in, outputs out.

    tf = Terraform(work_dir("my-run"))
    variables = TerraformVars(...)  # project, zone, tpu_name, accelerator_type, ...
    write_vars(tf.folder, variables)
    tf.init()
    tf.apply(print, vet=owned.vet)    # ChangeSummary(add=..., change=0, remove=0); again: none
    outputs = tf.outputs()            # InfraOutputs(bucket=..., tpu_name=..., ...)
    tf.destroy(print, vet=owned.vet)  # vet: sees what the plan would change, raises to refuse

Every run has its own working folder under the launcher's state folder (TPUCTL_HOME/infra/RUN):
a copy of the module (the repository's infra/ unless told otherwise), the variables file and
the run's local state, so runs never share state and nothing is written into the checkout.
Terraform runs with -json; its messages reach `on_line` as text, and when it fails, its own
last error becomes a one-line UserError.

Every apply and destroy is a saved plan first (`plan -out`, read back with `show -json`): the
caller's `vet` sees each resource the plan would delete, replace or update (`PlannedChange`) and
raises to refuse, so nothing is applied that the caller's ownership rule has not seen; then
Terraform applies exactly that plan (a state changed meanwhile makes it stale: refused too).

Terraform runs in a session of its own and writes to a file in the folder (LOG_FILE), not to a
pipe: nothing that ends the launcher (SIGKILL, a closed terminal) cuts an apply off between
making a resource and saving it in the state. Ctrl-C is passed on as one interrupt (Terraform's
graceful stop). The next command waits for a Terraform still running there (`wait_idle`), and
`resources()` reads what the state holds, also while an apply writes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from launcher.records import state_dir
from payload.core import layout, storage
from payload.core.errors import UserError, one_line

INFRA_DIR = Path(__file__).resolve().parent.parent / "infra"
VARS_FILE = "terraform.tfvars.json"
STATE_FILE = "terraform.tfstate"
LOG_FILE = ".tpuctl-terraform.log"  # the last Terraform command's own output, in its folder
# How long a command waits for a Terraform still running in the run's folder (one started by a
# command that was cut short finishes what it does) before giving up; and how long a Terraform
# command waits for the state lock (another command's Terraform, starting at the same moment).
BUSY_WAIT_S = 30 * 60
LOCK_TIMEOUT = "-lock-timeout=120s"
PLAN_FILE = ".tpuctl-plan"  # the plan being vetted, then applied, in the run's folder
STAGED_LIST = ".tpuctl-module-files"  # what stage_module copied, so the next copy replaces it
INSTALL_HINT = ("install Terraform 1.9 or newer (https://developer.hashicorp.com/terraform/install) "
                "and make sure `terraform` is on PATH")

# Never copied from the module source: Terraform's own files of whoever ran it there.
_NOT_STAGED = re.compile(r"(^|/)(\.terraform(/|\Z)|__pycache__/)|\.tfstate(\.backup)?\Z"
                         r"|(^|/)terraform\.tfvars(\.json)?\Z|\.terraform\.lock\.hcl\Z")
_RUN_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
# The TPU's resources in the module's state: infra/'s `module.tpu_vm` (google_tpu_v2_vm) and the
# test twin's `terraform_data.tpu_vm` both carry this name.
TPU_RESOURCE = "tpu_vm"

Verb = Literal["init", "plan", "apply", "show", "output"]
OnLine = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# The outputs contract: infra/outputs.tf has exactly these, and InfraOutputs is their one reader.


@dataclass(frozen=True)
class InfraOutputs:
    """What `tpuctl up` made, as the root module's outputs say."""

    bucket: str
    tpu_name: str
    zone: str
    accelerator_type: str
    runtime_version: str
    service_account: str
    bucket_created: bool
    tpu_created: bool
    network_tag: str  # a TPU made by a queued request must carry it for the SSH rule

    @classmethod
    def from_output_json(cls, text: str, where: str = "the Terraform state") -> InfraOutputs:
        """Parse `terraform output -json`; a missing or mistyped output is a UserError."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"terraform output in {where} is not JSON ({exc.msg})",
                            hint="run `tpuctl up` again") from None
        if not isinstance(raw, dict) or not raw:
            raise UserError(f"no Terraform outputs in {where}: nothing has been applied there",
                            hint="run `tpuctl up` first")
        values, problems = {}, []
        for f in fields(cls):
            entry = raw.get(f.name)
            if not isinstance(entry, dict) or "value" not in entry:
                problems.append(f"'{f.name}' is missing")
                continue
            value = entry["value"]
            wanted = _OUTPUT_TYPES[f.name]
            if type(value) is not wanted:
                problems.append(f"'{f.name}' is {type(value).__name__}, not {wanted.__name__}")
            values[f.name] = value
        if problems:
            raise UserError(f"the Terraform outputs in {where} are not the ones tpuctl reads: "
                            + ", ".join(problems),
                            hint="that state was made by another version of infra/; "
                                 "run `tpuctl up` again")
        return cls(**values)


_OUTPUT_TYPES: dict[str, type] = {f.name: {"str": str, "bool": bool}[str(f.type)]
                                  for f in fields(InfraOutputs)}
OUTPUTS: tuple[str, ...] = tuple(_OUTPUT_TYPES)


# ---------------------------------------------------------------------------------------------
# The variables: TerraformVars has exactly infra/variables.tf's variables; write_vars is the one
# writer of the variables file.


@dataclass(frozen=True, kw_only=True)
class TerraformVars:
    """Plain values for infra/'s variables (the run config is mapped to these elsewhere).

    Required fields are the environment-specific ones, as in infra/variables.tf; the defaults
    here equal the module's (a test compares them).
    """

    project: str
    region: str
    zone: str
    run_name: str
    tpu_name: str
    accelerator_type: str
    runtime_version: str
    provisioning: str = "on_demand"  # on_demand | spot | preemptible
    create_tpu: bool
    bucket: str
    create_bucket: bool
    noncurrent_version_retention_days: int = 7
    run_prefix: str  # the run's output_dir in bucket: the only objects the workers may change
    read_prefixes: tuple[str, ...] = field(default_factory=lambda: ["corpus"])
    corpus_buckets: tuple[str, ...] = field(default_factory=list)
    network: str = "default"
    subnetwork: str | None = None
    enable_external_ips: bool = True
    ssh_source_ranges: tuple[str, ...]
    ssh_user: str
    ssh_public_key: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allow_self_delete: bool = False

    def __post_init__(self):
        # Catches a caller's slip (a bare string for a list, a string for a flag) before
        # Terraform reports it against a file the user never wrote.
        for f in fields(self):
            value = getattr(self, f.name)
            kind = str(f.type)
            ok = {
                "str": isinstance(value, str),
                "str | None": value is None or isinstance(value, str),
                "bool": type(value) is bool,
                "int": type(value) is int,
                "tuple[str, ...]": (isinstance(value, (list, tuple))
                                    and all(isinstance(v, str) for v in value)),
                "Mapping[str, str]": (isinstance(value, Mapping)
                                      and all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items())),
            }[kind]
            if not ok:
                raise TypeError(f"TerraformVars.{f.name} must be {kind}, got {value!r}")
        for name in ("ssh_source_ranges", "read_prefixes", "corpus_buckets"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "labels", dict(self.labels))

    def tfvars(self) -> dict:
        """The variables as Terraform reads them from JSON."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("ssh_source_ranges", "read_prefixes", "corpus_buckets"):
            values[name] = list(getattr(self, name))
        values["labels"] = dict(sorted(self.labels.items()))
        return values


def write_vars(folder: Path, variables: TerraformVars) -> Path:
    """Write folder/terraform.tfvars.json (Terraform loads it by itself); whole or not at all."""
    path = folder / VARS_FILE
    storage.write_text(str(path), json.dumps(variables.tfvars(), indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Plans: the commands as data.


def work_dir(run_name: str, home: Path | None = None) -> Path:
    """The run's Terraform folder: TPUCTL_HOME/infra/RUN (default ~/.tpuctl/infra/RUN)."""
    if not _RUN_NAME.fullmatch(run_name):
        raise ValueError(f"not a run name: {run_name!r}")
    if home is None:
        home = state_dir()
    return home / layout.INFRA_DIR / run_name


def terraform_argv(binary: str, folder: Path, verb: Verb, *, destroy: bool = False
                   ) -> list[str]:
    """The command line for one Terraform step in `folder`, never asking for input: `plan`
    saves the plan (of a destroy, with `destroy`) to PLAN_FILE, `show` reads it back as JSON,
    `apply` applies exactly that saved plan."""
    common = [binary, f"-chdir={folder}", verb]
    if verb == "init":
        return [*common, "-input=false", "-no-color", "-json"]
    if verb == "plan":
        return [*common, "-input=false", "-no-color", "-json", LOCK_TIMEOUT, f"-out={PLAN_FILE}",
                *(["-destroy"] if destroy else [])]
    if verb == "show":
        return [*common, "-no-color", "-json", PLAN_FILE]
    if verb == "apply":
        return [*common, "-input=false", "-no-color", "-json", "-auto-approve", LOCK_TIMEOUT,
                PLAN_FILE]
    if verb == "output":
        return [*common, "-no-color", "-json"]
    raise ValueError(f"unknown Terraform step {verb!r}")


def state_argv(binary: str, folder: Path, *args: str) -> list[str]:
    """`terraform state ...` in `folder`: `list`, or `rm ADDRESS...`."""
    return [binary, f"-chdir={folder}", "state", *args]


def is_tpu_address(address: str) -> bool:
    """Whether a state address names the TPU (`module.tpu_vm[0].google_tpu_v2_vm.main`)."""
    return any(part.split("[", 1)[0] == TPU_RESOURCE for part in address.split("."))


def recorded(attributes: dict, key: str) -> str | None:
    """The value a state entry (or a planned change's `before`) says its resource has under
    `key` (`name`, `zone`): the google provider's own attribute, or, for the test twins'
    terraform_data stand-ins, the one in its output (the state file wraps it in `value`)."""
    value = attributes.get(key)
    if not value:
        output = attributes.get("output")
        inner = output.get("value", output) if isinstance(output, dict) else None
        value = inner.get(key) if isinstance(inner, dict) else None
    return value if isinstance(value, str) and value else None


def terraform_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment Terraform runs with: told it is automated, no prompts, no update check."""
    return {**base, "TF_IN_AUTOMATION": "1", "TF_INPUT": "0", "CHECKPOINT_DISABLE": "1"}


def staged_files(source: Path) -> list[Path]:
    """The module's files to copy (relative paths), without Terraform's own working files."""
    found = []
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if path.is_file() and not _NOT_STAGED.search(rel.as_posix()):
            found.append(rel)
    return found


def require_terraform(binary: str = "terraform") -> str:
    """The Terraform executable's path, or a UserError that says how to install it."""
    found = shutil.which(binary)
    if found is None:
        raise UserError(f"Terraform is not installed (no `{binary}` on PATH)", hint=INSTALL_HINT)
    return found


# ---------------------------------------------------------------------------------------------
# Doing it.


@dataclass(frozen=True)
class ChangeSummary:
    """What an apply or destroy changed, as Terraform counts it."""

    add: int
    change: int
    remove: int

    @property
    def none(self) -> bool:
        return self.add == self.change == self.remove == 0


@dataclass(frozen=True)
class StateResource:
    """One resource instance in the run's state, as Terraform wrote it."""

    address: str  # module.x.google_compute_firewall.ssh, terraform_data.y["ssh"], ...
    type: str
    attributes: dict
    tainted: bool  # a create that failed halfway (Terraform replaces it at the next apply)

    @property
    def fingerprint(self) -> str:
        """Changes whenever Terraform makes, replaces or updates the resource."""
        text = json.dumps([self.attributes, self.tainted], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def state_resources(text: str) -> list[StateResource]:
    """The managed resource instances of a state file's text (format version 4)."""
    found = []
    for resource in json.loads(text).get("resources", []):
        if resource.get("mode") != "managed":
            continue
        base = ".".join(part for part in (resource.get("module"),
                                          f"{resource['type']}.{resource['name']}") if part)
        for instance in resource.get("instances", []):
            key = instance.get("index_key")
            found.append(StateResource(
                address=base if key is None else f"{base}[{json.dumps(key)}]",
                type=resource["type"], attributes=instance.get("attributes") or {},
                tainted=instance.get("status") == "tainted"))
    return found


@dataclass(frozen=True)
class PlannedChange:
    """One resource instance a saved plan would change, as `terraform show -json` says it."""

    address: str
    type: str
    actions: tuple[str, ...]  # ("delete",), ("update",), ("delete", "create") (a replace), ...
    attributes: dict  # the values before the change (what the state holds): empty for a create

    @property
    def verb(self) -> str | None:
        """What the plan would do to what exists, in words (`delete`, `replace`, `update`), or
        None when it touches nothing that exists (a create, a read, no change)."""
        if "delete" in self.actions:
            return "replace" if "create" in self.actions else "delete"
        return "update" if "update" in self.actions else None


Vet = Callable[[list[PlannedChange]], None]


def planned_changes(text: str) -> list[PlannedChange]:
    """What a saved plan (`terraform show -json PLAN`) would do to existing managed resources:
    each delete, replace and update (creates and no-ops are left out)."""
    found = []
    for change in json.loads(text).get("resource_changes") or []:
        if change.get("mode", "managed") != "managed":
            continue
        body = change.get("change") or {}
        planned = PlannedChange(address=change["address"], type=change.get("type", ""),
                                actions=tuple(body.get("actions") or ()),
                                attributes=body.get("before") or {})
        if planned.verb is not None:
            found.append(planned)
    return found


@dataclass
class _Outcome:
    rc: int = 0
    errors: list[str] = field(default_factory=list)  # error diagnostics, one line each
    plain: list[str] = field(default_factory=list)  # lines that were not JSON (stderr)
    changes: ChangeSummary | None = None


def _diagnostic_line(diag: dict) -> str:
    detail = (diag.get("detail") or "").strip().split("\n\n")[0]
    summary = diag.get("summary") or "unknown error"
    return one_line(f"{summary}: {detail}" if detail else summary)


def _take_line(line: str, outcome: _Outcome, on_line: OnLine) -> str | None:
    """Show one line of Terraform's output and note what it says; its message type."""
    try:
        message = json.loads(line) if line.startswith("{") else None
    except json.JSONDecodeError:
        message = None
    if not isinstance(message, dict):
        if line.strip():
            outcome.plain.append(line)
            on_line(line)
        return None
    kind = message.get("type")
    if kind == "diagnostic":
        diag = message.get("diagnostic") or {}
        text = _diagnostic_line(diag)
        if diag.get("severity") == "error":
            outcome.errors.append(text)
            on_line(f"Error: {text}")
        else:
            on_line(f"Warning: {text}")
        return kind
    if kind == "change_summary" and (message.get("changes") or {}).get("operation") != "plan":
        c = message["changes"]
        outcome.changes = ChangeSummary(int(c.get("add", 0)), int(c.get("change", 0)),
                                        int(c.get("remove", 0)))
    if message.get("@message") and kind != "version":
        on_line(str(message["@message"]))
    return kind


def _follow(proc: subprocess.Popen, path: Path) -> Iterator[str]:
    """The lines Terraform writes to `path`, as it writes them, until it has exited."""
    with open(path, "rb") as stream:
        pending = b""
        while True:
            chunk = stream.readline()
            if chunk:
                pending += chunk
                if pending.endswith(b"\n"):
                    yield pending.decode("utf-8", "replace").rstrip("\n")
                    pending = b""
                continue
            if proc.poll() is not None:  # everything it wrote is in the file now
                for raw in (pending + stream.read()).splitlines():
                    yield raw.decode("utf-8", "replace")
                return
            time.sleep(0.05)


class Terraform:
    """Terraform steps in one run's working folder, on a copy of `module`."""

    def __init__(self, folder: Path, *, module: Path = INFRA_DIR, binary: str = "terraform",
                 env: Mapping[str, str] | None = None):
        self.folder = Path(folder).resolve()
        self.module = Path(module).resolve()
        self.binary = binary
        self._env = env
        if self.folder == self.module or self.module in self.folder.parents:
            raise UserError(f"the Terraform working folder {self.folder} is inside the module "
                            f"{self.module}", hint="set TPUCTL_HOME to a folder outside it")

    @property
    def state_file(self) -> Path:
        return self.folder / STATE_FILE

    def init(self, on_line: OnLine | None = None) -> None:
        """Copy the module into the working folder (replacing the last copy) and `init` it."""
        self.wait_idle(on_line)  # never under a Terraform still applying there
        self.stage_module()
        self._run("init", on_line or _ignore)

    def plan(self, on_line: OnLine, *, vet: Vet, destroy: bool = False) -> list[PlannedChange]:
        """Plan an apply with the variables file (or, with `destroy`, of removing everything in
        the state) into PLAN_FILE and hand `vet` what it would delete, replace or update; `vet`
        raises to refuse (the plan is removed: nothing can apply it). Terraform's plan messages
        are not shown, its warnings and errors are."""
        self._discard_plan()
        verb = "destroy" if destroy else "apply"  # what the user asked for, in its errors
        self._run("plan", _diagnostics_only(on_line), label=verb, destroy=destroy)
        argv = terraform_argv(require_terraform(self.binary), self.folder, "show")
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, env=terraform_env(self._base_env()),
                              check=False)
        try:
            if proc.returncode != 0:
                lines = [ln for ln in proc.stderr.splitlines() if ln.strip()] or [
                    f"exit status {proc.returncode}"]
                raise UserError(f"terraform {verb} failed: its plan cannot be read "
                                f"({one_line(lines[-1])})",
                                hint=f"Terraform's working folder is {self.folder}")
            changes = planned_changes(proc.stdout)
            vet(changes)
        except BaseException:
            self._discard_plan()
            raise
        return changes

    def apply_plan(self, on_line: OnLine, *, on_made: Callable[[], None] | None = None
                   ) -> ChangeSummary:
        """Apply the plan that `plan` saved and its `vet` let through, exactly that; returns
        what changed. `on_made` is called each time Terraform says it finished a resource (the
        state file has it then or at the next call: Terraform writes it just after saying so).
        """
        if not (self.folder / PLAN_FILE).exists():
            raise ValueError("apply_plan without a plan: call plan() first")
        try:
            return self._run("apply", on_line, on_made).changes or ChangeSummary(0, 0, 0)
        finally:
            self._discard_plan()

    def apply(self, on_line: OnLine, *, vet: Vet, on_made: Callable[[], None] | None = None
              ) -> ChangeSummary:
        """Plan with the variables file, let `vet` refuse it, apply it; returns what changed
        (nothing, the second time)."""
        self.plan(on_line, vet=vet)
        return self.apply_plan(on_line, on_made=on_made)

    def destroy(self, on_line: OnLine, *, vet: Vet) -> ChangeSummary:
        """Remove everything in the run's state, once `vet` has seen what that deletes;
        nothing to do when nothing was applied."""
        if not self.state_file.exists():
            return ChangeSummary(0, 0, 0)
        self.plan(on_line, vet=vet, destroy=True)
        return self.apply_plan(on_line)

    def _discard_plan(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / PLAN_FILE).unlink()

    def outputs(self) -> InfraOutputs:
        """The outputs of the last apply, checked against the contract."""
        argv = terraform_argv(require_terraform(self.binary), self.folder, "output")
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              env=terraform_env(self._base_env()), check=False)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            error = next((ln for ln in reversed(lines) if ln.startswith("Error:")),
                         lines[-1] if lines else f"exit status {proc.returncode}")
            raise UserError(f"terraform output failed in {self.folder}: {one_line(error)}",
                            hint="run `tpuctl up` again")
        return InfraOutputs.from_output_json(proc.stdout, where=str(self.folder))

    def resources(self) -> list[StateResource] | None:
        """Every resource instance in the run's state file, read directly (Terraform rewrites
        it in place as each resource is made, so this works during an apply); None while the
        file is being written (read again a moment later)."""
        try:
            text = self.state_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        try:
            return state_resources(text)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def busy(self) -> bool:
        """Whether a Terraform holds the run's state lock now (one still applying after the
        command that started it was cut short). Terraform's local state lock is a POSIX lock
        on the state file: taking it without waiting tells."""
        try:
            import fcntl
        except ImportError:  # no POSIX locks here: Terraform's own lock wait still applies
            return False
        try:
            fd = os.open(self.state_file, os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def wait_idle(self, on_line: OnLine | None = None, *, timeout_s: float = BUSY_WAIT_S
                  ) -> None:
        """Wait while a Terraform is still running in the run's folder, saying so once."""
        if not self.busy():
            return
        if on_line is not None:
            on_line(f"waiting for Terraform, still running in {self.folder} for a command that "
                    f"was cut short (its output: {self.folder / LOG_FILE})")
        deadline = time.monotonic() + timeout_s
        while self.busy():
            if time.monotonic() > deadline:
                raise UserError(f"Terraform is still running in {self.folder} after "
                                f"{timeout_s / 60:g} minutes", hint=f"see {LOG_FILE} there; "
                                "run the command again once it has finished")
            time.sleep(0.2)

    def addresses(self) -> list[str]:
        """Every resource instance in the run's state (none when nothing was applied)."""
        if not self.state_file.exists():
            return []
        return self._state("list").stdout.split()

    def forget(self, addresses: list[str]) -> None:
        """Take resources out of the state: Terraform stops managing them and never deletes
        them; they stay in the cloud as they are."""
        if addresses:
            self._state("rm", *addresses)

    def _state(self, *args: str) -> subprocess.CompletedProcess:
        argv = state_argv(require_terraform(self.binary), self.folder, *args)
        self.wait_idle()
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, env=terraform_env(self._base_env()),
                              check=False)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()] or [
                f"exit status {proc.returncode}"]
            raise UserError(f"terraform state {args[0]} failed: {one_line(lines[-1])}",
                            hint=f"Terraform's working folder is {self.folder}")
        return proc

    def stage_module(self) -> list[Path]:
        """Copy the module's files into the working folder; files copied last time and since
        removed from the module are removed (only those: the state and variables stay)."""
        if not self.module.is_dir() or not any(self.module.glob("*.tf")):
            raise UserError(f"no Terraform module at {self.module}",
                            hint="reinstall tpuctl or pass the folder of a module")
        self.folder.mkdir(parents=True, exist_ok=True)
        listing = self.folder / STAGED_LIST
        previous = listing.read_text(encoding="utf-8").splitlines() if listing.exists() else []
        files = staged_files(self.module)
        keep = {f.as_posix() for f in files}
        for rel in previous:
            stale = self.folder / rel
            if rel not in keep and stale.is_file() and self.folder in stale.parents:
                stale.unlink()
        for rel in files:
            target = self.folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.module / rel, target)  # follows links: the copy stands alone
        storage.write_text(str(listing), "".join(f"{k}\n" for k in sorted(keep)))
        return files

    def _base_env(self) -> Mapping[str, str]:
        return self._env if self._env is not None else os.environ

    def _run(self, verb: Verb, on_line: OnLine, on_made: Callable[[], None] | None = None, *,
             label: str | None = None, destroy: bool = False) -> _Outcome:
        argv = terraform_argv(require_terraform(self.binary), self.folder, verb, destroy=destroy)
        self.wait_idle(on_line)
        outcome = _Outcome()
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / LOG_FILE
        with open(log, "wb") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=terraform_env(self._base_env()),
                                    start_new_session=True)
        try:
            for line in _follow(proc, log):
                if _take_line(line, outcome, on_line) == "apply_complete" and on_made:
                    on_made()
        except BaseException:
            # Ctrl-C, or a failure here: pass one interrupt on, Terraform's graceful stop, and
            # let it finish what it is doing and save its state (a second Ctrl-C leaves it to
            # finish alone; the next command waits for it).
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        outcome.rc = proc.wait()
        if outcome.rc != 0:
            error = (outcome.errors[-1] if outcome.errors
                     else outcome.plain[-1] if outcome.plain else f"exit status {outcome.rc}")
            raise UserError(f"terraform {label or verb} failed: {one_line(error)}",
                            hint=f"Terraform's working folder is {self.folder}")
        return outcome


def _ignore(_line: str) -> None:
    pass


def _diagnostics_only(on_line: OnLine) -> OnLine:
    """A plan's lines as shown: its warnings and errors, not what it plans (the apply says
    what it does)."""
    def show(line: str) -> None:
        if line.startswith(("Error: ", "Warning: ")):
            on_line(line)
    return show
