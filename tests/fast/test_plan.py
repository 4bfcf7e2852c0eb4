"""The pure plan: which steps run where, with which commands; quoting that nothing can break."""

import json
import shlex

import pytest

from launcher import job_shell
from launcher.plan import (
    ALL_STAGES,
    Plan,
    Stage,
    build_plan,
    parse_stages,
    render_plan,
)
from launcher.worker_python import EnvMode, plan_environment
from payload.core.errors import UserError
from payload.training.strategy import CPU, Hardware
from tests.support.launch_plans import ENV, GCP, RAW, config, plan
from tests.support.paths import REPO

POD = Hardware.tpu("v4-32", "unit")




def test_cpu_workers_run_every_stage_with_shares_and_tf_config():
    p = plan(3)
    assert [s.name for s in p.steps] == ["tokenizer", "prepare", "train", "export"]
    tokenizer, prepare, train, export = p.steps
    assert tokenizer.workers == (0,) and export.workers == (0,)
    assert prepare.workers == (0, 1, 2)
    argv = prepare.command_for(2).argv
    assert argv[:3] == ("/opt/py/bin/python", "-m", "payload")
    assert argv[3:] == ("prepare", "--config", p.paths[2].config, "--worker-index", "2",
                        "--num-workers", "3")
    # Each worker has its own job folder (workers may share a home), one payload folder.
    assert p.paths[2].job_dir == ".tpuctl/jobs/unit-1/worker-2"
    assert len({(x.job_dir, x.pid, x.rc, x.log, x.agent_plan, x.wheel) for x in p.paths}) == 3
    assert len({x.payload_dir for x in p.paths}) == 1
    assert train.workers == (0, 1, 2)
    tf_config = json.loads(dict(train.command_for(1).env)["TF_CONFIG"])
    assert tf_config == {"cluster": {"worker": ["10.0.0.2:29477", "10.0.0.3:29477",
                                                "10.0.0.4:29477"]},
                         "task": {"type": "worker", "index": 1}}
    assert dict(prepare.command_for(0).env)["PYTHONPATH"] == p.paths[0].payload_dir
    # Worker 1 listens for the others on its port, checked free before training; worker 0
    # holds the run lock.
    assert p.agent_plan(1)["coordination_port"] == 29477
    assert p.agent_plan(0)["holds_run_lock"] and not p.agent_plan(1)["holds_run_lock"]
    assert p.barrier_dir == "/shared/out/.tpuctl/jobs/unit-1"
    assert p.log_copies[2] == "/shared/out/logs/worker-2.log"


def test_single_cpu_worker_has_no_tf_config():
    p = plan(1)
    assert "TF_CONFIG" not in dict(p.steps[2].commands[0].env)
    assert p.agent_plan(0)["coordination_port"] is None


def test_tpu_pod_trains_on_worker_zero_after_freeing_every_host():
    p = plan(4, POD)
    names = [s.name for s in p.steps]
    assert names == ["tokenizer", "prepare", "free-tpu", "train", "export"]
    free = p.steps[2]
    assert free.workers == (0, 1, 2, 3)
    script = free.commands[0].argv[2]
    assert "/dev/accel*" in script and "/dev/vfio/*" in script
    assert "/tmp/libtpu_lockfile" in script
    train = p.steps[3]
    assert train.workers == (0,)
    assert train.commands[0].argv[-4:] == ("--worker-index", "0", "--num-workers", "4")
    assert "TF_CONFIG" not in dict(train.commands[0].env)


def test_jax_cpu_workers_all_train_joined_through_worker_zeros_port():
    p = plan(3, cfg=config(train={**RAW["train"], "engine": "jax"}))
    train = p.steps[2]
    assert train.workers == (0, 1, 2)
    for worker in range(3):
        env = dict(train.command_for(worker).env)
        assert "TF_CONFIG" not in env
        assert env["TPUCTL_JAX_COORDINATOR"] == "10.0.0.2:29477"  # worker 0's, for every one
    # Only the coordinator listens: worker 0's port is checked free, the others' are not used.
    assert [p.agent_plan(w)["coordination_port"] for w in range(3)] == [29477, None, None]
    assert "TPUCTL_JAX_COORDINATOR" not in dict(plan(1, cfg=config(
        train={**RAW["train"], "engine": "jax"})).steps[2].commands[0].env)


def test_a_jax_pod_slice_trains_on_every_host_without_tpu_servers():
    p = plan(4, POD, cfg=config(cluster=GCP, train={**RAW["train"], "engine": "jax"}))
    assert [s.name for s in p.steps] == ["tokenizer", "prepare", "free-tpu", "train", "export"]
    train = p.steps[3]
    assert train.workers == (0, 1, 2, 3) and train.services == ()
    assert train.command_for(3).argv[-4:] == ("--worker-index", "3", "--num-workers", "4")
    env = dict(train.command_for(3).env)
    assert env["TPUCTL_JAX_COORDINATOR"] == "10.0.0.2:29477"
    assert "TPUCTL_TPU_WORKERS" not in env and "TF_CONFIG" not in env


def test_the_free_tpu_step_runs_for_either_engine():
    """The step is the TPU's, not the engine's: a JAX run on a pod slice frees every host too."""
    for engine in ("tensorflow", "jax"):
        p = plan(4, POD, cfg=config(cluster=GCP, train={**RAW["train"], "engine": engine}))
        free = next(s for s in p.steps if s.name == "free-tpu")
        assert free.workers == (0, 1, 2, 3)


def test_a_stand_in_fleet_frees_files_of_its_own():
    """Tests' sshd workers share /proc with this machine, where any libtpu user holds
    /tmp/libtpu_lockfile: with a stand-in cloud (its endpoint forwarded to the stages) the
    free-tpu step looks for holders of the stand-in's files, never the real TPU's."""
    from payload.cloud import stand_ins

    for name in stand_ins.ENDPOINT_ENVS:
        p = plan(4, POD, forward_env=((name, "http://127.0.0.1:1"),))
        script = next(s for s in p.steps if s.name == "free-tpu").commands[0].argv[2]
        assert not any(real in script for real in ("/tmp/libtpu_lockfile", "/dev/accel", "/dev/vfio"))
        assert "/tmp/tpuctl-stand-in-tpu/libtpu_lockfile" in script


def test_cpu_workers_skip_free_tpu():
    assert "free-tpu" not in [s.name for s in plan(2).steps]


def test_tokenizer_path_skips_the_tokenizer_stage():
    cfg = config(tokenizer={"path": "/shared/tok"})
    assert [s.name for s in plan(cfg=cfg).steps] == ["prepare", "train", "export"]


def test_stage_subset_resume_and_overwrite_flags():
    p = plan(stages=parse_stages("train,prepare"), resume=True, overwrite=True)
    assert [s.name for s in p.steps] == ["prepare", "train"]
    assert p.steps[1].commands[0].argv[-2:] == ("--resume", "--overwrite")


def test_parse_stages():
    assert parse_stages(None) == ALL_STAGES
    for empty in ("", " ", ","):
        with pytest.raises(UserError, match="names no stage"):
            parse_stages(empty)
    assert parse_stages("export, tokenizer") == (Stage.TOKENIZER, Stage.EXPORT)
    with pytest.raises(UserError, match="unknown stage 'trian'"):
        parse_stages("trian")


def test_no_workers_and_nothing_to_run_are_user_errors():
    with pytest.raises(UserError):
        build_plan(config(), (), job_id="x", payload_digest="a", environment=ENV,
                   hardware=CPU)
    with pytest.raises(UserError, match="nothing to run"):
        plan(cfg=config(tokenizer={"path": "/t"}), stages=(Stage.TOKENIZER,))


def test_environment_modes_and_keys():
    reqs = ("tensorflow==2.20.0", "tf-keras==2.20.1", "transformers==4.57.6")
    existing = plan_environment(python="/opt/py", wheelhouse_digest=None, requirements=reqs,
                                tpu=False)
    assert existing.mode is EnvMode.EXISTING and existing.python == "/opt/py"
    assert existing.setup[:2] == ("/opt/py", "-c") and "tensorflow==2.20.0" in existing.setup
    house = plan_environment(python=None, wheelhouse_digest="w1", requirements=reqs, tpu=False)
    assert house.mode is EnvMode.WHEELHOUSE and house.python.endswith("/bin/python")
    assert "--no-index" in house.setup[2] and ".tpuctl/wheelhouse/w1" in house.setup[2]
    index = plan_environment(python=None, wheelhouse_digest=None, requirements=reqs, tpu=False)
    tpu = plan_environment(python=None, wheelhouse_digest=None, requirements=reqs, tpu=True)
    assert index.mode is EnvMode.CREATE
    assert "tensorflow==2.20.0" in index.setup[2] and "tensorflow-tpu" not in index.setup[2]
    assert "tensorflow-tpu==2.20.0" in tpu.setup[2] and "libtpu-tf-releases" in tpu.setup[2]
    assert "libtpu==0.0.14" in tpu.setup[2] and "tf-keras==2.20.1" in tpu.setup[2]
    keys = {e.key for e in (existing, house, index, tpu)}
    assert len(keys) == 4
    # Same contents, same key, whatever the order; a changed pin, a new key.
    again = plan_environment(python=None, wheelhouse_digest=None,
                             requirements=tuple(reversed(reqs)), tpu=False)
    assert again.key == index.key
    bumped = plan_environment(python=None, wheelhouse_digest=None,
                              requirements=(*reqs[:2], "transformers==4.57.7"), tpu=False)
    assert bumped.key != index.key


def _installed(setup: str) -> list[str]:
    """The packages of every `pip install` in a set-up script, and pip's options; those of a
    hash-checked install are the pins of the requirements file the script writes first."""
    found = []
    for part in setup.split(" && "):
        words = shlex.split(part)
        if words[:1] == ["printf"]:  # printf '%s\n' 'PIN --hash=sha256:HEX' ... > FILE
            found += [line.split()[0] for line in words[2:words.index(">")]]
        if "install" in words[:5] and words[words.index("install") - 1] == "pip":
            found += [w for w in words[words.index("install") + 1:]
                      if not w.startswith("-") and "://" not in w]
    return found


def _libtpu_jax_asks_for():
    """The libtpu requirement of jax[tpu], from the metadata of the jax installed here (the
    project's pin)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    asks = [Requirement(r) for r in metadata.requires("jax") or ()
            if r.startswith("libtpu") and Requirement(r).marker.evaluate({"extra": "tpu"})]
    assert len(asks) == 1, asks
    return asks[0]


@pytest.mark.parametrize("engine", ["tensorflow", "jax"])
def test_the_tpu_environment_pins_everything_it_installs_for_every_accelerator(tmp_path, engine):
    """tensorflow-tpu 2.20.0 asks for libtpu~=0.0.14: unpinned, pip took the newest 0.0.x. Every
    accelerator an engine runs on gets that engine's locked set, each package at one version,
    with the libtpu the engine was built with; TensorFlow on v6e is refused."""
    from importlib import metadata

    import yaml
    from packaging.requirements import Requirement

    from launcher import launch, ship
    from launcher.worker_python import UV_VERSION, tpu_lock, tpu_requirements
    from payload.cloud import accelerators
    from payload.core.engines import JAX_TPU_PYTHON, TPU_WHEELS_INDEX, engine_spec

    lock = {Requirement(r).name: Requirement(r) for r in tpu_lock(engine)}
    libtpu = next(iter(lock["libtpu"].specifier)).version
    if engine == "tensorflow":
        assert libtpu == "0.0.14"
    else:  # the release jax 0.10.2's tpu extra names (0.0.42.*), as pip resolved it
        assert _libtpu_jax_asks_for().specifier.contains(libtpu)
        assert str(lock["jax"].specifier) == f"=={metadata.version('jax')}"
        assert not {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-keras"} & set(lock)
    # The lock holds what pyproject asks for the engine (TensorFlow as the route's build).
    normal, nodeps = tpu_requirements(ship.worker_requirements(extras=engine_spec(engine).extras),
                                      engine)
    for req in map(Requirement, normal + nodeps):
        pinned = next(iter(lock[req.name.lower()].specifier)).version
        assert req.specifier.contains(pinned), (req, pinned)
    checked, refused = 0, 0
    for name, acc in sorted(accelerators.ACCELERATORS.items()):
        raw = {"name": "pins", "cluster": {"provider": "gcp", "project": "my-project-1",
                                           "zone": acc.zones[0], "accelerator_type": name},
               "data": {"corpus": "gs://c/books.txt"},
               "model": {"family": "gpt2", "size": "tiny"},
               "train": {"engine": engine, "steps": 1, "batch_size": 8 * acc.chips,
                         "learning_rate": 1e-3}}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        if engine not in accelerators.engines_on(acc):
            with pytest.raises(UserError, match=r"set train\.engine: jax"):
                launch.plan_train(path, launch.TrainOptions(dry_run=True))
            refused += 1
            continue
        env = launch.plan_train(path, launch.TrainOptions(dry_run=True)).plan.environment
        setup = env.setup[2]
        installed = _installed(setup)
        assert installed and all("==" in r and not set("<>~!*,") & set(r) for r in installed), (
            name, [r for r in installed if "==" not in r])
        assert f"libtpu=={libtpu}" in installed, name
        assert len({Requirement(r).name for r in installed}) == len(installed), name
        if engine == "jax":  # the Python the route brings, pinned, and uv that brings it
            assert set(installed) == {*lock_pins(lock), f"uv=={UV_VERSION}"}, name
            assert f"cpython-{JAX_TPU_PYTHON}-linux-x86_64-gnu" in setup
            assert TPU_WHEELS_INDEX not in setup
        else:
            assert set(installed) == set(lock_pins(lock)), name
            assert "uv" not in {Requirement(r).name for r in installed}
        checked += 1
    assert checked >= (3 if engine == "tensorflow" else 4) * 2
    assert refused == (len(accelerators.GENERATIONS["v6e"].sizes) if engine == "tensorflow"
                       else 0)


def lock_pins(lock: dict) -> list[str]:
    return [str(req) for req in lock.values()]


def test_each_engine_has_its_own_tpu_environment():
    """The engine picks the lock (and, for JAX, the Python brought onto the image); the key
    changes with it, and a CPU run installs the engine's pyproject set as it is."""
    from launcher.worker_python import UV_VERSION, tpu_lock
    from payload.core.engines import JAX_TPU_PYTHON

    reqs = ("tensorflow==2.20.0", "tf-keras==2.20.1", "jax==0.10.2")
    tf = plan_environment(python=None, wheelhouse_digest=None, requirements=reqs, tpu=True)
    jax = plan_environment(python=None, wheelhouse_digest=None, requirements=reqs, tpu=True,
                           engine="jax")
    assert tf.key != jax.key
    assert "tensorflow-tpu==2.20.0" in _installed(tf.setup[2])
    assert set(_installed(jax.setup[2])) == {*tpu_lock("jax"), f"uv=={UV_VERSION}"}
    steps = jax.setup[2].split(" && ")
    build = f"cpython-{JAX_TPU_PYTHON}-linux-x86_64-gnu"
    # uv first (its requirements file, then its hash-checked install), then the interpreter
    # under the environment, then the venv made with it, then the lock without dependencies.
    assert steps[0] == f"rm -rf {jax.dir}"
    assert steps[1] == f"python3 -m venv {jax.dir}/.uv"
    assert steps[2].startswith("printf") and "--require-hashes" in steps[3]
    assert f"python install --no-config --no-bin {build}" in steps[4]
    assert steps[5].startswith('"$(') and steps[5].endswith(f")\" -m venv {jax.dir}")
    assert "--no-deps" in steps[-1] and jax.python == f"{jax.dir}/bin/python"
    # The same lock from a wheelhouse: uv comes from it too, nothing from the index.
    house = plan_environment(python=None, wheelhouse_digest="w1", requirements=reqs, tpu=True,
                             engine="jax")
    assert house.key not in (jax.key, tf.key)
    assert all("--no-index" in s for s in house.setup[2].split(" && ") if "pip install" in s)
    # On CPU workers the engine's requirements are installed as given (no TPU lock, no uv).
    cpu = plan_environment(python=None, wheelhouse_digest=None, requirements=reqs, tpu=False,
                           engine="jax")
    assert set(_installed(cpu.setup[2])) == set(reqs) and "uv" not in cpu.setup[2]


def test_the_lock_file_is_what_the_script_writes(monkeypatch):
    """launcher/tpu_lock.py round-trips through scripts/write_tpu_lock.py's reader and writer (no
    package index asked): the file is the script's output, and what the script writes parses
    back to the same locks."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("tpu_lock_script",
                                                  REPO / "scripts" / "write_tpu_lock.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclass looks itself up there
    spec.loader.exec_module(script)
    from launcher import tpu_lock as module

    text = (REPO / "launcher" / "tpu_lock.py").read_text()
    locks = script.read(text)
    assert set(locks) == {"tensorflow", "jax"}
    assert script.render(locks, script.read_uv(text)) == text
    assert locks["tensorflow"].pins == module.TPU_LOCK and locks["jax"].pins == module.JAX_TPU_LOCK
    assert (locks["tensorflow"].python, locks["jax"].python) == ("3.10", "3.11")
    made = {"tensorflow": script.Lock(engine="tensorflow", python="3.10", libtpu_source="x",
                                      pins=("a==1", "tf-keras==2")),
            "jax": script.Lock(engine="jax", python="3.11", libtpu_source="it's \"y\"",
                               pins=("b==2",))}
    assert script.read(script.render(made)) == made
    # Each route's Python is the one the environment plan runs it on.
    assert script.python_of("jax") == locks["jax"].python
    assert script.python_of("tensorflow") == locks["tensorflow"].python


def test_plan_round_trips_through_json_and_renders():
    p = plan(2, POD)
    assert Plan.from_json(p.to_json()) == p
    text = render_plan(p)
    assert "step 3: free-tpu on workers 0, 1" in text
    assert "worker-0$ env " in text
    agent = p.agent_plan(1)
    assert [s["command"] is None for s in agent["steps"]] == [True, False, False, True, True]


def test_job_commands_parse():
    p = plan(1)
    start = job_shell.start_command(p.paths[0], "/opt/py bin/python")
    assert "setsid -f sh -c" in start and "'/opt/py bin/python'" in start
    poll = job_shell.parse_poll("exited 3 train\nline 1\nline 2\npart")
    assert poll.state is job_shell.JobState.EXITED and poll.rc == 3 and poll.stage == "train"
    assert poll.lines == ("line 1", "line 2") and poll.partial == "part"
    assert job_shell.parse_poll("running - -\n").stage == ""


def test_providers_are_one_table_and_a_record_reopens_the_same_reach(tmp_path, monkeypatch):
    from launcher import providers
    from payload.config import CLUSTERS

    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path))
    # Every provider the launcher serves is one the config knows.
    assert set(providers.PROVIDERS) <= set(CLUSTERS)
    ssh_config = config(cluster={"provider": "ssh", "hosts": ["10.0.0.5", "10.0.0.6"],
                                 "user": "me", "known_hosts": "/keys/kh", "port": 2222})
    provider = providers.provider_for(ssh_config)
    fleet = provider.fleet()
    assert [w.host for w in fleet.workers] == ["10.0.0.5", "10.0.0.6"]
    assert fleet.hardware is CPU and not fleet.shares_launcher_machine
    again = providers.reopen(provider.reach(fleet), fleet.workers)
    assert again == provider
    local = providers.provider_for(ssh_config, local_override=True, num_workers=3)
    local_fleet = local.fleet()
    assert len(local_fleet.workers) == 3 and local_fleet.shares_launcher_machine
    assert providers.reopen(local.reach(local_fleet), local_fleet.workers).fleet().workers == (
        local_fleet.workers)
    with pytest.raises(UserError, match="--workers only applies with --local"):
        providers.provider_for(ssh_config, num_workers=2)
    # Coordination ports: consecutive from a base drawn per job (not a fixed 29477 + i), so two
    # jobs on the same hosts rarely meet.
    bases = set()
    for _ in range(20):
        ports = [w.coordination_port for w in providers.provider_for(ssh_config).fleet().workers]
        assert ports[1] == ports[0] + 1 and 20_000 <= ports[0] < 32_000 - 1
        bases.add(ports[0])
    assert len(bases) > 1
    with pytest.raises(UserError, match="provider 'nope'"):
        providers.reopen({"provider": "nope"}, ())
