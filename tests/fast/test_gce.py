"""Provider gce without credentials: the slice table, the config's checks (one line each, through
the real entry point), the request bodies `up` would send, and `up --dry-run`'s plan and price."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app
from launcher.providers import gce_slice
from payload.cloud import accelerators
from payload.config import parse_config
from payload.core.errors import UserError
from tests.support.gce_configs import gce_raw
from tests.support.paths import REPO
from tests.support.runners import tpuctl

runner = CliRunner()




def _write(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(("machine", "topology", "name", "chips", "hosts"), [
    ("tpu7x-standard-4t", "2x2x1", "tpu7x-8", 4, 1),
    ("tpu7x-standard-4t", "2x2x2", "tpu7x-16", 8, 2),
    ("tpu7x-standard-4t", "4x4x4", "tpu7x-128", 64, 16),
    ("ct6e-standard-1t", "1x1", "v6e-1", 1, 1),
    ("ct6e-standard-8t", "2x4", "v6e-8", 8, 1),
    ("ct6e-standard-4t", "2x4", "v6e-8", 8, 2),
    ("ct6e-standard-4t", "4x4", "v6e-16", 16, 4),
    ("ct5p-hightpu-4t", "2x2x1", "v5p-8", 4, 1),
    ("ct5p-hightpu-4t", "2x2x4", "v5p-32", 16, 4),
])
def test_a_slice_is_a_machine_type_and_a_topology(machine, topology, name, chips, hosts):
    acc = accelerators.compute_slice(machine, topology)
    assert (acc.name, acc.chips, acc.hosts) == (name, chips, hosts)
    assert not acc.tf_supported
    # The fleet's hardware spec names the slice; the table finds its chips and peak again.
    assert accelerators.accelerator(acc.name).chips == chips


def test_tpu7x_facts_and_topologies_follow_the_sources():
    tpu7x = accelerators.MACHINE_TYPES["tpu7x-standard-4t"]
    assert tpu7x.generation.peak_bf16_flops_per_chip == 2307e12
    assert tpu7x.generation.hbm_gib_per_chip == 192
    # xpk's generate_tpu_topologies: the four small shapes, then multiples of 4 in order.
    assert tpu7x.topologies[:5] == ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4")
    assert "4x4x8" in tpu7x.topologies and "4x8x4" not in tpu7x.topologies
    assert "2x2" not in tpu7x.topologies
    assert accelerators.MACHINE_TYPES["ct6e-standard-4t"].topologies == (
        "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")


def test_the_tpu_api_provider_refuses_a_compute_engine_only_generation():
    raw = gce_raw()
    raw["cluster"] = {"provider": "gcp", "project": "my-project", "zone": "us-central1-c",
                      "accelerator_type": "tpu7x-8"}
    with pytest.raises(UserError, match=r"only as Compute Engine VMs.*provider: gce"):
        parse_config(raw)


def test_a_gce_config_defaults_output_dir_to_the_bucket_and_prices_from_the_catalog():
    config = parse_config(gce_raw(zone="us-east5-b", machine_type="ct6e-standard-4t",
                               topology="4x4"))
    assert config.output_dir == "gs://my-project-tpuctl/iron"
    price = config.cluster.hourly_price()
    assert price.usd_per_hour == pytest.approx(16 * 2.70)
    assert config.cluster.hourly_usd() == pytest.approx(43.2)


BAD = [
    ({"machine_type": "ct6e-standard-1t", "topology": "1x1", "zone": "us-east5-b"},
     {"__model__": {"family": "gpt2", "size": "xl"}}, ["model.size xl", "v6e-1"]),
    ({"machine_type": "tpu7x-standard-9t"}, {}, ["cluster.machine_type",
                                                  "unknown TPU machine type 'tpu7x-standard-9t'",
                                                  "tpu7x-standard-4t"]),
    ({"topology": "3x3x3"}, {}, ["cluster.topology", "'3x3x3' does not exist for "
                                 "tpu7x-standard-4t", "2x2x1"]),
    ({"machine_type": "ct6e-standard-8t", "topology": "4x4", "zone": "us-east5-b"}, {},
     ["cluster.topology", "'4x4' does not exist for ct6e-standard-8t", "2x4"]),
    ({"zone": "europe-west4-a"}, {}, ["cluster.zone", "europe-west4-a does not offer tpu7x-8",
                                      "us-central1-c"]),
    ({"provisioning": "flex_start"}, {}, ["flex_start needs cluster.max_run_hours"]),
    ({"machine_type": "ct5lp-hightpu-4t", "topology": "2x2"}, {},
     ["ct5lp-hightpu-4t is TPU v5e", "provider: gcp", "v5litepod-N"]),
    ({}, {"engine": "tensorflow"}, ["train.engine: tensorflow does not run on provider gce",
                                    "train.engine: jax"]),
    ({"provisioning": "spot", "reservation": "my-reservation"}, {},
     ["cluster.reservation takes on_demand capacity, not spot"]),
]


@pytest.mark.parametrize(("cluster", "train", "needles"), BAD,
                         ids=["model-too-big", "machine-type", "topology", "topology-of-type", "zone",
                              "flex-start-duration", "v5e", "tensorflow", "spot-reservation"])
def test_bad_gce_input_is_one_line_and_nothing_is_written(tmp_path, cluster, train, needles):
    train = dict(train)
    model = train.pop("__model__", None)
    raw = gce_raw(train=train, **cluster)
    if model:
        raw["model"] = model
    raw["cluster"]["ssh_source_ranges"] = ["203.0.113.7/32"]
    path = _write(tmp_path / "run", raw)
    home = tmp_path / "home"
    before = sorted(p.name for p in path.parent.iterdir())
    proc = tpuctl("up", "-c", path, cwd=REPO, env={"TPUCTL_HOME": str(home),
                                                   "PATH": "/usr/bin:/bin"})
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not home.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == before


def test_up_dry_run_shows_the_slice_and_its_price_without_credentials(tmp_path, tpuctl_home,
                                                                       monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    tpu7x = _write(tmp_path / "tpu7x", gce_raw())
    out = runner.invoke(app, ["up", "-c", str(tpu7x), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "slice iron: tpu7x-8 = 2x2x1 on 1 x tpu7x-standard-4t (4 chips of TPU tpu7x" in (
        out.output)
    assert "workload policy" not in out.output  # one VM needs no placement
    assert "1 VM in one zone" in out.output
    # The catalog has no TPU7x price yet: it says so rather than make one up.
    assert "cost: no on-demand price for TPU tpu7x in us-central1" in out.output
    assert "prices change" in out.output
    assert "missing: cluster.ssh_source_ranges" in out.output
    assert "firewall rules iron-ssh: tcp/22 from (not set); iron-internal" in out.output

    v6e = _write(tmp_path / "v6e", gce_raw("trillium", zone="us-east5-b",
                                        machine_type="ct6e-standard-4t", topology="4x4",
                                        provisioning="spot"))
    out = runner.invoke(app, ["up", "-c", str(v6e), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "slice trillium: v6e-16 = 4x4 on 4 x ct6e-standard-4t" in out.output
    assert "workload policy trillium-topology: HIGH_THROUGHPUT, accelerator topology 4x4" in (
        out.output)
    assert "4 VMs in one zone" in out.output and "provisioning SPOT" in out.output
    assert "cost: $17.28/h for v6e-16 (16 chips x $1.0800, spot, us-east5" in out.output
    # The training plan too: the table's hosts, JAX's coordinator port, the same price.
    plan = runner.invoke(app, ["train", "-c", str(v6e), "--dry-run"])
    assert plan.exit_code == 0, plan.output
    assert "4 workers, hardware tpu/v6e-16/trillium" in plan.output
    assert "cost: $17.28/h" in plan.output
    assert not tpuctl_home.exists()


def test_what_up_asks_for_a_multi_host_slice():
    config = parse_config(gce_raw("trillium", zone="us-east5-b", machine_type="ct6e-standard-4t",
                               topology="4x4", network="my-vpc", subnetwork="my-subnet",
                               ssh_source_ranges=["203.0.113.7/32"]))
    sent = gce_slice.slice_requests(config, user="me", public_key="ssh-ed25519 AAAA tpuctl\n",
                                    service_account="sa@my-project.iam.gserviceaccount.com")
    assert sent.region == "us-east5"
    assert sent.policies[0]["workloadPolicy"] == {"type": "HIGH_THROUGHPUT",
                                             "acceleratorTopology": "4x4",
                                             "acceleratorTopologyMode": "AUTO_CONNECT"}
    props = sent.template["properties"]
    assert props["machineType"] == "ct6e-standard-4t"
    assert props["labels"] == {"tpuctl-run": "trillium"}
    assert {"key": "enable-guest-attributes", "value": "TRUE"} in props["metadata"]["items"]
    assert {"key": "ssh-keys", "value": "me:ssh-ed25519 AAAA tpuctl"} in (
        props["metadata"]["items"])
    assert props["scheduling"]["provisioningModel"] == "STANDARD"
    assert "maxRunDuration" not in props["scheduling"]
    assert props["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert "resourcePolicies" not in props  # the workload policy is the MIG's
    assert props["networkInterfaces"][0]["subnetwork"] == (
        "projects/my-project/regions/us-east5/subnetworks/my-subnet")
    assert props["tags"] == {"items": ["tpuctl-trillium"]}
    assert props["serviceAccounts"] == [{"email": "sa@my-project.iam.gserviceaccount.com",
                                         "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    ssh, internal = sent.firewalls
    assert ssh["network"] == internal["network"] == "projects/my-project/global/networks/my-vpc"
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["targetTags"] == internal["targetTags"] == internal["sourceTags"] == [
        "tpuctl-trillium"]
    assert "sourceRanges" not in internal
    assert [kind for kind, _ in sent.in_order()] == [
        "firewalls", "firewalls", "policies", "templates", "groups"]
    [group] = sent.groups
    assert group["targetSize"] == 4
    assert group["targetSizePolicy"] == {"mode": "INDIVIDUAL"}  # on-demand: no bulk mode
    assert group["distributionPolicy"] == {"targetShape": "ANY_SINGLE_ZONE",
                                           "zones": [{"zone": "zones/us-east5-b"}]}
    assert group["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    assert group["resourcePolicies"]["workloadPolicy"].endswith(
        "/regions/us-east5/resourcePolicies/trillium-topology")
    assert "name" not in sent.template and "instanceTemplate" not in group  # Terraform's


@pytest.mark.parametrize(("cluster", "scheduling", "affinity"), [
    ({"provisioning": "flex_start", "max_run_hours": 2.5},
     {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": "9000"},
      "instanceTerminationAction": "DELETE"}, "NO_RESERVATION"),
    ({"provisioning": "spot"}, {"provisioningModel": "SPOT",
                                "instanceTerminationAction": "DELETE"}, "NO_RESERVATION"),
    ({"reservation": "my-reservation"}, {"provisioningModel": "RESERVATION_BOUND"},
     "SPECIFIC_RESERVATION"),
])
def test_provisioning_becomes_the_templates_scheduling(cluster, scheduling, affinity):
    config = parse_config(gce_raw(**cluster))
    sent = gce_slice.slice_requests(config, user="me", public_key="ssh-ed25519 AAAA")
    assert sent.template["properties"]["serviceAccounts"][0]["email"] == "default"
    got = sent.template["properties"]["scheduling"]
    for key, value in scheduling.items():
        assert got[key] == value, key
    assert sent.template["properties"]["reservationAffinity"]["consumeReservationType"] == (
        affinity)
    assert sent.policies == ()  # 2x2x1 on a 4-chip VM is one host


@pytest.mark.parametrize("variable", ["TPUCTL_TPU_API_ENDPOINT", "TPUCTL_COMPUTE_API_ENDPOINT"])
def test_either_cloud_api_as_a_stand_in_puts_jax_on_the_cpu(variable, monkeypatch):
    """One rule (payload.cloud.stand_ins) for gcp's and gce's stand-ins: no TPU by design, JAX
    computes on the CPU; the launcher passes the endpoint on to every stage."""
    from payload.cloud import stand_ins
    from payload.training.strategy import Hardware, cluster_facts, plan_strategy

    hardware = Hardware.tpu("v6e-8", "trillium")
    facts = cluster_facts(hardware, worker_index=1, num_workers=2, engine="jax",
                          environ={variable: "http://127.0.0.1:1",
                                   "TPUCTL_JAX_COORDINATOR": "10.0.0.2:8476"})
    plan = plan_strategy(facts)
    assert plan.stand_in and plan.env["JAX_PLATFORMS"] == "cpu"
    assert (plan.coordinator, plan.num_processes, plan.process_id) == ("10.0.0.2:8476", 2, 1)
    real = plan_strategy(cluster_facts(hardware, worker_index=1, num_workers=2, engine="jax",
                                       environ={"TPUCTL_JAX_COORDINATOR": "10.0.0.2:8476"}))
    assert not real.stand_in and "JAX_PLATFORMS" not in real.env
    for name in stand_ins.ENDPOINT_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "http://127.0.0.1:1")
    assert stand_ins.forwarded_env() == ((variable, "http://127.0.0.1:1"),)
