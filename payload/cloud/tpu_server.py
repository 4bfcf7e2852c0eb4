"""Serve this host's TPU to a pod slice's driver: the TPU worker server of the tensorflow-tpu wheel.

    python -m payload.cloud.tpu_server          # runs until stopped (the job's agent stops it)

On a multi-host slice TensorFlow drives every chip from worker 0, which reaches each host's TPU
worker server on port 8470. Base images run a placeholder in the `tpu-runtime` service, so tpuctl
stops that service (with sudo, when allowed) and runs `start_grpc_tpu_worker` (installed with
tensorflow-tpu, next to this Python) in the foreground instead. With the TPU API stand-in
(TPUCTL_TPU_API_ENDPOINT, tests) there is no TPU: it says so and waits until stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

SERVER = "start_grpc_tpu_worker"


def main() -> int:
    from payload.cloud import tpu_api

    if tpu_api.stand_in():
        print("tpuctl: the TPU API is a stand-in, so there is no TPU to serve here; waiting",
              flush=True)
        stop = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        signal.sigwait(stop)
        return 0
    server = Path(sys.executable).with_name(SERVER)
    if not server.exists():
        print(f"error: {server} is missing: the environment has no tensorflow-tpu; a pod slice "
              "needs it on every host", file=sys.stderr, flush=True)
        return 2
    if shutil.which("systemctl"):
        # The image's placeholder runtime holds the TPU; it is not ours to keep running.
        stopped = subprocess.run(["sudo", "-n", "systemctl", "stop", "tpu-runtime"],
                                 capture_output=True, text=True, check=False)
        if stopped.returncode != 0:
            print(f"tpuctl: could not stop tpu-runtime ({stopped.stderr.strip()[-200:]})",
                  flush=True)
    print(f"tpuctl: serving this host's TPU with {SERVER}", flush=True)
    os.execv(server, [str(server)])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
