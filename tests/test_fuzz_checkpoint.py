"""Mutation fuzzing of the safetensors reader (a Python parser, so not in the libFuzzer harnesses of
tests/fuzz/): thousands of byte flips, truncations, splices and header edits of a valid checkpoint must
each load as it was or raise ValueError, never another exception or a silently different tensor."""
import json
import random
import struct

import numpy as np
import pytest

from fasttrain.checkpoint import load_file, save_file


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "valid.safetensors"
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1, -2], np.int64),
               "s": np.float32(3.5)}
    save_file(path, tensors, {"epoch": "3"})
    return path.read_bytes(), tensors


def mutations(data, rng):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    yield "flip", bytes(b ^ (1 << rng.randrange(8)) if i == rng.randrange(len(data)) else b
                        for i, b in enumerate(data))
    cut = rng.randrange(len(data))
    yield "truncate", data[:cut]
    yield "splice", data[:cut] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16))) + data[cut:]
    yield "length", struct.pack("<Q", max(0, n + rng.choice([-8, -1, 1, 8, 1 << 40]))) + data[8:]
    name = rng.choice([k for k in header if k != "__metadata__"])
    entry = dict(header[name])
    field, value = rng.choice([("dtype", rng.choice(["F16", "X9", "", 7])),
                               ("shape", rng.choice([[3], [-1, 4], [2 ** 62, 2], "3", [3.5]])),
                               ("data_offsets", rng.choice([[0, 4], [4, 0], [-8, 40], [0, 2 ** 63], [1]]))])
    entry[field] = value
    edited = json.dumps(dict(header, **{name: entry})).encode()
    edited += b" " * (-len(edited) % 8)
    yield "header", struct.pack("<Q", len(edited)) + edited + data[8 + n:]


def test_mutated_checkpoints_load_as_they_were_or_raise_value_error(valid, tmp_path):
    data, tensors = valid
    rng = random.Random(11)
    path = tmp_path / "m.safetensors"
    kinds = set()
    for _ in range(400):
        for kind, blob in mutations(data, rng):
            path.write_bytes(blob)
            try:
                got, _ = load_file(path)
            except ValueError:
                kinds.add(kind)
                continue
            assert all(isinstance(v, np.ndarray) for v in got.values()), kind
            if kind != "flip":  # a flipped byte may rename a tensor or change a value and stay valid; the rest
                assert set(got) == set(tensors), kind  # must not load at all, or load as saved
                for k, v in tensors.items():
                    assert got[k].dtype == v.dtype and got[k].shape == np.shape(v), (kind, k)
    assert kinds >= {"truncate", "length", "header"}  # the mutations reach the checks
