"""The JAX engine's persistent compilation cache: a resumed or preempted run loads the compiled
training step instead of compiling it again.

    use_compilation_cache(cache_folder(output_dir))      # before anything compiles
    compiled, report = compile_ahead(program.train_step, state, batch)
    report   # {"compile_s": 35.2, "cache": "hit"}  ("miss": compiled now and stored)

The cache lives in the run's output_dir (tpuctl's own folder in it), not on the worker's disk:
a preempted TPU VM comes back as a new VM with an empty disk, and on a multi-host slice only
process 0 writes cache entries (JAX's rule, against write contention), so every host must read
the same folder, as every host reads output_dir. Whoever can write there can also write the
run's checkpoints: JAX's warning that a cache is trusted code holds for both alike.
A cache the environment names (JAX_COMPILATION_CACHE_DIR: a user's own, or a test suite's
shared one) is used instead. Whether the step came from the cache is JAX's own monitoring event
(/jax/compilation_cache/cache_hits), counted while it compiles.
"""

from __future__ import annotations

import os
import threading
import time

import jax

from payload.core import layout

ENVIRONMENT = "JAX_COMPILATION_CACHE_DIR"

CACHE_HITS = "/jax/compilation_cache/cache_hits"
CACHE_MISSES = "/jax/compilation_cache/cache_misses"
_counts = {CACHE_HITS: 0, CACHE_MISSES: 0}
_lock = threading.Lock()
_listening = False


def _count(event: str, **_) -> None:
    if event in _counts:
        with _lock:
            _counts[event] += 1


def cache_folder(output_dir: str) -> str:
    """The run's cache: the environment's if it names one, else output_dir/.tpuctl/jax-cache."""
    return os.environ.get(ENVIRONMENT) or layout.own_path(output_dir, layout.JAX_CACHE)


def use_compilation_cache(directory: str) -> None:
    """Keep compiled programs in `directory` (local or gs://), from the next compile on."""
    global _listening
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", directory)
    # A process that compiled before (a test, a second run in one process) had its cache set
    # up for another folder: start it over for this one.
    compilation_cache.reset_cache()
    if not _listening:
        jax.monitoring.register_event_listener(_count)
        _listening = True


def cache_enabled() -> bool:
    return bool(jax.config.jax_compilation_cache_dir)


def compile_ahead(jitted, *args):
    """`jitted` lowered and compiled for `args` (arrays or their shapes), stored in the cache
    whatever the compile took (JAX stores only compiles of a second or more by default; a
    small model's step may be quicker here, and the cache is what a resume is tested on).
    Returns the compiled program and {"compile_s", "cache": "hit" | "miss" | "off"}."""
    with _lock:
        hits, misses = _counts[CACHE_HITS], _counts[CACHE_MISSES]
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    began = time.monotonic()
    try:
        compiled = jitted.lower(*args).compile()
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)
    seconds = time.monotonic() - began
    with _lock:
        hit = _counts[CACHE_HITS] > hits
        missed = _counts[CACHE_MISSES] > misses
    cache = "hit" if hit and not missed else "miss" if cache_enabled() else "off"
    return compiled, {"compile_s": round(seconds, 3), "cache": cache}
