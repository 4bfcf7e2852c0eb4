"""Provider gce without credentials: the slice table, the config's checks (one line each, through
the real entry point), the request bodies `up` would send, and `up --dry-run`'s plan and price."""

from __future__ import annotations

import subprocess

from launcher.providers import gce_slice
from payload.config import parse_config
from tests.support.gce_configs import gce_raw
from tests.support.paths import REPO


def test_the_slice_module_its_twin_and_the_launcher_agree():
    import shutil

    from scripts.infra_docs import INFRA, load_module

    module_dir = INFRA / "modules" / "tpu_slice"
    twin_dir = REPO / "tests" / "terraform_twin_slice"
    module, twin = load_module(module_dir), load_module(twin_dir)
    # The twin reads the module's own variables (their validations run in its tests) and has
    # its outputs; the launcher writes exactly those variables.
    assert (twin_dir / "variables.tf").resolve() == (module_dir / "variables.tf").resolve()
    assert list(twin.outputs) == list(module.outputs)
    config = parse_config(gce_raw("trillium", zone="us-east5-b", machine_type="ct6e-standard-4t",
                               topology="4x4", ssh_source_ranges=["203.0.113.7/32"]))
    variables = gce_slice.terraform_variables(config, user="me", public_key="ssh-ed25519 AAAA")
    assert set(variables) == set(module.variables)
    required = {n for n, body in module.variables.items() if "default" not in body}
    assert required <= {n for n, v in variables.items() if v is not None}
    # The twin stands in for each of the module's resource types, under that type's name (and
    # sends their in-place updates through stand-ins named for no Google type).
    standing_in = {name for name in twin.resources["terraform_data"]
                   if name.startswith("google_")}
    assert standing_in == set(module.resources), standing_in ^ set(module.resources)
    # The bulk MIG's settings, in the real module.
    group = module.resources["google_compute_region_instance_group_manager"]["main"]
    assert group["target_size_policy"] == [{"mode": "${var.size_mode}"}]
    assert group["distribution_policy_target_shape"] == "ANY_SINGLE_ZONE"
    assert group["instance_lifecycle_policy"] == [{"default_action_on_failure": "DO_NOTHING"}]
    template = module.resources["google_compute_region_instance_template"]["main"]
    assert template["metadata"]["enable-guest-attributes"] == "TRUE"
    if shutil.which("terraform"):
        proc = subprocess.run(["terraform", "fmt", "-check", "-recursive", str(twin_dir)],
                              capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin:/usr/local/bin",
                                   "TF_CLI_CONFIG_FILE": "/dev/null"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
