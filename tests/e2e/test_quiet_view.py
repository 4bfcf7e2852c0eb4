"""What a user watching a healthy job sees, for real: either engine through every stage on two
local workers, then again with --overwrite. The live view, `tpuctl logs` and `tpuctl status`
show tpuctl's own lines only, none over 300 characters; every library's line (Orbax, Gloo,
absl, TensorFlow's C++ side, CUDA probes, ...) stays in the worker's full log."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("optax")
pytest.importorskip("tensorflow")

from typer.testing import CliRunner

from launcher import view
from launcher.cli import app
from payload.training import progress
from tests.support.configs import tiny_config

runner = CliRunner()
LONGEST = 300
WORKER_LINE = re.compile(r"^worker-(\d) \| (.*)$")
# A line of the payload's own logging: time, worker, stage, then a message; a library's record
# names the library in brackets after the stage (payload.__main__).
OWN_LOG = re.compile(r"^\d\d:\d\d:\d\d w\d+ \w+ (?!\[)")


def is_tpuctls(line: str) -> bool:
    """Whether a line of a worker's full log is tpuctl's own: a progress record, the agent's
    `== tpuctl: ... ==`, a stage's own log line or error. Anything else a library printed."""
    return (progress.parse(line) is not None or line.startswith(("== tpuctl: ", "error: ",
                                                                 "tpuctl: "))
            or OWN_LOG.match(line) is not None)


def worker_lines(output: str) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(2)) for m in map(WORKER_LINE.match, output.splitlines())
            if m]


# The JAX engine's run in the slow tier: its view is the same code; the TensorFlow engine is
# the chattier library, and the one the default suite keeps.
@pytest.mark.parametrize("engine", ["tensorflow", pytest.param("jax", marks=pytest.mark.slow)])
def test_a_healthy_run_shows_tpuctls_lines_only(tmp_path, tpuctl_home, engine):
    out = tmp_path / "out"
    config = tiny_config(tmp_path / "run", name=f"quiet-{engine}", output_dir=str(out),
                         cluster={"provider": "local", "workers": 2}, train={"engine": engine})
    library_lines: set[str] = set()
    for again in ((), ("--overwrite",)):
        trained = runner.invoke(app, ["train", "-c", str(config), "--local", *again])
        assert trained.exit_code == 0, trained.output
        # The real run says its time estimate as a dry run would (not "not estimated").
        assert "  time: about " in trained.output, trained.output
        logs = runner.invoke(app, ["logs", "-c", str(config)])
        assert logs.exit_code == 0, logs.output
        full = {w: (out / "logs" / f"worker-{w}.log").read_text().splitlines() for w in (0, 1)}
        found = {line for lines in full.values() for line in lines if not is_tpuctls(line)}
        assert found, "no library printed anything: this run proves nothing about the view"
        library_lines |= found
        for output in (trained.output, logs.output):
            shown = worker_lines(output)
            assert shown, output
            long = [text for _, text in shown if len(text) > LONGEST]
            assert not long, long
            noise = [text for _, text in shown if not shown_as_tpuctls(text, found)]
            assert not noise, noise
        # `tpuctl status` shows a worker's last line the view would show: at every moment of
        # the run (each prefix of its log), tpuctl's own.
        for lines in full.values():
            records = [r for r in map(progress.parse, lines) if r is not None]
            for end in range(1, len(lines) + 1):
                _, last = view.step_and_last(records, lines[:end])
                assert last == "" or shown_as_tpuctls(last, found), last
    if engine == "jax":  # the lines this route used to show, kept in the full log only
        assert any(line.startswith("[Gloo] ") for line in library_lines), library_lines


def shown_as_tpuctls(text: str, library_lines: set[str]) -> bool:
    """Whether a line the view shows is tpuctl's: not a library's line of the full log, and
    tpuctl's own or a progress record as the view words it ("step 4/4  loss ...")."""
    described = text.startswith(("step ", "eval at step ", "training from step ", "resuming "))
    return text not in library_lines and (is_tpuctls(text) or described)
