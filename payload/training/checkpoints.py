"""The rules of `output_dir/checkpoints/`, whichever engine writes it, and the resume guard.

    check_start(output_dir, resume=True, overwrite=False, engine="jax")  # no framework needed
    check_resume(output_dir, identity)      # then: refuses a changed model or tokenizer
    start_fresh(output_dir, identity)       # clears an earlier run's files, records run.json
    step, state = restore_newest([4, 2], restore, directory=d, doing="--resume",
                                 describe=why, files=step_files)   # newest restorable, or one line

Each engine writes its own checkpoint format there (TensorFlow's CheckpointManager files,
Orbax step folders; payload.core.engines knows them without the framework); the rules around
them are these, written once.
The folder is complete (its `.tpuctl-complete` marker, payload.core.folders) once a fresh run
has cleared an earlier run's files and recorded what its checkpoints are made from (`run.json`: model,
tokenizer, family and engine); resume and export require the marker, so a clearing cut short is
never mistaken for a run. A fresh start removes only checkpoint files of tpuctl's engines and
tpuctl's own files, and names them first. A resume continues only the engine that wrote the
checkpoints. A newest checkpoint that cannot be restored (truncated, another model's) is one
line naming it and the newest intact one, and how to go back to that one; tpuctl never moves
or deletes it itself.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import TypeVar

from payload.core import folders, layout, ownership, reading, storage
from payload.core.engines import DEFAULT, ENGINES, engine_spec, newest_checkpoint
from payload.core.errors import UserError

IDENTITY = layout.RUN_IDENTITY
log = logging.getLogger(__name__)
T = TypeVar("T")

# What tpuctl itself writes in the folder: run.json, the training schedule (train.py), the
# input order (payload.data.stream), the marker, and storage's temporaries of each.
_OWN = re.compile(
    r"^(?:(?:run|schedule|data)\.json|" + re.escape(layout.COMPLETE)
    + r"|\.tmp-[^/]+-(?:run\.json|schedule\.json|data\.json|" + re.escape(layout.COMPLETE)
    + r"))\Z"
)


def _earlier_run(directory: str) -> UserError:
    return UserError(f"{directory} already holds checkpoints of an earlier run",
                     hint="pass --resume to continue it, or --overwrite to start again")


def _nothing_to_resume(directory: str) -> UserError:
    return UserError(f"--resume: no checkpoint in {directory}",
                     hint="run without --resume to start fresh")


def incomplete(directory: str, doing: str) -> UserError:
    return UserError(
        f"{doing}: the checkpoints in {directory} are incomplete (no {layout.COMPLETE}: a "
        "start that cleared an earlier run's files was cut short)",
        hint="start again with --overwrite",
    )


def restore_newest(steps: list[int], restore: Callable[[int], T], *, directory: str,
                   doing: str, describe: Callable[[BaseException], str],
                   files: Callable[[int], str], label: Callable[[int], str] = str
                   ) -> tuple[int, T]:
    """(step, what `restore(step)` gives) for the newest of `steps` (newest first). When it
    cannot be restored (a truncated file, another model's arrays), the older steps are tried
    only to say which one is intact, in one line with what to do: nothing is restored from an
    older step, and nothing is moved or deleted (a checkpoint tpuctl cannot read is still the
    user's to keep or drop). `describe` says in words why an engine's restore failed, `files`
    names what to move out of the folder to go back to an older step, `label` names a step as
    the engine's files do ("4", "ckpt-4")."""
    newest = steps[0]
    try:
        return newest, restore(newest)
    except MemoryError:
        raise
    except Exception as exc:  # Orbax and tensorstore raise bare Exceptions too
        failure = exc
    intact = None
    for step in steps[1:]:
        try:
            restore(step)
        except MemoryError:
            raise
        except Exception:  # broken too: look further back
            continue
        intact = step
        break
    raise broken_checkpoint(directory, doing=doing, step=label(newest),
                            why=describe(failure), files=files(newest),
                            intact=None if intact is None else label(intact)) from failure


def broken_checkpoint(directory: str, *, doing: str, step: str, why: str, files: str,
                      intact: str | None) -> UserError:
    """The one line for a newest checkpoint that cannot be restored: which, why, which older
    one is intact, and how to go back to it (the user moves the broken one away)."""
    if intact is None:
        return UserError(
            f"{doing}: the newest checkpoint in {directory}, {step}, cannot be restored ({why}),"
            " and no older one can",
            hint="start again with --overwrite (it removes these checkpoints)")
    again = ("--resume then continues" if doing == "--resume"
             else "the export then takes the weights")
    return UserError(
        f"{doing}: the newest checkpoint in {directory}, {step}, cannot be restored ({why}); "
        f"{intact} is intact",
        hint=f"move {files} out of {directory} (tpuctl leaves it as it is), and {again} from "
             f"{intact}; or start again with --overwrite")


def check_exportable(output_dir: str, engine: str) -> int:
    """The step of the newest checkpoint `engine` wrote in a complete folder, or one line: there
    is none (train first), or the clearing before it was cut short."""
    directory = layout.checkpoints_dir(output_dir)
    step = engine_spec(engine).newest_step(output_dir)
    if step is None:
        raise UserError(f"nothing to export: no checkpoint in {directory}",
                        hint="run the train stage first")
    if not folders.is_complete(directory):
        raise incomplete(directory, "nothing to export")
    return step


def check_flags(*, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other (--resume continues the "
                        "checkpoints, --overwrite removes them)", hint="pass one of them")


def read_identity(output_dir: str) -> dict | None:
    """checkpoints/run.json (what the checkpoints were made with), None without one; one line
    when it is not a JSON object (payload.core.reading's refusals included)."""
    path = layout.run_identity_path(output_dir)
    if not storage.exists(path):
        return None
    hint = "restore it from a copy, or train again with --overwrite"
    identity = reading.read_json(path, hint=hint)
    if not isinstance(identity, dict):
        raise UserError(f"{path} is not a JSON object", hint=hint)
    return identity


def recorded_engine(output_dir: str) -> str | None:
    """The engine the checkpoints were written by, as run.json records it (runs from before
    engines were recorded were TensorFlow's); None without a run.json."""
    identity = read_identity(output_dir)
    return None if identity is None else identity.get("engine", DEFAULT)


def newest_step(output_dir: str) -> int | None:
    """The step of the newest checkpoint, whichever engine wrote it (no framework)."""
    newest = newest_checkpoint(output_dir)
    return None if newest is None else newest[1]


def check_start(output_dir: str, *, resume: bool, overwrite: bool,
                engine: str = DEFAULT) -> None:
    """Refuse to mix runs, from the checkpoint files, the marker and run.json alone (no
    TensorFlow, no JAX; the launcher checks it before it starts anything, the stage before it
    writes anything): a resume needs a complete checkpoint of the same engine, and a
    fresh start must not silently bury an earlier run's checkpoints."""
    check_flags(resume=resume, overwrite=overwrite)
    directory = layout.checkpoints_dir(output_dir)
    ownership.check_no_link(output_dir, directory)  # training writes and deletes in it
    present = newest_step(output_dir) is not None
    if not resume and present and not overwrite:
        raise _earlier_run(directory)
    if resume and not present:
        raise _nothing_to_resume(directory)
    if resume and not folders.is_complete(directory):
        raise incomplete(directory, "--resume")
    if resume:
        written_by = recorded_engine(output_dir)
        if written_by not in (None, engine):
            raise UserError(
                f"--resume: the checkpoints in {directory} were written by the {written_by} "
                f"engine, but train.engine is {engine}",
                hint=f"set train.engine: {written_by} to continue them, or start again with "
                "--overwrite")
        if engine_spec(engine).newest_step(output_dir) is None:
            raise _nothing_to_resume(directory)


def check_resume(output_dir: str, identity: dict) -> None:
    """Refuse to continue checkpoints made from another model or tokenizer (after
    `check_start`, which refused the rest). `identity` is what run.json records for this run."""
    saved = read_identity(output_dir)
    if saved is not None:
        saved.setdefault("engine", DEFAULT)
        changed = [key for key in identity if saved.get(key) != identity[key]]
        if changed:
            raise UserError(
                f"--resume: the {' and '.join(changed)} changed since the checkpoints in "
                f"{layout.checkpoints_dir(output_dir)} were written",
                hint="restore the original settings, or start again with --overwrite",
            )


def start_fresh(output_dir: str, identity: dict) -> None:
    """Clear an earlier run's checkpoint files (named first; nothing else in the folder is
    touched) and record what this run's are made from; the folder is then complete. Every
    engine's files go, not only this run's engine's: they would be an earlier run's too."""
    directory = layout.checkpoints_dir(output_dir)
    ownership.check_no_link(output_dir, directory)
    present = storage.list_tree(directory)
    engines_files = [n for engine in ENGINES.values() for n in engine.checkpoint_files(present)]
    own = [n for n in present if _OWN.match(n.replace("\\", "/"))]
    names = engines_files + own
    folders.clear_complete(directory)  # first: readers stop trusting the folder
    if names:
        log.info("removing an earlier run's checkpoints from %s: %s", directory,
                 removal_summary(engines_files, own))
        ownership.remove_owned(output_dir, [storage.join(directory, n) for n in names])
    storage.write_text(storage.join(directory, IDENTITY), json.dumps(identity, indent=1) + "\n")
    folders.mark_complete(directory, {"identity": identity})


# Checkpoints named one by one in the removal line up to this many; more are counted.
NAMED_CHECKPOINTS = 6


def removal_summary(checkpoint_files: list[str], own_files: list[str]) -> str:
    """What a fresh start removes, in one readable line: the checkpoints by name (an Orbax step
    folder, a TensorFlow `ckpt-N` with its index and data files) and how many files they hold,
    then tpuctl's own files; never every internal file of a checkpoint (a JAX run's hold dozens
    each)."""
    groups: dict[str, int] = {}
    for name in checkpoint_files:
        top = name.replace("\\", "/").split("/", 1)[0]
        # ckpt-20.index and ckpt-20.data-00000-of-00001 are one checkpoint, ckpt-20.
        key = top + "/" if "/" in name.replace("\\", "/") else top.split(".", 1)[0]
        groups[key] = groups.get(key, 0) + 1
    ordered = sorted(groups, key=lambda key: (_step_of(key) is None, _step_of(key) or 0, key))
    parts = []
    if ordered:
        named = ", ".join(ordered[:NAMED_CHECKPOINTS])
        if len(ordered) > NAMED_CHECKPOINTS:
            named += f" and {len(ordered) - NAMED_CHECKPOINTS} more"
        files = len(checkpoint_files)
        parts.append(f"{named} ({files} file{'s' if files != 1 else ''})")
    own = sorted(n for n in own_files if not n.startswith(".tmp-"))
    if own:
        parts.append("tpuctl's " + ", ".join(own))
    return " and ".join(parts) or "temporary files"


def _step_of(key: str) -> int | None:
    digits = re.search(r"(\d+)/?\Z", key)
    return int(digits.group(1)) if digits else None
