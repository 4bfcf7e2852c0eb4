"""The launcher's early refusal of a checkpoint clash, before anything starts."""

from __future__ import annotations

import pytest

from payload.core.errors import UserError
from payload.training.checkpoints import check_start


def test_check_start_refuses_a_clash_and_a_resume_without_checkpoints(tmp_path):
    check_start(str(tmp_path), resume=False, overwrite=False)  # nothing there: a fresh start
    with pytest.raises(UserError, match="no checkpoint in"):
        check_start(str(tmp_path), resume=True, overwrite=False)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    with pytest.raises(UserError, match=r"already holds checkpoints.*--resume.*--overwrite"):
        check_start(str(tmp_path), resume=False, overwrite=False)
    # Checkpoints without the folder's completeness marker are not resumed (a cut-short clear).
    with pytest.raises(UserError, match=r"incomplete.*--overwrite"):
        check_start(str(tmp_path), resume=True, overwrite=False)
    (tmp_path / "checkpoints" / ".tpuctl-complete").write_text("{}\n")
    check_start(str(tmp_path), resume=True, overwrite=False)
    check_start(str(tmp_path), resume=False, overwrite=True)


