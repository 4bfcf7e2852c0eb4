"""Compile a run's JAX steps for a TPU slice on this machine, without a TPU: the worker side of
`tpuctl train --dry-run --compile` (launcher.tpu_compile runs it as a process of its own).

    main(["--config", "run.yaml", "--accelerator", "v5litepod-4", "--report", "r.json"])
    main(["--config", "run.yaml", "--machine-type", "tpu7x-standard-4t", "--topology",
          "2x2x2", "--report", "r.json"])                   # a Compute Engine slice

(`python -m payload.stages.tpu_compile ...` with the same arguments, TPU_LIBRARY_PATH naming
libtpu.so.)

Writes the report (payload.engines.jax.tpu_compile) as JSON to --report; a mistake or a program
that does not fit is one `error:` line and exit status 2, as every stage ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from payload.core.errors import UserError, error_lines


def compile_environment(accelerator_type: str) -> dict[str, str]:
    """What libtpu is told before JAX starts: no TPU here (no metadata server to ask, one host
    named localhost) and which slice it compiles for; JAX runs its own work on the CPU. And no
    chips to guard: without ALLOW_MULTIPLE_LIBTPU_LOAD a second compile while one runs (two
    dry runs, a bench beside one) stopped at libtpu's lockfile, /tmp/libtpu_lockfile
    ("Internal error when accessing libtpu multi-process lockfile"), and a compile on a TPU VM
    would hold the lock its training needs."""
    return {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
            "TPU_ACCELERATOR_TYPE": accelerator_type, "JAX_PLATFORMS": "cpu",
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m payload.stages.tpu_compile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", "-c", required=True)
    parser.add_argument("--accelerator", help="a TPU API accelerator type (v5litepod-4)")
    parser.add_argument("--machine-type", help="a Compute Engine TPU machine type")
    parser.add_argument("--topology", help="the slice's topology (with --machine-type)")
    parser.add_argument("--slices", type=int, default=1,
                        help="slices over the data-center network (cluster.slices)")
    parser.add_argument("--report", required=True, help="where to write the JSON report")
    return parser


def target_of(args):
    """(the Accelerator of one slice, the CompileTopology of them all) the arguments name."""
    from payload.cloud import accelerators

    if args.slices < 1:
        raise UserError(f"--slices {args.slices}: at least 1")

    if args.machine_type:
        if not args.topology:
            raise UserError("--machine-type needs --topology")
        acc = accelerators.compute_slice(args.machine_type, args.topology)
        return acc, accelerators.compile_topology(acc, args.topology, num_slices=args.slices)
    if not args.accelerator:
        raise UserError("name the slice: --accelerator TYPE, or --machine-type and --topology")
    acc = accelerators.accelerator(args.accelerator)
    return acc, accelerators.compile_topology(acc, num_slices=args.slices)


def run(args) -> dict:
    from payload.config import load_config
    from payload.core.engines import JAX

    config = load_config(args.config)
    if config.train.engine != JAX:
        raise UserError(f"train.engine {config.train.engine}: only the JAX engine's steps can "
                        "be compiled for a TPU here", hint="set train.engine: jax")
    acc, target = target_of(args)
    for key, value in compile_environment(acc.name).items():
        os.environ.setdefault(key, value)
    if not os.environ.get("TPU_LIBRARY_PATH"):
        raise UserError("no TPU compiler: TPU_LIBRARY_PATH names no libtpu.so",
                        hint="run it through `tpuctl train --dry-run --compile`, which "
                        "installs libtpu")
    from payload.engines import compile_for_tpu

    return compile_for_tpu(config, acc, target)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        report = run(args)
    except UserError as exc:
        if os.environ.get("TPUCTL_DEBUG"):
            raise
        for line in error_lines(exc):
            print(f"error: {line}", file=sys.stderr, flush=True)
        return exc.exit_code
    with open(args.report, "w", encoding="utf-8") as out:
        json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
