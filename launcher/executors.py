"""Run shell commands and copy files on workers: local processes or SSH hosts (fabric).

    with SshExecutor(workers, settings) as executor:     # or LocalExecutor(workers)
        result = executor.run(worker, "echo hi")
    results = on_workers(workers, lambda w: executor.run(w, "hostname"))

A provider (launcher.providers) picks the executor for its workers; nothing else asks which
kind it is.
Both executors run the same `sh` command strings (launcher.job_shell, launcher.ship) and relative
paths mean the same thing: a local worker starts in its own working directory, an SSH worker in
the user's home. SSH is strict and uses only what the run config says: host keys are checked
against the configured known_hosts file and never added; no ~/.ssh/config, ~/.fabric.yaml,
ssh-agent or agent forwarding. A command reaches the remote `sh` on its standard input, so the
login shell (csh, fish, ...) never parses it. Transient connection failures are retried with
backoff. fabric and paramiko are imported here only, when an SSH worker is used.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher.plan import Worker
from payload.core.errors import UserError

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


def run_here(argv: list[str], *, env: dict[str, str] | None = None,
             timeout_s: float | None = None) -> Result:
    """A command of the launcher's own on this machine (not a worker's): `env` added to the
    launcher's environment, no input, its output captured."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return Result(124, "", f"{argv[0]}: no answer in {timeout_s:.0f} s")
    return Result(proc.returncode, proc.stdout, proc.stderr)


class LocalExecutor:
    """Each worker is a local process group in its own working directory (made on first use)."""

    def __init__(self, workers: tuple[Worker, ...]):
        self._workers = workers

    def run(self, worker: Worker, command: str, *, timeout_s: float | None = 120.0,
            secret_env: dict[str, str] | None = None) -> Result:
        """`secret_env`: variables for the command's shell only, through its environment (never
        its arguments, which every user can read)."""
        Path(worker.base_dir or ".").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **secret_env} if secret_env else None
        proc = subprocess.run(["sh", "-c", command], cwd=worker.base_dir, capture_output=True,
                              text=True, errors="replace", timeout=timeout_s,
                              stdin=subprocess.DEVNULL, env=env)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def put(self, worker: Worker, local: str, remote: str) -> None:
        target = Path(worker.base_dir or ".") / remote
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)

    def interactive(self, worker: Worker) -> int:
        Path(worker.base_dir or ".").mkdir(parents=True, exist_ok=True)
        return subprocess.call([os.environ.get("SHELL", "/bin/sh")], cwd=worker.base_dir)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Executor(Protocol):
    """What the launcher needs of a way to reach workers; LocalExecutor and SshExecutor are it.
    A provider picks one (`Provider.connect`); the rest of the launcher sees only this."""

    def run(self, worker: Worker, command: str, *, timeout_s: float | None = 120.0,
            secret_env: dict[str, str] | None = None) -> Result: ...

    def put(self, worker: Worker, local: str, remote: str) -> None: ...

    def interactive(self, worker: Worker) -> int: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc) -> None: ...


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def check_known_hosts(path: str) -> None:
    """A one-line UserError unless `path` is a readable known_hosts file (comments, markers
    such as @cert-authority and key types paramiko does not know are let through)."""
    import base64
    import binascii

    if not os.path.isfile(path):
        raise UserError(f"cluster.known_hosts: no file at {path}",
                        hint="host keys are checked, never added; put the workers' keys "
                        "there (ssh-keyscan HOST >> FILE after checking them)")
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as exc:
        raise UserError(f"cluster.known_hosts {path} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"cluster.known_hosts {path} is not a known_hosts file (not text)",
                        hint="it holds lines of HOST KEYTYPE BASE64KEY, as ssh-keyscan "
                        "prints") from None
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#") or fields[0].startswith("@"):
            continue
        try:
            if len(fields) < 3:
                raise ValueError
            base64.b64decode(fields[2], validate=True)
        except (ValueError, binascii.Error):
            raise UserError(f"cluster.known_hosts {path} line {number} is not a host key "
                            "entry", hint="each line is HOST KEYTYPE BASE64KEY, as "
                            "ssh-keyscan prints") from None


def load_identity(path: str):
    """The private key in cluster.identity_file, or a one-line UserError that says what to do.
    A key others can read is used, with one warning."""
    import paramiko

    if not os.path.isfile(path):
        raise UserError(f"cluster.identity_file: no file at {path}")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        _warn_once(path, f"cluster.identity_file {path} can be read by other users (mode "
                   f"{mode:04o}); `chmod 600 {shlex.quote(path)}` (ssh itself refuses such a "
                   "key)")
    try:
        try:
            return paramiko.PKey.from_path(path)
        except TypeError as exc:  # cryptography's word for an OpenSSH key with a passphrase
            if "password" not in str(exc):
                raise ValueError(str(exc)) from None
            raise paramiko.PasswordRequiredException(str(exc)) from None
    except paramiko.PasswordRequiredException:
        raise UserError(f"cluster.identity_file {path} is protected by a passphrase; tpuctl "
                        "neither asks for passphrases nor uses ssh-agent",
                        hint="give the workers a key of their own without one: ssh-keygen -t "
                        "ed25519 -N '' -f ~/.ssh/tpuctl_ed25519, add the .pub to their "
                        "authorized_keys, point cluster.identity_file at it") from None
    except (paramiko.SSHException, ValueError, OSError, UnicodeDecodeError):
        raise UserError(f"cluster.identity_file {path} is not a private key tpuctl can read",
                        hint="use an OpenSSH or PEM ed25519, ecdsa or rsa private key (not the "
                        ".pub)") from None


def _ssh_config_word(value: str) -> str:
    """A path as one word of an ssh_config value (`-o Key=...`): quoted, with OpenSSH's `%`
    tokens escaped, so spaces or a `%` in it mean themselves."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def _script_for_stdin(command: str, secret_env: dict[str, str] | None = None) -> str:
    """What `sh -s` reads: the command as a subshell whose own stdin is /dev/null, so nothing
    in it can read the rest of the script (and it sees no stdin, as on local workers).
    `secret_env` becomes exported shell variables of that shell: they travel inside the
    encrypted channel and live in the shell's memory, in no argument and no file."""
    exports = "".join(f"{name}={shlex.quote(value)}; export {name}\n"
                      for name, value in (secret_env or {}).items())
    return f"{exports}(\n{command}\n) </dev/null\n"


def _drain(read, sink: list) -> None:
    while True:
        data = read(65536)
        if not data:
            return
        sink.append(data)


class SshExecutor:
    """One SSH connection per worker, opened on first use and reused."""

    def __init__(self, workers: tuple[Worker, ...], settings: SshSettings, *,
                 unreachable_hint: str = ""):
        check_known_hosts(settings.known_hosts)
        self._key = load_identity(settings.identity_file) if settings.identity_file else None
        self._settings = settings
        self._unreachable_hint = unreachable_hint
        self._connections: dict[int, object] = {}
        self._locks = {w.index: threading.Lock() for w in workers}

    def _connect(self, worker: Worker):
        import paramiko
        from fabric import Config, Connection

        connect_kwargs = {"look_for_keys": False, "allow_agent": False,
                          "banner_timeout": CONNECT_TIMEOUT_S, "auth_timeout": CONNECT_TIMEOUT_S,
                          "channel_timeout": CONNECT_TIMEOUT_S}
        if self._key is not None:
            connect_kwargs["pkey"] = self._key
        # lazy: no ~/.fabric.yaml, /etc/fabric.yaml or ssh_config is read; only what is given.
        config = Config(lazy=True, ssh_config=paramiko.SSHConfig(),
                        overrides={"load_ssh_configs": False, "forward_agent": False})
        conn = Connection(worker.host, user=self._settings.user, port=worker.ssh_port,
                          config=config, forward_agent=False, gateway=False,
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
            except (TimeoutError, OSError, EOFError) as exc:
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

    @staticmethod
    def _exec(conn, command: str, timeout_s: float | None,
              secret_env: dict[str, str] | None = None) -> Result:
        """`sh -s` with the command on its standard input: the login shell only ever parses
        `sh -s`, whatever it is (csh and tcsh reject newlines inside quotes)."""
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise EOFError("the connection closed")
        channel = transport.open_session(timeout=CONNECT_TIMEOUT_S)
        try:
            out: list[bytes] = []
            err: list[bytes] = []
            readers = [threading.Thread(target=_drain, args=(channel.recv, out), daemon=True),
                       threading.Thread(target=_drain, args=(channel.recv_stderr, err),
                                        daemon=True)]
            channel.exec_command("sh -s")
            for reader in readers:
                reader.start()
            channel.sendall(_script_for_stdin(command, secret_env).encode())
            channel.shutdown_write()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            for reader in readers:
                reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if any(reader.is_alive() for reader in readers):
                raise TimeoutError(f"no answer within {timeout_s:.0f} s")
            rc = channel.recv_exit_status()
            if rc == -1 and not transport.is_active():
                raise EOFError("the connection closed")
            return Result(rc, b"".join(out).decode(errors="replace"),
                          b"".join(err).decode(errors="replace"))
        finally:
            channel.close()

    def run(self, worker: Worker, command: str, *, timeout_s: float | None = 120.0,
            secret_env: dict[str, str] | None = None) -> Result:
        return self._with_connection(
            worker, lambda conn: self._exec(conn, command, timeout_s, secret_env),
            "running a command")

    def put(self, worker: Worker, local: str, remote: str) -> None:
        def action(conn):
            try:
                conn.put(local, remote)
            except FileNotFoundError:  # the folder is missing: one more round trip
                parent = os.path.dirname(remote) or "."
                made = self._exec(conn, f"mkdir -p {shlex.quote(parent)}", CONNECT_TIMEOUT_S)
                if not made.ok:
                    raise UserError(f"{worker.label}: cannot make {parent}: "
                                    f"{made.stderr.strip()[-200:]}") from None
                conn.put(local, remote)

        self._with_connection(worker, action, "copying a file")

    def interactive_argv(self, worker: Worker) -> list[str]:
        """The system ssh client with the same strict, config-only settings: no ssh_config
        file, no global known_hosts, no agent."""
        argv = ["ssh", "-F", "/dev/null", "-p", str(worker.ssh_port), "-l", self._settings.user,
                "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={_ssh_config_word(self._settings.known_hosts)}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
                "-o", "IdentityAgent=none", "-o", "ForwardAgent=no"]
        if self._settings.identity_file:
            argv += ["-o", f"IdentityFile={_ssh_config_word(self._settings.identity_file)}"]
        return [*argv, "--", worker.host]

    def interactive(self, worker: Worker) -> int:
        """A login shell through the system ssh client."""
        return subprocess.call(self.interactive_argv(worker))

    def close(self) -> None:
        for index in list(self._connections):
            self._drop(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
