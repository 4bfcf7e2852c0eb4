"""The Terraform variables the infra tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from launcher.terraform import (
    TerraformVars,
)
from tests.support.paths import REPO

TWIN = REPO / "tests" / "terraform_twin"


def make_vars(**changes) -> TerraformVars:
    values = dict(
        project="my-project-1", region="us-central2", zone="us-central2-b", run_name="demo",
        tpu_name="demo", accelerator_type="v4-32", runtime_version="tpu-vm-tf-2.16.1-pod-pjrt",
        create_tpu=True, bucket="my-project-1-tpuctl", create_bucket=True, run_prefix="demo",
        ssh_source_ranges=["203.0.113.7/32"], ssh_user="alice",
        ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB+x alice@laptop")
    values.update(changes)
    return TerraformVars(**values)
