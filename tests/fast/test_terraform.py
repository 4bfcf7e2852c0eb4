"""launcher/terraform.py: the plans as data, the outputs parser, the variables writer, and real
`terraform init / apply / output / destroy` on tests/terraform_twin (built-in resources only)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from launcher.terraform import (
    OUTPUTS,
    PLAN_FILE,
    STAGED_LIST,
    VARS_FILE,
    InfraOutputs,
    Terraform,
    TerraformVars,
    planned_changes,
    require_terraform,
    staged_files,
    terraform_argv,
    terraform_env,
    work_dir,
    write_vars,
)
from payload.core.errors import UserError
from tests.support.terraform_vars import TWIN, make_vars


def output_json(**changes) -> str:
    values = {"bucket": "b", "tpu_name": "t", "zone": "us-central2-b", "accelerator_type": "v4-8",
              "runtime_version": "r", "service_account": "sa@p.iam.gserviceaccount.com",
              "bucket_created": True, "tpu_created": False, "network_tag": "tpuctl-t"}
    values.update(changes)
    return json.dumps({k: {"sensitive": False, "type": "x", "value": v}
                       for k, v in values.items() if v is not None})


# --- plans, parser, writer: no terraform needed ------------------------------------------------


def test_argv_never_asks_for_input_and_runs_in_the_working_folder(tmp_path):
    for verb in ("init", "plan", "apply"):
        argv = terraform_argv("terraform", tmp_path, verb)
        assert argv[:3] == ["terraform", f"-chdir={tmp_path}", verb]
        assert {"-input=false", "-no-color", "-json"} <= set(argv)
    # Every apply is of the plan saved (and vetted) before it: nothing planned anew.
    assert f"-out={PLAN_FILE}" in terraform_argv("terraform", tmp_path, "plan")
    assert "-destroy" in terraform_argv("terraform", tmp_path, "plan", destroy=True)
    assert "-destroy" not in terraform_argv("terraform", tmp_path, "plan")
    assert terraform_argv("terraform", tmp_path, "apply")[-1] == PLAN_FILE
    assert terraform_argv("terraform", tmp_path, "show")[-1] == PLAN_FILE
    assert terraform_argv("tf", tmp_path, "output") == ["tf", f"-chdir={tmp_path}", "output",
                                                         "-no-color", "-json"]
    with pytest.raises(ValueError):
        terraform_argv("terraform", tmp_path, "import")
    env = terraform_env({"PATH": "/bin", "TF_IN_AUTOMATION": "0"})
    assert env == {"PATH": "/bin", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0",
                   "CHECKPOINT_DISABLE": "1"}


def test_outputs_are_parsed_into_the_contract():
    parsed = InfraOutputs.from_output_json(output_json())
    assert parsed == InfraOutputs(bucket="b", tpu_name="t", zone="us-central2-b",
                                  accelerator_type="v4-8", runtime_version="r",
                                  service_account="sa@p.iam.gserviceaccount.com",
                                  bucket_created=True, tpu_created=False, network_tag="tpuctl-t")
    assert tuple(f.name for f in dataclasses.fields(InfraOutputs)) == OUTPUTS
    # Outputs the launcher does not read are no error.
    extra = json.loads(output_json())
    extra["something_else"] = {"value": 1}
    assert InfraOutputs.from_output_json(json.dumps(extra)) == parsed


@pytest.mark.parametrize(("text", "needles"), [
    (output_json(zone=None), ["'zone' is missing"]),
    (output_json(zone=None, tpu_created=None), ["'zone' is missing", "'tpu_created' is missing"]),
    (output_json(tpu_created="false"), ["'tpu_created' is str, not bool"]),
    (output_json(bucket=["b"]), ["'bucket' is list, not str"]),
    (output_json(bucket_created=1), ["'bucket_created' is int, not bool"]),
    ("{}", ["no Terraform outputs", "nothing has been applied"]),
    ("not json", ["is not JSON"]),
])
def test_a_missing_or_mistyped_output_is_a_clear_error(text, needles):
    with pytest.raises(UserError) as err:
        InfraOutputs.from_output_json(text, where="/state/here")
    message = str(err.value)
    assert "\n" not in message and "/state/here" in message
    for needle in needles:
        assert needle in message


def test_terraform_vars_are_written_as_json_with_lists_and_maps(tmp_path):
    variables = make_vars(labels={"team": "x", "a": "b"}, corpus_buckets=("c1", "c2"))
    path = write_vars(tmp_path / "run", variables)
    assert path == tmp_path / "run" / VARS_FILE
    written = json.loads(path.read_text())
    assert written["ssh_source_ranges"] == ["203.0.113.7/32"]
    assert written["labels"] == {"a": "b", "team": "x"}
    assert written["corpus_buckets"] == ["c1", "c2"] and written["subnetwork"] is None
    assert written["read_prefixes"] == ["corpus"] and written["run_prefix"] == "demo"
    assert written["provisioning"] == "on_demand" and written["create_tpu"] is True
    assert set(written) == {f.name for f in dataclasses.fields(TerraformVars)}
    assert list(tmp_path.joinpath("run").iterdir()) == [path]  # no temporary file left


@pytest.mark.parametrize(("field", "value"), [
    ("ssh_source_ranges", "203.0.113.7/32"),  # a string is not a list of ranges
    ("create_tpu", "true"),
    ("noncurrent_version_retention_days", 7.5),
    ("labels", {"a": 1}),
    ("subnetwork", 3),
])
def test_terraform_vars_refuse_wrong_types(field, value):
    with pytest.raises(TypeError, match=field):
        make_vars(**{field: value})
    with pytest.raises(TypeError):
        TerraformVars(project="p")  # required values have no default


def test_work_dir_is_per_run_under_the_state_folder(tpuctl_home, tmp_path):
    assert work_dir("my-run") == tpuctl_home / "infra" / "my-run"
    assert work_dir("my-run", home=tmp_path) == tmp_path / "infra" / "my-run"
    for bad in ("../x", "a/b", "", "Run"):
        with pytest.raises(ValueError):
            work_dir(bad)


def test_the_working_folder_may_not_be_inside_the_module(tmp_path):
    with pytest.raises(UserError, match="inside the module"):
        Terraform(TWIN / "state", module=TWIN)
    with pytest.raises(UserError, match="no Terraform module"):
        Terraform(tmp_path / "w", module=tmp_path / "nothing").stage_module()


def test_staging_copies_the_module_and_replaces_the_last_copy(tmp_path):
    module = tmp_path / "module"
    (module / "modules" / "x").mkdir(parents=True)
    (module / "main.tf").write_text("# main\n")
    (module / "old.tf").write_text("# old\n")
    (module / "modules" / "x" / "main.tf").write_text("# x\n")
    (module / "helper.sh").write_text("#!/bin/sh\n")
    (module / "helper.sh").chmod(0o755)
    # Terraform's own files from a run inside the module are never copied.
    (module / ".terraform" / "providers").mkdir(parents=True)
    (module / ".terraform" / "providers" / "p").write_text("binary")
    for name in ("terraform.tfstate", "terraform.tfstate.backup", "terraform.tfvars.json",
                 ".terraform.lock.hcl"):
        (module / name).write_text("{}")
    assert [p.as_posix() for p in staged_files(module)] == [
        "helper.sh", "main.tf", "modules/x/main.tf", "old.tf"]

    folder = tmp_path / "work"
    tf = Terraform(folder, module=module)
    tf.stage_module()
    assert (folder / "old.tf").exists() and os.access(folder / "helper.sh", os.X_OK)
    (folder / "terraform.tfstate").write_text("state")  # the run's own files stay
    (folder / "notes.txt").write_text("mine")
    (module / "old.tf").unlink()
    (module / "main.tf").write_text("# main v2\n")
    tf.stage_module()
    assert not (folder / "old.tf").exists()
    assert (folder / "main.tf").read_text() == "# main v2\n"
    assert (folder / "terraform.tfstate").read_text() == "state"
    assert (folder / "notes.txt").read_text() == "mine"
    assert (folder / STAGED_LIST).read_text().split() == ["helper.sh", "main.tf",
                                                          "modules/x/main.tf"]


def test_no_terraform_on_path_is_one_line_saying_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as err:
        require_terraform()
    assert "Terraform is not installed" in err.value.message
    assert "install Terraform" in err.value.hint and "\n" not in str(err.value)
    tf = Terraform(tmp_path / "w", module=TWIN)
    with pytest.raises(UserError, match="Terraform is not installed"):
        tf.init()
    with pytest.raises(UserError, match="Terraform is not installed"):
        tf.outputs()


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




def test_a_plan_is_read_as_what_it_would_do_to_what_exists():
    shown = {"resource_changes": [
        {"address": "a.new", "mode": "managed", "type": "t", "change": {"actions": ["create"],
                                                                       "before": None}},
        {"address": "a.same", "mode": "managed", "type": "t", "change": {"actions": ["no-op"]}},
        {"address": "a.gone", "mode": "managed", "type": "t",
         "change": {"actions": ["delete"], "before": {"name": "x"}}},
        {"address": "a.moved", "mode": "managed", "type": "t",
         "change": {"actions": ["create", "delete"], "before": {"name": "y"}}},
        {"address": "a.edited", "mode": "managed", "type": "t",
         "change": {"actions": ["update"], "before": {"name": "z"}}},
        {"address": "data.d", "mode": "data", "type": "t", "change": {"actions": ["delete"]}},
    ]}
    found = planned_changes(json.dumps(shown))
    assert [(c.address, c.verb, c.attributes) for c in found] == [
        ("a.gone", "delete", {"name": "x"}), ("a.moved", "replace", {"name": "y"}),
        ("a.edited", "update", {"name": "z"})]
    assert planned_changes("{}") == []
