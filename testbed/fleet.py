"""Real sshd workers on this machine, each with its own address and its own view of /root, /tmp.

    with Fleet(3) as fleet:
        fleet.hosts, fleet.known_hosts, fleet.identity_file, fleet.shared

Each worker is an sshd in its own network namespace (a veth pair on a private bridge gives it
its own IP) and its own mount namespace, where a per-worker folder is bound over /root and /tmp
(/root/.pyenv, where this machine's Python lives, is bound back). One folder outside those is the
same on every worker and on this machine: the stand-in for an NFS mount shared by all. Without
permission for network namespaces, workers listen on loopback addresses 127.0.1.X instead.
Everything is torn down on exit: the workers' processes, sshd, the namespaces and the bridge.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from testbed.fakes.gcs import StartedOrClosed, process_state

SSHD = "/usr/sbin/sshd"
SSHD_NAMES = ("sshd", "sshd-session", "sshd-auth")
FLEET_ROOT = Path("/var/tmp")
PYENV = Path("/root/.pyenv")


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None and os.geteuid() == 0


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def netns_permitted() -> bool:
    if shutil.which("ip") is None:
        return False
    name = f"tpfprobe{secrets.token_hex(2)}"
    if _sh("ip", "netns", "add", name, check=False).returncode != 0:
        return False
    _sh("ip", "netns", "del", name, check=False)
    return True


def _wait_port(host: str, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd on {host}:{port} did not come up")


class Fleet(StartedOrClosed):
    def __init__(self, size: int, *, use_netns: bool | None = None,
                 login_shell: str | None = None):
        self.size = size
        # root's login shell on the workers (their own /etc/passwd), e.g. /usr/bin/tcsh.
        self.login_shell = login_shell
        self.token = secrets.token_hex(2)
        self.root = FLEET_ROOT / f"tpuctl-fleet-{self.token}"
        self.shared = self.root / "shared"
        self.use_netns = netns_permitted() if use_netns is None else use_netns
        self.subnet = f"10.{200 + int(self.token[:2], 16) % 50}.{int(self.token[2:], 16)}"
        self.bridge = f"tpf{self.token}br"
        self.hosts: list[str] = []
        self.port = 22 if self.use_netns else 20_000 + int(self.token, 16) % 20_000
        self.procs: list[subprocess.Popen] = []
        self.namespaces: list[str] = []
        self.host_keys: list[str] = []
        self._prefixes: list[list[str]] = []

    # -- set-up -------------------------------------------------------------------------
    @property
    def identity_file(self) -> str:
        return str(self.root / "client_key")

    @property
    def known_hosts(self) -> str:
        return str(self.root / "known_hosts")

    def worker_dir(self, index: int) -> Path:
        """This machine's view of the worker's private /root."""
        return self.root / f"worker-{index}" / "root"

    def _start(self) -> None:
        self.shared.mkdir(parents=True)
        Path("/run/sshd").mkdir(exist_ok=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.identity_file)
        shutil.copy(self.identity_file + ".pub", self.root / "authorized_keys")
        os.chmod(self.root / "authorized_keys", 0o600)
        if self.use_netns:
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _sh("ip", "link", "set", self.bridge, "up")
        lines = []
        for i in range(self.size):
            host = self._start_worker(i)
            self.hosts.append(host)
            key = (self.root / f"worker-{i}" / "host_key.pub").read_text().split()
            entry = host if self.port == 22 else f"[{host}]:{self.port}"
            self.host_keys.append(f"{key[0]} {key[1]}")
            lines.append(f"{entry} {key[0]} {key[1]}")
        Path(self.known_hosts).write_text("\n".join(lines) + "\n")
        for host in self.hosts:
            _wait_port(host, self.port)

    def _start_worker(self, i: int) -> str:
        wdir = self.root / f"worker-{i}"
        for sub in ("root/.pyenv", "root/.ssh", "tmp"):
            (wdir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(wdir / "tmp", 0o1777)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wdir / "host_key"))
        if self.use_netns:
            host = f"{self.subnet}.{10 + i}"
            ns = f"tpf{self.token}-{i}"
            outer, inner = f"tpf{self.token}h{i}", f"tpf{self.token}w{i}"
            _sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _sh("ip", "link", "set", inner, "netns", ns)
            _sh("ip", "link", "set", outer, "master", self.bridge)
            _sh("ip", "link", "set", outer, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{host}/24", "dev", inner)
            _sh("ip", "-n", ns, "link", "set", inner, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            prefix = ["ip", "netns", "exec", ns]
        else:
            host = f"127.0.1.{10 + i}"
            prefix = []
        self._prefixes.append(prefix)
        self._write_sshd_config(i, host)
        self.procs.append(self._spawn_sshd(i))
        return host

    def _write_sshd_config(self, i: int, host: str) -> None:
        wdir = self.root / f"worker-{i}"
        (wdir / "hosts").write_text(Path("/etc/hosts").read_text().rstrip("\n")
                                    + f"\n{host} worker-{i}\n")
        config = wdir / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {host}:{self.port}",
            f"HostKey {wdir / 'host_key'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            f"PidFile {wdir / 'sshd.pid'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            "LogLevel ERROR",
            "",
        ]))

    def _spawn_sshd(self, i: int) -> subprocess.Popen:
        wdir = self.root / f"worker-{i}"
        config = wdir / "sshd_config"
        # Bring back into the worker's private /root and /tmp what must stay visible there (this
        # machine's Python, the checkout and its venv, wherever the checkout lives), then hide
        # /root and /tmp.
        binds = []
        for keep in _kept_paths():
            for private in ("/root", "/tmp"):
                if keep == Path(private) or Path(private) not in keep.parents:
                    continue
                target = wdir / private.lstrip("/") / keep.relative_to(private)
                target.mkdir(parents=True, exist_ok=True)
                binds.append(f"mount --bind {shlex.quote(str(keep))} "
                             f"{shlex.quote(str(target))} && ")
        if self.login_shell:
            passwd = wdir / "passwd"
            passwd.write_text("".join(
                f"{':'.join([*line.rstrip(chr(10)).split(':')[:6], self.login_shell])}\n"
                if line.startswith("root:") else line
                for line in Path("/etc/passwd").read_text().splitlines(keepends=True)))
            binds.append(f"mount --bind {shlex.quote(str(passwd))} /etc/passwd && ")
        # As on a cloud VM, the worker's hostname resolves to its address (gloo, JAX's CPU
        # collectives, binds to what the hostname resolves to).
        binds.append(f"mount --bind {shlex.quote(str(wdir / 'hosts'))} /etc/hosts && ")
        setup = (
            "".join(binds)
            + f"mount --rbind {wdir / 'root'} /root && "
            f"mount --rbind {wdir / 'tmp'} /tmp && "
            f"exec {SSHD} -D -e -f {config}"
        )
        argv = [*self._prefixes[i], "unshare", "--mount", "--propagation", "private", "--uts",
                "sh", "-c", f"hostname worker-{i}; {setup}"]
        log = (wdir / "sshd.log").open("a")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def power_off(self, index: int) -> None:
        """The worker's host goes away: sshd and everything it started are killed at once."""
        sshd = self.procs[index]
        namespace = os.readlink(f"/proc/{sshd.pid}/ns/mnt")
        with contextlib.suppress(OSError):
            os.killpg(sshd.pid, signal.SIGKILL)
        for pid in _pids_in_mount_namespaces({namespace}):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        sshd.wait(timeout=5)

    def power_on(self, index: int) -> None:
        """Bring a powered-off worker back (same address, same host key, same disk)."""
        self.procs[index] = self._spawn_sshd(index)
        _wait_port(self.hosts[index], self.port)

    # -- inspection ---------------------------------------------------------------------
    def namespace_pids(self, index: int) -> list[int]:
        """Every live (non-zombie) process inside worker `index`'s namespaces, except sshd."""
        sshd = self.procs[index].pid
        if self.use_netns:
            out = _sh("ip", "netns", "pids", self.namespaces[index], check=False).stdout
            pids = [int(p) for p in out.split()]
        else:
            target = os.readlink(f"/proc/{sshd}/ns/mnt")
            pids = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):
                        if os.readlink(entry / "ns" / "mnt") == target:
                            pids.append(int(entry.name))
        return [p for p in pids if p != sshd and process_state(p) not in ("Z", "")]

    def job_processes(self, index: int) -> list[str]:
        """Command lines of non-sshd processes on a worker (what a leftover job would be)."""
        found = []
        for pid in self.namespace_pids(index):
            with contextlib.suppress(OSError):
                # By the executable's name: sshd rewrites its command line as a title.
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm not in SSHD_NAMES:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    found.append(f"{pid}: {cmd.decode(errors='replace')} ({comm})")
        return found

    # -- tear-down ----------------------------------------------------------------------
    def close(self) -> None:
        # sshd first (no new sessions), then everything else left in the workers' namespaces.
        targets = {i: os.readlink(f"/proc/{p.pid}/ns/mnt") for i, p in enumerate(self.procs)
                   if os.path.exists(f"/proc/{p.pid}/ns/mnt")}
        for proc in self.procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=5)
        for pid in _pids_in_mount_namespaces(set(targets.values())):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for ns in self.namespaces:
            _sh("ip", "netns", "del", ns, check=False)
        if self.use_netns:
            _sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _kept_paths() -> list[Path]:
    """Paths the workers share with this machine even inside their private /root and /tmp:
    the Python installation, the test's venv and the checkout under test (outermost first)."""
    candidates = {PYENV, Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                  Path(__file__).resolve().parent.parent}
    existing = sorted((p for p in candidates if p.exists()), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in existing:
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return kept


def _pids_in_mount_namespaces(namespaces: set[str]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") in namespaces:
                    found.append(int(entry.name))
    return found


