"""The optional Weights & Biases sink (train.wandb): the chief logs the scalars TensorBoard gets
to one W&B run, which a resumed run continues; nothing else logs, nothing is installed or handed
over unless the config asks.

wandb is not in the test environment (and installs nothing here): these tests give the sink a
stand-in `wandb` module in sys.modules that records what the sink calls (init's arguments, each
log), as the real one's API takes them."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from payload.config import parse_config
from payload.core.errors import UserError
from payload.training.metrics import MetricsSink
from payload.training.strategy import Hardware
from tests.support.launch_plans import GCP, RAW, plan


class Recorded:
    """TensorBoard's writer and a W&B run alike: the scalars each was given, by step."""

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def scalars(self, step, values):  # payload.data.events.EventWriter
        self.logged.append((step, dict(values)))

    def log(self, values, step):  # wandb.Run.log
        self.logged.append((step, dict(values)))

    def flush(self):
        pass

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        run = Recorded()
        module.runs.append((kwargs, run))
        return run

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def config(tmp_path, wandb={"project": "pretrain", "entity": "lab"}):  # noqa: B006
    return parse_config({**RAW, "output_dir": str(tmp_path / "out"),
                         "train": {**RAW["train"], "wandb": wandb}})


BOARDS: list[Recorded] = []


@pytest.fixture(autouse=True)
def tensorboard(monkeypatch):
    """The sink's TensorBoard writer (payload.data.events) recorded, as W&B's run is."""
    BOARDS.clear()
    monkeypatch.setattr("payload.training.metrics.EventWriter", lambda folder: BOARDS[-1])


def sink(cfg, *, chief=True):
    board = Recorded()
    BOARDS.append(board)
    trainer = SimpleNamespace(replicas=1)
    strategy = SimpleNamespace(is_chief=chief, kind=SimpleNamespace(value="cpu"))
    return MetricsSink(cfg, trainer, strategy), board


def train_a_little(s):
    s.report({"step": 10, "loss": 2.5, "learning_rate": 1e-3, "tokens_per_s": 900.0}, kept=True)
    s.evaluation({"step": 10, "loss": 2.7})
    s.write(10)
    s.close()


def test_the_chief_logs_what_tensorboard_gets_to_one_run_a_resume_continues(tmp_path,
                                                                           fake_wandb):
    cfg = config(tmp_path)
    first, board = sink(cfg)
    first.open(resume=False, start=0)
    train_a_little(first)
    [(kwargs, run)] = fake_wandb.runs
    assert {k: kwargs[k] for k in ("project", "entity", "resume", "name")} == {
        "project": "pretrain", "entity": "lab", "resume": "allow", "name": "unit"}
    assert run.logged == board.logged and run.finished  # goodput's too, when it has any
    names = {name for _, values in run.logged for name in values}
    assert {"train/loss", "train/learning_rate", "train/tokens_per_s", "eval/loss"} <= names
    # A resumed run logs to the same W&B run; a fresh start over the same output_dir to another.
    resumed, _ = sink(cfg)
    resumed.open(resume=True, start=10)
    resumed.close()
    fresh, _ = sink(cfg)
    fresh.open(resume=False, start=0)
    fresh.close()
    ids = [kwargs["id"] for kwargs, _ in fake_wandb.runs]
    assert ids[0] == ids[1] != ids[2]


def test_only_the_chief_and_only_when_asked(tmp_path, fake_wandb):
    other, _ = sink(config(tmp_path), chief=False)
    other.open(resume=False, start=0)
    train_a_little(other)
    unasked, _ = sink(config(tmp_path, wandb=None))
    unasked.open(resume=False, start=0)
    train_a_little(unasked)
    assert fake_wandb.runs == []


def test_without_wandb_installed_the_chief_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    s, _ = sink(config(tmp_path))
    with pytest.raises(UserError, match=r"train\.wandb: wandb is not installed in the workers"):
        s.open(resume=False, start=0)


@pytest.mark.parametrize(("wandb", "words"), [
    ({"project": "my/project"}, "'my/project' is not a Weights & Biases name"),
    ({"project": "p", "team": "x"}, "train.wandb.team"),
    ({"entity": "lab"}, "train.wandb.project"),
])
def test_bad_wandb_settings_are_refused(tmp_path, wandb, words):
    with pytest.raises(UserError) as raised:
        config(tmp_path, wandb=wandb)
    assert words in str(raised.value)


def test_the_key_reaches_the_chiefs_training_alone_and_wandb_is_installed_only_when_asked(
        tmp_path):
    from launcher.ship import worker_requirements
    from payload.training import wandb_sink

    wandb = {"project": "pretrain"}
    on_cpu = parse_config({**RAW, "train": {**RAW["train"], "wandb": wandb}})
    on_tpu = parse_config({**RAW, "cluster": GCP, "train": {**RAW["train"], "wandb": wandb}})
    for p in (plan(2, cfg=on_cpu), plan(4, Hardware.tpu("v4-32", "unit"), cfg=on_tpu)):
        named = [(step.name, c.worker) for step in p.steps for c in step.commands
                 if wandb_sink.API_KEY_ENV in c.secrets]
        assert named == [("train", 0)]
    assert not any(c.secrets for step in plan(2).steps for c in step.commands)
    assert any(r.startswith("wandb==") for r in worker_requirements(extras=("wandb",)))
    assert not any(r.startswith("wandb") for r in worker_requirements(extras=("worker", "jax")))
