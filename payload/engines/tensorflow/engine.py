"""The TensorFlow engine behind the seam (payload.engines.Engine): what the stages ask of it.

    from payload.engines import engine_for
    engine = engine_for("tensorflow")
"""

from __future__ import annotations


class TensorFlowEngine:
    name = "tensorflow"


ENGINE = TensorFlowEngine()
