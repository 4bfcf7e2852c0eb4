"""The strategy plan for each kind of cluster (TPU paths by their plan: no TPU here)."""

import pytest

from payload.core.errors import UserError
from payload.training.strategy import (
    CPU,
    ClusterFacts,
    cluster_facts,
    plan_strategy,
)
from tests.support.strategies import tpu


def test_cpu_plan_builds_the_default_strategy():
    tf = pytest.importorskip("tensorflow")
    from payload.engines.tensorflow.distribute import build_strategy

    strategy = build_strategy(plan_strategy(ClusterFacts(hardware=CPU, num_workers=1)))
    assert strategy is tf.distribute.get_strategy()


def test_no_tpu_is_an_error_unless_the_tpu_api_is_a_stand_in():
    tf = pytest.importorskip("tensorflow")
    from payload.engines.tensorflow.distribute import build_strategy

    real = plan_strategy(cluster_facts(tpu(), worker_index=0, num_workers=1, environ={}))
    with pytest.raises(UserError, match="no TPU found on this worker"):
        build_strategy(real)
    stand_in = plan_strategy(cluster_facts(
        tpu(), worker_index=0, num_workers=1,
        environ={"TPUCTL_TPU_API_ENDPOINT": "http://127.0.0.1:1"}))
    assert stand_in.stand_in
    assert build_strategy(stand_in) is tf.distribute.get_strategy()


