"""`python -m launcher.cli ...`: the same as the `tpuctl` command.

    python -m launcher.cli train --local --workers 2
"""

from launcher.cli import main

if __name__ == "__main__":
    main()
