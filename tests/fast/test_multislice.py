"""Several slices in one vocabulary (payload.cloud.accelerators.Topology): the config key and its
one-line refusals, chips, prices and the fit counted over every slice, the MEGASCALE variables
every worker gets, the plan's DCN line, and `up --dry-run` of two slices on gcp and gce."""

from __future__ import annotations

import pytest
import yaml

from payload.cloud import prices
from payload.cloud.accelerators import Topology, accelerator, compute_slice, topology_of
from payload.config import parse_config
from payload.core.errors import UserError
from payload.core.fit.sharding import plan_sharding
from payload.training import runplan, strategy
from payload.training.strategy import Hardware
from tests.support.configs import plan_config
from tests.support.gce_configs import gce_raw
from tests.support.runners import tpuctl


def test_chips_hosts_devices_and_peak_count_every_slice():
    top = topology_of(accelerator("v5litepod-16"), 2)
    assert (top.chips, top.hosts, top.hosts_per_slice, top.jax_devices,
            top.devices_per_slice) == (32, 8, 4, 32, 16)
    assert top.peak_bf16_flops == 2 * accelerator("v5litepod-16").peak_bf16_flops
    assert top.label == "2 slices of v5litepod-16"
    assert [top.slice_of_host(h) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    one = Topology(slice=accelerator("v5litepod-16"))
    assert (one.chips, one.label, one.dcn_allreduce_s(1e9)) == (16, "v5litepod-16", 0.0)


def test_the_dcn_all_reduce_is_gradient_bytes_times_2_s_minus_1_over_s_over_the_bandwidth():
    # v5p-8: 4 chips x 50 Gbps = 25e9 bytes/s per slice.
    two = topology_of(accelerator("v5p-8"), 2)
    assert two.dcn_allreduce_s(4e9) == pytest.approx(4e9 * 2 * 1 / 2 / 25e9)
    four = topology_of(accelerator("v5p-8"), 4)
    assert four.dcn_allreduce_s(4e9) == pytest.approx(4e9 * 2 * 3 / 4 / 25e9)
    # v6e and TPU7x: 100 Gbps a chip; v4: no figure in Google's pages, so no time.
    assert compute_slice("ct6e-standard-4t", "4x4").dcn_gbps_per_chip == 100
    assert compute_slice("tpu7x-standard-4t", "2x2x1").dcn_gbps_per_chip == 100
    assert topology_of(accelerator("v4-8"), 2).dcn_allreduce_s(4e9) is None


@pytest.mark.parametrize("value, said", [
    (0, "cluster.slices must be at least 1 (got 0)"),
    (-2, "cluster.slices must be at least 1 (got -2)"),
    (1.5, "cluster.slices must be a whole number"),
    ("2", "cluster.slices must be a whole number"),
    (True, "cluster.slices must be a whole number"),
])
def test_a_bad_slice_count_is_one_line(value, said):
    with pytest.raises(UserError, match="^config: " + said.replace("(", r"\(").replace(")", r"\)")):
        parse_config(plan_config(cluster={**plan_config()["cluster"], "slices": value}))


@pytest.mark.parametrize("cluster, train, said", [
    ({"slices": 2}, {"engine": "tensorflow"},
     "cluster.slices: 2 slices need train.engine: jax"),
    ({"provider": "local", "workers": 3, "slices": 2}, {"engine": "jax"},
     "cluster.slices: 2 slices do not split 3 workers into equal slices"),
    ({"provider": "ssh", "hosts": ["a", "b", "c"], "user": "u", "known_hosts": "k",
      "slices": 2}, {"engine": "jax"},
     "cluster.slices: 2 slices do not split 3 workers into equal slices"),
])
def test_slices_the_engine_or_workers_cannot_make_are_refused(cluster, train, said):
    base = plan_config()["cluster"] if "provider" not in cluster else {}
    with pytest.raises(UserError, match=said):
        parse_config(plan_config(cluster={**base, **cluster}, train=train))


def test_a_generation_without_multislice_is_refused_in_one_line(monkeypatch):
    import dataclasses

    from payload.cloud import accelerators

    old = dataclasses.replace(accelerators.ACCELERATORS["v4-8"], multislice=False)
    with pytest.raises(UserError, match="does not train over several slices"):
        topology_of(old, 2)
    assert topology_of(old, 1).chips == 4


def test_two_slices_cost_twice_one_through_the_one_catalog():
    one = parse_config(plan_config()).cluster.hourly_usd()
    two = parse_config(plan_config(cluster={**plan_config()["cluster"], "slices": 2},
                                   train={"engine": "jax"}))
    assert two.cluster.hourly_usd() == pytest.approx(2 * one)
    assert prices.hourly_cost("v5litepod-16", "us-central1-a", "spot", 2).chips == 32


def test_fsdp_never_spans_two_slices():
    # 1.5B parameters of AdamW state need FSDP over 4 v5e chips: inside each slice of 4.
    plan = plan_sharding(1_557_611_200, num_devices=8, hbm_bytes_per_chip=16 << 30,
                         num_slices=2)
    assert (plan.data, plan.fsdp, plan.slices) == (2, 4, 2)
    assert plan.kind == "data parallel over 2 slices, FSDP over 4 devices within each"
    # What one slice cannot hold is refused, though both slices together could.
    assert plan_sharding(3_000_000_000, num_devices=8, hbm_bytes_per_chip=16 << 30).fsdp == 8
    with pytest.raises(UserError, match="one slice of v5litepod-4"):
        plan_sharding(3_000_000_000, num_devices=8, hbm_bytes_per_chip=16 << 30,
                      num_slices=2, where="v5litepod-4")


def test_the_hardware_spec_carries_the_slices():
    for spec in ("cpu,slices=2", "tpu/v5litepod-16/run,slices=3", "tpu/v4-8/run", "cpu"):
        assert Hardware.parse(spec).spec() == spec
    assert Hardware.parse("tpu/v5litepod-16/run,slices=3").slices == 3
    with pytest.raises(UserError, match="is not slices=N"):
        Hardware.parse("cpu,slices=0")


def test_every_worker_is_told_its_slice_and_slice_0_worker_0():
    addresses = [f"10.0.0.{i}:8476" for i in range(4)]
    envs = [dict(strategy.trainer_env(Hardware(slices=2), 4, "jax", addresses=addresses,
                                      index=i)) for i in range(4)]
    assert [e["MEGASCALE_SLICE_ID"] for e in envs] == ["0", "0", "1", "1"]
    for env in envs:
        assert (env["MEGASCALE_COORDINATOR_ADDRESS"], env["MEGASCALE_NUM_SLICES"],
                env["MEGASCALE_PORT"]) == ("10.0.0.0", "2", str(strategy.MEGASCALE_PORT))
    # One slice: none of them.
    one = dict(strategy.trainer_env(Hardware(), 4, "jax", addresses=addresses, index=1))
    assert not set(strategy.MEGASCALE_NAMES) & set(one)


def test_the_strategy_refuses_slices_tensorflow_cannot_train():
    facts = strategy.ClusterFacts(hardware=Hardware(slices=2), num_workers=2,
                                  engine="tensorflow", tf_config=None)
    with pytest.raises(UserError, match=r"2 slices need train\.engine: jax"):
        strategy.plan_strategy(facts)
    jax_facts = strategy.ClusterFacts(hardware=Hardware(slices=2), num_workers=2, engine="jax",
                                      jax_coordinator="h:1", worker_index=1)
    assert strategy.plan_strategy(jax_facts).num_slices == 2


def test_the_plan_says_the_dcn_all_reduce_beside_the_compute_and_warns_when_it_dominates():
    config = parse_config(plan_config(cluster={**plan_config()["cluster"], "slices": 2},
                                      train={"engine": "jax"}))
    one = runplan.run_plan(config, hardware=Hardware.tpu("v5litepod-16", "plan"), num_workers=4)
    two = runplan.run_plan(config, hardware=Hardware.tpu("v5litepod-16", "plan", slices=2),
                           num_workers=8)
    assert (two.chips, two.slices, two.accelerator) == (32, 2, "2 slices of v5litepod-16")
    assert two.gradient_bytes == two.parameters * 4
    assert two.dcn_s_per_step == pytest.approx(two.gradient_bytes / (16 * 25e9 / 8))
    assert two.wall_time_s == pytest.approx(
        (two.compute_s_per_step + two.dcn_s_per_step) * two.steps)
    assert two.compute_s_per_step == pytest.approx(one.compute_s_per_step / 2)
    text = "\n".join(runplan.render(two))
    assert "DCN: " in text and "over 2 slices each step" in text and "16 chips x 25 Gbps" in text
    assert "DCN" not in "\n".join(runplan.render(one))
    assert not any("DCN" in w for w in runplan.warnings(one))
    # A warning exactly where the DCN time passes the compute: a smaller batch, the same
    # gradients, less compute.
    for batch in (32, 4096):
        small = parse_config(plan_config(cluster={**plan_config()["cluster"], "slices": 2},
                                         train={"engine": "jax", "batch_size": batch}))
        plan = runplan.run_plan(small, num_workers=8,
                                hardware=Hardware.tpu("v5litepod-16", "plan", slices=2))
        warned = any("all-reduce over DCN" in w for w in runplan.warnings(plan))
        assert warned == (plan.dcn_s_per_step > plan.compute_s_per_step) == (batch == 32)


@pytest.mark.parametrize("raw, price", [
    (plan_config(name="two", cluster={"provider": "gcp", "project": "my-project",
                                      "zone": "us-central1-a",
                                      "accelerator_type": "v5litepod-16", "slices": 2},
                 train={"engine": "jax"}), 19.20),
    (gce_raw("two", machine_type="ct6e-standard-4t", topology="4x4", zone="us-east5-a",
             slices=2, train={"batch_size": 32}), 43.20),
])
def test_up_dry_run_of_two_slices_needs_no_credentials(tmp_path, raw, price):
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = tpuctl("up", "-c", path, "--dry-run", env={
        "TPUCTL_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "2 slices of" in out and "32 chips" in out
    assert f"${2 * price:,.2f}/h" in out and f"= 2 x ${price:,.2f}/h per slice" in out
    assert "DCN between the slices: 16 chips x" in out and "MEGASCALE_SLICE_ID" in out
    assert not (tmp_path / "home").exists()


def test_gce_train_down_refuses_several_slices_before_anything(tmp_path):
    """gce brings several slices up (tests/e2e/test_multislice_gce.py); `train --down`, where
    worker 0 deletes the run's MIG, still refuses them in one line, before any call."""
    from launcher.providers.gce import GceProvider

    config = parse_config(gce_raw("two", machine_type="ct6e-standard-4t", topology="4x4",
                                  zone="us-east5-a", slices=2, train={"batch_size": 32}))
    with pytest.raises(UserError, match=r"cluster.slices: 2: `train --down` does not handle "
                                        "several slices yet"):
        GceProvider.from_config(config, num_workers=None).node_to_delete(print)


def test_a_multislice_queued_request_asks_for_n_nodes_named_name_0_to_n_minus_1():
    """The client's request as the TPU API v2 defines it (QueuedResource.Tpu.NodeSpec: node_id
    or multislice_params{node_count, node_id_prefix}), read back by the fake."""
    from payload.cloud.tpu_api import TpuApi
    from testbed.fakes.tpu_api import FakeTpuApi

    node = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base",
            "labels": {"tpuctl-run": "run"}}
    with FakeTpuApi() as fake, pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPUCTL_TPU_API_ENDPOINT", fake.endpoint)
        api = TpuApi(project="p", zone="us-central2-b")
        assert api.create_queued("run", node, spot=False, valid_for_s=3600, node_count=3)
        assert api.create_queued("one", node, spot=False, valid_for_s=3600)
        [many, one] = [r.body["tpu"]["nodeSpec"] for r in fake.requests("CreateQueuedResource")]
        assert many == [{"parent": "projects/p/locations/us-central2-b", "node": many[0]["node"],
                         "multisliceParams": {"nodeCount": 3, "nodeIdPrefix": "run"}}]
        assert one[0]["nodeId"] == "one" and "multisliceParams" not in one[0]
        request = api.get_queued("run")
        assert request.node_ids == ("run-0", "run-1", "run-2")
        assert request.labels == {"tpuctl-run": "run"}
        assert api.get_queued("one").node_ids == ("one",)
        assert fake.queued_resource("run")["state"]["state"] in ("ACTIVE", "PROVISIONING",
                                                                 "WAITING_FOR_RESOURCES")


def test_budgets_count_every_slice_at_the_price_of_all_of_them(tmp_path):
    """billing.json lists each slice's node; the price is N slices': an hour of two slices is
    one hour of the run's TPU and costs the two-slice price once (not twice, not four times)."""
    from payload.cloud import budget

    out = str(tmp_path / "out")

    def config(slices: int, **train):
        return parse_config(plan_config(name="two", output_dir=out, cluster={
            **plan_config()["cluster"], "slices": slices}, train={"engine": "jax", **train}))

    fleet_price = config(2).cluster.hourly_usd()
    assert fleet_price == pytest.approx(2 * config(1).cluster.hourly_usd())
    t0, hour = 1_700_000_000.0, 3600.0
    for uid in ("a", "b"):  # both slices up from t0
        budget.record_node(out, uid=uid, zone="us-central1-a", created=t0)
    by_time = budget.Budget.for_run(config(2, max_hours=1.0))
    by_cost = budget.Budget.for_run(config(2, max_cost=round(fleet_price, 2)))
    assert by_time.slices == by_cost.slices == 2
    assert by_time.hours(t0 + 0.99 * hour) == pytest.approx(0.99)
    assert by_time.exceeded(t0 + 0.99 * hour) is None
    assert by_cost.exceeded(t0 + 0.99 * hour) is None
    assert "max_hours 1 reached (1.01 h" in by_time.exceeded(t0 + 1.01 * hour)
    assert "max_cost" in by_cost.exceeded(t0 + 1.01 * hour)
    # One slice deleted after an hour, the other on: (1 h + 1.5 h) of nodes over 2 slices.
    budget.record_deleted(out, "a", when=t0 + hour)
    fresh = budget.Budget.for_run(config(2, max_hours=10.0))
    assert fresh.hours(t0 + 1.5 * hour) == pytest.approx((1.0 + 1.5) / 2)


def test_the_goodput_report_prices_each_slice_node_hour_at_one_slice(tmp_path):
    """billing.json has one node per slice and the run's price is all slices': the report's
    dollars and chip-hours are node-hours at one slice's price and chips, as budgets count."""
    from launcher import goodput as launcher_goodput
    from payload.cloud import budget
    from payload.core import ledger

    out = str(tmp_path / "out")

    def config(slices: int):
        return parse_config(plan_config(name="two", output_dir=out, cluster={
            **plan_config()["cluster"], "slices": slices}, train={"engine": "jax"}))

    one, two = config(1).cluster.hourly_price(), config(2).cluster.hourly_price()
    t0, hour = 1_700_000_000.0, 3600.0
    ledger.append(out, [{"t": t0, "event": "requested", "source": "launcher", "job": None,
                         "host": "h"}, {"t": t0 + hour, "event": "torn_down",
                                        "source": "launcher", "job": None, "host": "h"}])
    for uid in ("a", "b"):  # both slices up for one hour
        budget.record_node(out, uid=uid, zone="us-central1-a", created=t0)
        budget.record_deleted(out, uid, when=t0 + hour)
    report = launcher_goodput.run_report(config(2), now=t0 + 2 * hour)
    # One hour of two slices: the two-slice price once, every chip of both for an hour.
    assert report["billed"]["dollars"] == pytest.approx(two.usd_per_hour, rel=1e-3)
    assert report["billed"]["dollars"] == pytest.approx(2 * one.usd_per_hour, rel=1e-3)
    assert report["billed"]["chip_hours"] == pytest.approx(two.chips)
