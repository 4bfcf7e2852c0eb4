"""Launcher figures: `tpuctl --help` time, shipping to 1/4/16 SSH workers, a cached second set-up.

    python -m bench --only launch

Workers are real sshd processes on this machine (testbed/fleet.py), so the times are set-up and
protocol cost, not network distance, and every worker's own work (a Python start to check the
environment and unpack the payload) competes for this machine's cores: the fan-out figure
(probe + copy, no worker-side Python) is the launcher's own scaling. Targets: --help < 0.5 s; shipping to 16 workers at most
2x the time of 1; the set-up of a second `train` with nothing changed < 3 s on 4 workers.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _timed(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    return time.perf_counter() - started, proc


def _help_time(repeats: int, env: dict) -> float:
    times = []
    for _ in range(repeats):
        took, proc = _timed([sys.executable, "-m", "launcher.cli", "--help"], env)
        assert proc.returncode == 0, proc.stderr
        times.append(took)
    return min(times)


def _ship_times(fleet, sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    """First shipping + environment check (existing Python), from clean workers each time."""
    from launcher import ship
    from launcher.executors import SshExecutor, SshSettings, on_workers
    from launcher.plan import Worker, job_paths
    from launcher.worker_python import plan_environment

    settings = SshSettings(user="root", known_hosts=fleet.known_hosts,
                           identity_file=fleet.identity_file)
    workers = tuple(Worker(index=i, host=h, address=h, coordination_port=0, ssh_port=fleet.port)
                    for i, h in enumerate(fleet.hosts))
    env = plan_environment(python=sys.executable, wheelhouse_digest=None,
                           requirements=ship.worker_requirements(), tpu=False)
    with tempfile.TemporaryDirectory() as tmp:
        wheel, digest = ship.build_wheel(Path(tmp))
        paths = tuple(job_paths("bench", digest, w.index) for w in workers)
        results = {}
        with SshExecutor(workers, settings) as executor:
            for n in sizes:
                chosen = workers[:n]
                times = []
                for _ in range(repeats):
                    for w in workers:
                        executor.run(w, "rm -rf .tpuctl")  # also warms the connection
                    started = time.perf_counter()
                    done = ship.ship(executor, chosen, env, paths, wheel)
                    times.append(time.perf_counter() - started)
                    assert all(d["payload"] and d["env"] for d in done)
                results[n] = statistics.median(times)
                # The launcher's own fan-out: one probe and one copy per worker, no worker-side
                # Python (which here shares this machine's 2 cores with every other worker).
                fanout = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    on_workers(chosen, lambda w: (
                        executor.run(w, ship.probe_command(env, paths[w.index], None)),
                        executor.put(w, str(wheel), paths[w.index].wheel)))
                    fanout.append(time.perf_counter() - started)
                results[f"fanout-{n}"] = statistics.median(fanout)
    return results


def _second_setup_time(fleet, env: dict, repeats: int) -> float:
    """Wall time of `tpuctl train --detach` on 4 workers with everything cached: from the
    command to the job running (config, workers, wheel, checks, start), stages excluded."""
    import yaml

    from testbed import install_stub

    shared = fleet.shared / "bench-setup"
    stub = install_stub(shared / "stub", {"steps": {"train": 3}})
    corpus = shared / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a tiny corpus\n" for i in range(200)))
    config = shared / "tpuctl.yaml"
    config.write_text(yaml.safe_dump({
        "name": "bench", "output_dir": str(shared / "out"),
        "cluster": {"provider": "ssh", "hosts": fleet.hosts[:4], "user": "root",
                    "identity_file": fleet.identity_file, "known_hosts": fleet.known_hosts,
                    "port": fleet.port, "python": sys.executable},
        "data": {"corpus": str(corpus), "seq_len": 32, "records_per_shard": 50},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": 4, "batch_size": 4}}))
    env = {**env, "TPUCTL_STAGE_ENTRY": str(stub)}
    argv = [sys.executable, "-m", "launcher.cli", "train", "-c", str(config), "--detach",
            "--stages", "export"]
    times = []
    for attempt in range(repeats + 1):
        took, proc = _timed(argv, env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        if attempt:  # the first run sets the workers up
            assert "all cached" in proc.stdout, proc.stdout
            times.append(took)
        # Let the tiny job end so the next train is not refused as "still running".
        _timed([sys.executable, "-m", "launcher.cli", "logs", "-c", str(config)], env)
    return statistics.median(times)


def run(results: dict, quick: bool) -> None:
    from testbed.fleet import Fleet, sshd_available

    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TPUCTL_HOME": home}
        figures: dict = {"help_s": _help_time(3 if quick else 5, env)}
        if not sshd_available():
            figures["skipped"] = "no sshd (apt-get install -y openssh-server) or not root"
        else:
            started = time.perf_counter()
            with Fleet(16) as fleet:
                figures["fleet_up_16_s"] = time.perf_counter() - started
                ship = _ship_times(fleet, (1, 4, 16), 1 if quick else 3)
                figures["ship_s"] = {str(n): ship[n] for n in (1, 4, 16)}
                figures["ship_16_over_1"] = ship[16] / ship[1]
                figures["fanout_s"] = {str(n): ship[f"fanout-{n}"] for n in (1, 4, 16)}
                figures["fanout_16_over_1"] = ship["fanout-16"] / ship["fanout-1"]
                figures["second_setup_4_s"] = _second_setup_time(fleet, env, 2 if quick else 3)
    results["launcher"] = figures
    _print(figures)


def _print(figures: dict) -> None:
    print("\nlauncher")
    print(f"  {'tpuctl --help':<40} {figures['help_s']:7.3f} s   (target < 0.5 s)")
    if "skipped" in figures:
        print(f"  SSH figures skipped: {figures['skipped']}")
        return
    for n, t in figures["ship_s"].items():
        print(f"  {'ship + environment check, ' + n + ' workers':<40} {t:7.3f} s")
    print(f"  {'16 workers / 1 worker':<40} {figures['ship_16_over_1']:7.2f} x   (target <= 2)")
    for n, t in figures["fanout_s"].items():
        print(f"  {'fan-out only (probe + copy), ' + n + ' workers':<40} {t:7.3f} s")
    print(f"  {'fan-out 16 workers / 1 worker':<40} {figures['fanout_16_over_1']:7.2f} x")
    print(f"  {'second train set-up, 4 workers':<40} {figures['second_setup_4_s']:7.3f} s"
          "   (target < 3 s)")


if __name__ == "__main__":
    out: dict = {}
    run(out, quick="--quick" in sys.argv)
