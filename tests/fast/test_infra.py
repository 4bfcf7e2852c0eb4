"""infra/ checked without Google Cloud: format, structure (python-hcl2), checkov, and that the
module, its twin and the launcher's wrapper agree on variables and outputs."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from launcher.terraform import OUTPUTS, TerraformVars
from scripts.infra_docs import INFRA, load_module, module_folders, stale_readmes
from tests.support.paths import REPO

TWIN = REPO / "tests" / "terraform_twin"

# Values whose shape is known, so a validation block must reject a wrong one.
SHAPED = {"project", "region", "zone", "run_name", "tpu_name", "accelerator_type",
          "runtime_version", "provisioning", "bucket", "noncurrent_version_retention_days",
          "run_prefix", "read_prefixes", "corpus_buckets", "network", "subnetwork",
          "ssh_source_ranges", "ssh_user", "ssh_public_key", "labels"}
# Values that depend on the user's environment: the run config decides, never a default here.
NO_DEFAULT = {"project", "region", "zone", "run_name", "tpu_name", "accelerator_type",
              "runtime_version", "create_tpu", "bucket", "create_bucket", "run_prefix",
              "ssh_source_ranges", "ssh_user", "ssh_public_key"}
# Which provider a resource type belongs to, to check that each module declares what it uses.
PROVIDER_OF = {"google_tpu_v2_vm": "google-beta", "random_id": "random",
               "terraform_data": "terraform", "time_sleep": "time"}


@pytest.fixture(scope="module")
def root():
    return load_module(INFRA)


@pytest.fixture(scope="module")
def modules():
    return {folder: load_module(folder) for folder in [*module_folders(), TWIN]}


def _submodule(name: str):
    return load_module(INFRA / "modules" / name)


def _expr(value) -> str:
    return json.dumps(value)


def test_layout_follows_terraform_google_modules():
    for folder in [INFRA, *sorted((INFRA / "modules").iterdir())]:
        for name in ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"):
            assert (folder / name).is_file(), folder / name
    assert {p.name for p in (INFRA / "examples").iterdir()} == {"single_host", "pod_slice"}
    for example in (INFRA / "examples").iterdir():
        assert (example / "README.md").is_file() and (example / "main.tf").is_file()


def test_every_variable_is_typed_and_described_and_every_output_described(modules):
    assert len(modules) == 9  # root, 5 modules, 2 examples, the twin
    for folder, module in modules.items():
        assert module.variables, folder
        for name, body in module.variables.items():
            assert body.get("type"), f"{folder}: variable {name} has no type"
            assert str(body.get("description", "")).strip(), f"{folder}: {name} undescribed"
        for name, body in module.outputs.items():
            assert str(body.get("description", "")).strip(), f"{folder}: output {name}"


def test_root_outputs_are_the_launchers_contract(root):
    assert list(root.outputs) == list(OUTPUTS)


def test_twin_has_the_same_variables_and_outputs_as_infra(root):
    twin = load_module(TWIN)
    assert set(twin.variables) == set(root.variables)
    assert list(twin.outputs) == list(root.outputs)
    # Not only the names: the twin reads infra's own files, so the validations run in its tests.
    for linked in ("variables.tf", "names.tf"):
        assert (TWIN / linked).resolve() == (INFRA / linked).resolve(), linked
    # The scheduling block the twin compares with what the provider reads back is infra's own.
    assert ((TWIN / "tpu_scheduling.tf").resolve()
            == (INFRA / "modules" / "tpu_vm" / "scheduling.tf").resolve())


def test_terraform_vars_are_the_root_variables_with_the_same_defaults(root):
    wrapper = {f.name: f for f in dataclasses.fields(TerraformVars)}
    assert list(wrapper) == list(root.variables)
    for name, body in root.variables.items():
        f = wrapper[name]
        has_default = (f.default is not dataclasses.MISSING
                       or f.default_factory is not dataclasses.MISSING)
        assert has_default == ("default" in body), name
        if has_default:
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert value == body["default"], name


def test_shaped_values_are_validated_and_environment_values_have_no_default(root):
    validated = {name for name, body in root.variables.items() if body.get("validation")}
    assert validated >= SHAPED, SHAPED - validated
    no_default = {name for name, body in root.variables.items() if "default" not in body}
    assert no_default == NO_DEFAULT
    provisioning = _expr(root.variables["provisioning"]["validation"])
    for choice in ("on_demand", "spot", "preemptible"):
        assert choice in provisioning
    # The modules that take shaped values check them too.
    assert _submodule("tpu_vm").variables["provisioning"].get("validation")
    assert _submodule("tpu_vm").variables["accelerator_type"].get("validation")
    assert _submodule("ssh_firewall").variables["source_ranges"].get("validation")
    assert _submodule("bucket").variables["name"].get("validation")


def test_validation_patterns_accept_and_reject_known_shapes(root):
    """The regexes in variables.tf (HCL's regex is RE2; these patterns mean the same in Python)."""
    def pattern(name: str) -> re.Pattern:
        condition = root.variables[name]["validation"][0]["condition"]
        found = re.search(r'regex\("((?:[^"\\]|\\.)*)"', condition)
        assert found, condition
        return re.compile(found.group(1).encode().decode("unicode_escape"))

    cases = {
        "accelerator_type": (["v4-8", "v4-32", "v5litepod-16", "v5p-8", "v6e-8"],
                             ["v4", "v5e-8", "V4-8", "v4-8 ", "tpu-v4-8"]),
        "zone": (["us-central2-b", "europe-west4-a", "northamerica-northeast1-c"],
                 ["us-central2", "us-central2-b1", "US-central2-b"]),
        "tpu_name": (["a", "my-run-2", "x" * 63], ["1run", "run-", "Run", "x" * 64, "my_run"]),
        "project": (["my-project-123"], ["12345678", "My-Project", "short"]),
        "ssh_public_key": (["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB+x/y= me@host"],
                           ["AAAAC3Nza", "ssh-ed25519 AAAA\nssh-rsa BBBB", "ssh-dss AAAA"]),
    }
    for name, (good, bad) in cases.items():
        regex = pattern(name)
        for value in good:
            assert regex.fullmatch(value), (name, value)
        for value in bad:
            assert not regex.fullmatch(value), (name, value)


def test_bucket_is_private_versioned_and_never_force_destroyed(root):
    bucket = _submodule("bucket").resources["google_storage_bucket"]["main"]
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["force_destroy"] is False
    assert bucket["versioning"] == [{"enabled": True}]
    rule = bucket["lifecycle_rule"][0]
    assert rule["action"] == [{"type": "Delete"}]
    # send_age_if_zero explicitly false: with it true the provider sends age = 0 (every object).
    assert rule["condition"] == [
        {"days_since_noncurrent_time": "${var.noncurrent_version_retention_days}",
         "send_age_if_zero": False}]
    assert bucket["labels"] == "${var.labels}"
    # In the TPU's region, and only made when asked.
    call = root.blocks["module"]["bucket"]
    assert call["location"] == "${var.region}"
    assert call["count"] == "${var.create_bucket ? 1 : 0}"


def test_firewall_opens_only_ssh_from_the_given_ranges_to_the_tpu(root):
    rule = _submodule("ssh_firewall").resources["google_compute_firewall"]["main"]
    assert rule["direction"] == "INGRESS"
    assert rule["allow"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert rule["source_ranges"] == "${var.source_ranges}"
    assert rule["target_tags"] == ["${var.target_tag}"]
    assert "deny" not in rule
    # The slice's hosts reach each other, from their own tag only (a custom VPC has no
    # default-allow-internal rule: a pod slice hung there).
    internal = _submodule("ssh_firewall").resources["google_compute_firewall"]["internal"]
    assert internal["source_tags"] == internal["target_tags"] == ["${var.target_tag}"]
    assert "source_ranges" not in internal and internal["direction"] == "INGRESS"
    assert {a["protocol"] for a in internal["allow"]} == {"tcp", "udp", "icmp"}
    call = root.blocks["module"]["ssh_firewall"]
    assert call["internal_name"] == "${local.internal_name}"
    assert call["source_ranges"] == "${var.ssh_source_ranges}"
    assert call["target_tag"] == "${local.network_tag}"
    assert root.blocks["module"]["tpu_vm"]["network_tag"] == "${local.network_tag}"


def test_service_account_has_least_privilege():
    module = _submodule("service_account")
    members = module.resources["google_storage_bucket_iam_member"]
    # The shared bucket: objectAdmin only under the run's own prefix, read only under the
    # corpus prefixes, each by an IAM condition on the object name (and on a listing's prefix).
    run, read = members["run"], members["read"]
    assert run["role"] == "roles/storage.objectAdmin" and run["bucket"] == "${var.bucket}"
    assert run["condition"][0]["expression"] == "${local.prefix_conditions[var.run_prefix]}"
    assert read["role"] == "roles/storage.objectViewer" and read["bucket"] == "${var.bucket}"
    assert read["condition"][0]["expression"] == "${local.prefix_conditions[each.value]}"
    assert all("condition" in body for name, body in members.items() if name != "corpus")
    conditions = _expr(module.blocks["locals"])
    for needle in ("projects/_/buckets/${var.bucket}/objects/", "storage.googleapis.com/"
                   "objectListPrefix", "resource.name.startsWith"):
        assert needle in conditions, needle
    # Every other corpus bucket is readable, not only the first.
    assert members["corpus"]["for_each"] == "${toset(var.corpus_buckets)}"
    assert members["corpus"]["role"] == "roles/storage.objectViewer"
    # TPU permissions: a custom role per TPU, delete only when asked, and no condition on the
    # node's name (Cloud TPU does not show resource names to IAM conditions: it granted nothing).
    permissions = _expr(module.blocks["locals"])
    assert '[\\"tpu.nodes.get\\", \\"tpu.operations.get\\"]' in permissions
    assert 'var.allow_self_delete ? [\\"tpu.nodes.delete\\"] : []' in permissions
    binding = module.resources["google_project_iam_member"]["main"]
    assert binding["role"] == "${google_project_iam_custom_role.main.name}"
    assert "condition" not in binding and "dynamic" not in binding
    assert set(module.resources) == {"google_service_account", "google_storage_bucket_iam_member",
                                     "time_sleep", "random_id", "google_project_iam_custom_role",
                                     "google_project_iam_member"}


def test_a_new_service_account_is_given_time_before_the_tpu_uses_it(root):
    """The provider's own TPU example waits 60 s after creating the account; time_sleep waits
    only when created, and is created again only with a new account (its unique id)."""
    module = _submodule("service_account")
    wait = module.resources["time_sleep"]["main"]
    assert wait["create_duration"] == "60s" and "destroy_duration" not in wait
    assert wait["triggers"] == {"email": "${google_service_account.main.email}",
                                "unique_id": "${google_service_account.main.unique_id}"}
    # Everything that uses the account takes its email from the wait.
    assert module.outputs["email"]["value"] == '${time_sleep.main.triggers["email"]}'
    assert root.blocks["module"]["tpu_vm"]["service_account_email"] == (
        "${module.service_account.email}")


def test_no_basic_roles_anywhere_and_project_bindings_use_custom_roles(modules):
    for path in INFRA.rglob("*.tf"):
        text = path.read_text()
        assert not re.search(r"roles/(editor|owner|viewer)\b", text), path
    for folder, module in modules.items():
        for rtype in ("google_project_iam_member", "google_project_iam_binding"):
            for name, body in module.resources.get(rtype, {}).items():
                assert not str(body["role"]).startswith("roles/"), (folder, rtype, name)


def test_tpu_vm_takes_its_settings_from_the_variables(root):
    tpu = _submodule("tpu_vm").resources["google_tpu_v2_vm"]["main"]
    assert tpu["provider"] == "google-beta"
    # A block only where a flag is set: an all-false one is read back as none (defect: every
    # later apply replaced an on-demand TPU). tests/test_terraform.py shows it with the twin.
    assert "scheduling_config" not in tpu
    dynamic = tpu["dynamic"][0]["scheduling_config"]
    assert dynamic["for_each"] == "${local.scheduling_config}"
    scheduling = _expr(_submodule("tpu_vm").blocks["locals"])
    assert 'var.provisioning == \\"on_demand\\" ? []' in scheduling
    assert tpu["service_account"] == [{
        "email": "${var.service_account_email}",
        "scope": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert tpu["tags"] == ["${var.network_tag}"]
    assert tpu["metadata"] == {"ssh-keys": "${var.ssh_user}:${trimspace(var.ssh_public_key)}"}
    network = tpu["network_config"][0]
    assert network["enable_external_ips"] == "${var.enable_external_ips}"
    assert "var.network" in network["network"]
    call = root.blocks["module"]["tpu_vm"]
    assert call["count"] == "${var.create_tpu ? 1 : 0}"
    assert call["labels"] == "${local.labels}"
    labels = _expr(root.blocks["locals"])
    assert '\\"tpuctl-run\\" = var.run_name' in labels


def test_a_single_resource_of_a_type_is_named_main(modules):
    for folder, module in modules.items():
        if folder == TWIN:  # the twin names its stand-ins after infra's modules
            continue
        for rtype, named in module.resources.items():
            if len(named) == 1:
                assert list(named) == ["main"], (folder, rtype)


def test_versions_are_pinned_and_cover_the_providers_used(modules):
    bounded = re.compile(r">=\s*[0-9.]+\s*,\s*<\s*[0-9.]+")
    for folder, module in modules.items():
        settings = {k: v for block in module.blocks["terraform"] for k, v in block.items()}
        assert bounded.fullmatch(settings["required_version"]), folder
        declared = {name: spec for entry in settings.get("required_providers", [])
                    for name, spec in entry.items()}
        for name, spec in declared.items():
            assert spec["source"] == f"hashicorp/{name}", (folder, name)
            assert bounded.match(spec["version"]), (folder, name, spec["version"])
        used = {PROVIDER_OF.get(rtype, rtype.split("_")[0]) for rtype in module.resources}
        used |= {"google-beta"} if any(
            body.get("provider") == "google-beta"
            for named in module.resources.values() for body in named.values()) else set()
        used -= {"terraform"}
        assert used <= set(declared), (folder, used - set(declared))
    root_providers = {name for block in modules[INFRA].blocks["terraform"]
                      for entry in block["required_providers"] for name in entry}
    assert root_providers == {"google", "google-beta", "random", "time"}


def test_readme_tables_are_current():
    assert stale_readmes() == []
    readme = (INFRA / "README.md").read_text()
    # The split with the TPU API and every permission are explained where users look.
    assert "google_tpu_v2_queued_resource" in readme and "valid_until_duration" in readme
    for permission in ("roles/storage.objectAdmin", "roles/storage.objectViewer",
                       "tpu.nodes.get", "tpu.operations.get", "tpu.nodes.delete"):
        assert f"`{permission}`" in readme, permission


def _gcp_run(**changes):
    from payload.config import parse_config

    raw = {"name": "demo",
           "cluster": {"provider": "gcp", "project": "my-project-1", "zone": "us-central2-b",
                       "accelerator_type": "v4-8"},
           "data": {"corpus": ["gs://their-corpus/books/*.txt"]},
           "model": {"family": "gpt2", "size": "tiny"},
           "train": {"steps": 1, "batch_size": 8, "learning_rate": 1e-3}}
    for key, value in changes.items():
        raw[key] = value
    return parse_config(raw)


def test_the_workers_get_the_runs_prefix_and_every_corpus_bucket_not_the_whole_bucket():
    """Issue 16, points 11 and 12: the bucket is shared by every run of the project."""
    from launcher.providers.gcp_infra import bucket_access

    config = _gcp_run(data={"corpus": [
        "gs://their-corpus/books/*.txt", "gs://second-corpus/a.txt",
        "gs://my-project-1-tpuctl/mine/part-*.txt", "gs://my-project-1-tpuctl/one/file.txt",
        "/local/corpus.txt"]})
    run_prefix, read, others = bucket_access(config)
    assert run_prefix == "demo"  # output_dir defaults to gs://my-project-1-tpuctl/demo
    assert read == ("corpus", "mine", "one/file.txt")
    assert others == ("second-corpus", "their-corpus")  # every one, not only the first
    # An output_dir deeper in the run's bucket is the prefix; one elsewhere keeps the name.
    assert bucket_access(_gcp_run(output_dir="gs://my-project-1-tpuctl/team/x/"))[0] == "team/x"
    assert bucket_access(_gcp_run(output_dir="gs://elsewhere/x"))[0] == "demo"


def test_a_corpus_glob_over_the_whole_shared_bucket_is_refused():
    from launcher.providers.gcp_infra import bucket_access
    from payload.core.errors import UserError

    with pytest.raises(UserError) as err:
        bucket_access(_gcp_run(data={"corpus": ["gs://my-project-1-tpuctl/*.txt"]}))
    assert "reads the whole of gs://my-project-1-tpuctl" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("cluster", "needles"), [
    ({"reservation": "my-tpus"}, ["'my-tpus' is not a reservation path",
                                  "projects/PROJECT/locations/us-central2-b/reservations/NAME"]),
    ({"reservation": "projects/p-1/zones/us-central2-b/reservations/r"},
     ["is not a reservation path"]),
    ({"reservation": "projects/my-project-1/locations/us-central1-a/reservations/r"},
     ["reservation is in us-central1-a", "asked for in us-central2-b"]),
    ({"queued": True, "provisioning": "preemptible"},
     ["preemptible cannot be queued", "provisioning: spot"]),
])
def test_queued_capacity_is_checked_before_anything_runs(tmp_path, cluster, needles):
    """Issue 17, lesser: a reservation in the form the TPU API takes; preemptible was sent as
    spot for a queued request without a word."""
    import yaml

    from tests.support.runners import assert_user_error, tpuctl

    def up_dry_run():
        return tpuctl("up", "--dry-run", "-c", path, env={"TPUCTL_HOME": str(tmp_path / "home")})

    raw = {"name": "demo",
           "cluster": {"provider": "gcp", "project": "my-project-1", "zone": "us-central2-b",
                       "accelerator_type": "v4-8", "ssh_source_ranges": ["203.0.113.7/32"],
                       **cluster},
           "data": {"corpus": ["gs://c/books.txt"]}, "model": {"family": "gpt2", "size": "tiny"},
           "train": {"steps": 1, "batch_size": 8, "learning_rate": 1e-3}}
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_user_error(up_dry_run(), *needles)
    assert list(tmp_path.iterdir()) == [path]  # nothing written
    # The right form in the right zone is taken.
    raw["cluster"] = {**raw["cluster"], "queued": False, "provisioning": "on_demand",
                      "reservation": "projects/my-project-1/locations/us-central2-b/"
                                     "reservations/my-tpus"}
    path.write_text(yaml.safe_dump(raw))
    proc = up_dry_run()
    assert proc.returncode == 0, proc.stderr


def test_the_docs_list_what_a_first_real_run_must_confirm_with_a_command_each():
    text = (REPO / "docs" / "first-real-run.md").read_text()
    table = text.split("**What a first real run must confirm.**", 1)[1].split("\n\n")[1]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert len(rows) >= 10
    for row in rows:
        command = row.split(" | ")[1]
        assert command.startswith("`") and ("tpuctl" in command or "gcloud" in command), row
    for needle in ("libtpu 0.0.14", "policy-troubleshoot", "grpc_tpu_worker", "reservation",
                   "-detailed-exitcode"):
        assert needle in table, needle
    # Google's TF release CI is cited for what it tests (2.18), not for 2.20: where the route is
    # explained, which the table's page links.
    route = (REPO / "docs" / "google-cloud.md").read_text()
    assert "does not test 2.20" in route and "2.18.0rc2" in route
    assert "(first-real-run.md)" in route
