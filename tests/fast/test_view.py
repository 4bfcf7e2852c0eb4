"""What the launcher shows of a job (launcher.view) and the progress records it reads
(payload.training.progress): lines kept and hidden, one voice for training, the summary at the end."""

import pytest

from launcher import view
from launcher.view import NOISE, LineFilter, View, shown_lines, step_and_last, summary
from payload.training import progress

# Lines the live view leaves out (each also stays in the worker's full log).
HIDDEN = [
    *(rule.example for rule in NOISE),
    # transformers' notice through the stage's logging (CI=true), which names the library.
    "16:29:25 w0 train [transformers] TensorFlow and JAX classes are deprecated and will be "
    "removed in Transformers v5. We recommend migrating to PyTorch classes or pinning your "
    "version of Transformers.",
    "I0000 00:00:1795364972.509912   11099 grpc_server_lib.cc:466] Started server with target: "
    "grpc://localhost:46103",
    "I1122 16:30:01.123456   11099 collective_param_resolver_distributed.cc:36] anything at all",
    "2026-11-22 16:13:28.952313: E tensorflow/core/common_runtime/base_collective_executor.cc:248]"
    " BaseCollectiveExecutor::StartAbort UNAVAILABLE: Failed to send RPC to coordination service."
    " Either the leader task was preempted/died/restarted unexpectedly or this task is "
    "experiencing network issues.",
]

# Lines it always shows: tpuctl's own, errors, tracebacks, warnings it has no rule for.
KEPT = [
    "== tpuctl: train on worker-1 ==",
    "== tpuctl: train failed on worker-1 (exit 1) ==",
    "== tpuctl: stopping, train failed on worker-0 ==",
    "tpuctl: the run lock of /x is not this job's any more (another run took it over)",
    "error: train.batch_size=6 is not divisible by the 4 replicas; use a multiple of 4",
    "16:29:25 w0 prepare train shard 0: 2000 records -> train/train-w00000of00002-00000.tfrecord",
    "16:30:09 w1 train finished at step 200; weights sha256 e7748d264e576835",
    "Traceback (most recent call last):",
    '  File "/work/payload/training/train.py", line 356, in _loop',
    "tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:",
    "RuntimeError: the stub's train broke on worker 1",
    "MemoryError",
    "KeyboardInterrupt",
    "Killed",
    # An error of TensorFlow's C++ side that no rule describes stays, in both formats.
    "2026-11-22 16:13:28.952313: E tensorflow/core/framework/op_kernel.cc:1818] OP_REQUIRES "
    "failed at example_parsing_ops.cc:98 : INVALID_ARGUMENT: Key: ids.  Data types don't match.",
    "E0000 00:00:1795364972.509912   11099 some_kernel.cc:12] Resource exhausted: OOM when "
    "allocating tensor with shape[4096,50257]",
    "W0000 00:00:1795364972.509912   11099 some_file.cc:12] a warning nobody has judged yet",
    # A StartAbort that does not say a peer has gone is not the teardown noise.
    "2026-11-22 16:13:28.952313: E tensorflow/core/common_runtime/base_collective_executor.cc:248]"
    " BaseCollectiveExecutor::StartAbort INTERNAL: something else went wrong",
    # Lines that only continue noise, seen on their own.
    "/job:worker/replica:0/task:1",
    ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect"}',
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events.",
    "Some weights of the model checkpoint were not used when initializing TFRobertaForMaskedLM",
]


@pytest.mark.parametrize("line", HIDDEN)
def test_noise_is_hidden(line):
    assert not LineFilter().keeps(0, line)


@pytest.mark.parametrize("line", KEPT)
def test_real_lines_are_kept(line):
    assert LineFilter().keeps(0, line)


def test_every_rule_hides_its_example_and_nothing_of_another_kind():
    for rule in NOISE:
        assert rule.starts(rule.example), rule.what
    for line in KEPT:
        assert not any(rule.starts(line) for rule in NOISE), line


# What a worker printed when its chief was killed mid-training (seen on this machine): the
# StartAbort message is noise, the traceback repeats it and must be shown whole.
PEER_KILLED = """\
2026-11-22 16:13:28.952313: E tensorflow/core/common_runtime/base_collective_executor.cc:248] \
BaseCollectiveExecutor::StartAbort UNAVAILABLE: Failed to send RPC to coordination service. \
Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing \
network issues.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.CoordinationService/Heartbeat:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all \
addresses"}
Traceback (most recent call last):
  File "/work/payload/training/train.py", line 356, in _loop
    loss_sum, first_bad = train_chunk(iterator, tf.constant(stop - step))
tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:

Collective ops is aborted by: Failed to send RPC to coordination service. Either the leader \
task was preempted/died/restarted unexpectedly or this task is experiencing network issues.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.CoordinationService/Heartbeat:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all \
addresses"}
The error could be from a previous operation. Restart your program to reset.
== tpuctl: train failed on worker-1 (exit 1) ==
TensorFlow and JAX classes are deprecated and will be removed in Transformers v5. We recommend \
migrating to PyTorch classes or pinning your version of Transformers."""


def test_a_traceback_is_shown_whole_and_the_noise_around_it_is_not():
    lines = PEER_KILLED.splitlines()
    shown = shown_lines(lines)
    start = lines.index("Traceback (most recent call last):")
    end = lines.index("== tpuctl: train failed on worker-1 (exit 1) ==")
    assert shown == lines[start:end + 1]


# What a healthy chief printed when a worker left before it (seen here, before the train stage
# ended its workers together): one message of three lines.
HEALTHY_TEARDOWN = [
    "2026-11-22 16:15:03.551113: E tensorflow/core/common_runtime/base_collective_executor.cc:248]"
    " BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: "
    "The following tasks are unhealthy (stopped sending heartbeats):",
    "/job:worker/replica:0/task:1",
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. "
    "preemption, eviction) to debug further. [type.googleapis.com/tensorflow.Coordination"
    "ServiceError='']",
    "16:20:13 w0 train finished at step 300; weights sha256 8abd14042ba92f4b",
]


def test_a_noise_message_is_hidden_with_its_continuation_lines_only():
    assert shown_lines(HEALTHY_TEARDOWN) == HEALTHY_TEARDOWN[-1:]


def test_workers_are_filtered_apart():
    lines = LineFilter()
    assert not lines.keeps(0, HEALTHY_TEARDOWN[0])
    assert lines.keeps(1, "/job:worker/replica:0/task:1")  # worker 1 started no message
    assert not lines.keeps(0, "/job:worker/replica:0/task:1")


def _record(kind, **fields):
    return progress.line(kind, fields)


def _train(step, elapsed, steps=100):
    return _record("train", step=step, steps=steps, loss=5.0, learning_rate=1e-3,
                   tokens_per_s=2000.0, elapsed_s=elapsed, eta_s=(steps - step) / 10)


def test_progress_records_round_trip_and_read_as_one_line():
    fields = {"step": 50, "steps": 200, "loss": 7.6451, "learning_rate": 8.39e-4,
              "tokens_per_s": 5277.2, "elapsed_s": 12.5, "eta_s": 9.2}
    record = progress.parse(progress.line("train", fields))
    assert record == {"kind": "train", **fields}
    assert progress.describe(record) == ("step 50/200  loss 7.6451  lr 0.000839  5,277 tokens/s"
                                         "  ETA 0m09s")
    first = {**fields, "step": 1, "tokens_per_s": None, "eta_s": None, "first_step_s": 8.4}
    assert progress.describe({"kind": "train", **first}) == (
        "step 1/200  loss 7.6451  lr 0.000839  first step 8.4s (compiling included)")
    assert progress.describe({"kind": "eval", "step": 50, "loss": 2.0, "perplexity": 7.389,
                              "accuracy": 0.5}) == (
        "eval at step 50: loss 2.0000  perplexity 7.3890  accuracy 0.5000")
    for line in ("step 3 loss 0.3", "tpuctl-progress {not json", 'tpuctl-progress {"kind": "x"}',
                 "tpuctl-progress [1, 2]"):
        assert progress.parse(line) is None
    with pytest.raises(ValueError):
        progress.line("nonsense", {})


def test_a_mixtures_progress_line_says_the_examples_of_each_source():
    fields = {"step": 50, "steps": 200, "loss": 7.6451, "learning_rate": 8.39e-4,
              "tokens_per_s": None, "eta_s": None, "examples_per_source": {
                  "/data/web/*.txt + /data/books.txt": 3200, "gs://b/code/": 800}}
    assert progress.describe({"kind": "train", **fields}) == (
        "step 50/200  loss 7.6451  lr 0.000839  ETA ?  examples *.txt + books.txt 3,200 / "
        "code 800")
    assert view.live_text({"kind": "train", **fields}).endswith("code 800")


def test_live_view_shows_evaluations_and_keeps_progress_for_the_line():
    live = View(live=True)
    assert live.feed(0, _record("start", step=0, steps=100)) == []
    assert live.feed(0, _train(1, 3.0)) == []
    assert live.progress["step"] == 1
    assert live.feed(0, _record("eval", step=0, loss=8.0, accuracy=0.0)) == [
        "eval at step 0: loss 8.0000  accuracy 0.0000"]
    assert not live.training_over
    assert live.feed(0, _record("final", family="gpt2", step=100, stopped=None)) == []
    assert live.training_over


def test_without_a_terminal_progress_comes_at_a_steady_pace():
    plain = View(live=False, plain_every_s=10.0)
    shown = [plain.feed(0, _record("start", step=0, steps=100))]
    for step in range(1, 101):  # one record every 0.3 s of training
        shown.append(plain.feed(0, _train(step, elapsed=step * 0.3)))
    lines = [text for batch in shown for text in batch]
    assert lines[0].startswith("training from step 0 of 100")
    steps = [int(text.split()[1].split("/")[0]) for text in lines[1:]]
    assert steps == [1, 35, 69, 100]  # the first, then every 10 s of training, then the last
    # A resumed run starts its clock again: its first record shows at once.
    assert plain.feed(0, _train(101, elapsed=0.5, steps=200))


def test_status_reads_the_newest_progress_record_and_the_last_line_shown():
    records = [progress.parse(_record("start", step=0, steps=100)),
               progress.parse(_train(40, 2.0)),
               progress.parse(_record("eval", step=40, loss=2.0, accuracy=0.5))]
    step, last = step_and_last(records, [_train(40, 2.0), HEALTHY_TEARDOWN[0],
                                         _record("eval", step=40, loss=2.0, accuracy=0.5),
                                         view.NOISE[0].example])
    assert step == "40/100"
    assert last == "eval at step 40: loss 2.0000  accuracy 0.5000"
    assert step_and_last([], ["== tpuctl: prepare on worker-1 =="]) == (
        "", "== tpuctl: prepare on worker-1 ==")


@pytest.mark.parametrize(("family", "auto"), [
    ("bert", "MaskedLM"), ("roberta", "MaskedLM"), ("gpt2", "CausalLM"), ("t5", "Seq2SeqLM")])
def test_the_summary_says_how_it_went_and_how_to_load_the_model(family, auto, tmp_path):
    final = {"kind": "final", "family": family, "step": 200, "stopped": None,
             "eval": {"step": 200, "loss": 2.0, "perplexity": 7.389, "accuracy": 0.5}}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tf_model.h5").write_bytes(b"")
    lines = summary(final=final, family=family, output_dir=str(tmp_path), exported=True)
    model = f"{tmp_path}/model"
    assert lines[0] == "final evaluation at step 200: loss 2.0000  perplexity 7.3890  accuracy 0.5000"
    assert lines[1] == f"model: {model}"
    assert lines[2] == (f"  PyTorch:    from transformers import AutoModelFor{auto}; "
                        f'model = AutoModelFor{auto}.from_pretrained("{model}")')
    assert lines[3] == (f"  TensorFlow: from transformers import TFAutoModelFor{auto}; "
                        f'model = TFAutoModelFor{auto}.from_pretrained("{model}", '
                        "use_safetensors=False)")


def test_the_summary_offers_tensorflow_only_where_the_export_wrote_its_weights(tmp_path):
    """An export made without TensorFlow (the JAX route in .venv-jax) or of a family with no TF
    class holds model.safetensors alone: no TensorFlow line. On gs:// the line says when."""
    final = {"kind": "final", "family": "gpt2", "step": 2, "stopped": None, "eval": None}
    (tmp_path / "model").mkdir()
    lines = summary(final=final, family="gpt2", output_dir=str(tmp_path), exported=True)
    assert len(lines) == 2 and "PyTorch" in lines[1]
    remote = summary(final=final, family="gpt2", output_dir="gs://b/run", exported=True)
    assert remote[-1].startswith("  TensorFlow (where it holds tf_model.h5): ")


def test_the_summary_says_when_training_stopped_at_a_limit():
    final = {"kind": "final", "family": "gpt2", "step": 37, "eval": None,
             "stopped": "train.max_hours 1 reached (1.00 h so far)"}
    lines = summary(final=final, family="gpt2", output_dir="gs://b/run", exported=True)
    assert lines[0] == ("training stopped at step 37, before train.steps: train.max_hours 1 "
                        "reached (1.00 h so far); the model is that step's")
    assert lines[1:3] == ["model: gs://b/run/model",
                          "  copy it here first: gcloud storage cp -r gs://b/run/model ."]
    assert 'from_pretrained("model")' in lines[3]
    assert summary(final=None, family="gpt2", output_dir="o", exported=False) == []
