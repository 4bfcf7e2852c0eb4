"""Who the workers are: local processes or SSH hosts, from the config and the command line.

    workers, ssh = resolve_workers(config, local=True, num_workers=2, state_dir=home, ports=[...])

`gcp` clusters get their workers from the TPU API once `tpuctl up` exists; until then they are
refused with a clear message.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from launcher.executors import SshSettings
from launcher.plan import DEFAULT_COORDINATION_PORT, Topology, Worker
from payload.errors import UserError

MAX_LOCAL_WORKERS = 64


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


def local_workers(name: str, count: int, state_dir: Path, ports: list[int]) -> tuple[Worker, ...]:
    if count < 1 or count > MAX_LOCAL_WORKERS:
        raise UserError(f"--workers {count}: need between 1 and {MAX_LOCAL_WORKERS} workers")
    base = state_dir / "local" / name
    return tuple(
        Worker(index=i, host="localhost", address="localhost", coordination_port=ports[i],
               base_dir=str(base / f"worker-{i}"))
        for i in range(count)
    )


def local_config(config, num_workers: int):
    """The config as local workers see it: a `local` cluster of num_workers (whatever the file
    says, under --local), keeping where the environment comes from."""
    from payload.config import LocalCluster

    cluster = LocalCluster(provider="local", workers=num_workers, python=config.cluster.python,
                           wheelhouse=config.cluster.wheelhouse)
    return config.model_copy(update={"cluster": cluster})


def ssh_settings(cluster) -> SshSettings:
    """How to log in to an `ssh` cluster's hosts."""
    identity = os.path.expanduser(cluster.identity_file) if cluster.identity_file else None
    return SshSettings(user=cluster.user, known_hosts=os.path.expanduser(cluster.known_hosts),
                       identity_file=identity)


def resolve_workers(
    config, *, local: bool, num_workers: int | None, state_dir: Path,
    ports: list[int] | None = None,
) -> tuple[tuple[Worker, ...], SshSettings | None, Topology]:
    """The workers to run on, how to reach them (None: local processes) and the topology."""
    cluster = config.cluster
    if local or cluster.provider == "local":
        count = num_workers if num_workers is not None else (
            cluster.workers if cluster.provider == "local" else 2)
        ports = ports if ports is not None else free_ports(count)
        return local_workers(config.name, count, state_dir, ports), None, Topology.CPU_WORKERS
    if num_workers is not None:
        raise UserError("--workers only applies with --local",
                        hint="an ssh cluster runs on every host in cluster.hosts")
    if cluster.provider == "ssh":
        workers = tuple(
            # A port per worker, so workers that share an address (or a host) never clash.
            Worker(index=i, host=host, address=host,
                   coordination_port=DEFAULT_COORDINATION_PORT + i, ssh_port=cluster.port)
            for i, host in enumerate(cluster.hosts)
        )
        return workers, ssh_settings(cluster), Topology.CPU_WORKERS
    raise UserError(
        f"the gcp provider needs `tpuctl up` to create the TPU in project {cluster.project}, "
        "and cloud support is not in this version yet",
        hint="run with --local, or describe your hosts with provider: ssh",
    )
