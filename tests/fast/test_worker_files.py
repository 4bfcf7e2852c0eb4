"""The worker side of the launcher's shared-output check, run as the launcher runs it:
`python -m payload.jobs.files` (a module lint and tests see, not a string of code)."""

from __future__ import annotations


def test_the_shipped_wheel_holds_the_worker_package_alone():
    """What goes to a worker is payload/ (with the job agent, the run lock and these file
    checks), nothing of the launcher, which runs on the user's machine only."""
    import io
    import zipfile

    from launcher import ship

    names = zipfile.ZipFile(io.BytesIO(ship.wheel_bytes())).namelist()
    assert "payload/jobs/agent.py" in names and "payload/jobs/files.py" in names
    assert not [n for n in names if n.startswith("launcher/")]
