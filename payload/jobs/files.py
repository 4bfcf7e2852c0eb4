"""What the launcher has a worker do to one file of output_dir, seen from that worker.

    python -m payload.jobs.files write PATH TEXT OUTPUT_DIR   # only into an output_dir tpuctl may use
    python -m payload.jobs.files exists PATH                  # prints seen | missing
    python -m payload.jobs.files remove PATH

The launcher runs these on worker 0 and the others to check that output_dir is shared
(launcher.job_control.check_shared_output): the worker's view of a gs:// or mounted folder is
what counts.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from payload.core import ownership, storage
    from payload.core.errors import UserError

    command, path, *rest = argv
    if command == "write":
        text, output_dir = rest
        # The check comes first, so a folder of the user's gets nothing, not even the marker.
        try:
            ownership.check_output_dir(output_dir)
        except UserError as exc:
            print("error: " + str(exc))
            return 2
        storage.write_text(path, text)
    elif command == "exists":
        print("seen" if storage.exists(path) else "missing")
    elif command == "remove":
        storage.remove(path)
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
