"""The run plan: FLOPs, time and cost against a hand calculation; the batch refusal and the
mis-sizing warnings, through `tpuctl train --dry-run` as a user runs it."""

from __future__ import annotations

import pytest
import yaml

from payload.config import parse_config
from payload.core.errors import UserError
from payload.training import runplan
from payload.training.strategy import CPU, Hardware
from tests.support.configs import plan_config
from tests.support.paths import REPO
from tests.support.runners import tpuctl


def test_flops_time_and_cost_match_a_hand_calculation():
    config = parse_config(plan_config())
    plan = runplan.run_plan(config, hardware=Hardware.tpu("v5litepod-16", "plan"),
                            num_workers=4)
    # GPT-2, hidden 512, 4 layers, feed-forward 2048, vocabulary 32,000, rows of 512, batch 64.
    # One layer: 2 LayerNorms (2 x 2 x 512) + qkv (3 x 512 x 512 + 3 x 512) + attention output
    # (512 x 512 + 512) + feed-forward (512 x 2048 + 2048) + (2048 x 512 + 512) = 3,152,384;
    # four layers and the final LayerNorm (1,024): N = 12,610,560 without the embeddings.
    assert plan.non_embedding_parameters == 12_610_560
    dense = 6 * 12_610_560 * 512  # 6 x N per token: 38,739,640,320
    attention = 12 * 4 * 512 * 512 * 512  # 12 x layers x seq_len x hidden per token
    vocabulary = 6 * 32_000 * 512 * 512  # 6 x vocab x hidden at every position
    assert (dense, attention, vocabulary) == (38_739_640_320, 6_442_450_944, 50_331_648_000)
    per_row = 95_513_739_264
    assert dense + attention + vocabulary == per_row
    assert plan.flops_per_step == 64 * per_row == 6_112_879_312_896
    assert plan.total_flops == pytest.approx(6.112879312896e18)
    assert plan.tokens_per_step == 64 * 512 and plan.total_tokens == 32_768_000_000
    # v5litepod-16: 16 chips of TPU v5e at 197 TFLOP/s bf16, at the assumed 40%:
    # 6.1129e18 / (16 x 197e12 x 0.4 = 1.2608e15 FLOP/s) = 4,848.4 s = 80.8 min: 1h21m.
    assert (plan.chips, plan.peak_flops_per_chip, plan.utilisation) == (16, 197e12, 0.40)
    assert plan.wall_time_s == pytest.approx(4848.41, abs=0.01)
    # Spot v5e in us-central1: $0.213 per chip-hour x 16 chips = $3.408/h; x 1.3468 h.
    assert plan.usd_per_hour == pytest.approx(3.408)
    assert plan.cost_usd == pytest.approx(4.5898, abs=1e-4)
    # One replica per device (16: one per chip on v5e), 4 rows each.
    assert plan.replicas == 16
    text = "\n".join(runplan.render(plan))
    for needle in ("6.11e12 per step", "6.11e18 in total", "6 x N per token",
                   "attention 12 x layers x seq_len x hidden", "16 chips of TPU v5e",
                   "197 TFLOP/s bf16 per chip", "assumed 40% utilisation", "1h21m",
                   "$4.59 for that time (spot, $3.41/h for v5litepod-16 in us-central1",
                   "64 = 4 per replica",
                   # 50.3e9 / 95.5e9, 38.7e9 / 95.5e9, 6.4e9 / 95.5e9 of a row's FLOPs
                   "FLOPs by term: vocabulary projection 53%, layers' matrices 41%, attention 7%; "
                   "most goes to the vocabulary projection"):
        assert needle in text, text


def test_masked_lm_scores_only_the_masked_positions():
    config = parse_config(plan_config(model={"family": "roberta", "size": "base"},
                               data={"seq_len": 512}, tokenizer={"vocab_size": 50265}))
    flops = runplan.row_flops(config)
    # ceil(512 x 0.15) = 77 predicted positions; the projection is 6 x 50,265 x 768 at each.
    assert flops.vocabulary == 6 * 50265 * 768 * 77
    assert flops.attention == 12 * 12 * 512 * 768 * 512
    assert "77 masked positions" in flops.formula


def test_t5_counts_every_matrix_of_both_stacks_once():
    config = parse_config(plan_config(model={"family": "t5", "size": "base"},
                               tokenizer={"vocab_size": 32128}, data={"seq_len": 512}))
    from payload.core.sizes import count_parameters
    from payload.training.runplan import run_architecture

    arch = run_architecture(config)
    flops = runplan.step_flops(arch, seq_len=100, target_len=100)
    # Inputs as long as targets: the dense term is 6 x (every non-embedding matrix) per token;
    # only LayerNorm scales and the relative position buckets are left out (no products).
    d, layers, heads = 768, 12, 12
    norms = layers * 2 * d + d + layers * 3 * d + d
    relative = 2 * 32 * heads
    matrices = count_parameters(arch).non_embedding - norms - relative
    assert flops.dense == 6 * matrices * 100
    assert "encoder and decoder apart" in flops.formula


def test_cpu_workers_get_a_time_from_the_speed_they_are_given():
    config = parse_config(plan_config(cluster={"provider": "local", "workers": 2},
                               train={"steps": 1000}))
    plan = runplan.run_plan(config, hardware=CPU, num_workers=2)
    assert plan.accelerator is None and plan.wall_time_s is None and plan.cost_usd is None
    assert plan.replicas == 2 and plan.flops_per_step == 6_112_879_312_896
    text = "\n".join(runplan.render(plan))
    assert "time: not estimated (no measured CPU speed)" in text and "6.11e12 per step" in text
    # 1,000 steps x 6.1129e12 FLOPs, and 3 evaluations (the baseline, steps 500 and 1,000) of
    # 20 batches at a third of a step each: 6.2351e15 FLOPs at 50 GFLOP/s is 124,702.7 s
    # (34h38m), after a start-up of 30 s (1 min at the minute grain of the whole): 34h39m.
    assert plan.evaluations == 3
    speed = runplan.CpuSpeed(model_flops_per_s=50e9, source="as measured", start_s=30.0,
                             stages=(("prepare", 90.0, "as measured"),
                                     ("export", None, "not calibrated")))
    timed = runplan.run_plan(config, hardware=CPU, num_workers=2, cpu_speed=speed)
    assert timed.wall_time_s == pytest.approx(124_732.74, abs=0.01) and timed.cost_usd is None
    lines = runplan.render(timed)
    at = next(i for i, line in enumerate(lines) if line.startswith("  time:"))
    assert lines[at:at + 4] == [
        "  time: about 34h41m on CPU for the stages that run but export",
        "    train: 34h39m: 1 min to start (imports, compiling, the first evaluation), then "
        "1,000 steps and 3 evaluations in 34h38m (as measured)",
        "    prepare: 2 min (as measured)",
        "    export: not estimated (not calibrated)"]
    why = runplan.run_plan(config, hardware=CPU, num_workers=2, cpu_speed="not measured: why")
    assert "time: not estimated (not measured: why)" in "\n".join(runplan.render(why))


def _said_s(text: str) -> int:
    """Seconds of a duration as the plan says it ("2 min 18s", "21s", "1h05m")."""
    import re

    if text.startswith("under 1 "):
        return 0
    hours = re.fullmatch(r"([\d,]+) h \([\d.]+ days\)", text)
    if hours:
        return int(hours.group(1).replace(",", "")) * 3600
    found = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+) min)?(?: ?(\d+)s)?", text)
    assert found and any(found.groups()), text
    hours, h_minutes, minutes, seconds = (int(g or 0) for g in found.groups())
    return hours * 3600 + (h_minutes + minutes) * 60 + seconds


def test_the_parts_of_a_time_line_add_up():
    """Issue 38: "2 min: 21s to start, then 300 steps ... in 2 min" did not add up."""
    import re

    config = parse_config(plan_config(cluster={"provider": "local", "workers": 2},
                                      train={"steps": 300}))
    compute = runplan.run_plan(config, hardware=CPU, num_workers=2)
    flops = compute.total_flops + compute.eval_flops
    for start, compute_s, prepare in ((21.2, 117.2, 9.4), (21.2, 100.0, 0.6), (30.0, 3555.0, 95.0),
                                      (40.0, 50_000.0, 29.0), (50.0, 200_000.0, 1000.0)):
        speed = runplan.CpuSpeed(model_flops_per_s=flops / compute_s, source="as measured",
                                 start_s=start, stages=(("prepare", prepare, "as measured"),))
        lines = runplan.render(runplan.run_plan(config, hardware=CPU, num_workers=2,
                                                cpu_speed=speed))
        at = next(i for i, line in enumerate(lines) if line.startswith("  time:"))
        total = re.search(r"about (.+) on CPU", lines[at]).group(1)
        train, begin, steps = re.search(r"train: (.+?\)?): (.+?) to start .* in (.+) "
                                        r"\(as measured\)", lines[at + 1]).groups()
        prepared = re.search(r"prepare: (.+) \(as measured\)", lines[at + 2]).group(1)
        assert _said_s(train) == _said_s(begin) + _said_s(steps), lines[at + 1]
        assert _said_s(total) == _said_s(train) + _said_s(prepared), lines[at:at + 3]
    assert lines[at + 1].startswith("    train: 56 h (2.3 days): under 1 h to start"), lines


def test_a_resumed_run_is_timed_for_the_steps_left():
    config = parse_config(plan_config(cluster={"provider": "local", "workers": 2},
                                      train={"steps": 400, "eval_every": 100}))
    speed = runplan.CpuSpeed(model_flops_per_s=1e12, source="as measured", start_s=20.0)
    fresh = runplan.run_plan(config, hardware=CPU, num_workers=2, cpu_speed=speed)
    resumed = runplan.run_plan(config, hardware=CPU, num_workers=2, cpu_speed=speed,
                               start_step=120)
    assert (fresh.evaluations, resumed.evaluations) == (5, 3)  # 0, 100 ... 400; 200, 300, 400
    per_eval = config.train.eval_batches * fresh.flops_per_step * runplan.EVAL_SHARE_OF_STEP
    assert resumed.wall_time_s - 20.0 == pytest.approx(
        (280 * fresh.flops_per_step + 3 * per_eval) / 1e12)
    text = "\n".join(runplan.render(resumed))
    assert "in 400 steps; resumed at step 120: 280 steps left" in text
    assert "then 280 steps left and 3 evaluations in" in text
    assert resumed.total_tokens == fresh.total_tokens  # the model still sees the whole run's
    # On a TPU the time and the cost are the steps left's too.
    tpu = dict(hardware=Hardware.tpu("v4-8", "x"), num_workers=1)
    tpu_config = parse_config(plan_config(train={"steps": 400}))
    whole, rest = (runplan.run_plan(tpu_config, **tpu, start_step=s) for s in (0, 120))
    assert rest.wall_time_s == pytest.approx(whole.wall_time_s * 280 / 400)
    assert rest.cost_usd == pytest.approx(whole.cost_usd * 280 / 400)


def test_the_launchers_estimate_of_a_resume_counts_the_steps_left(tmp_path):
    from types import SimpleNamespace

    from launcher import estimate
    from payload.core import ownership
    from payload.core.stages import Stage

    out = tmp_path / "out"
    ownership.claim_output_dir(str(out))
    checkpoints = out / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "checkpoint").write_text('model_checkpoint_path: "ckpt-120"\n')
    (checkpoints / ".tpuctl-complete").write_text("{}\n")
    config = parse_config(plan_config(cluster={"provider": "local", "workers": 2},
                                      output_dir=str(out), train={"steps": 400}))
    fleet = SimpleNamespace(hardware=CPU, workers=(0, 1), shares_launcher_machine=True)

    def plan_text(**options):
        launch = SimpleNamespace(config=config, fleet=fleet, options=SimpleNamespace(
            **{"stages": (Stage.TRAIN,), "resume": False, "overwrite": False, "engine": None,
               **options}))
        return "\n".join(estimate.describe(launch, read_remote=False)[0])

    assert "resumed at step 120: 280 steps left" in plan_text(resume=True)
    assert "then 280 steps left and" in plan_text(resume=True)
    assert "steps left" not in plan_text() and "then 400 steps and" in plan_text()
    # A stage whose output is there counts nothing, unless --overwrite does it again.
    (out / "tokenizer").mkdir()
    (out / "tokenizer" / "tokenizer.json").write_text("{}")
    both = (Stage.TOKENIZER, Stage.TRAIN)
    assert "tokenizer: 0s (trained already)" in plan_text(stages=both)
    assert "trained already" not in plan_text(stages=both, overwrite=True)


def test_the_plan_says_which_family_and_length_cost_most():
    def shares(**over):
        plan = runplan.run_plan(parse_config(plan_config(**over)), hardware=CPU, num_workers=1)
        return dict(plan.flops_shares), runplan.render(plan)

    # The same width, depth and rows: GPT-2 projects onto the vocabulary at every position, a
    # masked LM at the 15% masked, so its projection is the larger share by far.
    gpt2, text = shares(data={"seq_len": 128})
    bert, _ = shares(data={"seq_len": 128},
                     model={"family": "bert", "hidden_size": 512, "num_layers": 4,
                            "num_heads": 8, "intermediate_size": 2048})
    assert gpt2["vocabulary projection"] > 0.5 > 0.2 > bert["vocabulary projection"]
    assert "GPT-2 predicts every position" in "\n".join(text)
    # Attention grows with the row length squared: a narrow model over 1,024 tokens spends most
    # on it.
    long, text = shares(data={"seq_len": 1024}, tokenizer={"vocab_size": 1000},
                        model={"family": "gpt2", "hidden_size": 64, "num_layers": 2,
                               "num_heads": 2, "intermediate_size": 256})
    assert max(long, key=long.get) == "attention"
    assert "grows with data.seq_len squared" in "\n".join(text)


def test_replicas_are_chips_on_every_generation():
    for name, chips in (("v4-8", 4), ("v4-32", 16), ("v5p-8", 4), ("v5litepod-16", 16),
                        ("v5litepod-8", 8)):
        assert runplan.replicas_of(Hardware.tpu(name, "x"), 1)[0] == chips, name
    assert runplan.replicas_of(CPU, 3)[0] == 3 and runplan.replicas_of(CPU, 1)[0] == 1


def test_batch_the_replicas_cannot_split_is_refused():
    config = parse_config(plan_config(train={"batch_size": 40}))
    plan = runplan.run_plan(config, hardware=Hardware.tpu("v5litepod-16", "x"), num_workers=4)
    with pytest.raises(UserError, match=r"batch_size=40 does not split over the 16 replicas"
                       r".*32 or 48"):
        runplan.check_batch(plan)


def test_warnings_for_an_obviously_mis_sized_run():
    config = parse_config(plan_config(train={"steps": 10}, model={"family": "roberta", "size": "base"}))
    plan = runplan.run_plan(config, hardware=Hardware.tpu("v5litepod-16", "x"), num_workers=4)
    lines = runplan.warnings(plan, dataset_rows=100)
    assert len(lines) == 2
    # 20 x 110,651,648 parameters / 32,768 tokens per step = 67,537 steps (rounded up).
    assert lines[0] == (
        "327.7K training tokens for 110.7M parameters leave the model far from trained: about "
        "2.2B (20 per parameter) would be enough, 67,537 steps at this batch; raise "
        "train.steps or train.batch_size, or pick a smaller model")
    assert "the dataset has 100 training rows but 10 steps x 64 read 640: 6.4 epochs" in lines[1]
    big = runplan.run_plan(parse_config(plan_config()), hardware=CPU, num_workers=1)
    assert runplan.warnings(big, dataset_rows=10**9) == []


def _dry_run(tmp_path, raw):
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return tpuctl("train", "-c", path, "--dry-run", cwd=tmp_path,
                  env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                       "TPUCTL_HOME": str(tmp_path / "home"),
                       "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")})


def test_dry_run_prints_the_plan_and_refuses_a_bad_batch(tmp_path):
    ok = _dry_run(tmp_path, plan_config())
    assert ok.returncode == 0, ok.stderr
    assert "run plan: gpt2, 29.5M parameters" in ok.stdout
    assert "$4.59 for that time" in ok.stdout
    assert "warning" not in ok.stderr
    bad = _dry_run(tmp_path, plan_config(train={"batch_size": 24}))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and "batch_size=24 does not split over the 16 replicas" in (
        errors[0]), bad.stderr
    assert not (tmp_path / "home").exists()


def _manifest(out, *, records: int) -> None:
    """The shard manifest an earlier prepare leaves in `out` (gpt2, seq_len 128)."""
    from payload.data import shards

    (out / "data").mkdir(parents=True)
    manifest = shards.Manifest(
        format=shards.FORMAT, seq_len=128, record_len=128, dtype="uint16", family="gpt2",
        vocab_size=1000, tokenizer_fingerprint="x", data_fingerprint="y", num_workers=1,
        documents=10, invalid_utf8_lines=0,
        splits={"train": shards.SplitSummary(records=records),
                "validation": shards.SplitSummary()})
    (out / "data" / "manifest.json").write_text(manifest.to_json())


def test_dry_run_on_cpu_workers_warns_from_the_manifest(tmp_path):
    from payload.core import ownership
    from payload.data import shards as records

    out = tmp_path / "out"
    ownership.claim_output_dir(str(out))  # an output_dir an earlier prepare made
    (out / "data").mkdir(parents=True)
    manifest = records.Manifest(
        format=records.FORMAT, seq_len=128, record_len=128, dtype="uint16", family="gpt2",
        vocab_size=1000, tokenizer_fingerprint="x", data_fingerprint="y", num_workers=1,
        documents=10, invalid_utf8_lines=0,
        splits={"train": records.SplitSummary(records=50), "validation": records.SplitSummary()})
    (out / "data" / "manifest.json").write_text(manifest.to_json())
    raw = plan_config(cluster={"provider": "local", "workers": 3}, output_dir=str(out),
               data={"corpus": str(tmp_path / "c.txt"), "seq_len": 128},
               train={"steps": 4, "batch_size": 30})
    # A document for each of the 3 workers: fewer is refused (the preflight reads the shares).
    (tmp_path / "c.txt").write_text("".join(f"some text {i}\n" for i in range(12)))
    result = _dry_run(tmp_path, raw)
    assert result.returncode == 0, result.stderr
    # No run has measured this machine yet: the calibrated figures, said as such.
    assert "time: about " in result.stdout
    assert "gpt2 training on the tensorflow engine reached when calibrated" in result.stdout
    assert "replicas: 3 (one per CPU worker process: 3 processes)" in result.stdout
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 2, result.stderr
    assert "the dataset has 50 training rows but 4 steps x 30 read 120" in warned[1]
    refused = _dry_run(tmp_path, {**raw, "train": {**raw["train"], "batch_size": 32}})
    assert refused.returncode == 2
    assert "over the 3 replicas (one per CPU worker process" in refused.stderr


def test_dry_run_on_cpu_workers_times_the_run_by_the_last_measured_speed(tmp_path):
    import json

    from payload.core import ownership

    out = tmp_path / "out"
    ownership.claim_output_dir(str(out))
    raw = plan_config(cluster={"provider": "local", "workers": 2}, output_dir=str(out),
               data={"corpus": str(tmp_path / "c.txt"), "seq_len": 128},
               train={"steps": 100, "batch_size": 32})
    (tmp_path / "c.txt").write_text("some text\n" * 12)  # a document for each worker
    # What the train stage writes on CPU: its meter's header and the final speed.
    metrics = {"family": "gpt2", "replicas": 2, "utilisation": {"device": "process"},
               "train": [], "final": {"step": 10, "model_flops_per_s": 2.0e10}}
    (out / "metrics.json").write_text(json.dumps(metrics))
    flops = runplan.run_plan(parse_config(raw), hardware=CPU, num_workers=2).total_flops
    assert flops / 2.0e10 == pytest.approx(3627.28, abs=0.01)  # 100 steps x 7.25e11: 1h00m
    result = _dry_run(tmp_path, raw)
    assert result.returncode == 0, result.stderr
    # With 2 evaluations (the baseline and the last step) of 20 batches at a third of a step:
    # 3,627.3 s + 483.6 s, 68.5 minutes: 1h09m.
    assert (f"then 100 steps and 2 evaluations in 1h09m (at the 20.0 GFLOP/s of model FLOPs "
            f"the last gpt2 run in {out} measured on 2 CPU process(es))") in result.stdout
    # A figure measured for another family or engine says nothing about this one.
    for other in ({"family": "bert"}, {"engine": "jax"}):
        (out / "metrics.json").write_text(json.dumps({**metrics, **other}))
        assert "reached when calibrated" in _dry_run(tmp_path, raw).stdout


def test_the_demo_is_sized_to_warn_of_nothing(tmp_path):
    # `make demo` is the first thing a user runs: a warning there would be noise. Its tokens
    # are over 2x its parameters; that its steps read at most one epoch of the bundled corpus
    # (the other warning) needs the manifest: tests/test_demo.py runs the demo.
    raw = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    raw["output_dir"] = str(tmp_path / "out")
    raw["data"]["corpus"] = str(REPO / "payload" / "data" / "corpus.txt.gz")
    result = _dry_run(tmp_path, raw)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    assert "time: about " in result.stdout


def test_the_jax_engine_says_how_it_lays_the_state_over_the_chips():
    """Issue 19: the run plan says data parallel or FSDP over N chips, from the accelerator
    table's memory per chip and the parameter count; the TF engine replicates and says nothing."""
    xl = plan_config(model={"family": "gpt2", "size": "xl"}, train={"engine": "jax"})
    hardware = Hardware.tpu("v5litepod-16", "plan")
    plan = runplan.run_plan(parse_config(xl), hardware=hardware, num_workers=4)
    # 1.5B parameters x 16 bytes of AdamW state = 22 GiB: a 16 GiB v5e chip gives it 9.6 GiB,
    # so the smallest group of the 16 chips that splits it small enough is 4.
    assert plan.sharding.startswith("FSDP over 4 devices (4 replica groups of 4 devices")
    assert "sharding: FSDP over 4 devices" in "\n".join(runplan.render(plan))
    small = runplan.run_plan(parse_config(plan_config(train={"engine": "jax"})), hardware=hardware,
                             num_workers=4)
    assert small.sharding.startswith("data parallel (every device holds the whole state")
    tf = runplan.run_plan(parse_config(plan_config(model={"family": "gpt2", "size": "xl"})),
                          hardware=hardware, num_workers=4)
    assert tf.sharding == "" and "sharding:" not in "\n".join(runplan.render(tf))
    on_cpu = runplan.run_plan(parse_config(xl), hardware=CPU, num_workers=1)
    assert on_cpu.sharding == ""


def test_dry_run_refuses_a_model_file_the_chips_cannot_hold(tmp_path):
    """A model described by a config.json is only known once the file is read: the dry run's
    plan refuses it, one line with what it needs and has, nothing made."""
    import json

    (tmp_path / "xl.json").write_text(json.dumps({
        "model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "n_positions": 1024,
        "vocab_size": 50257}))
    raw = plan_config(model={"family": "gpt2", "config": str(tmp_path / "xl.json")},
               train={"engine": "jax"})
    raw["cluster"]["accelerator_type"] = "v5litepod-1"
    bad = _dry_run(tmp_path, raw)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, bad.stderr
    assert "GiB of training state" in errors[0] and "the one device of v5litepod-1" in errors[0]
    assert not (tmp_path / "home").exists()
