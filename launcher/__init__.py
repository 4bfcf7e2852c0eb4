"""tpuctl's launcher: the CLI that provisions, ships the payload, runs and watches workers.

    tpuctl init && tpuctl train --local
"""
