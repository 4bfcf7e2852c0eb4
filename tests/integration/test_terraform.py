"""launcher/terraform.py: the plans as data, the outputs parser, the variables writer, and real
`terraform init / apply / output / destroy` on tests/terraform_twin (built-in resources only)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from launcher.terraform import (
    PLAN_FILE,
    VARS_FILE,
    ChangeSummary,
    PlannedChange,
    Terraform,
    recorded,
    write_vars,
)
from payload.core.errors import UserError
from testbed.fakes.tpu_api import FakeTpuApi
from tests.support.paths import REPO
from tests.support.terraform_vars import TWIN, make_vars


def no_refusal(changes: list[PlannedChange]) -> None:
    """These tests own the twin's state alone: no plan of theirs is refused."""


# --- plans, parser, writer: no terraform needed ------------------------------------------------


def test_importing_the_wrapper_loads_nothing_heavy():
    code = ("import sys, launcher.terraform; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'transformers', 'google', 'fabric', 'hcl2', 'rich', 'typer')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


# --- real terraform on the twin -------------------------------------------------------------


@pytest.fixture
def terraform(tmp_path, monkeypatch):
    """Terraform for the twin: skipped only where no terraform is installed."""
    if shutil.which("terraform") is None:
        pytest.skip("terraform is not installed (make setup-terraform installs one)")
    quiet = tmp_path / "terraform.rc"
    quiet.write_text("")  # a CLI config file that exists: no warning about a missing one
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(quiet))
    return lambda name="run": Terraform(tmp_path / "state" / name, module=TWIN)


def test_init_apply_output_destroy_and_twice_changes_nothing(terraform):
    tf = terraform()
    write_vars(tf.folder, make_vars())
    lines: list[str] = []
    tf.init(lines.append)
    assert any("successfully initialized" in line for line in lines)
    assert not any(line.startswith("{") for line in lines)  # JSON messages arrive as text

    lines.clear()
    first = tf.apply(lines.append, vet=no_refusal)
    assert first == ChangeSummary(add=5, change=0, remove=0)
    assert any(line.startswith("Apply complete! Resources: 5 added") for line in lines)
    assert any("terraform_data.tpu_vm[0]: Creation complete" in line for line in lines)
    assert tf.apply(lambda line: None, vet=no_refusal).none  # the second apply changes nothing

    outputs = tf.outputs()
    assert outputs.bucket == "my-project-1-tpuctl" and outputs.bucket_created is True
    assert outputs.tpu_name == "demo" and outputs.tpu_created is True
    assert (outputs.zone, outputs.accelerator_type) == ("us-central2-b", "v4-32")
    assert outputs.runtime_version == "tpu-vm-tf-2.16.1-pod-pjrt"
    assert outputs.service_account.endswith("@my-project-1.iam.gserviceaccount.com")
    assert outputs.network_tag.startswith("tpuctl-demo-")

    # State and variables are the run's own, in its folder; the module was copied there.
    assert tf.state_file.exists() and (tf.folder / VARS_FILE).exists()
    assert not list(TWIN.glob("*.tfstate*")) and not (TWIN / ".terraform").exists()

    assert tf.destroy(lambda line: None, vet=no_refusal) == ChangeSummary(add=0, change=0, remove=5)
    assert tf.destroy(lambda line: None, vet=no_refusal).none  # twice is fine
    assert Terraform(tf.folder.parent / "never-applied", module=TWIN).destroy(print, vet=no_refusal).none
    with pytest.raises(UserError, match="no Terraform outputs"):
        tf.outputs()


def test_changing_a_variable_changes_only_what_depends_on_it(terraform):
    tf = terraform()
    write_vars(tf.folder, make_vars())
    tf.init()
    tf.apply(lambda line: None, vet=no_refusal)
    # A queued request instead: the TPU goes, the rest stays, the name is still the contract's.
    write_vars(tf.folder, make_vars(create_tpu=False))
    assert tf.apply(lambda line: None, vet=no_refusal) == ChangeSummary(add=0, change=0, remove=2)
    outputs = tf.outputs()
    assert outputs.tpu_created is False and outputs.tpu_name == "demo"
    # An existing bucket is used as it is.
    write_vars(tf.folder, make_vars(create_tpu=False, create_bucket=False, bucket="theirs"))
    tf.apply(lambda line: None, vet=no_refusal)
    assert (tf.outputs().bucket, tf.outputs().bucket_created) == ("theirs", False)


@pytest.mark.parametrize("provisioning", ["on_demand", "spot", "preemptible"])
def test_a_second_up_with_the_same_inputs_replaces_no_tpu(terraform, provisioning,
                                                          monkeypatch):
    """google-beta reads an on-demand node's empty schedulingConfig back as no block, and the
    block forces a new TPU: a block written for on-demand replaced the TPU at every apply."""
    with FakeTpuApi() as api:
        monkeypatch.setenv("TPUCTL_TPU_API_ENDPOINT", api.endpoint)
        tf = terraform()
        write_vars(tf.folder, make_vars(provisioning=provisioning))
        tf.init()
        tf.apply(lambda line: None, vet=no_refusal)
        lines: list[str] = []
        assert tf.apply(lines.append, vet=no_refusal).none, [line for line in lines if "tpu" in line]
        assert tf.apply(lambda line: None, vet=no_refusal).none
        # The apply `train --down` makes to grant the self-delete right before training.
        write_vars(tf.folder, make_vars(provisioning=provisioning, allow_self_delete=True))
        granted = tf.apply(lambda line: None, vet=no_refusal)
        assert (granted.add, granted.remove) == (0, 0) and granted.change >= 1
        assert len(api.requests("CreateNode")) == 1 and api.requests("DeleteNode") == []
        sent = api.requests("CreateNode")[0].body.get("schedulingConfig")
        assert sent == {"on_demand": None, "spot": {"preemptible": False, "reserved": False,
                                                    "spot": True},
                        "preemptible": {"preemptible": True, "reserved": False}}[provisioning]


def test_fields_the_provider_forces_new_replace_the_tpu_and_labels_do_not(terraform):
    tf = terraform()
    write_vars(tf.folder, make_vars())
    tf.init()
    tf.apply(lambda line: None, vet=no_refusal)
    # Labels, metadata, tags and description: updated in place.
    write_vars(tf.folder, make_vars(labels={"team": "nlp"}))
    changed = tf.apply(lambda line: None, vet=no_refusal)
    assert changed.add == changed.remove == 0 and changed.change >= 1
    for forced in ({"runtime_version": "tpu-ubuntu2204-base"}, {"provisioning": "spot"},
                   {"accelerator_type": "v4-8"}, {"enable_external_ips": False}):
        write_vars(tf.folder, make_vars(labels={"team": "nlp"}, **forced))
        replaced = tf.apply(lambda line: None, vet=no_refusal)
        assert (replaced.add, replaced.remove) == (1, 1), forced
        write_vars(tf.folder, make_vars(labels={"team": "nlp"}))
        tf.apply(lambda line: None, vet=no_refusal)


def test_derived_names_fit_googles_limits_for_the_longest_tpu_name(terraform):
    tf = terraform()
    longest = "t" + "-x" * 31  # 63 characters
    write_vars(tf.folder, make_vars(tpu_name=longest))
    tf.init()
    tf.apply(lambda line: None, vet=no_refusal)
    outputs = tf.outputs()
    account_id = outputs.service_account.split("@")[0]
    assert 6 <= len(account_id) <= 30 and account_id[0].isalpha() and account_id[-1] != "-"
    assert len(outputs.network_tag) <= 63 and outputs.tpu_name == longest


@pytest.mark.parametrize(("changes", "needle"), [
    ({"accelerator_type": "v9-8"}, "accelerator_type must be a generation and a size"),
    ({"zone": "europe-west4-a"}, "zone europe-west4-a is not in region us-central2"),
    ({"ssh_source_ranges": ["0.0.0.0/0"]}, "must not contain a /0 range"),
    ({"ssh_source_ranges": []}, "non-empty list of CIDR ranges"),
    ({"tpu_name": "1-bad"}, "tpu_name must be 1 to 63 lowercase letters"),
    ({"bucket": "my-google-bucket"}, "bucket must be a Cloud Storage bucket name"),
    ({"provisioning": "reserved"}, "provisioning must be one of: on_demand, spot, preemptible"),
    ({"run_prefix": "demo/"}, "run_prefix must be an object-name prefix"),
    ({"run_prefix": 'a" || true || "'}, "run_prefix must be an object-name prefix"),
    ({"read_prefixes": ["corpus", ""]}, "read_prefixes must be object-name prefixes"),
    ({"corpus_buckets": ["Bad Bucket"]}, "corpus_buckets must be Cloud Storage bucket names"),
])
def test_a_failing_apply_is_one_line_with_terraforms_own_error(terraform, changes, needle):
    tf = terraform()
    write_vars(tf.folder, make_vars(**changes))
    tf.init()
    with pytest.raises(UserError) as err:
        tf.apply(lambda line: None, vet=no_refusal)
    message = str(err.value)
    assert message.startswith("terraform apply failed: Invalid value for variable: ")
    assert needle in message and "\n" not in message
    assert str(tf.folder) in err.value.hint
    assert not tf.state_file.exists()  # nothing was made


def test_every_apply_and_destroy_is_a_plan_the_vet_sees_first_and_may_refuse(terraform):
    """The vet sees each resource a plan would delete, replace or update, with what the state
    holds for it; one that raises leaves the state and the variables' effect unapplied."""
    tf = terraform()
    write_vars(tf.folder, make_vars())
    tf.init()
    first: list[list[PlannedChange]] = []
    tf.apply(lambda line: None, vet=first.append)
    assert first == [[]]  # creates only: nothing that exists is touched
    state = tf.state_file.read_text()

    write_vars(tf.folder, make_vars(create_tpu=False, labels={"team": "nlp"}))

    def refuse(changes: list[PlannedChange]) -> None:
        seen.extend(changes)
        raise UserError("not this one")

    seen: list[PlannedChange] = []
    with pytest.raises(UserError, match="not this one"):
        tf.apply(lambda line: None, vet=refuse)
    verbs = {change.address: change.verb for change in seen}
    assert verbs["terraform_data.tpu_vm[0]"] == "delete"
    assert verbs["terraform_data.bucket[0]"] == "update"  # its labels
    (tpu,) = [change for change in seen if change.address == "terraform_data.tpu_vm[0]"]
    assert recorded(tpu.attributes, "name") == "demo"  # what the state says it made
    assert recorded(tpu.attributes, "zone") == "us-central2-b"
    assert tf.state_file.read_text() == state  # nothing applied
    assert not (tf.folder / PLAN_FILE).exists()  # and no plan left to apply
    with pytest.raises(ValueError, match="without a plan"):
        tf.apply_plan(lambda line: None)

    write_vars(tf.folder, make_vars(tpu_name="other"))
    replaced: list[PlannedChange] = []
    tf.apply(lambda line: None, vet=replaced.extend)
    assert {c.address: c.verb for c in replaced}["terraform_data.tpu_vm[0]"] == "replace"
    assert tf.outputs().tpu_name == "other"

    with pytest.raises(UserError, match="not this one"):
        tf.destroy(lambda line: None, vet=refuse)
    assert tf.outputs().tpu_name == "other"  # the destroy was refused: all still there
    gone: list[PlannedChange] = []
    tf.destroy(lambda line: None, vet=gone.extend)
    assert {c.verb for c in gone} == {"delete"} and len(gone) == 5  # as many as made
