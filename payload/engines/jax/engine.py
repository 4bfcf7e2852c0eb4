"""The JAX engine behind the seam (payload.engines.Engine): what the stages ask of it.

    from payload.engines import engine_for
    engine = engine_for("jax")
"""

from __future__ import annotations


class JaxEngine:
    name = "jax"


ENGINE = JaxEngine()
