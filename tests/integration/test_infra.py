"""infra/ checked without Google Cloud: format, structure (python-hcl2), checkov, and that the
module, its twin and the launcher's wrapper agree on variables and outputs."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from scripts.infra_docs import INFRA
from tests.support.paths import REPO

TWIN = REPO / "tests" / "terraform_twin"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"


def _terraform() -> str:
    found = shutil.which("terraform")
    if found is None:
        pytest.skip("terraform is not installed (make setup-terraform installs one)")
    return found


def test_terraform_fmt_check_passes(tmp_path):
    terraform = _terraform()
    env = {"PATH": "/usr/bin:/bin", "TF_CLI_CONFIG_FILE": str(tmp_path / "none.tfrc")}
    (tmp_path / "none.tfrc").write_text("")
    for folder in (INFRA, TWIN):
        proc = subprocess.run([terraform, "fmt", "-check", "-recursive", "-diff", str(folder)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_checkov_finds_no_failed_check_and_every_skip_has_a_reason():
    if not CHECKOV.exists():
        pytest.skip("checkov is not installed: make setup-checkov")
    proc = subprocess.run([str(CHECKOV), "--directory", str(INFRA), "--framework", "terraform",
                           "--skip-download", "--compact", "--output", "json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    report = json.loads(proc.stdout)
    summary, results = report["summary"], report["results"]
    failed = [(c["check_id"], c["resource"]) for c in results.get("failed_checks", [])]
    assert failed == [] and proc.returncode == 0, failed or proc.stderr[-2000:]
    assert summary["parsing_errors"] == 0
    passed = {c["check_id"] for c in results["passed_checks"]}
    # The bucket and the firewall were scanned (UBLA, public access prevention, versioning,
    # no SSH from anywhere).
    assert {"CKV_GCP_29", "CKV_GCP_114", "CKV_GCP_78", "CKV_GCP_2"} <= passed
    for check in results.get("skipped_checks", []):
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason.strip()) > 20, check["check_id"]


