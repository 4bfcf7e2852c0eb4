"""`tpuctl train --dry-run --compile` before anything compiles: the slice as the TPU compiler
takes it, the refusals that cost nothing, where libtpu comes from and how it is installed, and
the lines a compile's report becomes. (The compiles themselves: tests/integration.)"""

from __future__ import annotations

import pytest
import yaml

from launcher import executors
from launcher import tpu_compile as launcher_compile
from launcher.executors import Result
from launcher.tpu_lock import JAX_TPU_LOCK, JAX_TPU_LOCK_SHA256
from payload.cloud.accelerators import accelerator, compile_topology, compute_slice
from payload.core.errors import UserError
from tests.support.gce_configs import gce_raw
from tests.support.jax_plans import V6E, config
from tests.support.runners import tpuctl


@pytest.mark.parametrize("name, topology, chip_config, bounds, devices", [
    ("v5litepod-1", "v5e:1x1", "default", (1, 1, 1), 1),
    ("v5litepod-4", "v5e:2x2", "default", (2, 2, 1), 4),
    ("v5litepod-8", "v5e:2x4", "default", (2, 4, 1), 8),
    ("v5litepod-16", "v5e:4x4", "default", (2, 2, 1), 16),
    ("v6e-256", "v6e:16x16", "default", (2, 2, 1), 256),
    # v4 and v5p names count TensorCores; JAX drives a chip's two as one megacore device.
    ("v4-8", "v4:2x2x1", "megacore", (2, 2, 1), 4),
    ("v4-32", "v4:2x2x4", "megacore", (2, 2, 1), 16),
    ("v5p-16", "v5p:2x2x2", "default", (2, 2, 1), 8),
])
def test_a_tpu_api_slice_is_compiled_for_as_libtpu_names_it(name, topology, chip_config,
                                                           bounds, devices):
    target = compile_topology(accelerator(name))
    assert (target.name, target.chip_config, target.chips_per_host_bounds, target.devices,
            target.num_slices) == (topology, chip_config, bounds, devices, 1)


def test_a_compute_engine_slice_keeps_its_own_topology():
    # TPU7x: two TensorCores a chip, each a JAX device.
    target = compile_topology(compute_slice("tpu7x-standard-4t", "2x2x2"), "2x2x2")
    assert (target.name, target.devices, target.chips_per_host_bounds) == (
        "tpu7x:2x2x2", 16, (2, 2, 1))
    target = compile_topology(compute_slice("ct6e-standard-8t", "2x4"), "2x4")
    assert (target.name, target.chips_per_host_bounds) == ("v6e:2x4", (2, 4, 1))


def test_several_slices_are_one_compile_request_of_every_slice():
    from argparse import Namespace

    from payload.stages.tpu_compile import target_of

    acc, target = target_of(Namespace(accelerator="v5litepod-16", machine_type=None,
                                      topology=None, slices=2))
    assert acc.name == "v5litepod-16"  # one slice's, as HBM and the ICI shape are per slice
    assert (target.name, target.num_slices, target.devices) == ("v5e:4x4", 2, 32)
    _, target = target_of(Namespace(accelerator=None, machine_type="ct6e-standard-4t",
                                    topology="4x4", slices=2))
    assert (target.name, target.num_slices, target.devices) == ("v6e:4x4", 2, 32)


def _dry_compile(tmp_path, monkeypatch, raw: dict, *extra):
    calls = []
    monkeypatch.setattr(executors, "run_here", lambda *a, **k: calls.append(a) or Result(1, "", ""))
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = tpuctl("train", "-c", path, *extra, env={
        "TPUCTL_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")})
    return result, calls


@pytest.mark.parametrize("raw_over, args, said", [
    ({}, ("--compile",), "--compile goes with --dry-run"),
    ({}, ("--dry-run", "--accelerator", "v5litepod-4"), "--accelerator goes with --compile"),
    ({"train": {"engine": "tensorflow"}}, ("--dry-run", "--compile", "--accelerator",
                                           "v5litepod-4"),
     "--compile: the tensorflow engine has no TPU compile check"),
    ({}, ("--dry-run", "--compile"), "--compile: cluster.provider local has no TPU to compile "
                                     "for; name one: --accelerator v5litepod-4"),
    ({}, ("--dry-run", "--compile", "--accelerator", "v5e-4"),
     "unknown accelerator type 'v5e-4'"),
])
def test_what_cannot_be_compiled_is_one_line_before_anything_runs(tmp_path, monkeypatch,
                                                                   raw_over, args, said):
    result, calls = _dry_compile(tmp_path, monkeypatch, config(tmp_path, **raw_over), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.stdout + result.stderr
    assert calls == [] and not (tmp_path / "home").exists() and not (tmp_path / "out").exists()


def test_a_model_no_arrangement_of_the_slice_holds_is_refused_before_a_compile(tmp_path,
                                                                               monkeypatch):
    # GPT-2 xl at seq 1024, batch 64 on one v5e chip with every activation kept: the plan
    # refuses it (its state alone is over a chip's share) and names what would fit; the
    # compiler is never asked.
    raw = config(tmp_path, cluster={**V6E, "accelerator_type": "v5litepod-1",
                                    "zone": "us-west4-a"},
                 data={"seq_len": 1024}, tokenizer={"kind": "bpe", "vocab_size": 50257},
                 model={"family": "gpt2", "size": "xl"},
                 train={"batch_size": 64, "bf16": True, "remat": "none"})
    del raw["output_dir"]
    result, calls = _dry_compile(tmp_path, monkeypatch, raw, "--dry-run", "--compile")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "v5litepod-1" in lines[0] and "use v5litepod-" in lines[0], lines
    assert calls == []


def test_libtpu_is_the_tpu_hosts_pin_with_its_hash():
    pin, sha256 = launcher_compile.libtpu_pin()
    assert pin in JAX_TPU_LOCK and JAX_TPU_LOCK_SHA256[pin] == sha256
    assert pin.startswith("libtpu==")


def test_libtpu_is_found_where_named_or_where_tpuctl_installed_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    assert launcher_compile.find_libtpu() is None
    library = launcher_compile.library_in(launcher_compile.libtpu_folder())
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert launcher_compile.find_libtpu() == library
    assert str(launcher_compile.libtpu_folder()).startswith(str(tmp_path / "home" / "libtpu"))
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(tmp_path / "nowhere.so"))
    with pytest.raises(UserError, match=r"TPU_LIBRARY_PATH=.* names no file"):
        launcher_compile.find_libtpu()


def test_libtpu_is_installed_hash_checked_and_whole_or_not_at_all(tmp_path, monkeypatch):
    folder = tmp_path / "libtpu" / "0.0.42.1"
    seen = {}

    def pip(argv, **_):
        seen["argv"] = argv
        seen["requirements"] = (tmp_path / argv[argv.index("-r") + 1]).read_text()
        return Result(1, "", "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES")

    monkeypatch.setattr(executors, "run_here", pip)
    with pytest.raises(UserError, match=r"could not install libtpu==.*DO NOT MATCH THE HASHES"):
        launcher_compile.install_libtpu(folder)
    assert "--require-hashes" in seen["argv"] and "--no-deps" in seen["argv"]
    pin, sha256 = launcher_compile.libtpu_pin()
    assert seen["requirements"] == f"{pin} --hash=sha256:{sha256}\n"
    # Nothing left behind: neither the folder nor the staging beside it.
    assert list(folder.parent.iterdir()) == []

    def installs(argv, **_):
        site = tmp_path / argv[argv.index("--target") + 1]
        (site / "libtpu").mkdir(parents=True)
        (site / "libtpu" / "libtpu.so").write_bytes(b"\x7fELF")
        return Result(0, "", "")

    monkeypatch.setattr(executors, "run_here", installs)
    assert launcher_compile.install_libtpu(folder) == folder / "libtpu" / "libtpu.so"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["0.0.42.1"]


REPORT = {
    "accelerator": "v5litepod-4", "generation": "v5e", "topology": "v5e:2x2", "chips": 4,
    "devices": 4, "device_kind": "TPU v5 lite", "hbm_bytes_per_device": 16 << 30,
    "mesh": {"data": 4, "fsdp": 1}, "remat": "none", "estimate_bytes": int(5.67 * (1 << 30)),
    "train": {"fits": True, "hbm_bytes": int(6.11 * (1 << 30)),
              "memory": {"arguments": int(1.39 * (1 << 30)), "temporaries": int(4.72 * (1 << 30)),
                         "outputs": int(1.39 * (1 << 30)), "aliased": int(1.39 * (1 << 30))},
              "flops": 1.2e15, "kernels": {"splash": 36}, "compile_s": 36.5},
    "eval": {"fits": True, "hbm_bytes": 2 << 30, "kernels": {"splash": 12}, "compile_s": 9.0},
    "flops_per_step_formula": 1.0e15, "seconds": 50.2,
}


def test_a_policy_the_compiler_chose_over_the_estimate_is_said_with_its_setting():
    said = launcher_compile.render(REPORT | {"chosen_by": "compiler",
                                             "estimate_choice": {"remat": "full", "fsdp": 1}})
    assert said[2] == ("the compiler's choice: train.remat none (the plan's estimate chose "
                       "full); to train with it, set train.remat: none")
    agreed = launcher_compile.render(REPORT | {"chosen_by": "estimate",
                                               "estimate_choice": {"remat": "none", "fsdp": 1}})
    assert not any("choice" in line for line in agreed)


def test_a_compile_report_is_a_few_lines_that_say_compiled():
    lines = launcher_compile.render(REPORT)
    assert lines[0] == ("compile: v5litepod-4 = 4 TPU v5 lite devices (v5e:2x2), mesh data 4 x "
                        "fsdp 1 (data parallel), train.remat none")
    assert lines[1].startswith("compiled train step: 6.11 GiB HBM per chip (arguments 1.39 GiB "
                               "+ temporaries 4.72 GiB + outputs 1.39 GiB - aliased 1.39 GiB) "
                               "of 16 GiB; the plan estimated 5.67 GiB")
    assert "attention in the compiled program: splash" in lines[3]
    assert "1.2e+15 by the compiler (all devices), 1e+15 by the project's formula (x1.20)" in \
        lines[4]
    no_kernel = {**REPORT, "train": {**REPORT["train"], "kernels": {}}}
    assert "the reference (no Pallas TPU attention kernel" in launcher_compile.render(no_kernel)[3]


@pytest.mark.parametrize("raw, target", [
    (gce_raw(topology="2x2x2"), ["--machine-type", "tpu7x-standard-4t", "--topology", "2x2x2"]),
    (gce_raw(machine_type="ct6e-standard-4t", topology="4x4"),
     ["--machine-type", "ct6e-standard-4t", "--topology", "4x4"]),
    ({**gce_raw(), "cluster": {**V6E}}, ["--accelerator", "v6e-8"]),
    # cluster.slices: the one program spans every slice (get_topology_desc num_slices).
    (gce_raw(machine_type="ct6e-standard-4t", topology="4x4", slices=2,
             train={"batch_size": 32}),
     ["--machine-type", "ct6e-standard-4t", "--topology", "4x4", "--slices", "2"]),
    ({**gce_raw(train={"batch_size": 32}), "cluster": {**V6E, "slices": 2}},
     ["--accelerator", "v6e-8", "--slices", "2"]),
])
def test_the_compile_is_for_the_configs_own_slice(tmp_path, monkeypatch, raw, target):
    # What the compile process is asked for (its answer here: one error line, passed on).
    library = tmp_path / "libtpu.so"
    library.write_bytes(b"")
    calls = []

    def compile_process(argv, **kwargs):
        calls.append((argv, kwargs["env"]))
        return Result(2, "", "libtpu start-up noise\nerror: the compiler said no\n")

    monkeypatch.setattr(executors, "run_here", compile_process)
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = tpuctl("train", "-c", path, "--dry-run", "--compile", env={
        "TPUCTL_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
        "TPU_LIBRARY_PATH": str(library),
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")})
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert errors == ["error: the compiler said no"]
    (argv, env), = calls
    assert argv[1:4] == ["-m", "payload.stages.tpu_compile", "--config"]
    assert argv[5:-2] == target and env == {"TPU_LIBRARY_PATH": str(library)}


def test_a_compiler_that_crashes_is_one_line_naming_the_signal(tmp_path, monkeypatch):
    # libtpu's compiler has ended in SIGSEGV here (T5 base, train.remat full, v5litepod-8).
    library = tmp_path / "libtpu.so"
    library.write_bytes(b"")
    monkeypatch.setattr(executors, "run_here", lambda argv, **kwargs: Result(
        -11, "", "E1128 03:03:54 process_state.cc:708] RAW: Raising signal 11 with default "
                 "behavior\n"))
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump({**gce_raw(), "cluster": {**V6E}}))
    result = tpuctl("train", "-c", path, "--dry-run", "--compile", env={
        "TPUCTL_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
        "TPU_LIBRARY_PATH": str(library),
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")})
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the TPU compile crashed (SIGSEGV)" in errors[0], errors
