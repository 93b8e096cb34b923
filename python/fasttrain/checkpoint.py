"""Checkpoints in the safetensors format (an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and byte range, then
the raw data), readable by safetensors.numpy and PyTorch.

ft.save writes the model's parameters and buffers under PyTorch's key names,
the optimizer's state, and in the string metadata the optimizer's
hyperparameters, the scheduler, the random generator, the data loader's
position and the epoch/step, atomically (a temporary file, fsync, rename).
ft.load checks everything before it changes anything."""
from __future__ import annotations

import fcntl
import json
import math
import os
import struct
import warnings
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from typing import Any, Mapping

    from ._types import dtype as _dtype
    from .data import Loader
    from .nn.modules import Module
    from .nn.program import Program
    from .optim.ema import EMA
    from .optim.lr_scheduler import LRScheduler
    from .optim.optimizer import Optimizer

_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
           "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "F16": np.float16, "F32": np.float32,
           "F64": np.float64, "BF16": None}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items() if v is not None}
_MAX_HEADER = 100 << 20


def _dtype_code(a):
    code = _CODES.get(a.dtype)
    if code is None:
        raise TypeError(f"safetensors cannot hold {a.dtype} arrays")
    return code


def _remove_stale_temporaries(directory, prefix):
    """Deletes the temporaries that killed saves of the same target left behind. A live save holds a lock on
    its temporary (released by the kernel when its process dies), so a lock we can take marks a stale one."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(".safetensors")]
    except OSError:
        return
    for name in names:
        stale = os.path.join(directory, name)
        try:
            fd = os.open(stale, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(stale)
        except OSError:  # locked by a save in progress, or already gone
            pass
        finally:
            os.close(fd)


def save_file(path, tensors, metadata=None, bfloat16=()):
    """Writes {name: ndarray} and string metadata to `path` atomically; the names in `bfloat16` are uint16
    arrays of bfloat16 bits, stored as BF16."""
    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        a = np.asarray(value)
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would also turn 0-d arrays into 1-d ones)
            a = a.copy(order="C")
        n = a.nbytes
        code = "BF16" if name in bfloat16 else _dtype_code(a)
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + n]}
        arrays.append(a)
        offset += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    directory, target = os.path.split(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: {path}: the directory {directory} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"save: {path} is a directory: give a file's path in it")
    prefix = f".tmp-{target}-"
    _remove_stale_temporaries(directory, prefix)
    import tempfile  # here, not at the top: with shutil and random it is a tenth of import fasttrain's own time
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".safetensors")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the file is closed, after the rename: marks a live save
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for a in arrays:
                f.write(a.tobytes())
            f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0)  # mkstemp makes the file private; give it the mode a plain open() would
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_file(path):
    """({name: ndarray}, metadata) from a safetensors file, each array writable and of the file's dtype (bfloat16,
    which NumPy lacks, widened exactly to float32); ValueError for a corrupt or truncated one."""
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)  # the arrays view it: writable, as a copy would be
        data = data[:f.readinto(data)]
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (only {len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(_MAX_HEADER, len(data) - 8):
        for magic, kind in ((b"PK\x03\x04", "a zip archive"), (b"\x80", "a Python pickle")):
            if data.startswith(magic):  # torch.save's formats (their first bytes read as a header length too large)
                raise ValueError(f"{path}: {kind} (torch.save's format?), not a safetensors file: in PyTorch, write "
                                 "the weights with safetensors.torch.save_file(model.state_dict(), path)")
        raise ValueError(f"{path}: corrupt or truncated safetensors file (header of {n} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:  # bad UTF-8 or JSON, an integer of thousands of digits
        raise ValueError(f"{path}: corrupt safetensors header: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: corrupt safetensors header: nested too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: the safetensors metadata must map names to strings")
    body = memoryview(data)[8 + n:]
    tensors, spans = {}, []
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                raise ValueError(f"unsupported dtype {dtype!r}")
            if not all(type(v) is int and v >= 0 for v in [*shape, begin, end]):  # true is no size
                raise ValueError("shape and offsets must be non-negative integers")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: corrupt entry for tensor {name!r}: {e}") from None
        itemsize = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        if not begin <= end <= len(body) or end - begin != math.prod(shape) * itemsize:  # exact Python ints
            raise ValueError(f"{path}: tensor {name!r} lies outside the file or has the wrong size (truncated?)")
        spans.append((begin, end, name))
        raw = np.frombuffer(body[begin:end], dtype=np.uint16 if dtype == "BF16" else _DTYPES[dtype])
        try:
            tensors[name] = (raw.reshape(shape), dtype)
        except ValueError as e:  # more dimensions than NumPy holds, or a size beyond its range (with a zero)
            raise ValueError(f"{path}: corrupt entry for tensor {name!r}: shape {shape}: {e}") from None
    # The format requires the tensors to fill the body exactly, one after the other: a header length one byte
    # short (its JSON ending in padding) would otherwise shift every tensor by a byte and still load.
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin < at:
            raise ValueError(f"{path}: tensor {name!r} overlaps the one before it")
        if begin > at:
            raise ValueError(f"{path}: bytes {at}..{begin} of the data belong to no tensor (corrupt header length?)")
        at = end
    if at != len(body):
        raise ValueError(f"{path}: the tensors end at byte {at} of the data, the file at {len(body)} "
                         "(corrupt header length, or a truncated or appended file)")
    out = {}
    for name, (arr, dtype) in tensors.items():
        if dtype == "BF16":  # widened exactly: bfloat16 is the top half of a float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out, metadata


def _program_parts(obj):
    from .nn.modules import Module
    if isinstance(obj, Module):
        return obj, None
    model = getattr(obj, "model", None)
    if model is None:
        hint = " (a state_dict: give the model itself, ft.save(path, model))" if isinstance(obj, dict) else \
            " (the path comes first: ft.save(path, model), where torch.save takes the object first)" \
            if isinstance(obj, (str, os.PathLike)) else ""
        raise TypeError(f"ft.save expects a Module or a compiled Program, got {type(obj).__name__}{hint}")
    for c in {id(c): c for c in (obj._c, obj._eval_c)}.values():  # fit in another thread: its step moves all this
        c._check_free()
    return model, obj


def _float16(name, a):
    """float32 a rounded to float16 (to nearest even, as fasttrain's and NumPy's conversions); ValueError where a
    finite value lies beyond float16's range."""
    a = np.asarray(a, np.float32)
    with np.errstate(over="ignore"):
        half = a.astype(np.float16)
    if np.any(np.isinf(half) & np.isfinite(a)):
        raise ValueError(f"ft.save: {name} holds values of magnitude up to {np.abs(a[np.isfinite(a)]).max():.6g}, "
                         f"beyond float16's largest (65504); save a bfloat16 copy instead")
    return half


def _bfloat16_bits(a):
    """float32 a rounded to bfloat16 as fasttrain rounds (to nearest even): the uint16 bits safetensors stores."""
    from .creation import as_tensor
    wide = np.asarray(as_tensor(np.ascontiguousarray(a, np.float32)).to("bfloat16"))  # exactly widened back
    return (wide.view(np.uint32) >> 16).astype(np.uint16)


def save(path: str | os.PathLike[str], obj: Module | Program, *, optimizer: Optimizer | None = None,
         scheduler: LRScheduler | None = None, loader: Loader | None = None, ema: EMA | None = None,
         epoch: int | None = None, step: int | None = None, metadata: Mapping[str, Any] | None = None,
         dtype: str | _dtype | None = None) -> None:
    """Saves a model or a compiled program (with its optimizer) and the training position to `path`; `ema`, an
    ft.optim.EMA of the model's parameters, as "ema." tensors named after them (timm's checkpoints keep theirs).
    `epoch`, `step` and the values of `metadata` come back from ft.load with their types: strings as they are,
    anything else through JSON.

    dtype="bfloat16" (or "bf16") or "float16" (or "fp16", "half") saves an inference copy instead: the model's
    float32 parameters and buffers rounded to that dtype (half the bytes, to nearest even), without optimizer,
    scheduler or loader state. safetensors and PyTorch read it in that dtype; ft.load into a model widens it back to
    float32 exactly. A float16 copy refuses a value beyond float16's range (65504), which would become infinite."""
    from .random import default_generator
    model, program = _program_parts(obj)
    low_name = None
    if dtype is not None:
        names = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                 "half": "float16"}
        low_name = names.get(str(dtype).removeprefix("fasttrain.").removeprefix("torch.").lower())
        if low_name is None:
            raise ValueError(f"ft.save: dtype must be 'bfloat16' or 'float16' (an inference copy) or None, got "
                             f"{dtype!r}")
        if optimizer is not None or scheduler is not None or loader is not None or ema is not None:
            raise ValueError(f"ft.save: a {low_name} inference copy holds the model only; save the optimizer, "
                             f"scheduler, loader and EMA in a float32 checkpoint (or ema.copy_to() the averages "
                             "into the model first, to export them)")
    elif optimizer is None and program is not None:
        optimizer = program.optimizer
    own = model._state()
    wide = {k for k, t in own.items() if t.dtype.name == "bfloat16"}  # a model.bfloat16(): NumPy has no bfloat16
    tensors = {k: (t.float() if k in wide else t).cpu().numpy().copy() for k, t in own.items()}
    low = {k for k, v in tensors.items() if dtype is not None and v.dtype == np.float32 and k not in wide}
    tensors.update((k, _bfloat16_bits(tensors[k]) if low_name == "bfloat16" else _float16(k, tensors[k]))
                   for k in low)
    tensors.update((k, _bfloat16_bits(tensors[k])) for k in wide)
    bfloat16 = wide | (low if low_name == "bfloat16" else set())
    meta = {"format": "fasttrain", "rng": json.dumps([default_generator.initial_seed(), default_generator._offset])}
    if optimizer is not None:
        state = optimizer.state_dict()
        names = []
        for idx, entries in state["state"].items():
            scalars = {}
            for key, value in entries.items():
                if isinstance(value, np.ndarray):
                    tensors[f"optimizer.state.{idx}.{key}"] = value
                    names.append(f"{idx}.{key}")
                else:
                    scalars[key] = value
            if scalars:
                meta[f"optimizer.state.{idx}"] = json.dumps(scalars)
        meta["optimizer.param_groups"] = json.dumps(state["param_groups"])
        meta["optimizer.class"] = type(optimizer).__name__
        meta["optimizer.tensors"] = json.dumps(names)  # what ft.load must find: a lost entry is an error
        params = _param_names(model, optimizer)
        if None not in params:
            meta["optimizer.params"] = json.dumps(params)
    if scheduler is not None:
        meta["scheduler"] = json.dumps(scheduler.state_dict(), default=str)
    if ema is not None:
        names = _ema_names(model, ema, "ft.save")
        tensors.update((f"ema.{name}", a) for name, a in zip(names, ema.state_dict()["shadow"]))
        meta["ema"] = json.dumps({"decay": ema.decay, "num_updates": ema.num_updates, "params": names})
    if loader is None and program is not None and dtype is None:  # the Loader ft.fit made of (x, y) arrays
        loader = program.__dict__.get("_array_loaders", {}).get(True, (None, None))[1]
        fitted = program.__dict__.get("_fitted_loader", lambda: None)()
        if fitted is not None and fitted is not loader:
            warnings.warn(f"{path}: the program was last trained by ft.fit on a Loader whose position this "
                          "checkpoint does not keep, so a run resumed from it starts that Loader's epochs over: "
                          "pass loader= to ft.save and ft.load", stacklevel=2)
        loader = loader if hasattr(loader, "state_dict") else None
    if loader is not None:
        if not callable(getattr(loader, "state_dict", None)):
            raise TypeError(f"ft.save: loader= keeps where a fasttrain Loader (or a loader with a state_dict) stands "
                            f"in its epochs; a {type(loader).__name__} has none, so leave it out: a run resumed from "
                            "the checkpoint then starts its loader's epoch afresh")
        meta["loader"] = json.dumps(loader.state_dict())
    if program is not None and dtype is None:
        meta["program.step"] = str(program.step_count)
        meta["program.dropout"] = json.dumps(program._c.get_dropout_state())
        if program.grad_scaler is not None and program.grad_scaler.is_enabled():
            meta["program.grad_scaler"] = json.dumps(program.grad_scaler.state_dict())
    user = dict(metadata or {})
    for key, value in (("epoch", epoch), ("step", step)):
        if value is not None:
            if key in user:
                raise ValueError(f"ft.save: {key} given both as an argument and in metadata")
            user[key] = value
    typed = []
    for key, value in user.items():
        key = str(key)
        if key in meta or key in _RESERVED or key.startswith(("optimizer.", "program.")):
            raise ValueError(f"ft.save: metadata key {key!r} is one fasttrain uses itself (ft.load would read it)")
        if isinstance(value, str):
            meta[key] = value
            continue
        try:
            meta[key] = json.dumps(value, allow_nan=False, default=_numpy_scalar)
        except (TypeError, ValueError) as e:
            raise TypeError(f"ft.save: metadata {key!r} must be a string or JSON-serializable: {e}") from None
        typed.append(key)
    if typed:
        meta[_TYPED] = json.dumps(typed)
    from . import distributed
    if distributed.get_rank() == 0:  # under ft.distributed every rank holds the same state: rank 0 writes it
        save_file(path, tensors, meta, bfloat16)
    if distributed.is_initialized():
        distributed.barrier()  # the file is complete before any rank goes on (and may load it)


def _numpy_scalar(value):
    """A NumPy scalar (np.int64(3), an accuracy's np.float32) as the Python number JSON writes."""
    if isinstance(value, np.generic) and value.ndim == 0 and value.dtype.kind in "biuf":
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_TYPED = "fasttrain.json_keys"  # the metadata keys whose values were not strings, stored as JSON
# with optimizer.* and program.*: what ft.load reads
_RESERVED = {"format", "rng", "scheduler", "loader", "ema", _TYPED}
_STATE_TENSORS = ("optimizer.state.", "ema.")  # the training state's tensors, not the model's


def _ema_names(model, ema, op):
    """The model's names of the parameters an EMA averages (a tied weight's first name)."""
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    missing = [i for i, p in enumerate(ema.params) if id(p) not in names]
    if missing:
        raise ValueError(f"{op}: the EMA averages {len(missing)} tensor(s) that are not this model's parameters "
                         f"(first, param {missing[0]})")
    return [names[id(p)] for p in ema.params]


def _ema_state(path, meta, tensors, model, ema):
    """The checkpoint's EMA state for `ema`, checked against its parameters' names and shapes."""
    state = _json_meta(path, meta, "ema")
    if not (isinstance(state, dict) and isinstance(state.get("params"), list) and
            all(isinstance(n, str) for n in state["params"]) and isinstance(state.get("num_updates"), int) and
            not isinstance(state["num_updates"], bool) and state["num_updates"] >= 0 and
            isinstance(state.get("decay"), (int, float)) and not isinstance(state["decay"], bool)):
        raise ValueError(f"{path}: corrupt metadata 'ema': expected decay, num_updates and params")
    names = _ema_names(model, ema, f"{path}")
    if state["params"] != names:
        raise ValueError(f"{path}: the checkpoint's EMA averages {len(state['params'])} parameters "
                         f"({', '.join(state['params'][:3])}...), this EMA {len(names)} ({', '.join(names[:3])}...)")
    shadow = []
    for name, p in zip(names, ema.params):
        a = tensors.get(f"ema.{name}")
        if a is None or tuple(a.shape) != tuple(p.shape):
            raise ValueError(f"{path}: the EMA average of {name!r} is "
                             f"{'missing' if a is None else f'of shape {tuple(a.shape)}'}, the parameter "
                             f"{tuple(p.shape)}")
        shadow.append(a)
    return {"decay": state["decay"], "num_updates": state["num_updates"], "shadow": shadow}


def _decoded_metadata(path, meta):
    """The metadata with the values save() encoded as JSON decoded again (and the list of them removed)."""
    if _TYPED not in meta:
        return dict(meta)
    out = dict(meta)
    try:
        keys = json.loads(out.pop(_TYPED))
        if not isinstance(keys, list) or not all(isinstance(k, str) and k in out for k in keys):
            raise ValueError("not a list of its metadata keys")
        for key in keys:
            out[key] = json.loads(out[key])
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: corrupt metadata: {_TYPED}: {e}") from None
    return out


def _json_meta(path, meta, key):
    try:
        return json.loads(meta[key])
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: corrupt metadata {key!r}: {e}") from None


def _uint64(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64


def _param_names(model, optimizer):
    """The model's name of each of the optimizer's params in its groups' order (None for one the model lacks)."""
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return [names.get(id(p)) for g in optimizer.param_groups for p in g["params"]]


def _by_name(path, meta, opt_state, model, optimizer):
    """opt_state with each param's state moved to the position of the param of its name in this optimizer: a
    state_dict is by position, and a model declaring its layers in another order has other positions."""
    saved = _json_meta(path, meta, "optimizer.params")
    own = _param_names(model, optimizer)
    if saved == own or not isinstance(saved, list) or sorted(map(str, saved)) != sorted(map(str, own)):
        return opt_state  # by position, as a state_dict: other names (a tied weight first named otherwise)
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    groups = opt_state["param_groups"]
    if len(set(saved)) != len(saved) or [len(g.get("params", ())) for g in groups] != sizes:
        raise ValueError(f"{path}: corrupt metadata 'optimizer.params', or the optimizer's groups differ")
    at, start = {}, 0
    for i, n in enumerate(sizes):
        names = saved[start:start + n]
        if set(names) != set(own[start:start + n]):
            other = sorted(set(names) ^ set(own[start:start + n]), key=str)[0]
            raise ValueError(f"{path}: the optimizer's parameter group {i} holds {other!r} in one of the checkpoint "
                             "and the optimizer but not the other")
        at.update((name, own.index(name, start, start + n)) for name in names)
        start += n
    keys = [k for g in groups for k in g["params"]]
    state = {at[saved[j]]: opt_state["state"][k] for j, k in enumerate(keys) if k in opt_state["state"]}
    ordered, start = [], 0
    for g, n in zip(groups, sizes):
        ordered.append({**g, "params": list(range(start, start + n))})
        start += n
    return {"state": state, "param_groups": ordered}


def _optimizer_state(path, meta, tensors, optimizer):
    """The optimizer's state_dict from the checkpoint, with every state tensor it lists present and no other."""
    saved_class = meta.get("optimizer.class")
    if saved_class is not None and saved_class != type(optimizer).__name__:
        raise ValueError(f"{path}: the checkpoint holds {saved_class} state, the optimizer is "
                         f"{type(optimizer).__name__}")
    groups = _json_meta(path, meta, "optimizer.param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ValueError(f"{path}: corrupt metadata 'optimizer.param_groups': not a list of groups")
    # JSON has no tuples: hyperparameters such as betas come back as lists
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()} for g in groups]
    present = {key[len("optimizer.state."):] for key in tensors if key.startswith("optimizer.state.")}
    if "optimizer.tensors" in meta:
        listed = _json_meta(path, meta, "optimizer.tensors")
        if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed):
            raise ValueError(f"{path}: corrupt metadata 'optimizer.tensors'")
        missing, unknown = sorted(set(listed) - present), sorted(present - set(listed))
        if missing:
            raise ValueError(f"{path}: the checkpoint lacks optimizer state tensor 'optimizer.state.{missing[0]}'")
        if unknown:
            raise ValueError(f"{path}: the checkpoint has an unexpected optimizer state tensor "
                             f"'optimizer.state.{unknown[0]}'")
    state = {}

    def entry(idx, key):
        try:
            i = int(idx)
        except ValueError:
            raise ValueError(f"{path}: optimizer state {key!r} does not name a param index") from None
        return state.setdefault(i, {})

    for name in present:
        idx, _, key = name.partition(".")
        entry(idx, f"optimizer.state.{name}")[key] = tensors[f"optimizer.state.{name}"]
    for key in meta:
        if key.startswith("optimizer.state."):
            scalars = _json_meta(path, meta, key)
            if not isinstance(scalars, dict):
                raise ValueError(f"{path}: corrupt metadata {key!r}")
            entry(key[len("optimizer.state."):], key).update(scalars)
    keys_of = optimizer._state_keys
    for i, entries in state.items():
        group_keys = {k for g in optimizer.param_groups for k in keys_of(g)}
        for key in entries:
            if key not in group_keys:
                raise ValueError(f"{path}: optimizer state {key!r} of param {i} is not one "
                                 f"{type(optimizer).__name__} keeps")
    return {"state": state, "param_groups": groups}


def _loader_state(path, meta, loader):
    """The checkpoint's loader position, checked against `loader` (when given)."""
    state = _json_meta(path, meta, "loader")
    if not isinstance(state, dict) or not all(isinstance(state.get(k), int) and not isinstance(state.get(k), bool)
                                              and state[k] >= 0 for k in ("epoch", "batch", "seed")):
        raise ValueError(f"{path}: corrupt metadata 'loader': epoch, batch and seed must be integers >= 0")
    if loader is not None and state["batch"] > len(loader):
        raise ValueError(f"{path}: the loader position is batch {state['batch']} of an epoch of {len(loader)}")
    return state


def _like(value, own):
    """Whether a scheduler state's value from a checkpoint has the kind of the scheduler's own: numbers alike (int
    or float), lists element by element, None either way (a value set later)."""
    if value is None or own is None:
        return True
    if isinstance(own, (list, tuple)):
        return isinstance(value, (list, tuple)) and len(value) == len(own) and all(map(_like, value, own))
    number = (int, float)
    if isinstance(own, number) and not isinstance(own, bool):
        return isinstance(value, number) and not isinstance(value, bool)
    return type(value) is type(own)


def _keyed_like(value, own):
    """A mapping read from JSON, whose keys are strings, with integer keys where the scheduler's own has them
    (MultiStepLR's milestones, a Counter of steps), in its type; anything else as it is."""
    if not (isinstance(value, dict) and isinstance(own, dict) and own and all(isinstance(k, int) for k in own)):
        return value
    try:
        return type(own)({int(k): v for k, v in value.items()})
    except ValueError:
        return value


def _scheduler_state(path, meta, scheduler):
    state = _json_meta(path, meta, "scheduler")
    own = scheduler.state_dict()
    if not isinstance(state, dict) or set(state) != set(own):
        raise ValueError(f"{path}: the checkpoint's scheduler state is not one of a {type(scheduler).__name__}")
    state = {key: _keyed_like(value, own[key]) for key, value in state.items()}
    for key, value in state.items():  # checked now, rather than failing in the next fit
        if not _like(value, own[key]):
            raise ValueError(f"{path}: corrupt scheduler state: {key!r} is {value!r}, where a "
                             f"{type(scheduler).__name__} holds a value like {own[key]!r}")
    return state


def load(path: str | os.PathLike[str], into: Module | Program | None = None, *, optimizer: Optimizer | None = None,
         scheduler: LRScheduler | None = None, loader: Loader | None = None, ema: EMA | None = None,
         restore_rng: bool | None = None, strict: bool = True, weights_only: bool = True
         ) -> dict[str, Any] | tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Without `into`: ({name: ndarray}, metadata). With a model or program: loads into it (and into the given
    or the program's optimizer, the scheduler, the loader) and returns the metadata. Everything is checked before
    anything is written: a mismatch names the first tensor that differs, and a failed load changes nothing.
    strict, as load_state_dict's: the model's tensors and the checkpoint's (but the optimizer's) must be the same
    names; strict=False loads those both have and leaves the model's others as they are. Where the names differ,
    such a load is of weights alone (a pretrained backbone under a new head): the optimizer's state and the
    scheduler's, the step count and the dropout stream are not restored. The optimizer's state follows its params'
    names (a model declaring its layers in another order gets each layer's own), as a state_dict's positions do
    not.

    The global random generator gets the checkpoint's state when the load resumes training (an optimizer's state
    or a loader's position is restored) or restore_rng=True; loading weights alone leaves it as it is.
    weights_only is taken for PyTorch's torch.load(path, weights_only=True): a safetensors file holds tensors and
    metadata only, never code, whatever it is."""
    tensors, raw_meta = load_file(path)
    meta = _decoded_metadata(path, raw_meta)
    if into is None:
        return tensors, meta
    from .nn.modules import _is_counter
    from .random import default_generator
    model, program = _program_parts(into)
    if optimizer is None and program is not None:
        optimizer = program.optimizer
    if not isinstance(strict, bool):
        raise TypeError(f"load: strict must be a bool, got {strict!r}")
    # a tied weight under each of its names, as state_dict saves it; a batch norm's count of forwards that the file
    # lacks (PyTorch's older and converted checkpoints) stays as it is, as PyTorch's load_state_dict leaves it
    own = {k: t for k, t in model._state().items() if k in tensors or not _is_counter(k)}
    partial = set(own) != {k for k in tensors if not k.startswith(_STATE_TENSORS)}  # tied: each name
    if strict:
        unexpected = sorted(k for k in tensors if k not in own and not k.startswith(_STATE_TENSORS))
        if unexpected:
            raise KeyError(f"{path}: the checkpoint has {len(unexpected)} tensor(s) the model does not, first "
                           f"{unexpected[0]!r}; strict=False loads only those the model has")
    else:
        own = {k: t for k, t in own.items() if k in tensors}
    for name, t in own.items():
        if name not in tensors:
            raise KeyError(f"{path}: the checkpoint has no tensor {name!r} that the model needs (strict=False "
                           "leaves the model's own)")
        if tuple(tensors[name].shape) != t.shape:
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)} in the checkpoint, "
                             f"{t.shape} in the model")
    opt_state = None
    if partial and "optimizer.param_groups" in raw_meta and optimizer is not None:
        warnings.warn(f"{path}: strict=False loaded {len(own)} of the model's tensors by name; the optimizer's "
                      "state, of other parameters, is not restored (nor the "
                      "scheduler, the step count or the dropout stream): training starts afresh", stacklevel=2)
    elif optimizer is not None and "optimizer.param_groups" in raw_meta:
        opt_state = _optimizer_state(path, raw_meta, tensors, optimizer)
        if "optimizer.params" in raw_meta:
            opt_state = _by_name(path, raw_meta, opt_state, model, optimizer)
    elif optimizer is not None and any(k.startswith("optimizer.state.") for k in tensors):
        warnings.warn(f"{path}: the checkpoint holds optimizer state tensors but not the metadata that describes "
                      "them (rewritten by another tool?): the optimizer's state is not restored, and training "
                      "resumes with a fresh one", stacklevel=2)
    sched_state = _scheduler_state(path, raw_meta, scheduler) \
        if scheduler is not None and "scheduler" in raw_meta and not partial else None
    if scheduler is None and "scheduler" in raw_meta and opt_state is not None:
        warnings.warn(f"{path}: the checkpoint holds a learning-rate scheduler's state that this load does not "
                      "restore, so a new scheduler starts its schedule over; pass scheduler= to resume it",
                      stacklevel=2)
    if ema is not None and "ema" not in raw_meta:
        raise KeyError(f"{path}: the checkpoint holds no EMA (saved without ft.save(..., ema=)) to load into ema=")
    ema_state = _ema_state(path, raw_meta, tensors, model, ema) if ema is not None else None
    if ema is None and "ema" in raw_meta and opt_state is not None:
        warnings.warn(f"{path}: the checkpoint holds an EMA of the weights that this load does not restore; pass "
                      "ema=", stacklevel=2)
    loader_state = _loader_state(path, raw_meta, loader) if loader is not None and "loader" in raw_meta else None
    # without a loader, the position of the Loader ft.fit made of (x, y) arrays: the next fit of the program on
    # arrays goes on from there
    arrays_state = _loader_state(path, raw_meta, None) if loader is None and program is not None and \
        "loader" in raw_meta and opt_state is not None else None
    if restore_rng is None:
        restore_rng = opt_state is not None or loader_state is not None or arrays_state is not None
    rng = None
    if restore_rng and "rng" in raw_meta:
        rng = _json_meta(path, raw_meta, "rng")
        if not (isinstance(rng, list) and len(rng) == 2 and all(_uint64(v) for v in rng)):
            raise ValueError(f"{path}: corrupt metadata 'rng': expected [seed, offset], two integers in [0, 2**64)")
    program_step = dropout = None
    if program is not None and "program.step" in raw_meta and not partial:
        program_step = _json_meta(path, raw_meta, "program.step")
        if not (_uint64(program_step) and program_step < 1 << 63):
            raise ValueError(f"{path}: corrupt metadata 'program.step': {raw_meta['program.step']!r}")
    if program is not None and "program.dropout" in raw_meta and not partial:
        dropout = _json_meta(path, raw_meta, "program.dropout")
        if not (isinstance(dropout, list) and len(dropout) == 2 and all(_uint64(v) for v in dropout)):
            raise ValueError(f"{path}: corrupt metadata 'program.dropout': expected two integers in [0, 2**64)")

    scaler = None
    if program is not None and "program.grad_scaler" in raw_meta:
        if program.grad_scaler is None or not program.grad_scaler.is_enabled():
            warnings.warn(f"{path}: the checkpoint holds a GradScaler state (loss scale and growth count) that this "
                          "program, compiled without an enabled grad_scaler, does not restore; compile with "
                          "grad_scaler=ft.amp.GradScaler() to resume the loss scaling", stacklevel=2)
        else:
            scaler = _json_meta(path, raw_meta, "program.grad_scaler")
            if not isinstance(scaler, dict):
                raise ValueError(f"{path}: corrupt metadata 'program.grad_scaler': expected a GradScaler state_dict")

    # Everything read; the parts whose own checks run as they load go first, and a refusal puts back what was
    # already written. The model goes first: the optimizer checks its state against the parameters.
    previous = {k: t.clone() for k, t in model._state().items()}
    previous_opt = optimizer.state_dict() if opt_state is not None else None
    previous_sched = scheduler.state_dict() if sched_state is not None else None
    previous_ema = ema.state_dict() if ema_state is not None else None
    done = []
    try:
        model.load_state_dict({k: tensors[k] for k in own}, strict=strict)
        done.append(lambda: model.load_state_dict(previous))
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)
            done.append(lambda: optimizer.load_state_dict(previous_opt))
        if sched_state is not None:
            scheduler.load_state_dict(sched_state)
            done.append(lambda: scheduler.load_state_dict(previous_sched))
        if scaler is not None:
            previous_scaler = program.grad_scaler.state_dict()
            program.grad_scaler.load_state_dict(scaler)
            done.append(lambda: program.grad_scaler.load_state_dict(previous_scaler))
        if ema_state is not None:
            ema.load_state_dict(ema_state)
            done.append(lambda: ema.load_state_dict(previous_ema))
        if loader_state is not None:
            loader.load_state_dict(loader_state)
    except Exception as e:
        for undo in reversed(done):
            undo()
        if type(e) in (ValueError, TypeError) and not str(e).startswith(f"{path}:"):  # say which checkpoint
            raise type(e)(f"{path}: {e}") from e
        raise
    if rng is not None:
        default_generator.manual_seed(rng[0])
        default_generator._offset = rng[1]
    if program_step is not None:
        program.step_count = program_step
    if dropout is not None:
        program._c.set_dropout_state(*dropout)
    if arrays_state is not None:
        program.__dict__.pop("_array_loaders", None)
        program._resume_arrays = arrays_state
    return meta
