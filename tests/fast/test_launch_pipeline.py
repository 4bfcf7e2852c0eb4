"""The real payload stages through the launcher: SSH workers and local workers, same outputs."""





def test_the_use_case_decides_teardown_and_download(tmp_path):
    """launch.finish, not the CLI, deletes the TPU (--down) and copies model/ (--download):
    both after a finished job; a failed job is torn down but nothing is copied; a detached job
    is left alone (its worker 0 deletes the TPU itself)."""
    from types import SimpleNamespace

    from launcher import launch
    from launcher.job_control import Outcome
    from payload.core import folders, layout

    model = tmp_path / "out" / layout.MODEL_DIR
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    folders.mark_complete(str(model), {"stage": "export"})
    calls: list[str] = []
    provider = SimpleNamespace(down=lambda on_event: calls.append("down"))
    executor = SimpleNamespace(close=lambda: calls.append("close"))
    job = launch.Job(record=None, plan=SimpleNamespace(output_dir=str(tmp_path / "out")),
                     provider=provider, executor=executor)

    def finish(outcome: Outcome, target) -> list[str]:
        calls.clear()
        options = launch.TrainOptions(down=True, download=target)
        launch.finish(SimpleNamespace(options=options), job, outcome, on_note=calls.append)
        return calls

    assert finish(Outcome(ok=True, detached=True), tmp_path / "a") == ["close"]
    assert not (tmp_path / "a").exists()
    assert finish(Outcome(ok=False, reason="worker-0 failed"), tmp_path / "b") == ["close", "down"]
    assert not (tmp_path / "b").exists()
    done = finish(Outcome(ok=True), tmp_path / "c")
    assert done[:2] == ["close", "down"] and "copied" in done[2]
    assert (tmp_path / "c" / "config.json").read_text() == "{}"
