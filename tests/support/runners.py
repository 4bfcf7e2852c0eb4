"""The payload and the CLI, run as a user runs them or in this process.

    result = payload_main("prepare", "--config", path)   # `python -m payload ...`, in-process
    line = assert_user_error(result, "data.corpus")       # exit 2, one `error:` line
    result = tpuctl("train", "--dry-run", "-c", path)     # `tpuctl ...`, in-process
    proc = run_payload("train", "--config", path)         # a real process (it trains, it is killed)
    result = invoke("status", "-c", path)                 # typer's CliRunner

In-process runs are for what happens before a framework loads (refusals, plans, dry runs): they
cost milliseconds where a process costs seconds of imports. Whatever trains, is signalled or must
die with its process runs as a process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from tests.support.paths import REPO
from tests.support.waits import wait_for


@dataclass
class Result:
    """What a command left: exit status and its two streams (subprocess.CompletedProcess's
    field names, so an assertion reads the same for either)."""

    returncode: int
    stdout: str
    stderr: str


def payload_env(**extra: str) -> dict:
    """The environment a stage runs with in tests: this checkout first on the path, tf-keras,
    no traceback switch and no stray TF_CONFIG; `extra` on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.pop("TPUCTL_DEBUG", None)
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def run_payload(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m payload ARGS` as a user would; returns the finished process."""
    proc = subprocess.run(
        [sys.executable, "-m", "payload", *map(str, args)], capture_output=True, text=True,
        env=kwargs.pop("env", payload_env()), timeout=kwargs.pop("timeout", 300), **kwargs,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"payload {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


@contextlib.contextmanager
def _as_a_process(env: dict | None, cwd=None):
    """This process made to look like a fresh one for a command: its environment (plus `env`,
    without TPUCTL_DEBUG), working folder, temporary folder and streams restored afterwards."""
    saved_env, saved_cwd, saved_tmp = dict(os.environ), os.getcwd(), tempfile.tempdir
    out, err = io.StringIO(), io.StringIO()
    saved_in = sys.stdin
    # The root logger as a fresh process has it (no handlers), so a stage's logging.basicConfig
    # writes its lines to this command's stdout; pytest's own handlers come back afterwards.
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []
    try:
        os.environ.pop("TPUCTL_DEBUG", None)
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO("")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = saved_handlers, saved_level
        sys.stdin = saved_in
        os.chdir(saved_cwd)
        tempfile.tempdir = saved_tmp
        os.environ.clear()
        os.environ.update(saved_env)


def payload_main(*args, check: bool = False, env: dict | None = None, cwd=None) -> Result:
    """`python -m payload ARGS` in this process (payload.__main__.main); `check`: it must
    succeed. For stages that load no framework (tokenizer, prepare) and every refusal."""
    from payload.__main__ import main

    with _as_a_process(env, cwd) as (out, err):
        code = main([str(a) for a in args])
    if check and code != 0:
        raise AssertionError(f"payload {args} failed ({code}):\n{err.getvalue()[-3000:]}")
    return Result(code, out.getvalue(), err.getvalue())


def tpuctl(*args, env: dict | None = None, cwd=None) -> Result:
    """`tpuctl ARGS` in this process, through the console entry point (launcher.cli.main): the
    same one-line errors and exit statuses a user sees."""
    from launcher.cli import main

    saved_argv = sys.argv
    with _as_a_process(env, cwd) as (out, err):
        sys.argv = ["tpuctl", *map(str, args)]
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved_argv
    return Result(code, out.getvalue(), err.getvalue())


def run_cli(*args, env: dict | None = None, cwd=None, timeout: float = 120,
            **kwargs) -> subprocess.CompletedProcess:
    """`tpuctl ARGS` as a process of its own (`python -m launcher.cli`), stdin closed."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("TPUCTL_DEBUG", None)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "launcher.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=environment,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


def invoke(*args):
    """`tpuctl ARGS` through Typer's CliRunner (exceptions stay exceptions: result.exception)."""
    from typer.testing import CliRunner

    from launcher.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def assert_user_error(proc, *needles: str) -> str:
    """Exit status 2, one `error:` line on stderr, no traceback, mentioning every needle."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, f"exit {proc.returncode}: {err[-2000:]}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def process_with_pid(pid: int, argv: list[str], attempts: int = 500):
    """An unrelated process, leader of its own session and group, that gets exactly `pid`:
    how a finished job's recorded process group id comes to be reused. The kernel hands out
    the id after the one in ns_last_pid (root only); other processes forking at the same moment
    can take it first, so this tries again. None where ids cannot be steered."""
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout_s=30)
    for _ in range(attempts):
        try:
            with open(NS_LAST_PID, "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(argv, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_python(code: str) -> str:
    """`python -c CODE` in the checkout; its last line of output (it must succeed)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]
