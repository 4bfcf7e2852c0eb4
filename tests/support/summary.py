"""The end of a run's report: what the skipped tests lacked, and the command that provides it.

    skipped_groups(["needs terraform on PATH (make setup-terraform)", ...])
    -> ["   1 skipped: Terraform  ->  make setup-terraform"]
"""

from __future__ import annotations

# What a skipped test lacked, read from its reason, and the command that provides it. A laptop
# run skips what this machine cannot do; the summary says so, and how to cover it (CI does).
SKIP_NEEDS = (  # the first key found in a reason names the group: the narrowest need first
    ("tcsh", "tcsh (a worker login shell)", "apt-get install -y tcsh"),
    ("openssh-server", "real SSH workers (sshd)", "apt-get install -y openssh-server (as root)"),
    ("network namespaces", "workers in network namespaces",
     "run as root where `ip netns` works (apt-get install -y iproute2)"),
    ("terraform", "Terraform", "make setup-terraform"),
    ("checkov", "checkov", "make setup-checkov"),
    (".venv-libtpu", "the TPU compiler (libtpu)", "make setup-libtpu"),
    (".venv-torch", "PyTorch + transformers 5.x (.venv-torch)", "make setup-torch"),
    ("gs:// sandbox", "the gs:// sandbox (mount and network namespaces)",
     "run as root with util-linux and iproute2; make setup"),
    ("namespaces here", "the gs:// sandbox (mount and network namespaces)",
     "run as root with util-linux and iproute2; make setup"),
    ("ns_last_pid", "steering process ids (ns_last_pid)", "run as root"),
    ("setpriv", "setpriv", "apt-get install -y util-linux"),
    ("could not import", "a Python package", "make setup"),
)


def skipped_groups(reasons: list[str]) -> list[str]:
    """One line per group of skipped tests: how many, what they need, what installs it."""
    groups: dict[tuple[str, str], int] = {}
    for reason in reasons:
        need, command = next(((n, c) for key, n, c in SKIP_NEEDS if key in reason), (reason, ""))
        if need == "a Python package":
            need = f"the Python package {reason.split(chr(39))[1]}" if "'" in reason else need
        groups[(need, command)] = groups.get((need, command), 0) + 1
    return [f"{count:4d} skipped: {need}" + (f"  ->  {command}" if command else "")
            for (need, command), count in sorted(groups.items(), key=lambda g: -g[1])]
