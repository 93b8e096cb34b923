"""JPEG decoding against libjpeg-turbo's own djpeg on real photos and on Go's
image/testdata (every chroma subsampling, progressive, grayscale, CMYK), DCT
scaling, truncated and corrupt files, and the three file-based sources."""
import io
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

import fasttrain as ft
import data_reference as R

D = ft.data
GO_TESTDATA = "/usr/share/go-1.19/src/image/testdata"  # Debian golang-1.19-src
SKLEARN_IMAGES = "/usr/lib/python3/dist-packages/sklearn/datasets/images"  # Debian python3-sklearn


def files_in(folder, suffix, package):
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} is absent: install Debian's {package}")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(suffix))


def go_jpegs():
    return files_in(GO_TESTDATA, ".jpeg", "golang-1.19-src")


def photos():
    return files_in(SKLEARN_IMAGES, ".jpg", "python3-sklearn")


def djpeg(path, *args):
    if not shutil.which("djpeg"):
        pytest.skip("djpeg is absent: install Debian's libjpeg-turbo-progs")
    out = subprocess.run(["djpeg", *args, path], capture_output=True, check=True).stdout
    return R.read_pnm(out)


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("scale", ["1/1", "1/2", "1/4", "1/8"])
def test_decode_equals_djpeg(scale):
    files = go_jpegs() + photos()
    assert len(files) >= 20
    num = 8 // int(scale.split("/")[1])
    for path in files:
        want = djpeg(path, "-scale", scale)
        got = D.decode_jpeg(read(path), num / 8)
        if want.shape[2] == 1:  # grayscale files come out replicated as RGB
            want = np.repeat(want, 3, axis=2)
        assert got.shape == want.shape, path
        assert np.array_equal(got, want), path


def test_odd_subsamplings_and_kinds_are_covered():
    infos = {os.path.basename(p): D.jpeg_info(read(p)) for p in go_jpegs()}
    assert infos["video-001.cmyk.jpeg"]["components"] == 4
    assert infos["video-005.gray.jpeg"]["components"] == 1
    assert infos["video-001.progressive.jpeg"]["progressive"]
    for name in ("video-001.q50.410.jpeg", "video-001.q50.411.jpeg", "video-001.q50.440.jpeg",
                 "video-001.221212.jpeg"):
        assert infos[name]["width"] == 150 and infos[name]["height"] == 103


def test_grayscale_decode_equals_djpeg():
    for path in go_jpegs() + photos():
        if "cmyk" in path:
            continue  # djpeg has no CMYK -> grayscale conversion
        assert np.array_equal(D.decode_jpeg(read(path), mode="L"), djpeg(path, "-grayscale")), path


def test_a_gray_batch_of_colour_files_is_pillows_luma_of_their_rgb(tmp_path):
    """Loader(channels=1) over colour JPEGs gives Pillow's convert("L") of the RGB pixels (torchvision's
    Grayscale), as for PNG and raw samples: not libjpeg's Y plane, which differs by the chroma's rounding."""
    differs = False
    for k, p in enumerate([p for p in go_jpegs() + photos() if "gray" not in p][:4]):
        root = tmp_path / f"tree{k}"
        (root / "a").mkdir(parents=True)
        (root / "a" / "x.jpg").write_bytes(read(p))
        rgb = D.decode_jpeg(read(p)).astype(np.int64)
        want = (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16
        x, _ = next(iter(D.Loader(D.ImageFolder(root), channels=1, num_workers=1,
                                  transforms=[D.PILToTensor(channels_last=True)])))
        np.testing.assert_array_equal(x.numpy()[0, 0], want, err_msg=p)
        differs |= not np.array_equal(want, D.decode_jpeg(read(p), mode="L"))
    assert differs  # the two lumas differ on these files: the test tells them apart


def test_truncated_and_corrupt_files():
    china = read(photos()[0])
    with pytest.raises(ValueError, match="truncated|Premature"):
        D.decode_jpeg(china[: len(china) // 3])
    with pytest.raises(ValueError, match="JPEG"):
        D.decode_jpeg(china[:100])
    with pytest.raises(ValueError, match="not a JPEG"):
        D.decode_jpeg(b"hello world, not an image")
    broken = bytearray(china)
    broken[len(broken) // 2: len(broken) // 2 + 64] = b"\xff\xd9" * 32  # EOI markers inside the scan
    with pytest.raises(ValueError):
        D.decode_jpeg(bytes(broken))


def build_tree(tmp_path, n_copies=3):
    """An ImageFolder of the 150x103 Go frames (colour and gray, every subsampling) in two classes."""
    files = [p for p in go_jpegs() if "truncated" not in p]
    root = tmp_path / "tree"
    samples = []
    for k, path in enumerate(files * n_copies):
        cls = "b_gray" if "gray" in path else "a_color"
        name = f"{k:03d}_{os.path.basename(path)[:-5].replace('.', '_')}.jpg"
        os.makedirs(root / cls, exist_ok=True)
        shutil.copy(path, root / cls / name)
        samples.append((cls, name, path))
    samples.sort()
    return root, samples


def write_tar(path, samples, root):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for cls, name, _ in samples:
            key = f"{cls}/{name[:-4]}"
            tar.add(root / cls / name, arcname=key + ".jpg")
            label = str(["a_color", "b_gray"].index(cls)).encode()
            info = tarfile.TarInfo(key + ".cls")
            info.size = len(label)
            tar.addfile(info, io.BytesIO(label))


def test_loader_pixels_equal_djpeg(tmp_path):
    root, samples = build_tree(tmp_path, n_copies=1)
    loader = D.Loader(D.ImageFolder(root), batch_size=len(samples), transforms=[D.PILToTensor(channels_last=True)],
                      num_workers=2)
    (x, y), = list(loader)
    for k, (cls, name, path) in enumerate(samples):
        want = djpeg(path)
        want = np.repeat(want, 3, axis=2) if want.shape[2] == 1 else want
        assert np.array_equal(x.numpy()[k].transpose(1, 2, 0), want), path
        assert int(y[k]) == ["a_color", "b_gray"].index(cls)
    folder = loader.source  # torchvision's attributes: the same samples, paths and labels
    assert folder.class_to_idx == {"a_color": 0, "b_gray": 1}
    assert folder.samples == folder.imgs == [(str(root / cls / name), ["a_color", "b_gray"].index(cls))
                                             for cls, name, _ in samples]
    assert folder.targets == [int(v) for v in y.numpy()]


def test_sources_agree_and_workers_do_not_matter(tmp_path):
    root, samples = build_tree(tmp_path)
    write_tar(tmp_path / "shard-0.tar", samples, root)
    tf = [D.RandomResizedCrop(48), D.RandomHorizontalFlip(), D.Normalize((0.5, 0.4, 0.3), (0.2, 0.2, 0.2))]
    folder = D.ImageFolder(root)
    assert folder.classes == ["a_color", "b_gray"]
    records = D.write_records(tmp_path / "all.rec", folder)
    assert records.class_names == ["a_color", "b_gray"]
    sources = [folder, D.TarShards(str(tmp_path / "shard-*.tar")), records]
    ref = None
    for src in sources:
        for workers in (1, 2, 4):
            loader = D.Loader(src, batch_size=7, transforms=tf, shuffle=True, seed=5, num_workers=workers)
            loader.set_epoch(2)
            batches = [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]
            if ref is None:
                ref = batches
            assert len(batches) == len(ref)
            for (x, y), (rx, ry) in zip(batches, ref):
                assert np.array_equal(x, rx) and np.array_equal(y, ry), (src, workers)


def test_dct_scaled_decode_matches_box_resampling():
    path = photos()[0]  # 640 x 427
    data = read(path)
    for scale_den, size in ((8, (40, 60)), (4, (100, 150)), (2, (200, 300))):
        loader = D.Loader(D.RecordFile(_one_record(data)), batch_size=1, transforms=[D.Resize(size)],
                          num_workers=0, dct_scale=True, dtype="uint8")
        (x, _), = list(loader)
        small = djpeg(path, "-scale", f"1/{scale_den}")
        f = 1 / scale_den
        want = R.pil_resize_box(small, size[0], size[1], (0.0, 0.0, 640 * f, 427 * f))
        assert np.array_equal(x.numpy()[0].transpose(1, 2, 0), want), size
        full = D.Loader(D.RecordFile(_one_record(data)), batch_size=1, transforms=[D.Resize(size)],
                        num_workers=0, dct_scale=False, dtype="uint8")
        (xf, _), = list(full)
        assert np.array_equal(xf.numpy()[0].transpose(1, 2, 0), R.pil_resize(djpeg(path), *size))
        # Close in value to the full-size result: the scaling is an approximation.
        assert np.abs(xf.numpy().astype(int) - x.numpy()).mean() < 4


_counter = [0]


def _one_record(data):
    import tempfile
    _counter[0] += 1
    path = os.path.join(tempfile.gettempdir(), f"ft_one_{os.getpid()}_{_counter[0]}.rec")
    with D.RecordWriter(path) as w:
        w.add_jpeg(data, 0)
    return path


def test_corrupt_files_raise_or_skip(tmp_path):
    root, samples = build_tree(tmp_path, n_copies=1)
    bad = root / "a_color" / samples[3][1]
    good = read(bad)
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=samples[3][1]):
        for _ in D.Loader(D.ImageFolder(root), batch_size=4, transforms=[D.CenterCrop(64)], num_workers=2):
            pass
    loader = D.Loader(D.ImageFolder(root), batch_size=4, transforms=[D.CenterCrop(64)], num_workers=2,
                      on_error="skip")
    sizes = [len(y) for _, y in loader]
    assert sum(sizes) == len(samples) - 1 and sizes[0] == 3
    st = loader.stats()
    assert st["skipped"] == 1 and samples[3][1] in st["last_error"]
    # A file that disappears after the folder was listed: OSError naming it.
    src = D.ImageFolder(root)
    os.unlink(root / "a_color" / samples[0][1])
    with pytest.raises(OSError, match=samples[0][1]):
        list(D.Loader(src, batch_size=4, transforms=[D.CenterCrop(64)], num_workers=1))
