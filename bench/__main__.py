"""Run every benchmark, print the tables, write bench/results.json."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SUITES = ["bench.prepare_bench", "bench.train_bench", "bench.launch_bench", "bench.gcs_bench",
          "bench.accel_bench", "bench.reader_bench"]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller inputs (a smoke run)")
    parser.add_argument("--only", help="run one suite: prepare, train, launch, gcs, accel or "
                        "reader")
    parser.add_argument("--torch-python", help="accel: the Python with torch and transformers "
                        "(default: this one)")
    parser.add_argument("--jax-python", help="accel: the Python with JAX (default: this one)")
    args = parser.parse_args()
    # Only the suites that take an option get it (the accelerator bench's Pythons).
    options = {"torch_python": args.torch_python, "jax_python": args.jax_python}
    results: dict = {"machine": {"cores": os.cpu_count(), "python": platform.python_version()},
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for name in SUITES:
        if args.only and args.only not in name:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        accepted = inspect.signature(module.run).parameters
        module.run(results, quick=args.quick,
                   **{k: v for k, v in options.items() if k in accepted and v is not None})
    out = Path(__file__).resolve().parent / "results.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
