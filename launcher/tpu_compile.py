"""`tpuctl train --dry-run --compile`: the run's JAX steps through the real TPU compiler on this
machine, before any TPU exists, and what it said, in a few lines.

    target = compile_target(the_launch, accelerator="v5litepod-4")   # or the config's own slice
    report = compile_steps(the_launch, target, on_note=print)        # libtpu installed on first use
    for line in render(report): print(line)

The compiler is libtpu, the wheel jax[tpu] pins (the same pin and hash as the TPU hosts' lock,
launcher.tpu_lock). It is never installed into the environment JAX trains in on a CPU (a libtpu
that JAX can import makes every CPU run probe for a TPU and print libtpu's start-up errors):
it lives in its own folder under tpuctl's local state, `~/.tpuctl/libtpu/VERSION/`, installed
there on first use, hash-checked; JAX's own TPU_LIBRARY_PATH, where set, names another. The
compile runs as a process of its own (payload.stages.tpu_compile), so libtpu's C++ start-up
lines stay out of the terminal unless the compile fails (TPUCTL_DEBUG=1 shows them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher import executors
from payload.core import layout
from payload.core.errors import UserError

GIB = 1 << 30
LIBTPU = "libtpu"
LIBTPU_DIR = "libtpu"  # under tpuctl's local state: libtpu/VERSION/libtpu/libtpu.so
# A compile of a large model on a laptop's two cores takes minutes, and up to three are tried.
COMPILE_TIMEOUT_S = 3600


@dataclass(frozen=True, kw_only=True)
class CompileTarget:
    """The slice a compile is for, as payload.stages.tpu_compile takes it."""

    accelerator: str  # a TPU API type or a Compute Engine slice's name
    machine_type: str | None = None
    topology: str | None = None
    slices: int = 1  # cluster.slices: the program spans that many slices (get_topology_desc)

    def arguments(self) -> list[str]:
        more = ["--slices", str(self.slices)] if self.slices > 1 else []
        if self.machine_type:
            return ["--machine-type", self.machine_type, "--topology", self.topology or "",
                    *more]
        return ["--accelerator", self.accelerator, *more]


def compile_target(the_launch, *, accelerator: str | None = None) -> CompileTarget:
    """What to compile for: `accelerator` (--accelerator, any provider), else the config's TPU
    (gcp: its accelerator type; gce: its machine type and topology). A run on CPU workers
    without --accelerator has no TPU to compile for."""
    from payload.cloud.accelerators import accelerator as known_accelerator

    cluster = the_launch.config.cluster
    slices = cluster.slices
    if accelerator:
        return CompileTarget(accelerator=known_accelerator(accelerator).name, slices=slices)
    machine_type, topology = getattr(cluster, "machine_type", None), getattr(cluster,
                                                                           "topology", None)
    hardware = the_launch.fleet.hardware
    if machine_type and topology:
        return CompileTarget(accelerator=hardware.accelerator_type or "",
                             machine_type=machine_type, topology=topology, slices=slices)
    if hardware.accelerator_type:
        return CompileTarget(accelerator=hardware.accelerator_type, slices=slices)
    raise UserError(f"--compile: cluster.provider {cluster.provider} has no TPU to compile for",
                    hint="name one: --accelerator v5litepod-4 (any type in the accelerator "
                    "table)")


def check_can_compile(config) -> None:
    """What --compile needs before anything runs: the JAX engine, and its packages here."""
    from payload.core.engines import JAX, engine_spec

    if config.train.engine != JAX:
        raise UserError(f"--compile: the {config.train.engine} engine has no TPU compile check",
                        hint="the JAX engine has one: set train.engine: jax, or pass --engine "
                        "jax")
    missing = [name for name in ("jax", "flax", "optax") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"--compile: {', '.join(missing)} not installed in this Python "
                        f"({sys.executable})",
                        hint=f"pip install 'tpuctl[{'/'.join(engine_spec(JAX).extras)}]'")


# --- libtpu ----------------------------------------------------------------------------------


def libtpu_pin() -> tuple[str, str]:
    """(the pin, its wheel's sha256): the libtpu of the JAX engine's TPU lock."""
    from launcher.worker_python import tpu_lock, tpu_lock_hashes

    pin = next(p for p in tpu_lock("jax") if p.split("==")[0] == LIBTPU)
    return pin, tpu_lock_hashes("jax")[pin]


def libtpu_folder() -> Path:
    """Where tpuctl keeps the TPU compiler: ~/.tpuctl/libtpu/VERSION (TPUCTL_HOME moves it)."""
    version = libtpu_pin()[0].split("==")[1]
    return layout.state_dir() / LIBTPU_DIR / version


def library_in(folder: Path) -> Path:
    return folder / LIBTPU / "libtpu.so"


def find_libtpu() -> Path | None:
    """The libtpu.so to compile with: TPU_LIBRARY_PATH's (JAX's own variable) where it names a
    file, else tpuctl's installed one; None when neither is there."""
    named = os.environ.get("TPU_LIBRARY_PATH")
    if named:
        if not Path(named).is_file():
            raise UserError(f"TPU_LIBRARY_PATH={named} names no file",
                            hint="unset it to use tpuctl's own libtpu, or name a libtpu.so")
        return Path(named)
    library = library_in(libtpu_folder())
    return library if library.is_file() else None


def install_argv(requirements: Path, target: Path) -> list[str]:
    """pip, installing exactly the locked libtpu wheel, hash-checked, into `target`."""
    from launcher.worker_python import HASH_PINNED

    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            *HASH_PINNED, "--target", str(target), "-r", str(requirements)]


def install_libtpu(folder: Path, *, on_note=lambda line: None) -> Path:
    """The locked libtpu installed into `folder` (made whole or not at all: installed beside it,
    then renamed into place); returns its libtpu.so."""
    pin, sha256 = libtpu_pin()
    on_note(f"installing {pin.replace('==', ' ')} (the TPU compiler, a 210 MB download, 690 MB "
            f"installed) into {folder}, once")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        requirements = staging / "requirements.txt"
        requirements.write_text(f"{pin} --hash=sha256:{sha256}\n", encoding="utf-8")
        result = executors.run_here(install_argv(requirements, staging / "site"),
                                    timeout_s=COMPILE_TIMEOUT_S)
        if not result.ok:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"could not install {pin}: {last}",
                            hint="check the connection to the package index, or set "
                            "TPU_LIBRARY_PATH to a libtpu.so")
        try:
            os.rename(staging / "site", folder)
        except OSError:
            if not library_in(folder).is_file():  # another install got there first: keep it
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return library_in(folder)


# --- the compile -----------------------------------------------------------------------------


def compile_argv(config_file: Path, target: CompileTarget, report: Path) -> list[str]:
    return [sys.executable, "-m", "payload.stages.tpu_compile", "--config", str(config_file),
            *target.arguments(), "--report", str(report)]


def compile_steps(the_launch, target: CompileTarget, *, on_note=lambda line: None) -> dict:
    """Run payload.stages.tpu_compile for the launch's resolved config; its report, or its one
    line as a UserError."""
    from payload.config import dump_config

    check_can_compile(the_launch.config)
    library = find_libtpu() or install_libtpu(libtpu_folder(), on_note=on_note)
    slices = f" x {target.slices} slices" if target.slices > 1 else ""
    on_note(f"compiling for {target.accelerator}{slices} with the TPU compiler on this machine "
            "(minutes on a laptop's CPU)")
    with tempfile.TemporaryDirectory(prefix="tpuctl-compile-") as work:
        config_file, report = Path(work) / "tpuctl.yaml", Path(work) / "report.json"
        config_file.write_text(dump_config(the_launch.config), encoding="utf-8")
        result = executors.run_here(compile_argv(config_file, target, report),
                                    env={"TPU_LIBRARY_PATH": str(library)},
                                    timeout_s=COMPILE_TIMEOUT_S)
        if result.ok and report.is_file():
            return json.loads(report.read_text(encoding="utf-8"))
    said = [line.removeprefix("error: ") for line in result.stderr.splitlines()
            if line.startswith("error: ")]
    if said:
        raise UserError(said[0])
    if os.environ.get("TPUCTL_DEBUG"):
        sys.stderr.write(result.stderr)
    last = next((line for line in reversed(result.stderr.splitlines())
                 if line.strip() and not line.startswith((" ", "\t"))), "no output")
    raise UserError(f"the TPU compile {how_it_ended(result.rc)}: {last[:300]}",
                    hint="TPUCTL_DEBUG=1 shows all it printed")


def how_it_ended(rc: int) -> str:
    """The compile process's end in words: a signal by its name (libtpu's compiler has crashed
    here on a T5 with train.remat full: SIGSEGV), else its status.

    >>> how_it_ended(-11), how_it_ended(-9), how_it_ended(1)
    ('crashed (SIGSEGV)', 'was killed (SIGKILL; out of memory on this machine?)', 'ended with status 1')
    """
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        if name == "SIGKILL":
            return "was killed (SIGKILL; out of memory on this machine?)"
        return f"crashed ({name})"
    return f"ended with status {rc}"


# --- what it said ----------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def render(report: dict) -> list[str]:
    """The compile's report in a few lines: slice and mesh, memory beside the estimate, the
    attention kernel in the program, FLOPs beside the formula, the compile time."""
    train, evaluation = report["train"], report["eval"]
    memory = train["memory"]
    # Per chip where a chip is one device; TPU7x's two TensorCores are two devices of half its HBM.
    per = "chip" if report["devices"] == report["chips"] else "device"
    mesh = report["mesh"]
    layout_words = ("data parallel" if mesh["fsdp"] == 1 else
                    f"FSDP over {mesh['fsdp']} devices")
    slices = report.get("slices", 1)
    if slices > 1:
        layout_words = f"data parallel over {slices} slices (DCN), {layout_words} within each"
    lines = [
        f"compile: {report['accelerator']}{f' x {slices} slices' if slices > 1 else ''} = "
        f"{report['devices']} {report['device_kind']} "
        f"devices ({report['topology']}), mesh data {mesh['data']} x fsdp {mesh['fsdp']} "
        f"({layout_words}), train.remat {report['remat']}",
        f"compiled train step: {_gib(train['hbm_bytes'])} HBM per {per} (arguments "
        f"{_gib(memory['arguments'])} + temporaries {_gib(memory['temporaries'])} + outputs "
        f"{_gib(memory['outputs'])} - aliased {_gib(memory['aliased'])}) of "
        f"{report['hbm_bytes_per_device'] / GIB:.0f} GiB; the plan estimated "
        f"{_gib(report['estimate_bytes'])}",
        *_choice_words(report),
        f"compiled eval step: {_gib(evaluation['hbm_bytes'])} HBM per {per}",
        f"attention in the compiled program: {attention_words(train['kernels'])}",
    ]
    formula = report["flops_per_step_formula"]
    if train["flops"] and formula:
        lines.append(f"FLOPs per step: {train['flops']:.3g} by the compiler (all devices), "
                     f"{formula:.3g} by the project's formula (x{train['flops'] / formula:.2f})")
    lines.append(f"compile time: {train['compile_s']:.0f} s (train step), "
                 f"{evaluation['compile_s']:.0f} s (eval step), {report['seconds']:.0f} s in all")
    return lines


def _choice_words(report: dict) -> list[str]:
    """With train.remat auto the compiler's figure chose the policy; where that is not the
    estimate's choice, which the run's own plan makes, the line says how to train with it."""
    estimated = report.get("estimate_choice") or {}
    if report.get("chosen_by") != "compiler":
        return []
    return [f"the compiler's choice: train.remat {report['remat']} (the plan's estimate chose "
            f"{estimated.get('remat')}); to train with it, set train.remat: {report['remat']}"]


def attention_words(kernels: dict[str, int]) -> str:
    splash = kernels.get("splash", 0)
    if splash:
        return (f"splash (Pallas TPU kernels: {splash} calls, forward and backward, in the "
                "training step)")
    return "the reference (no Pallas TPU attention kernel in the program)"


if __name__ == "__main__":  # the test suite's set-up: python -m launcher.tpu_compile FOLDER
    print(install_libtpu(Path(sys.argv[1]).resolve(), on_note=print))
