"""What a user watching `tpuctl train` sees, end to end: the real stages on local workers piped
(as under CI or `| tee`), stand-in stages on a terminal, a failing worker, `tpuctl jobs`,
`tpuctl status` and the dry run's checks."""

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.launch import STAGE_ENTRY_ENV
from launcher.view import NOISE, LineFilter
from payload.training import progress
from tests.support.cloud import install_stub
from tests.support.configs import tiny_config
from tests.support.paths import REPO
from tests.support.waits import wait_for

runner = CliRunner()
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def tpuctl(*args: str, env: dict | None = None, timeout: float = 600):
    """`tpuctl ARGS` as a separate process with its output piped: not a terminal."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def said_by(output: str, worker: int) -> list[str]:
    prefix = f"worker-{worker} | "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def records(log: str) -> list[dict]:
    return [r for r in map(progress.parse, log.splitlines()) if r is not None]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One real run, tokenizer to export, on two local workers; its output piped."""
    tmp = tmp_path_factory.mktemp("watch")
    corpus = tmp / "corpus.txt"
    corpus.write_text("".join(f"sentence {i} about {' '.join(['rivers', 'stones'][i % 2:])} "
                              f"and light {i % 13}\n" for i in range(800)))
    # Reports only at the end (eval_every > steps): progress must still come from step 1.
    config = tiny_config(tmp / "run", name="watch", corpus=str(corpus),
                         output_dir=str(tmp / "out"), cluster={"provider": "local", "workers": 2},
                         train={"steps": 30, "eval_every": 1000, "checkpoint_every": 1000})
    env = {"TPUCTL_HOME": str(tmp / "home")}
    result = tpuctl("train", "-c", str(config), "--local", env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"out": tmp / "out", "home": tmp / "home", "config": config, "env": env,
            "output": result.stdout}


def test_the_live_view_leaves_out_noise_that_the_full_logs_keep(real_run):
    output, out, home = real_run["output"], real_run["out"], real_run["home"]
    noise_seen = 0
    for worker in (0, 1):
        full = (out / f"logs/worker-{worker}.log").read_text().splitlines()
        copy = next(home.glob(f"jobs/watch/*/logs/worker-{worker}.log")).read_text()
        assert copy.splitlines() == full  # the launcher's copy is the whole log too
        shown = said_by(output, worker)
        lines = LineFilter()
        for line in full:
            if progress.parse(line) is not None:
                continue
            if lines.keeps(worker, line):
                assert line in shown, line  # every line the view keeps reached the screen
            else:
                noise_seen += 1
                assert line not in shown, line
        for line in shown:
            assert not any(rule.starts(line) for rule in NOISE), line
    # TensorFlow's chatter was there to leave out (the transformers banner, at least).
    assert noise_seen >= 2
    assert "TensorFlow and JAX classes are deprecated" in (out / "logs/worker-0.log").read_text()
    assert "TensorFlow and JAX classes are deprecated" not in output


def test_training_speaks_once_from_the_first_step(real_run):
    output, out = real_run["output"], real_run["out"]
    chief, other = said_by(output, 0), said_by(output, 1)
    assert "tpuctl-progress" not in output
    assert not [line for line in other if "eval at step" in line or "/30" in line]
    assert not records((out / "logs/worker-1.log").read_text())
    assert chief.index("training from step 0 of 30: building and compiling the step") < (
        next(i for i, line in enumerate(chief) if line.startswith("step 1/30")))
    first = next(line for line in chief if line.startswith("step 1/30"))
    assert "first step" in first and "(compiling included)" in first
    assert next(line for line in chief if line.startswith("step 30/30"))
    assert [line.split(":")[0] for line in chief if line.startswith("eval at")] == [
        "eval at step 0", "eval at step 30"]
    # Both workers still say their own last word: the same weights.
    digests = [re.search(r"finished at step 30; weights sha256 (\w+)", "\n".join(lines))
               for lines in (chief, other)]
    assert digests[0] and digests[1] and digests[0].group(1) == digests[1].group(1)


def test_one_record_of_progress_agrees_with_metrics_json(real_run):
    out = real_run["out"]
    said = records((out / "logs/worker-0.log").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    trains = [r for r in said if r["kind"] == "train"]
    assert trains[0]["step"] == 1 and trains[0]["first_step_s"] > 0
    # A report's record is metrics.json's entry, field for field (the ones between are live).
    reported = {e["step"]: e for e in metrics["train"]}
    assert reported == {30: {k: v for k, v in trains[-1].items() if k != "kind"}}
    evals = [{k: v for k, v in r.items() if k != "kind"} for r in said if r["kind"] == "eval"]
    assert evals == metrics["evals"]
    final = next(r for r in said if r["kind"] == "final")
    assert final == {"kind": "final", "family": "gpt2", **metrics["final"]}


def test_the_end_says_how_it_went_and_how_to_load_the_model(real_run):
    output, out = real_run["output"], real_run["out"]
    metrics = json.loads((out / "metrics.json").read_text())
    last = metrics["evals"][-1]
    tail = output[output.index("\njob watch-"):]
    assert (f"final evaluation at step 30: loss {last['loss']:.4f}  perplexity "
            f"{last['perplexity']:.4f}  accuracy {last['accuracy']:.4f}") in tail
    assert f"model: {out / 'model'}" in tail
    assert (f'PyTorch:    from transformers import AutoModelForCausalLM; '
            f'model = AutoModelForCausalLM.from_pretrained("{out / "model"}")') in tail
    assert (f'TensorFlow: from transformers import TFAutoModelForCausalLM; model = '
            f'TFAutoModelForCausalLM.from_pretrained("{out / "model"}", use_safetensors=False)'
            ) in tail
    assert "stopped" not in tail


def test_status_and_jobs_read_the_record(real_run):
    env, config = real_run["env"], str(real_run["config"])
    status = tpuctl("status", "-c", config, env={**env, "COLUMNS": "200"})
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if "worker-0" in line)
    assert "30/30" in row and "== tpuctl: worker-0 finished ==" in row, status.stdout
    listed = tpuctl("jobs", "-c", config, env={**env, "COLUMNS": "250"})
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "watch-" in line)
    assert row.startswith("*") and " all " in row  # the current job; every stage
    assert "finished" in row and f"outputs: {real_run['out']}" in listed.stdout


@pytest.fixture
def stub_run(tmp_path, tpuctl_home, monkeypatch):
    def make(behaviour=None, **sections):
        stub = install_stub(tmp_path / "stub", behaviour)
        monkeypatch.setenv(STAGE_ENTRY_ENV, str(stub))
        return tiny_config(tmp_path, output_dir=str(tmp_path / "out"),
                           cluster={"provider": "local", "workers": 2}, **sections)
    return make


NOISY = [rule.example for rule in NOISE]


def test_a_real_error_is_never_hidden(stub_run, tmp_path):
    config = stub_run({"print": {"train": NOISY}, "raise": {"train": 1}, "steps": {"train": 50}})
    result = runner.invoke(app, ["train", "-c", str(config), "--local"])
    assert result.exit_code == 1, result.output
    output = result.output
    stream, _, report = output.partition("worker-1 failed in train (exit 1)")
    for line in ("Traceback (most recent call last):",
                 "RuntimeError: the stub's train broke on worker 1"):
        assert f"worker-1 | {line}" in stream  # as it happened
        assert f"  {line}" in report  # and in the failure's report
    log = (tmp_path / "out/logs/worker-1.log").read_text()
    for line in NOISY:
        assert line in log and line not in output


def _terminal_run(args: list[str], env: dict, timeout_s: float = 120) -> str:
    """Run tpuctl on a pseudo-terminal; everything it drew."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", *args], stdin=follower,
                            stdout=follower, stderr=follower, cwd=REPO, close_fds=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120",
                                 "TERM": "xterm", **env})
    os.close(follower)
    drawn = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: the process is done
                    break
                if not chunk:
                    break
                drawn += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, drawn.decode(errors="replace")[-3000:]
    finally:
        proc.kill()
        os.close(leader)
    return drawn.decode(errors="replace")


def test_on_a_terminal_progress_is_one_line_redrawn(stub_run, tpuctl_home):
    config = stub_run({"steps": {"train": 30}})
    drawn = _terminal_run(["train", "-c", str(config), "--local"],
                          env={"TPUCTL_HOME": str(tpuctl_home),
                               STAGE_ENTRY_ENV: os.environ[STAGE_ENTRY_ENV]})
    text = ANSI.sub("", drawn)
    assert "tpuctl-progress" not in text
    # The line is redrawn in place (cursor up, erase line), with its bar, until the last step.
    assert "\x1b[1A" in drawn and "\x1b[2K" in drawn
    assert re.search(r"train ━+.* 30/30  loss 0\.0333", text), text[-2000:]
    assert "━" in text and "eval at step 30: loss 0.5000  accuracy 0.2500" in text
    # Plain progress lines are for pipes only.
    assert not re.search(r"worker-0 \| step \d+/30", text)
    assert "final evaluation at step 30: loss 0.5000  accuracy 0.2500" in text


def test_status_shows_the_step_and_where_the_last_line_starts(stub_run):
    long = "16:29:25 w1 train " + "a long line of the stage, " * 8 + "and its end"
    config = stub_run({"print": {"train": [long]}, "hang": {"train": 1},
                       "steps": {"train": 600}})
    assert runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"]).exit_code == 0
    try:
        status = wait_for(lambda: (lambda out: out if "16:29:25 w1 train a long" in out and
                                   "/600" in out else "")(
            tpuctl("status", "-c", str(config), env={"COLUMNS": "250"}).stdout), 60)
    finally:
        runner.invoke(app, ["stop", "-c", str(config)])
    rows = {line.split()[1]: line for line in status.splitlines() if "│ worker-" in line}
    assert re.search(r"│ \d+/600 ", rows["worker-0"]), status  # from worker 0's records
    assert "16:29:25 w1 train a long line of the stage" in rows["worker-1"]
    assert "and its end" not in status and "…" in rows["worker-1"]


def test_jobs_lists_every_job_with_its_state(stub_run, tpuctl_home):
    config = stub_run({"steps": {"train": 600}})
    empty = runner.invoke(app, ["jobs", "-c", str(config)])
    assert empty.exit_code == 0 and "no job of this run" in empty.output
    done = runner.invoke(app, ["train", "-c", str(config), "--local", "--stages",
                               "tokenizer,prepare"])
    assert done.exit_code == 0, done.output
    detached = runner.invoke(app, ["train", "-c", str(config), "--local", "--stages", "train",
                                   "--detach"])
    assert detached.exit_code == 0, detached.output
    try:
        wait_for(lambda: "train" in runner.invoke(app, ["status", "-c", str(config)]).output)
        listed = runner.invoke(app, ["jobs", "-c", str(config)], env={"COLUMNS": "250"})
        rows = [line for line in listed.output.splitlines() if "t-20" in line]
        assert len(rows) == 2, listed.output
        assert "tokenizer, prepare" in rows[0] and "finished" in rows[0]
        assert rows[1].startswith("*") and "not followed to its end" in rows[1]
        checked = runner.invoke(app, ["jobs", "-c", str(config), "--check"],
                                env={"COLUMNS": "250"})
        assert "running (train)" in checked.output, checked.output
    finally:
        assert runner.invoke(app, ["stop", "-c", str(config)]).exit_code == 0
    after = runner.invoke(app, ["jobs", "-c", str(config)], env={"COLUMNS": "250"})
    current = next(line for line in after.output.splitlines() if line.startswith("*"))
    assert "stopped" in current, after.output


def test_jobs_fits_80_columns_and_knows_a_watched_job(stub_run, tpuctl_home):
    """Issue 18: in 80 columns every job id stays on one line, and a job whose launcher is
    following it now says so, until that launcher is gone."""
    config = stub_run({"steps": {"train": 3000}})
    env = {"TPUCTL_HOME": str(tpuctl_home), STAGE_ENTRY_ENV: os.environ[STAGE_ENTRY_ENV]}
    assert tpuctl("train", "-c", str(config), "--local", "--stages", "tokenizer,prepare",
                  env=env).returncode == 0
    watcher = subprocess.Popen([sys.executable, "-m", "launcher.cli", "train", "-c",
                                str(config), "--local", "--stages", "train"],
                               env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: "train" in tpuctl("status", "-c", str(config), env=env).stdout, 60)
        listed = tpuctl("jobs", "-c", str(config), env={**env, "COLUMNS": "80"}).stdout
        lines = listed.splitlines()
        assert all(len(line) <= 80 for line in lines), listed
        ids = [path.name for path in (tpuctl_home / "jobs" / "t").iterdir() if path.is_dir()]
        assert len(ids) == 2 and all(any(i in line for line in lines) for i in ids), listed
        current = next(i for i, line in enumerate(lines) if line.startswith("*"))
        # The state wraps within its column: read the current job's rows as words.
        words = " ".join(" ".join(lines[current:]).split())
        assert f"running, watched by pid {watcher.pid}" in words, listed
        assert "not followed" not in listed
        watcher.kill()  # the launcher is gone: nobody watches any more
        watcher.wait(30)
        unwatched = tpuctl("jobs", "-c", str(config), env={**env, "COLUMNS": "80"}).stdout
        assert "watched" not in unwatched and "not followed" in unwatched, unwatched
    finally:
        watcher.kill()
        assert runner.invoke(app, ["stop", "-c", str(config)]).exit_code == 0


def test_dry_run_refuses_what_the_real_run_refuses(stub_run, tmp_path, tpuctl_home):
    config = stub_run(corpus=str(tmp_path / "nothere" / "*.txt"))
    for args in (["--dry-run"], []):
        result = tpuctl("train", "-c", str(config), "--local", *args,
                        env={"TPUCTL_HOME": str(tpuctl_home)})
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count("\n") == 1 and "no file matches" in result.stderr
        assert "step 1" not in result.stdout  # no plan printed
    assert not tpuctl_home.exists() and not (tmp_path / "out").exists()
