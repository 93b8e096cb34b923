"""Checkpoints in the safetensors format (an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and byte range, then
the raw data), readable by safetensors.numpy and PyTorch.

ft.save writes the model's parameters and buffers under PyTorch's key names,
the optimizer's state, and in the string metadata the optimizer's
hyperparameters, the scheduler, the random generator, the data loader's
position and the epoch/step, atomically (a temporary file, fsync, rename).
ft.load checks everything before it changes anything."""
import json
import math
import os
import struct

import numpy as np

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


def save_file(path, tensors, metadata=None):
    """Writes {name: ndarray} and string metadata to `path` atomically."""
    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        a = np.asarray(value)
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would also turn 0-d arrays into 1-d ones)
            a = a.copy(order="C")
        n = a.nbytes
        header[name] = {"dtype": _dtype_code(a), "shape": list(a.shape), "data_offsets": [offset, offset + n]}
        arrays.append(a)
        offset += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    directory = os.path.dirname(os.path.abspath(path))
    import tempfile  # here, not at the top: with shutil and random it is a tenth of import fasttrain's own time
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".safetensors")
    try:
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
    """({name: ndarray}, metadata) from a safetensors file; ValueError for a corrupt or truncated one."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (only {len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(_MAX_HEADER, len(data) - 8):
        raise ValueError(f"{path}: corrupt or truncated safetensors file (header of {n} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: corrupt safetensors header: {e}") from None
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
            if not all(isinstance(v, int) and v >= 0 for v in [*shape, begin, end]):
                raise ValueError("shape and offsets must be non-negative integers")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: corrupt entry for tensor {name!r}: {e}") from None
        itemsize = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        if not begin <= end <= len(body) or end - begin != math.prod(shape) * itemsize:  # exact Python ints
            raise ValueError(f"{path}: tensor {name!r} lies outside the file or has the wrong size (truncated?)")
        spans.append((begin, end, name))
        raw = np.frombuffer(body[begin:end], dtype=np.uint16 if dtype == "BF16" else _DTYPES[dtype])
        tensors[name] = (raw.reshape(shape), dtype)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError(f"{path}: tensors {n0!r} and {n1!r} overlap")
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
        raise TypeError(f"ft.save expects a Module or a compiled Program, got {type(obj).__name__}")
    return model, obj


def save(path, obj, *, optimizer=None, scheduler=None, loader=None, epoch=None, step=None, metadata=None):
    """Saves a model or a compiled program (with its optimizer) and the training position to `path`."""
    from .random import default_generator
    model, program = _program_parts(obj)
    if optimizer is None and program is not None:
        optimizer = program.optimizer
    tensors = dict(model.state_dict())
    meta = {"format": "fasttrain", "rng": json.dumps([default_generator.initial_seed(), default_generator._offset])}
    if optimizer is not None:
        state = optimizer.state_dict()
        for idx, entries in state["state"].items():
            scalars = {}
            for key, value in entries.items():
                if isinstance(value, np.ndarray):
                    tensors[f"optimizer.state.{idx}.{key}"] = value
                else:
                    scalars[key] = value
            if scalars:
                meta[f"optimizer.state.{idx}"] = json.dumps(scalars)
        meta["optimizer.param_groups"] = json.dumps(state["param_groups"])
        meta["optimizer.class"] = type(optimizer).__name__
    if scheduler is not None:
        meta["scheduler"] = json.dumps(scheduler.state_dict(), default=str)
    if loader is not None:
        meta["loader"] = json.dumps(loader.state_dict())
    if epoch is not None:
        meta["epoch"] = str(epoch)
    if step is not None:
        meta["step"] = str(step)
    if program is not None:
        meta["program.step"] = str(program.step_count)
        meta["program.dropout"] = json.dumps(program._c.get_dropout_state())
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    save_file(path, tensors, meta)


def load(path, into=None, *, optimizer=None, scheduler=None, loader=None):
    """Without `into`: ({name: ndarray}, metadata). With a model or program: loads into it (and into the given
    or the program's optimizer, the scheduler, the loader and the random generator) and returns the metadata.
    Every shape is checked before anything is written: a mismatch names the first tensor that differs."""
    tensors, meta = load_file(path)
    if into is None:
        return tensors, meta
    from .random import default_generator
    model, program = _program_parts(into)
    if optimizer is None and program is not None:
        optimizer = program.optimizer
    own = dict(list(model.named_parameters()) + list(model.named_buffers()))
    for name, t in own.items():
        if name not in tensors:
            raise KeyError(f"{path}: the checkpoint has no tensor {name!r} that the model needs")
        if tuple(tensors[name].shape) != t.shape:
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)} in the checkpoint, "
                             f"{t.shape} in the model")
    opt_state = None
    if optimizer is not None and "optimizer.param_groups" in meta:
        saved_class = meta.get("optimizer.class")
        if saved_class is not None and saved_class != type(optimizer).__name__:
            raise ValueError(f"{path}: the checkpoint holds {saved_class} state, the optimizer is "
                             f"{type(optimizer).__name__}")
        # JSON has no tuples: hyperparameters such as betas come back as lists
        groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
                  for g in json.loads(meta["optimizer.param_groups"])]
        state = {}
        for key, value in tensors.items():
            if key.startswith("optimizer.state."):
                idx, name = key[len("optimizer.state."):].split(".", 1)
                state.setdefault(int(idx), {})[name] = value
        for key, value in meta.items():
            if key.startswith("optimizer.state."):
                state.setdefault(int(key[len("optimizer.state."):]), {}).update(json.loads(value))
        opt_state = {"state": state, "param_groups": groups}
    # The model is written first (the optimizer checks its state against the parameters); if the optimizer then
    # refuses its part, the model gets its previous values back, so a failed load changes nothing.
    previous = model.state_dict()
    model.load_state_dict({k: tensors[k] for k in own})
    try:
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)
    except Exception:
        model.load_state_dict(previous)
        raise
    if scheduler is not None and "scheduler" in meta:
        scheduler.load_state_dict(json.loads(meta["scheduler"]))
    if loader is not None and "loader" in meta:
        loader.load_state_dict(json.loads(meta["loader"]))
    if "rng" in meta:
        seed, offset = json.loads(meta["rng"])
        default_generator.manual_seed(seed)
        default_generator._offset = offset
    if program is not None and "program.step" in meta:
        program.step_count = int(meta["program.step"])
    if program is not None and "program.dropout" in meta:
        program._c.set_dropout_state(*json.loads(meta["program.dropout"]))
    return meta
