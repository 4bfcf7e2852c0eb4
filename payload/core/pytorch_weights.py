"""Model weights in PyTorch transformers' names and layouts, as `model.safetensors` holds them.

    state = with_tied_copies(state, "gpt2")       # adds lm_head.weight = transformer.wte.weight
    header = read_header("gs://b/run/model/model.safetensors")   # {name: (dtype, shape)}
    tensors = load_tensors("gs://b/run/model/model.safetensors")  # {name: numpy array}
    key = next(k for k in spellings("transformer.h.0.ln_1.weight", "gpt2") if k in header)
    check_fits(header, "bert", config_json, source="model.init_from m")   # family and shape

The common currency of both engines: each exports its weights under these names (a rename,
not a transform), and `model.init_from` reads them, ours or the Hub's. How a family names its
weights (tied keys, the task model's prefix, the embeddings, the layers) is its spec's
(payload.core.families). Framework-free: reading
a header and checking it against config.json is what the launcher does before a job starts.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct

from payload.core import reading, storage
from payload.core.errors import UserError
from payload.core.families import FAMILIES

# The weights file of a model folder under PyTorch's names (what the export writes, what
# model.init_from reads), and transformers' TF classes' own file beside it.
WEIGHTS = "model.safetensors"
TF_WEIGHTS = "tf_model.h5"

_HEADER_LIMIT = 100 << 20  # the format's own cap on the JSON header


def with_tied_copies(state: dict, family: str) -> dict:
    """`state` with the family's tied keys added, as `save_pretrained` writes them; every array
    C-contiguous and separately owned (safetensors refuses shared buffers)."""
    state = dict(state)
    for alias, source in FAMILIES[family].names.tied.items():
        if alias not in state and source in state:
            state[alias] = state[source]
    return {key: value.copy(order="C") for key, value in state.items()}


def spellings(name: str, family: str) -> list[str]:
    """The keys a checkpoint may hold one of our weights under: ours, the bare model's (no task
    prefix), and early BERT's LayerNorm gamma/beta."""
    prefix = FAMILIES[family].names.base_prefix
    names = [name]
    if prefix and name.startswith(prefix):
        names.append(name[len(prefix):])
    for new, old in ((".weight", ".gamma"), (".bias", ".beta")):
        if "LayerNorm" in name and name.endswith(new):
            names += [n[: -len(new)] + old for n in list(names)]
    return names


# The element sizes of the dtypes tpuctl reads (what numpy holds; BF16 and the 8-bit floats it
# has no type for).
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2,
              "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "C64": 8}


def _not_safetensors(path: str, why: str) -> UserError:
    return UserError(f"{path} is not a readable safetensors file: {why}",
                     hint="save the model again with save_pretrained(safe_serialization=True)")


def read_header(path: str, *, what: str | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's dtype and shape from a .safetensors file's header (local or gs://; the
    header alone is read). Every entry is checked against the format as the safetensors reader
    checks it (an 8-byte little-endian length, then a JSON object of entries whose
    data_offsets tile the rest of the file): a broken file is one line here, not an error deep
    in a loader. `what` names the file in that line (default: `path`, which may be a path to
    an opened file: payload.core.reading.opened_in_folder)."""
    shown = what or path
    hint = "save the model again with save_pretrained(safe_serialization=True)"
    with reading.open_file(path, what=shown, hint=hint) as f:
        total = storage.size(path) if storage.is_gcs(path) else os.fstat(f.fileno()).st_size
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if length is None or not 0 < length <= _HEADER_LIMIT:
            raise _not_safetensors(shown, f"no header (the file is {total} bytes)"
                                   if length is None else f"a header length of {length}")
        if 8 + length > total:
            raise _not_safetensors(shown, f"its header length {length} runs past the end of "
                                          f"the file ({total} bytes)")
        raw = f.read(length)
    entries, problem = reading.json_value(raw)
    if problem:
        raise _not_safetensors(shown, f"its header {problem}")
    path = shown  # what the lines below name
    if not isinstance(entries, dict):
        raise _not_safetensors(path, "its header is not a JSON object")
    data_bytes, found, spans = total - 8 - length, {}, []
    for name, entry in entries.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(
                    isinstance(v, str) for v in entry.values()):
                raise _not_safetensors(path, "its __metadata__ is not an object of strings")
            continue
        what = f"entry {name!r}"
        if not isinstance(entry, dict):
            raise _not_safetensors(path, f"{what} is {json.dumps(entry)[:40]}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise _not_safetensors(path, f"{what} has no dtype")
        if dtype not in ITEM_BYTES:
            raise UserError(f"{path}: {what} holds {dtype} values, which tpuctl does not read "
                            f"(it reads {', '.join(ITEM_BYTES)})",
                            hint="save the model in float32 first (from_pretrained with "
                                 "torch_dtype=torch.float32, then save_pretrained)")
        if not (isinstance(shape, list) and all(_count(n) for n in shape)):
            raise _not_safetensors(path, f"{what} has shape {json.dumps(shape)[:40]}, not a "
                                         "list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_count, offsets))
                and offsets[0] <= offsets[1] <= data_bytes):
            raise _not_safetensors(path, f"{what} has data_offsets {json.dumps(offsets)[:40]}, "
                                         f"outside the file's {data_bytes} bytes of data")
        needed = ITEM_BYTES[dtype] * math.prod(shape)
        if offsets[1] - offsets[0] != needed:
            raise _not_safetensors(path, f"{what} spans {offsets[1] - offsets[0]} bytes but "
                                         f"its shape {shape} of {dtype} needs {needed}")
        found[name] = (dtype, tuple(shape))
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise _not_safetensors(path, f"entry {name!r} starts at byte {begin} of the data, "
                                         f"not at {end} (entries overlap or leave a gap)")
        end = stop
    if end != data_bytes:
        raise _not_safetensors(path, f"its entries hold {end} bytes but the file has "
                                     f"{data_bytes} after the header")
    return found


def _count(value) -> bool:
    """A JSON size or offset: a non-negative integer (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_tensors(path: str, *, what: str | None = None) -> dict:
    """Every tensor of a .safetensors file (local, or gs:// read whole) as numpy arrays; its
    header checked first (read_header; `what` names the file as there)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load, load_file

    read_header(path, what=what)
    try:
        return load(storage.read_bytes(path)) if storage.is_gcs(path) else load_file(path)
    except SafetensorError as exc:  # changed since its header was read
        raise _not_safetensors(what or path, str(exc).splitlines()[0] if str(exc)
                               else "unreadable") from exc


def check_fits(header: dict, family: str, settings: dict, *, source: str) -> None:
    """The file holds the family's weights in the shape config.json describes: its token
    embeddings [vocab_size, hidden] and as many layers. One line naming what differs."""
    names = FAMILIES[family].names
    anchor = names.embeddings
    key = next((k for k in spellings(anchor, family) if k in header), None)
    if key is None:
        sample = ", ".join(sorted(header)[:2]) or "nothing"
        raise UserError(f"{source}: {WEIGHTS} holds no {family} weights (no {anchor}; "
                        f"it has {sample}, ...)",
                        hint="point model.init_from at a model of model.family")
    hidden = names.hidden
    expected = (settings.get("vocab_size"), settings.get(hidden))
    found = header[key][1]
    if found != expected:
        raise UserError(f"{source}: {WEIGHTS}'s {key} is {list(found)} but config.json "
                        f"says [vocab_size, {hidden}] = {list(expected)}",
                        hint="its config.json must describe the weights beside it")
    task = re.escape(names.base_prefix)
    for setting, numbered in names.layers:
        wanted = settings.get(setting)
        if wanted is None and setting == "num_decoder_layers":  # T5: as many as the encoder
            wanted = settings.get("num_layers")
        pattern = re.compile(f"^(?:{task})?{re.escape(numbered)}(\\d+)\\.")
        layers = {int(m.group(1)) for k in header if (m := pattern.match(k))}
        count = max(layers) + 1 if layers else 0
        if wanted is not None and count != wanted:
            raise UserError(f"{source}: {WEIGHTS} has {count} layers ({numbered}N) but "
                            f"config.json says {setting} {wanted}",
                            hint="its config.json must describe the weights beside it")
