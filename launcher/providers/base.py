"""What every provider offers the launcher: its fleet, a way to reach it, and a record of both.

    class MyProvider:                     # one file per provider, listed in PROVIDERS
        name = "mine"
        @classmethod
        def from_config(cls, config: RunConfig, *, num_workers): ...
        @classmethod
        def from_reach(cls, reach, workers): ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from launcher.plan import NodeToDelete, Worker
from payload.training.strategy import Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig



@dataclass(frozen=True, kw_only=True)
class Fleet:
    """The workers a provider offers, and what they are."""

    workers: tuple[Worker, ...]
    hardware: Hardware
    # Local processes share the launcher's disk, credentials and Python: the launcher can check
    # what the stages would refuse before anything starts, and the workers can run its Python.
    shares_launcher_machine: bool = False
    python: str | None = None  # an interpreter every worker can use when the config names none


@dataclass(frozen=True)
class Check:
    """One line of `tpuctl doctor`."""

    name: str
    verdict: str  # ok | fix | skip
    detail: str = ""

    def line(self) -> str:
        return f"{self.verdict:<5} {self.name}" + (f": {self.detail}" if self.detail else "")


class Provider(Protocol):
    """What the launcher needs from a kind of cluster.

    local: worker processes on this machine; ssh: the configured hosts; gcp: a TPU VM or pod
    slice that `up` creates, whose workers the TPU API names, and which can be taken away
    (`trouble`).
    """

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config: RunConfig, *, num_workers: int | None) -> Provider:
        """The provider a run config describes (`num_workers`: the --workers option)."""

    @classmethod
    def from_reach(cls, reach: dict, workers: tuple[Worker, ...]) -> Provider:
        """The provider of a recorded job, from what `reach` returned then."""

    def up_plan(self) -> list[str]:
        """What `up` would create and what it costs, as lines; touches nothing remote."""

    def up(self, on_event: Callable[[str], None]) -> None:
        """Create what the cluster needs (nothing for local and ssh)."""

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        """Remove what `up` created (nothing for local and ssh)."""

    def describe(self) -> list[str]:
        """The cluster as it is now, for `tpuctl status` (empty for local and ssh)."""

    def billing(self) -> str | None:
        """What keeps costing money while nothing runs (a TPU left up), or None."""

    def doctor(self) -> list[Check]:
        """Checks of the set-up that catch failed runs before they cost anything."""

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        """What the job's worker 0 deletes when the job ends (`train --down`), with the
        permission to do so in place; a UserError for providers that bill nothing."""

    def record_billing(self, output_dir: str) -> None:
        """Note in output_dir that the run uses the fleet now (what time and cost limits count)."""

    def recover(self, on_event: Callable[[str], None]) -> None:
        """Replace a fleet that was taken away (a preempted TPU) with a new one, READY; a
        UserError where that cannot be done."""

    def fleet(self) -> Fleet:
        """The workers, how they are addressed, and their hardware."""

    def planned_fleet(self) -> Fleet:
        """The fleet as far as it is known without asking anyone (dry runs): for a cloud, the
        accelerator table's hosts with placeholder addresses."""

    def price(self) -> str | None:
        """What the fleet costs per hour, as words (None when tpuctl does not bill anything)."""

    def trouble(self) -> str | None:
        """Why the fleet cannot go on (its machines were taken away), or None."""

    def connect(self, workers: tuple[Worker, ...]):
        """An executor (launcher.executors) for these workers."""

    def worker_config(self, config: RunConfig):
        """The run config as the workers see it: what is shipped and recorded."""

    def stage_inputs(self, config: RunConfig, on_event: Callable[[str], None]):
        """Put what the workers must read but cannot see (a laptop's corpus) where they can;
        the config that points at it (unchanged for local and ssh)."""

    def reach(self, fleet: Fleet) -> dict:
        """How to reach this fleet again later, as JSON data for the job record."""


class OwnMachines:
    """What local and ssh providers share: machines tpuctl neither creates, bills nor replaces.
    A provider sets `what` ("local workers", "ssh hosts") and inherits the rest."""

    what: ClassVar[str] = "these workers"

    def up_plan(self) -> list[str]:
        return [f"{self.what}: nothing to create, nothing billed by tpuctl"]

    def up(self, on_event: Callable[[str], None]) -> None:
        on_event(f"{self.what} need nothing created")

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        on_event(f"{self.what}: nothing to remove")

    def describe(self) -> list[str]:
        return []

    def billing(self) -> str | None:
        return None

    def doctor(self) -> list[Check]:
        return [Check(self.what, "skip", "nothing to check before a run; `tpuctl train "
                      "--dry-run` shows the plan")]

    def planned_fleet(self) -> Fleet:
        return self.fleet()

    def price(self) -> str | None:
        return None

    def trouble(self) -> str | None:
        return None

    def stage_inputs(self, config: RunConfig, on_event: Callable[[str], None]):
        return config

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        from payload.core.errors import UserError

        raise UserError(f"--down deletes a cloud TPU when the job ends; {self.what} have none",
                        hint="leave --down out")

    def record_billing(self, output_dir: str) -> None:
        return None

    def recover(self, on_event: Callable[[str], None]) -> None:
        from payload.core.errors import UserError

        raise UserError(f"{self.what} cannot be replaced by tpuctl",
                        hint="--auto-resume recovers preempted cloud TPUs")
