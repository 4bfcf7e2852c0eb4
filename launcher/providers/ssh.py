"""Hosts the user already has, reached over SSH: `provider: ssh`.

    provider = SshProvider.from_config(config, num_workers=None)
    with provider.connect(provider.fleet().workers) as executor: ...

Host keys are checked against `cluster.known_hosts` and never added. The job record keeps the
user, key and known_hosts paths, and the plan keeps the hosts, so a job is reopened on the hosts
it ran on whatever the config says later.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.executors import SshExecutor, SshSettings
from launcher.plan import Worker
from launcher.providers.base import Fleet, OwnMachines
from payload.core.errors import UserError
from payload.training.strategy import CPU, Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig


NAME = "ssh"
# Where MultiWorkerMirroredStrategy workers listen for each other: consecutive ports from a base
# drawn per job in this range (below Linux's ephemeral ports, 32768 and up), so two jobs or two
# users on the same hosts rarely meet; a worker checks its port is free before training.
COORDINATION_PORTS = range(20_000, 32_000)
UNREACHABLE_HINT = "check cluster.hosts and that sshd runs there, then retry"


def coordination_ports(count: int) -> list[int]:
    """`count` consecutive ports from a base drawn at random for this job."""
    base = COORDINATION_PORTS.start + secrets.randbelow(len(COORDINATION_PORTS) - count)
    return list(range(base, base + count))


def ssh_settings(cluster) -> SshSettings:
    """How to log in to an `ssh` cluster's hosts."""
    identity = os.path.expanduser(cluster.identity_file) if cluster.identity_file else None
    return SshSettings(user=cluster.user, known_hosts=os.path.expanduser(cluster.known_hosts),
                       identity_file=identity)


@dataclass(frozen=True)
class SshProvider(OwnMachines):
    settings: SshSettings
    workers: tuple[Worker, ...]
    slices: int = 1  # cluster.slices: equal groups of the hosts, in order, stand for slices

    name = NAME
    what = "ssh hosts"

    @classmethod
    def from_config(cls, config: RunConfig, *, num_workers: int | None) -> SshProvider:
        if num_workers is not None:
            raise UserError("--workers only applies with --local",
                            hint="an ssh cluster runs on every host in cluster.hosts")
        cluster = config.cluster
        ports = coordination_ports(len(cluster.hosts))
        workers = tuple(
            Worker(index=i, host=host, address=host, coordination_port=ports[i],
                   ssh_port=cluster.port)
            for i, host in enumerate(cluster.hosts)
        )
        return cls(ssh_settings(cluster), workers, cluster.slices)

    @classmethod
    def from_reach(cls, reach: dict, workers: tuple[Worker, ...]) -> SshProvider:
        settings = SshSettings(user=reach["user"], known_hosts=reach["known_hosts"],
                               identity_file=reach["identity_file"])
        return cls(settings, workers, reach.get("slices", 1))

    def fleet(self) -> Fleet:
        hardware = CPU if self.slices == 1 else Hardware(slices=self.slices)
        return Fleet(workers=self.workers, hardware=hardware)

    def connect(self, workers: tuple[Worker, ...]) -> SshExecutor:
        return SshExecutor(workers, self.settings, unreachable_hint=UNREACHABLE_HINT)

    def worker_config(self, config: RunConfig):
        return config

    def reach(self, fleet: Fleet) -> dict:
        return {"provider": NAME, "slices": self.slices, "user": self.settings.user,
                "known_hosts": self.settings.known_hosts,
                "identity_file": self.settings.identity_file}
