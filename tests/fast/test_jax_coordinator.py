"""Where worker 0's JAX coordinator listens (issue 32, item 6): an address the other workers
reach, resolved, not loopback unless every worker is on this machine, and the NAT case decided
by the config (`cluster.coordinator_bind`), never a silent listen on every interface. The
decision is a pure function of what worker 0 resolved (payload.training.coordinator); the
launcher hands worker 0 the other workers' hosts and the config's choice."""

from __future__ import annotations

import pytest

from payload.config import parse_config
from payload.core.errors import UserError
from payload.training import strategy
from payload.training.coordinator import listen_address
from payload.training.strategy import CPU, cluster_facts, plan_strategy
from tests.support.launch_plans import RAW, plan

INTERNAL = "10.128.0.2"  # worker 0's own address on the workers' network
PEER = ["10.128.0.3"]  # another worker, elsewhere


def listen(coordinator="w0:8476", *, resolved, peers=(PEER,), own=(INTERNAL,), bind=None):
    return listen_address(coordinator, resolved=resolved, peers=list(peers), own=set(own),
                          bind=bind)


def test_a_name_is_bound_by_the_address_it_resolves_to_on_worker_zero():
    assert listen(resolved=[INTERNAL]) == f"{INTERNAL}:8476"  # the address, not "w0"
    # A name with a loopback entry first (an /etc/hosts line) and its real address after.
    assert listen(resolved=["127.0.1.1", INTERNAL], own=("127.0.1.1", INTERNAL)) == (
        f"{INTERNAL}:8476")
    assert listen("[fd00::2]:8476", resolved=["fd00::2"], own=("fd00::2",)) == "[fd00::2]:8476"


def test_a_name_that_is_loopback_on_worker_zero_is_refused_while_others_are_elsewhere():
    """Debian and Ubuntu map a machine's own name to 127.0.1.1: listening there, worker 0 was
    out of the others' reach and they waited for it until their timeout."""
    with pytest.raises(UserError) as refused:
        listen(resolved=["127.0.1.1"], own=("127.0.1.1",))
    said = str(refused.value)
    assert "w0 is 127.0.1.1 on worker 0, a loopback address" in said
    assert "cluster.coordinator_bind" in said and "\n" not in said
    # One peer elsewhere is enough to refuse; an unresolvable one is elsewhere too.
    with pytest.raises(UserError, match="loopback"):
        listen(resolved=["127.0.1.1"], peers=[["127.0.0.1"], PEER], own=("127.0.1.1",))
    with pytest.raises(UserError, match="loopback"):
        listen(resolved=["127.0.0.1"], peers=[[]], own=("127.0.0.1",))


def test_loopback_is_bound_when_every_worker_is_on_this_machine():
    local = [["127.0.0.1", "::1"], ["127.0.0.1", "::1"]]  # `localhost`, the local CPU mode
    assert listen("localhost:8476", resolved=["::1", "127.0.0.1"], peers=local,
                  own=("::1", "127.0.0.1")) == "127.0.0.1:8476"
    assert listen("[::1]:8476", resolved=["::1"], peers=[["::1"]], own=("::1",)) == "[::1]:8476"
    # Workers on loopback addresses of their own (the sshd fleet's loopback mode).
    assert listen("127.0.0.2:8476", resolved=["127.0.0.2"], peers=[["127.0.0.3"]],
                  own=("127.0.0.2",)) == "127.0.0.2:8476"
    # A peer named by one of worker 0's own addresses is on this machine too.
    assert listen(resolved=["127.0.1.1"], peers=[[INTERNAL]],
                  own=("127.0.1.1", INTERNAL)) == "127.0.1.1:8476"


def test_an_address_worker_zero_does_not_hold_is_refused_until_the_config_decides():
    """Behind NAT the others reach worker 0 at an address no interface of it holds: JAX used to
    listen on every interface then, without a word in the config."""
    with pytest.raises(UserError) as refused:
        listen("203.0.113.7:8476", resolved=["203.0.113.7"])
    said = str(refused.value)
    assert "203.0.113.7 (203.0.113.7) is not an address of worker 0" in said
    assert "set cluster.coordinator_bind to worker 0's own address" in said
    assert "0.0.0.0 to listen on every interface" in said
    assert listen("203.0.113.7:8476", resolved=["203.0.113.7"], bind=INTERNAL) == (
        f"{INTERNAL}:8476")
    assert listen("203.0.113.7:8476", resolved=["203.0.113.7"], bind="0.0.0.0") == "0.0.0.0:8476"
    assert listen("203.0.113.7:8476", resolved=["203.0.113.7"], bind="::") == "[::]:8476"
    with pytest.raises(UserError, match=r"coordinator_bind 10\.9\.9\.9 is not an address of"):
        listen("203.0.113.7:8476", resolved=["203.0.113.7"], bind="10.9.9.9")
    with pytest.raises(UserError, match="cannot resolve its own coordinator address w0"):
        listen(resolved=[])


def _ssh(**cluster):
    return {**RAW, "cluster": {"provider": "ssh", "hosts": ["w0", "w1", "w2"], "user": "me",
                               "known_hosts": "/k", **cluster},
            "train": {**RAW["train"], "engine": "jax"}}


@pytest.mark.parametrize(("value", "problem"), [
    ("127.0.0.1", "a loopback address"), ("::1", "a loopback address"),
    ("w0", "not an IP address"), ("224.0.0.1", "a multicast address"),
    ("10.0.0.2/24", "not an IP address"), (True, "must be text"), (8476, "must be text"),
])
def test_coordinator_bind_is_checked_at_load(value, problem):
    with pytest.raises(UserError) as refused:
        parse_config(_ssh(coordinator_bind=value))
    assert "cluster.coordinator_bind" in str(refused.value) and problem in str(refused.value)
    assert parse_config(_ssh(coordinator_bind="0.0.0.0")).cluster.coordinator_bind == "0.0.0.0"
    assert parse_config(_ssh(coordinator_bind="fd00::0002")).cluster.coordinator_bind == "fd00::2"
    assert parse_config(_ssh()).cluster.coordinator_bind is None


def test_worker_zero_alone_is_told_the_others_hosts_and_the_configs_choice():
    p = plan(3, cfg=parse_config(_ssh(coordinator_bind="10.0.0.2")))
    train = next(s for s in p.steps if s.name == "train")
    envs = [dict(train.command_for(w).env) for w in range(3)]
    assert envs[0][strategy.JAX_PEERS_ENV] == "10.0.0.3,10.0.0.4"  # ports left out
    assert envs[0][strategy.JAX_BIND_ENV] == "10.0.0.2"
    assert all(strategy.JAX_PEERS_ENV not in e and strategy.JAX_BIND_ENV not in e
               for e in envs[1:])
    assert strategy.JAX_BIND_ENV not in dict(
        next(s for s in plan(3, cfg=parse_config(_ssh())).steps
             if s.name == "train").command_for(0).env)
    facts = cluster_facts(CPU, worker_index=0, num_workers=3, engine="jax", environ=envs[0])
    chosen = plan_strategy(facts)
    assert chosen.coordinator_peers == ("10.0.0.3", "10.0.0.4")
    assert chosen.coordinator_bind == "10.0.0.2"
