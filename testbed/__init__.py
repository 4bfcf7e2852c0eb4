"""The local test bed: stand-ins for what cannot run on a developer's machine, used by the tests
and by `make bench`. Each speaks the real wire format or runs for real.

    fleet.py        real sshd workers in network namespaces (Fleet)
    fakes/          Cloud Storage (and TensorFlow's own gs:// in a sandbox), the Cloud TPU API,
                    Compute Engine, the Hugging Face Hub: local servers driven by the real clients
    stub_stages.py  stand-in pipeline stages that misbehave on request (install_stub)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

STUB_STAGES = Path(__file__).resolve().parent / "stub_stages.py"


def install_stub(folder: Path, behaviour: dict | None = None) -> Path:
    """Copy the stand-in stages into `folder`, with what they should do wrong
    (testbed/stub_stages.py says how to ask)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "stub_stages.py"
    shutil.copy(STUB_STAGES, target)
    (folder / "stub_stages.json").write_text(json.dumps(behaviour or {}))
    return target
