"""The record file from Python: writer, round trip, checksums, truncation,
converters, and Fashion-MNIST."""
import os
import threading
import time

import numpy as np
import pytest

import fasttrain as ft

D = ft.data


def test_crc32c_check_value():
    assert ft._C.crc32c(b"123456789") == 0xE3069283
    assert ft._C.crc32c(b"6789", ft._C.crc32c(b"12345")) == 0xE3069283


def write_mixed(path, n=20):
    rng = np.random.default_rng(1)
    items = []
    with D.RecordWriter(path) as w:
        w.meta = {"classes": ["x", "y"]}
        for i in range(n):
            if i % 3 == 0:
                img = rng.integers(0, 256, (16, 12, 3), np.uint8)
                data = D.encode_jpeg(img, quality=85, subsampling="444")
                w.add_jpeg(data, i)
                items.append(("jpeg", data, i))
            else:
                img = rng.integers(0, 256, (5 + i % 4, 7) + ((3,) if i % 2 else ()), np.uint8)
                w.add_image(img, -i)
                items.append(("raw", img, -i))
    return items


def test_round_trip(tmp_path):
    path = tmp_path / "mixed.rec"
    items = write_mixed(path)
    rf = D.RecordFile(path)
    assert len(rf) == 20 and rf.metadata == {"classes": ["x", "y"]}
    for i, (kind, payload, label) in enumerate(items):
        k, data, lab, h, w, c = rf.get(i)
        assert k == kind and lab == label
        if kind == "jpeg":
            assert data == payload
        else:
            img = payload if payload.ndim == 3 else payload[:, :, None]
            assert (h, w, c) == img.shape and data == img.tobytes()
    assert not os.path.exists(str(path) + ".tmp")


def test_writer_failure_leaves_nothing(tmp_path):
    path = tmp_path / "broken.rec"
    with pytest.raises(RuntimeError):
        with D.RecordWriter(path) as w:
            w.add_image(np.zeros((2, 2), np.uint8), 0)
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="an image must be"):
        D.RecordWriter(tmp_path / "x.rec").add_image(np.zeros((2, 2, 2), np.uint8), 0)


def test_labels_and_bytes_the_readers_would_not_take_are_refused_when_written(tmp_path):
    """A label 1.5 or True was stored truncated, as 1; bytes that are no JPEG were written and refused only when a
    reader decoded them: both are refused by add_jpeg / add_image, and the file keeps only good samples."""
    jpeg = D.encode_jpeg(np.zeros((4, 4, 3), np.uint8))
    path = tmp_path / "labels.rec"
    with D.RecordWriter(path) as w:
        for label in (1.5, True, np.float32(2.0), "3"):
            with pytest.raises(TypeError, match="a label must be an integer"):
                w.add_jpeg(jpeg, label)
            with pytest.raises(TypeError, match="a label must be an integer"):
                w.add_image(np.zeros((2, 2), np.uint8), label)
        for data in (b"", b"\x89PNG\r\n\x1a\n", b"garbage"):
            with pytest.raises(ValueError, match="the data is no JPEG"):
                w.add_jpeg(data, 0)
        w.add_jpeg(jpeg, np.int64(4))
    rf = D.RecordFile(path)
    assert len(rf) == 1 and rf.get(0)[2] == 4


@pytest.mark.parametrize("pixels", [np.full((4, 4, 3), 0.5, np.float32), np.full((4, 4), 300), [[1, 2], [3, 4]]])
def test_pixels_other_than_uint8_are_refused_not_wrapped(tmp_path, pixels):
    """Float pixels in [0, 1] stored as uint8 would all be 0, 300 would be 44: both writers refuse any dtype but
    uint8 (as torchvision's encode_jpeg), and the record file is not left behind."""
    with pytest.raises(TypeError, match="pixels must be uint8"):
        D.encode_jpeg(pixels)
    with pytest.raises(TypeError, match="pixels must be uint8"):
        with D.RecordWriter(tmp_path / "x.rec") as w:
            w.add_image(pixels, 0)
    assert os.listdir(tmp_path) == []


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x55]))


def test_crc_mismatch_raise_and_skip(tmp_path):
    path = tmp_path / "a.rec"
    images = np.arange(10 * 4 * 4, dtype=np.uint8).reshape(10, 4, 4)
    D.write_records(path, (images, np.arange(10)))
    # Record 4's payload: 64-byte header, then 40 + 16 bytes per record.
    flip(path, 64 + 4 * 56 + 40 + 3)
    with pytest.raises(ValueError, match=r"a\.rec#4.*CRC32C"):
        list(D.Loader(path, batch_size=3, num_workers=2))
    loader = D.Loader(path, batch_size=3, num_workers=2, on_error="skip", dtype="uint8")
    labels = np.concatenate([y.numpy() for _, y in loader])
    assert list(labels) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert loader.stats()["skipped"] == 1
    # verify=False reads the damaged bytes as they are.
    assert len(list(D.Loader(path, batch_size=3, num_workers=1, verify=False))) == 4


def test_truncation_and_recovery(tmp_path):
    path = tmp_path / "t.rec"
    images = np.arange(10 * 4 * 4, dtype=np.uint8).reshape(10, 4, 4)
    D.write_records(path, (images, np.arange(10)))
    size = os.path.getsize(path)
    os.truncate(path, size - 100)
    with pytest.raises(ValueError, match="truncated"):
        D.RecordFile(path)
    rf = D.RecordFile(path, recover=True)
    assert len(rf) == 9  # the index (80 bytes) and part of record 9 are gone
    (x, y), = list(D.Loader(rf, batch_size=9, num_workers=1, dtype="uint8"))
    assert np.array_equal(x.numpy()[:, 0], images[:9]) and list(y.numpy()) == list(range(9))
    with open(path, "wb") as f:
        f.write(b"nothing")
    with pytest.raises(ValueError, match="not a fasttrain record file"):
        D.RecordFile(path)
    with pytest.raises(OSError):
        D.RecordFile(tmp_path / "missing.rec")


def fashion():
    try:
        return D.FashionMNIST(train=False)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_fashion_mnist_arrays_and_records(tmp_path):
    test = fashion()
    assert test.images.shape == (10000, 28, 28) and test.labels.shape == (10000,)
    assert set(np.unique(test.labels)) == set(range(10)) and len(test.class_names) == 10
    assert isinstance(test.images, np.memmap)  # mapped, not loaded
    rf = test.to_records(tmp_path / "fmnist-test.rec")
    assert len(rf) == 10000 and rf.metadata["classes"][9] == "Ankle boot"
    tf = [D.RandomCrop(28, padding=2), D.RandomHorizontalFlip(), D.Normalize(0.286, 0.353)]
    a = D.Loader(test, batch_size=1000, transforms=tf, shuffle=True, num_workers=2)
    b = D.Loader(rf, batch_size=1000, transforms=tf, shuffle=True, num_workers=1)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert np.array_equal(xa.numpy(), xb.numpy()) and np.array_equal(ya.numpy(), yb.numpy())
    assert tuple(xa.shape) == (1000, 1, 28, 28)


@pytest.mark.parametrize("end", ["abort", "close"])
def test_writer_end_from_another_thread_waits_for_a_running_add(tmp_path, end):
    path = tmp_path / "w.rec"
    writer = D.RecordWriter(path)
    payload = b"\xff\xd8" + bytes(8 << 20)  # large: the add runs without the GIL
    added, outcome = [], []

    def add_until_closed():
        try:
            while True:
                writer.add_jpeg(payload, len(added))
                added.append(1)
        except ValueError as e:
            outcome.append(e)

    adder = threading.Thread(target=add_until_closed)
    adder.start()
    while not added:
        time.sleep(0.001)
    getattr(writer, end)()
    adder.join()
    assert len(outcome) == 1 and "closed" in str(outcome[0])
    if end == "abort":
        assert os.listdir(tmp_path) == []
    else:
        rf = D.RecordFile(path)
        assert len(rf) == len(added) and rf.get(len(added) - 1)[1] == payload
