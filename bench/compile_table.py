"""The run plan's memory estimate against the real TPU compiler: each row a run config compiled
for a TPU slice on this machine (payload.stages.tpu_compile; libtpu from `make setup-libtpu` or
TPU_LIBRARY_PATH), its training step's HBM per chip as XLA allocates it beside the plan's
estimate. Compiles take minutes each on two cores: run it once, keep its table in
docs/jax-speed.md ("The estimate against the compiler").

    python -m bench.compile_table                 # every row (an hour or more here)
    python -m bench.compile_table --only gpt2     # the rows of one family
    python -m bench.compile_table --quick         # tiny models on each generation (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LIBTPU = REPO / ".venv-libtpu" / "libtpu" / "libtpu.so"
GIB = 1 << 30

# (family, size, seq_len, global batch, where): each family at its base and largest size on v5e
# and v6e, a row each on v4, v5p and TPU7x; every row with train.remat none and full.
SHAPES = {"bert": ("base", "large", 512, 64), "roberta": ("base", "large", 512, 64),
          "gpt2": ("small", "xl", 1024, 32), "t5": ("base", "large", 512, 64),
          "llama": ("135m", "1.1b", 2048, 32)}
V5E, V6E = ("--accelerator", "v5litepod-8"), ("--accelerator", "v6e-8")
OTHERS = {"v4": ("--accelerator", "v4-16"), "v5p": ("--accelerator", "v5p-16"),
          "tpu7x": ("--machine-type", "tpu7x-standard-4t", "--topology", "2x2x1")}


def rows(only: str | None) -> list[tuple[str, str, int, int, tuple, str]]:
    """Every row: the base sizes first (each family on v5e, then v6e), then the largest, then
    the other generations."""
    found = []
    for index in (0, 1):
        for where in (V5E, V6E):
            for family, shape in SHAPES.items():
                if only and only != family:
                    continue
                size, seq_len, batch = shape[index], shape[2], shape[3]
                found += [(family, size, seq_len, batch, where, remat)
                          for remat in ("none", "full")]
    for target, family in zip(OTHERS.values(), ("bert", "gpt2", "t5"), strict=True):
        if only and only != family:
            continue
        base, _, seq_len, batch = SHAPES[family]
        found += [(family, base, seq_len, batch, target, remat) for remat in ("none", "full")]
    return found


def quick_rows() -> list[tuple]:
    return [("gpt2", "tiny", 256, 8, target, "none")
            for target in (V5E, V6E, *OTHERS.values())]


def config(family: str, size: str, seq_len: int, batch: int, remat: str) -> dict:
    return {
        "name": "compile-table", "cluster": {"provider": "local", "workers": 1},
        "data": {"corpus": str(REPO / "payload" / "data" / "corpus.txt.gz"), "seq_len": seq_len},
        "tokenizer": {"kind": "bpe", "vocab_size": 32000},
        "model": {"family": family, "size": size},
        "train": {"engine": "jax", "steps": 1000, "batch_size": batch, "learning_rate": 1e-4,
                  "bf16": True, "remat": remat},
        "output_dir": str(Path(tempfile.gettempdir()) / "compile-table"),
    }


def compile_row(row, work: Path) -> dict:
    family, size, seq_len, batch, target, remat = row
    path = work / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(config(family, size, seq_len, batch, remat)))
    report = work / "report.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "TPU_LIBRARY_PATH": os.environ.get("TPU_LIBRARY_PATH", str(LIBTPU))}
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "payload.stages.tpu_compile", "-c", str(path),
                             *target, "--report", str(report)], capture_output=True, text=True,
                            env=env, stdin=subprocess.DEVNULL)
    said = {"family": family, "size": size, "seq_len": seq_len, "batch": batch,
            "target": " ".join(target[1:]), "remat": remat,
            "seconds": round(time.monotonic() - began)}
    if result.returncode != 0 or not report.is_file():
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        return said | {"refused": (errors or result.stderr.splitlines()[-1:] or ["?"])[0]}
    data = json.loads(report.read_text())
    return said | {"accelerator": data["accelerator"], "fsdp": data["mesh"]["fsdp"],
                   "estimate": data["estimate_bytes"], "compiled": data["train"]["hbm_bytes"],
                   "hbm": data["hbm_bytes_per_device"],
                   "splash": data["train"]["kernels"].get("splash", 0)}


def table(results: list[dict]) -> list[str]:
    lines = ["| model | seq x batch | slice | remat | FSDP | estimate GiB | compiled GiB | "
             "estimate / compiled | splash calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        what = f"{r['family']} {r['size']}"
        shape = f"{r['seq_len']} x {r['batch']}"
        if "refused" in r:
            lines.append(f"| {what} | {shape} | {r['target']} | {r['remat']} | | | | "
                         f"{r['refused'][:120]} | |")
            continue
        ratio = r["estimate"] / r["compiled"] if r["compiled"] else float("nan")
        lines.append(f"| {what} | {shape} | {r['accelerator']} | {r['remat']} | {r['fsdp']} | "
                     f"{r['estimate'] / GIB:.2f} | {r['compiled'] / GIB:.2f} | {ratio:.2f} | "
                     f"{r['splash']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_table")
    parser.add_argument("--only", help="one family's rows")
    parser.add_argument("--quick", action="store_true", help="tiny models on each generation")
    parser.add_argument("--rows", type=int, help="only the first N rows")
    parser.add_argument("--out", default=str(REPO / "bench" / "compile-table.json"))
    args = parser.parse_args()
    if not (os.environ.get("TPU_LIBRARY_PATH") or LIBTPU.is_file()):
        sys.exit("no TPU compiler: run `make setup-libtpu` (or set TPU_LIBRARY_PATH)")
    results = []
    with tempfile.TemporaryDirectory() as work:
        for row in (quick_rows() if args.quick else rows(args.only))[:args.rows]:
            results.append(compile_row(row, Path(work)))
            print(table(results)[-1], flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
