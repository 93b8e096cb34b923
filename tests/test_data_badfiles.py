"""Damaged and hostile inputs to the data pipeline: each must raise a clear
error naming the file, never hang, crash or give silently wrong batches."""
import struct

import numpy as np
import pytest

import fasttrain as ft

D = ft.data


def write_raw(path, records):
    """A record file of raw records (height, width, channels, payload) whose headers claim what they are given,
    written byte by byte as record-format.md lays it out (the writer refuses bad sizes)."""
    body, offsets = b"", []
    for height, width, channels, payload in records:
        offsets.append(64 + len(body))
        fields = struct.pack("<IQqIIII", 2, len(payload), 7, height, width, channels, 0)
        body += struct.pack("<I", ft._C.crc32c(fields + payload)) + fields + payload + b"\0" * (-len(payload) % 8)
    index = struct.pack(f"<{len(offsets)}Q", *offsets)
    index_off = 64 + len(body)
    head = b"FTRECORD" + struct.pack("<IIQQQQI", 1, 0, len(offsets), index_off, index_off + len(index), 0,
                                     ft._C.crc32c(index))
    head += struct.pack("<I", ft._C.crc32c(head)) + b"\0" * 8
    path.write_bytes(head + body + index)


# 2900561549 * 4239809835 * 3 = 2^64 + 13: the product wraps around 64 bits onto 13 bytes.
WRAP_H, WRAP_W = 2900561549, 4239809835


def test_raw_sizes_whose_product_wraps_are_refused(tmp_path):
    with D.RecordWriter(tmp_path / "w.rec") as w:
        with pytest.raises(ValueError, match="raw record"):
            w._add(2, b"x" * 13, 0, WRAP_H, WRAP_W, 3)
        w.add_image(np.zeros((2, 3), np.uint8), 0)
    path = tmp_path / "wrap.rec"
    write_raw(path, [(4, 4, 1, bytes(16)), (WRAP_H, WRAP_W, 3, b"x" * 13)])
    rf = D.RecordFile(path)
    with pytest.raises(ValueError, match=r"wrap\.rec: record 1 claims 2900561549 x 4239809835 x 3"):
        rf.get(1)
    for transforms in ([D.RandomHorizontalFlip(), D.Resize((4, 4))], [D.Resize((4, 4))], [D.CenterCrop(4)]):
        with pytest.raises(ValueError, match=r"wrap\.rec#1: record 1 claims"):
            list(D.Loader(path, transforms=transforms, num_workers=1))
        loader = D.Loader(path, transforms=transforms, num_workers=1, on_error="skip")
        assert sum(len(y) for _, y in loader) == 1
        assert loader.stats()["errors"] == 1
    # The first sample fixes the batch shape when the loader is built.
    first = tmp_path / "first.rec"
    write_raw(first, [(WRAP_H, WRAP_W, 3, b"x" * 13)])
    with pytest.raises(ValueError, match=r"first\.rec#0: record 0 claims"):
        D.Loader(first, transforms=[D.Resize((4, 4))])


def test_zero_sided_raw_record_is_refused(tmp_path):
    path = tmp_path / "zero.rec"
    write_raw(path, [(0, 5, 1, b"")])
    with pytest.raises(ValueError, match="claims 0 x 5 x 1"):
        D.RecordFile(path).get(0)


def test_nonzero_header_flags_are_refused(tmp_path):
    path = tmp_path / "flags.rec"
    D.write_records(path, (np.zeros((2, 3, 3), np.uint8), np.arange(2)))
    data = bytearray(path.read_bytes())
    data[12:16] = struct.pack("<I", 4)
    data[52:56] = struct.pack("<I", ft._C.crc32c(bytes(data[:52])))
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"flags\.rec: header flags 0x4"):
        D.RecordFile(path)
    with pytest.raises(ValueError, match=r"flags\.rec: header flags 0x4"):  # a newer writer's: not recovered
        D.RecordFile(path, recover=True)
    data[12:16], data[8:12] = struct.pack("<I", 0), struct.pack("<I", 2)
    data[52:56] = struct.pack("<I", ft._C.crc32c(bytes(data[:52])))
    path.write_bytes(bytes(data))
    for recover in (False, True):
        with pytest.raises(ValueError, match=r"record format version 2, this build reads version 1"):
            D.RecordFile(path, recover=recover)


def test_loader_errors_name_the_sample_once(tmp_path):
    path = tmp_path / "once.rec"
    D.write_records(path, (np.arange(3 * 16, dtype=np.uint8).reshape(3, 4, 4), np.arange(3)))
    data = bytearray(path.read_bytes())
    data[64 + 56 + 40] ^= 0x55  # record 1's first pixel
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        list(D.Loader(path, batch_size=3, num_workers=1))
    assert str(e.value).count(str(path)) == 1 and str(e.value).startswith(f"{path}#1: record 1 fails")
    root = tmp_path / "folder"
    (root / "a").mkdir(parents=True)
    (root / "a" / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError) as e:
        list(D.Loader(root, batch_size=1, num_workers=1, image_size=8))
    assert str(e.value).count("bad.jpg") == 1


def tar_member(name, payload, kind=b"0"):
    import tarfile
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.type = kind
    return info.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (-len(payload) % 512)


def test_pax_length_near_2_64_is_an_error(tmp_path):
    jpeg = D.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
    good = tmp_path / "good.tar"
    good.write_bytes(tar_member("PaxHeader", b"16 path=s/a.jpg\n", b"x") + tar_member("ignored", jpeg)
                     + tar_member("s/a.cls", b"3") + b"\0" * 1024)
    assert len(D.TarShards(good)) == 1 and D.TarShards(good).get(0)[2] == 3
    for record in (b"18446744073709551610 path=a.jpg\n", b"99999999999999999999999999 path=a.jpg\n",
                   b"3 path=a.jpg\n", b"x path=a.jpg\n"):
        path = tmp_path / "evil.tar"
        path.write_bytes(tar_member("PaxHeader", record, b"x") + tar_member("a.jpg", jpeg)
                         + tar_member("a.cls", b"1") + b"\0" * 1024)
        with pytest.raises(ValueError, match=r"evil\.tar: bad pax extended header record at byte 51[25]"):
            D.TarShards(path)


def test_named_pipes_in_an_image_folder_never_block(tmp_path):
    import os
    root = tmp_path / "folder"
    (root / "a").mkdir(parents=True)
    (root / "a" / "good.jpg").write_bytes(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    os.mkfifo(root / "a" / "x.jpg")
    folder = D.ImageFolder(root)
    assert len(folder) == 1
    assert [len(y) for _, y in D.Loader(folder, num_workers=1)] == [1]
    # A sample replaced by a pipe after the listing fails instead of blocking the worker in open().
    os.unlink(root / "a" / "good.jpg")
    os.mkfifo(root / "a" / "good.jpg")
    with pytest.raises(OSError, match=r"good\.jpg is not a regular file"):
        list(D.Loader(folder, num_workers=1))


def test_links_back_up_an_image_folder_are_not_walked_again(tmp_path):
    """Links to directories are followed (os.walk(followlinks=True), torchvision's), but not one leading back to a
    directory the walk is in: a class directory linking to itself and to the root listed its files once per level
    of nesting the system allowed, and with both the walk never ended. A link to another directory is walked."""
    import os
    root = tmp_path / "folder"
    for c in ("a", "b", "elsewhere"):
        (root / c).mkdir(parents=True)
    for name in ("a/x.jpg", "b/y.jpg", "elsewhere/z.jpg"):
        (root / name).write_bytes(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    os.symlink(root / "a", root / "a" / "loop")
    os.symlink(root, root / "a" / "up")
    os.symlink(root / "b", root / "a" / "to_b")
    folder = D.ImageFolder(root)
    assert folder.classes == ["a", "b", "elsewhere"]
    assert sorted(os.path.relpath(folder.describe(i), root) for i in range(len(folder))) == [
        "a/to_b/y.jpg", "a/x.jpg", "b/y.jpg", "elsewhere/z.jpg"]


def test_image_files_it_cannot_decode_are_named_in_a_warning(tmp_path):
    """Images in a format it does not decode (BMP, WebP, ...) are skipped with one warning that counts them,
    not silently; other files (labels, notes) are not counted."""
    root = tmp_path / "folder"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        (root / c / "good.jpg").write_bytes(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    (root / "a" / "x.bmp").write_bytes(b"not decoded")
    (root / "b" / "y.WEBP").write_bytes(b"not decoded")
    (root / "b" / "notes.txt").write_text("not an image")
    with pytest.warns(UserWarning, match=r"2 image files that are not JPEG or PNG .* are skipped") as record:
        folder = D.ImageFolder(root)
    assert len(record) == 1 and len(folder) == 2 and folder.skipped_images == 2
    (root / "a" / "x.bmp").unlink()
    (root / "b" / "y.WEBP").unlink()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.ImageFolder(root).skipped_images == 0


def test_a_record_file_truncated_after_it_was_opened_is_an_error(tmp_path):
    import os
    path = tmp_path / "cut.rec"
    # more batches than the loader's ring holds: its workers start reading at construction, and a ring that held
    # the whole file could be full before the cut
    D.write_records(path, (np.zeros((400, 64, 64), np.uint8), np.arange(400)))
    rf = D.RecordFile(path)
    loader = D.Loader(path, batch_size=5, num_workers=1)
    os.truncate(path, 3 * 4096)  # a mapping of the file would turn reads of the later records into SIGBUS
    with pytest.raises(OSError, match=r"cut\.rec was truncated after it was opened \(it ends before byte \d+\)"):
        rf.get(9)
    assert rf.get(1)[2] == 1  # the index was read at open: records before the cut still read
    with pytest.raises(OSError, match=r"cut\.rec was truncated after it was opened"):
        list(loader)


def test_a_tar_shard_truncated_after_it_was_opened_is_an_error(tmp_path):
    import os
    jpeg = D.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
    path = tmp_path / "cut.tar"
    path.write_bytes(b"".join(tar_member(f"{k:02d}.jpg", jpeg + bytes(4096)) + tar_member(f"{k:02d}.cls", b"1")
                              for k in range(8)) + b"\0" * 1024)
    shards = D.TarShards(path)
    os.truncate(path, 4096)
    with pytest.raises(OSError, match=r"cut\.tar was truncated after it was opened"):
        shards.get(7)


def test_a_channel_mismatch_names_the_loaders_channels_option(tmp_path):
    """Grayscale JPEGs decode to 3 channels unless asked; a model of 1 channel says what to pass."""
    root = tmp_path / "gray"
    (root / "a").mkdir(parents=True)
    for i in range(4):
        (root / "a" / f"{i}.jpg").write_bytes(D.encode_jpeg(np.full((8, 8, 1), 40 * i, np.uint8)))
    model = ft.nn.Sequential(ft.nn.Conv2d(1, 2, 3), ft.nn.Flatten(), ft.nn.Linear(72, 2))
    program = model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=4, input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match=r"have 3 channels, the model takes 1 .*channels=1"):
        ft.fit(program, D.Loader(D.ImageFolder(root), batch_size=4, num_workers=1), epochs=1, progress=False)
    history = ft.fit(program, D.Loader(D.ImageFolder(root), batch_size=4, num_workers=1, channels=1), epochs=1,
                     progress=False)
    assert len(history["train_loss"]) == 1


def test_a_jpeg_header_asking_for_gigabytes_is_refused(tmp_path):
    """A valid-looking 65535x65535 frame header is refused before any buffer is sized from it."""
    jpeg = bytearray(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5:sof + 9] = b"\xff\xff\xff\xff"  # height, width
    with pytest.raises(ValueError, match=r"JPEG of 65535x65535 pixels is larger than"):
        D.jpeg_info(bytes(jpeg))
    root = tmp_path / "big"
    (root / "a").mkdir(parents=True)
    (root / "a" / "huge.jpg").write_bytes(bytes(jpeg))
    with pytest.raises(ValueError, match=r"huge\.jpg.*65535x65535"):
        list(D.Loader(D.ImageFolder(root), batch_size=1, num_workers=1, transforms=[D.Resize(8)]))


def test_a_missing_image_folder_is_file_not_found(tmp_path):
    """As torchvision's ImageFolder (FileNotFoundError is an OSError too)."""
    for root in (tmp_path / "missing", str(tmp_path / "missing")):
        with pytest.raises(FileNotFoundError, match="missing is not a directory"):
            D.ImageFolder(root)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="file is not a directory"):
        D.ImageFolder(tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="typo_dir: no such file or directory .a Loader reads an ImageFolder"):
        D.Loader(tmp_path / "typo_dir")  # it said "cannot open record file"


def test_a_class_directory_without_images_is_refused_unless_allowed(tmp_path):
    """As torchvision (FileNotFoundError, allow_empty=): an empty class directory kept silently shifted nothing
    but left a label no sample has, which a model sized from len(classes) trained towards without a word."""
    root = tmp_path / "folder"
    for c in ("a", "b", "c", "d"):
        (root / c).mkdir(parents=True)
    for name in ("a/1.jpg", "a/2.jpg", "c/1.jpg"):
        (root / name).write_bytes(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    (root / "d" / "notes.txt").write_text("not an image")
    with pytest.raises(FileNotFoundError, match=r"no \.jpg, \.jpeg or \.png file for the classes 'b', 'd' "
                                                r"\(pass allow_empty=True"):
        D.ImageFolder(root)
    folder = D.ImageFolder(root, allow_empty=True)
    assert folder.classes == ["a", "b", "c", "d"] and folder.class_counts == [2, 0, 1, 0]
    assert [folder.get(i)[2] for i in range(len(folder))] == [0, 0, 2]
    (root / "b" / "1.jpeg").write_bytes(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    (root / "d" / "x.jpg").write_bytes(D.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    assert D.ImageFolder(root).class_counts == [2, 1, 1, 1]
