"""What a stage's log holds of the libraries it uses: their warnings, marked with their name,
and none of their INFO narration (payload.__main__: QUIET_LIBRARIES)."""

from __future__ import annotations

import logging

import payload.__main__ as stage_main
from tests.support.runners import payload_main


def test_a_stage_keeps_its_own_lines_and_only_libraries_warnings_named(monkeypatch):
    def run_stage(args):
        logging.getLogger("payload.stages.export").info("exported it")
        for library in stage_main.QUIET_LIBRARIES:
            logging.getLogger(f"{library}.inner").info("%s narrates its work", library)
        logging.getLogger("absl").warning("a checkpoint step is missing")

    monkeypatch.setattr(stage_main, "run_stage", run_stage)
    result = payload_main("export", "--config", "unused.yaml")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith(" w0 export exported it")
    assert lines[1].endswith(" w0 export [absl] a checkpoint step is missing")
