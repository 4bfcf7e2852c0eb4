"""A stage's stderr is the stage's own (issue 32 item 4): nothing in `python -m payload` drops
a report by its text. A real `RuntimeError: Event loop is closed`, raised in the stage's main
thread or in a thread of its own, with a second line or written together with an `error:`
line, reaches stderr whole. (Orbax's reads left in flight by a failed restore are waited for
where the restore runs: payload.engines.jax.checkpoints.read_step.)"""

import subprocess
import sys
import textwrap

import pytest

from tests.support.configs import write_training_config
from tests.support.runners import payload_env

# The export stage replaced by one that fails as `how` says, then `python -m payload export`.
RUN = textwrap.dedent("""
    import runpy, sys, threading
    import payload.stages.export as export

    def main_thread(config):
        raise RuntimeError("Event loop is closed")

    def in_a_thread(config):
        def fail():
            raise RuntimeError("Event loop is closed\\n403 Forbidden")
        t = threading.Thread(target=fail, name="worker-thread")
        t.start()
        t.join()
        sys.stderr.write("error: the thread above failed\\n")

    export.run_export = {"main": main_thread, "thread": in_a_thread}[sys.argv.pop(1)]
    sys.argv[0] = "payload"
    runpy.run_module("payload", run_name="__main__", alter_sys=True)
""")


@pytest.mark.parametrize("how", ["main", "thread"])
def test_a_real_event_loop_error_is_reported_whole(tmp_path, how):
    config = write_training_config(tmp_path / "run", "gpt2")
    proc = subprocess.run([sys.executable, "-c", RUN, how, "export", "--config", str(config)],
                          capture_output=True, text=True, env=payload_env(), timeout=120)
    err = proc.stderr
    assert "Traceback (most recent call last):" in err, err
    assert "RuntimeError: Event loop is closed" in err, err
    if how == "main":
        assert proc.returncode == 1, err
    else:
        assert "worker-thread" in err and "403 Forbidden" in err, err
        assert "error: the thread above failed" in err, err
