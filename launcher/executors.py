"""Run shell commands and copy files on workers: local processes or SSH hosts (fabric).

    with SshExecutor(workers, settings) as executor:     # or LocalExecutor(workers)
        result = executor.run(worker, "echo hi")
    results = on_workers(workers, lambda w: executor.run(w, "hostname"))

A provider (launcher.providers) picks the executor for its workers; nothing else asks which
kind it is.
Both executors run the same `sh` command strings (launcher.jobs, launcher.ship) and relative
paths mean the same thing: a local worker starts in its own working directory, an SSH worker in
the user's home. SSH is strict: host keys are checked against the configured known_hosts file
and never added; transient connection failures are retried with backoff. fabric and paramiko
are imported here only, when an SSH worker is used.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from launcher.plan import Worker
from payload.errors import UserError

RETRY_DELAYS_S = (0.5, 1.0, 2.0)
CONNECT_TIMEOUT_S = 10.0


class WorkerUnreachable(Exception):
    """A worker stopped answering (after retries); `hint` is its provider's advice."""

    def __init__(self, worker: Worker, reason: str, hint: str = ""):
        super().__init__(f"{worker.label} ({worker.host}) is not answering: {reason}")
        self.worker = worker
        self.hint = hint


def on_workers(workers, action: Callable[[Worker], object]) -> list:
    """action on every worker in parallel; results in worker order, the first error raised."""
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(workers)))) as pool:
        return [f.result() for f in [pool.submit(action, w) for w in workers]]


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True, kw_only=True)
class SshSettings:
    user: str
    known_hosts: str
    identity_file: str | None = None


class LocalExecutor:
    """Each worker is a local process group in its own working directory."""

    def __init__(self, workers: tuple[Worker, ...]):
        for worker in workers:
            Path(worker.base_dir or ".").mkdir(parents=True, exist_ok=True)

    def run(self, worker: Worker, command: str, *, timeout_s: float | None = 120.0) -> Result:
        proc = subprocess.run(["sh", "-c", command], cwd=worker.base_dir, capture_output=True,
                              text=True, errors="replace", timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def put(self, worker: Worker, local: str, remote: str) -> None:
        target = Path(worker.base_dir or ".") / remote
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)

    def interactive(self, worker: Worker) -> int:
        return subprocess.call([os.environ.get("SHELL", "/bin/sh")], cwd=worker.base_dir)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SshExecutor:
    """One fabric connection per worker, opened on first use and reused."""

    def __init__(self, workers: tuple[Worker, ...], settings: SshSettings, *,
                 unreachable_hint: str = ""):
        if not os.path.isfile(settings.known_hosts):
            raise UserError(f"cluster.known_hosts: no file at {settings.known_hosts}",
                            hint="host keys are checked, never added; put the workers' keys "
                            "there (ssh-keyscan HOST >> FILE after checking them)")
        if settings.identity_file and not os.path.isfile(settings.identity_file):
            raise UserError(f"cluster.identity_file: no file at {settings.identity_file}")
        self._settings = settings
        self._unreachable_hint = unreachable_hint
        self._connections: dict[int, object] = {}
        self._locks = {w.index: threading.Lock() for w in workers}

    def _connect(self, worker: Worker):
        import paramiko
        from fabric import Config, Connection

        connect_kwargs = {"look_for_keys": False, "allow_agent": False,
                          "banner_timeout": CONNECT_TIMEOUT_S, "auth_timeout": CONNECT_TIMEOUT_S}
        if self._settings.identity_file:
            connect_kwargs["key_filename"] = self._settings.identity_file
        conn = Connection(worker.host, user=self._settings.user, port=worker.ssh_port,
                          config=Config(overrides={"load_ssh_configs": False}),
                          connect_timeout=CONNECT_TIMEOUT_S, connect_kwargs=connect_kwargs)
        # fabric accepts any host key by default; check against known_hosts instead.
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        conn.client.get_host_keys().clear()
        conn.client.load_host_keys(self._settings.known_hosts)
        conn.open()
        return conn

    def _with_connection(self, worker: Worker, action: Callable, what: str):
        """Run action(connection), reconnecting with backoff on transient failures."""
        import paramiko
        from invoke.exceptions import CommandTimedOut

        last = ""
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            try:
                with self._locks[worker.index]:
                    conn = self._connections.get(worker.index)
                    if conn is None:
                        conn = self._connect(worker)
                        self._connections[worker.index] = conn
                    return action(conn)
            except paramiko.BadHostKeyException:
                raise UserError(
                    f"{worker.label} ({worker.host}): host key does not match "
                    f"{self._settings.known_hosts}",
                    hint="if the host was rebuilt, check and replace its entry; refusing to connect",
                ) from None
            except paramiko.AuthenticationException:
                raise UserError(
                    f"{worker.label} ({worker.host}): login refused for user "
                    f"'{self._settings.user}'",
                    hint="check cluster.user and cluster.identity_file",
                ) from None
            except paramiko.SSHException as exc:
                if "not found in known_hosts" in str(exc):
                    raise UserError(
                        f"{worker.label} ({worker.host}:{worker.ssh_port}) has no entry in "
                        f"{self._settings.known_hosts}",
                        hint="add its host key there after checking it; tpuctl never adds keys",
                    ) from None
                last = str(exc) or type(exc).__name__
            except (TimeoutError, OSError, EOFError, CommandTimedOut) as exc:
                last = str(exc) or type(exc).__name__
            self._drop(worker.index)
            if attempt < len(RETRY_DELAYS_S):
                time.sleep(RETRY_DELAYS_S[attempt])
        raise WorkerUnreachable(worker, f"{what}: {last}", self._unreachable_hint)

    def _drop(self, index: int) -> None:
        conn = self._connections.pop(index, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def run(self, worker: Worker, command: str, *, timeout_s: float | None = 120.0) -> Result:
        def action(conn):
            # sh, as on local workers, whatever the user's login shell is.
            res = conn.run(f"sh -c {shlex.quote(command)}", hide=True, warn=True,
                           in_stream=False, timeout=timeout_s)
            return Result(res.exited, res.stdout, res.stderr)

        return self._with_connection(worker, action, "running a command")

    def put(self, worker: Worker, local: str, remote: str) -> None:
        def action(conn):
            try:
                conn.put(local, remote)
            except FileNotFoundError:  # the folder is missing: one more round trip
                parent = os.path.dirname(remote) or "."
                made = conn.run(f"mkdir -p {shlex.quote(parent)}", hide=True, warn=True,
                                in_stream=False)
                if made.failed:
                    raise UserError(f"{worker.label}: cannot make {parent}: "
                                    f"{made.stderr.strip()[-200:]}") from None
                conn.put(local, remote)

        self._with_connection(worker, action, "copying a file")

    def interactive(self, worker: Worker) -> int:
        """A login shell through the system ssh client, with the same strict host checking."""
        argv = ["ssh", "-p", str(worker.ssh_port), "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self._settings.known_hosts}",
                "-o", "IdentitiesOnly=yes"]
        if self._settings.identity_file:
            argv += ["-i", self._settings.identity_file]
        return subprocess.call([*argv, f"{self._settings.user}@{worker.host}"])

    def close(self) -> None:
        for index in list(self._connections):
            self._drop(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
