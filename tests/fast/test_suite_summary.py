"""A run of the suite that skips tests for a missing tool says so at the end: which groups were
skipped and the command that installs what they need (issue 15), so a laptop run that covers
less than CI does not pass for a full one."""

from __future__ import annotations

from tests.support.summary import skipped_groups


def test_skip_reasons_are_grouped_by_what_they_need():
    lines = skipped_groups([
        "needs root and openssh-server (apt-get install -y openssh-server)",
        "needs root and openssh-server (apt-get install -y openssh-server)",
        "no transformers 5.x environment (.venv-torch; `make setup-torch`)",
        "could not import 'tensorflow': No module named 'tensorflow'",
        "something this table does not know",
    ])
    assert lines == [
        "   2 skipped: real SSH workers (sshd)  ->  apt-get install -y openssh-server (as root)",
        "   1 skipped: PyTorch + transformers 5.x (.venv-torch)  ->  make setup-torch",
        "   1 skipped: the Python package tensorflow  ->  make setup",
        "   1 skipped: something this table does not know",
    ]
