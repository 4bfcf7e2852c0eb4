"""The processes of a run leave together, the chief last: payload.training.leaving against a
coordination service of threads (the engines' own services are met in
tests/integration/test_train_exit.py and test_jax_multiprocess.py)."""

import threading
import time

import pytest

from payload.training import leaving


class Service:
    """One run's coordination service: a barrier and keys, shared by its processes."""

    def __init__(self, count: int):
        self.barrier = threading.Barrier(count)
        self.keys: dict[str, float] = {}
        self.changed = threading.Condition()
        self.ended: dict[int, float] = {}


class Process:
    def __init__(self, service: Service, index: int, count: int, *, post_after_s: float = 0.0,
                 fails: bool = False):
        self.service, self.index, self.count = service, index, count
        self.post_after_s, self.fails = post_after_s, fails

    def meet(self, name: str) -> None:
        self.service.barrier.wait(timeout=10)

    def post(self, key: str) -> None:
        time.sleep(self.post_after_s)  # a busy host: back from the barrier late
        if self.fails:
            raise RuntimeError("the service is gone")
        with self.service.changed:
            self.service.keys[key] = time.monotonic()
            self.service.changed.notify_all()

    def wait_for(self, key: str, timeout_s: float) -> bool:
        with self.service.changed:
            return self.service.changed.wait_for(lambda: key in self.service.keys, timeout_s)


class Left(Exception):
    pass


@pytest.fixture
def exits(monkeypatch):
    """os._exit records who left when, in place of ending the test."""
    monkeypatch.setattr(leaving, "CHIEF_LINGER_S", 0.05)

    def leave(processes, service):
        def run(process):
            try:
                leaving.leave_together(process, is_chief=process.index == 0)
            except Left:
                service.ended[process.index] = time.monotonic()

        threads = [threading.Thread(target=run, args=(p,)) for p in processes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    def _exit(code):
        assert code == 0
        raise Left

    monkeypatch.setattr(leaving.os, "_exit", _exit)
    return leave


def test_the_chief_leaves_after_every_other_process_said_it_leaves(exits):
    service = Service(3)
    # Process 2 comes back from the barrier 0.5 s late, as on a busy host: the chief waits.
    processes = [Process(service, 0, 3), Process(service, 1, 3),
                 Process(service, 2, 3, post_after_s=0.5)]
    exits(processes, service)
    assert set(service.ended) == {0, 1, 2}
    assert service.ended[0] > max(service.keys.values())
    assert service.ended[0] >= service.ended[2]


def test_a_process_that_never_says_it_left_keeps_the_chief_only_so_long(exits, monkeypatch,
                                                                         caplog):
    monkeypatch.setattr(leaving, "LEFT_WAIT_S", 0.3)
    service = Service(2)
    exits([Process(service, 0, 2), Process(service, 1, 2, fails=True)], service)
    assert set(service.ended) == {0, 1}  # both left, the worker too though its post failed
    said = caplog.text
    assert "process(es) 1 did not say they left within 0.3 s" in said
    assert "could not tell the chief this process leaves (the service is gone)" in said


def test_a_process_that_trains_alone_returns():
    assert leaving.leave_together(None, is_chief=True) is None
