"""Local worker processes: the local CPU mode (`tpuctl train --local`) and `provider: local`.

    provider = LocalProvider.from_config(config, num_workers=2)
    provider.fleet().workers[1].base_dir          # ~/.tpuctl/local/NAME/worker-1

Each worker is a process group started in its own folder under the state folder, so the
relative paths of a plan mean the same as in an SSH user's home. They share this machine's
disk, credentials and Python, and coordinate over loopback ports that are free when planned.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.executors import LocalExecutor
from launcher.plan import Worker
from launcher.providers.base import Fleet, OwnMachines
from launcher.records import state_dir
from payload.config import MAX_LOCAL_WORKERS, LocalCluster
from payload.core import layout
from payload.core.errors import UserError
from payload.core.layout import worker_label
from payload.training.strategy import CPU, Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig


NAME = "local"
DEFAULT_WORKERS = 2


def free_ports(count: int) -> list[int]:
    """Ports free right now on this machine, for local workers' TF coordination."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def check_count(count: int) -> None:
    if not 1 <= count <= MAX_LOCAL_WORKERS:
        raise UserError(f"--workers {count}: need between 1 and {MAX_LOCAL_WORKERS} workers")


def check_slices(count: int, slices: int, *, flag: bool) -> None:
    """Local workers stand for `slices` slices in equal groups: refuse a count that does not
    split (`flag`: the count came from --workers, not the config)."""
    if count % slices:
        said = f"--workers {count}" if flag else f"cluster.workers {count}"
        raise UserError(f"{said} does not split into cluster.slices: {slices} equal slices",
                        hint=f"use a number of workers divisible by {slices}")


def local_workers(name: str, count: int, ports: list[int]) -> tuple[Worker, ...]:
    check_count(count)
    base = state_dir() / layout.LOCAL_DIR / name
    return tuple(
        Worker(index=i, host="localhost", address="localhost", coordination_port=ports[i],
               base_dir=str(base / worker_label(i)))
        for i in range(count)
    )


@dataclass(frozen=True)
class LocalProvider(OwnMachines):
    run_name: str
    count: int
    known: tuple[Worker, ...] | None = None  # a recorded job's workers
    slices: int = 1  # cluster.slices: equal groups of the workers stand for slices

    name = NAME
    what = "local workers"

    @classmethod
    def from_config(cls, config: RunConfig, *, num_workers: int | None) -> LocalProvider:
        cluster = config.cluster
        count = num_workers if num_workers is not None else (
            cluster.workers if isinstance(cluster, LocalCluster) else DEFAULT_WORKERS)
        check_count(count)
        check_slices(count, cluster.slices, flag=num_workers is not None)
        return cls(config.name, count, slices=cluster.slices)

    @classmethod
    def from_reach(cls, reach: dict, workers: tuple[Worker, ...]) -> LocalProvider:
        return cls(reach["run_name"], len(workers), workers, slices=reach.get("slices", 1))

    def fleet(self) -> Fleet:
        workers = self.known or local_workers(self.run_name, self.count, free_ports(self.count))
        hardware = CPU if self.slices == 1 else Hardware(slices=self.slices)
        return Fleet(workers=workers, hardware=hardware, shares_launcher_machine=True,
                     python=sys.executable)

    def connect(self, workers: tuple[Worker, ...]) -> LocalExecutor:
        return LocalExecutor(workers)

    def worker_config(self, config: RunConfig):
        """A `local` cluster of this many workers (whatever the file says, under --local),
        keeping where the environment comes from."""
        cluster = LocalCluster(provider=NAME, workers=self.count, python=config.cluster.python,
                               wheelhouse=config.cluster.wheelhouse, slices=self.slices)
        return config.model_copy(update={"cluster": cluster})

    def reach(self, fleet: Fleet) -> dict:
        return {"provider": NAME, "run_name": self.run_name, "slices": self.slices}
