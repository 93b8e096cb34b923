"""PNG samples: files written here by a small encoder of our own (zlib + struct, filter 0 scanlines, optional
Adam7), decoded through ImageFolder / TarShards + Loader and compared with the pixels computed in NumPy
from what was written."""
import io
import struct
import tarfile
import zlib

import numpy as np
import pytest

import fasttrain as ft

D = ft.data

SIGNATURE = b"\x89PNG\r\n\x1a\n"
# (x0, y0, dx, dy) of the seven Adam7 passes.
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
SAMPLES_PER_PIXEL = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def scanlines(samples, depth):
    """Rows of (h, n) sample values, each packed at `depth` bits behind a filter-0 byte."""
    out = b""
    for row in samples:
        if depth == 16:
            data = row.astype(">u2").tobytes()
        elif depth == 8:
            data = row.astype(np.uint8).tobytes()
        else:
            bits = np.unpackbits(row.astype(np.uint8)[:, None], axis=1)[:, 8 - depth:]
            data = np.packbits(bits.reshape(-1)).tobytes()
        out += b"\0" + data
    return out


def encode_png(samples, color_type, depth, palette=None, trns=None, interlace=False):
    """samples: (H, W, samples per pixel) integers; palette: (n, 3); trns: the tRNS chunk's bytes."""
    h, w, _ = samples.shape
    if interlace:
        raw = b""
        for x0, y0, dx, dy in ADAM7:
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:  # an empty pass has no scanlines at all
                raw += scanlines(sub.reshape(sub.shape[0], -1), depth)
    else:
        raw = scanlines(samples.reshape(h, -1), depth)
    out = SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace)))
    if palette is not None:
        out += chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def luma(rgb):
    """Pillow's convert("L") (ITU-R 601-2 in 16-bit fixed point)."""
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)[..., None]


def case(color_type, depth, h=11, w=13, seed=0, trns=False, interlace=False):
    """(name, PNG bytes, expected RGB (H, W, 3), expected gray (H, W, 1)) of a random image."""
    rng = np.random.default_rng(seed * 100 + color_type * 17 + depth)
    spp = SAMPLES_PER_PIXEL[color_type]
    top = (1 << depth) - 1
    palette = trns_bytes = None
    if color_type == 3:
        n = 1 << depth
        palette = rng.integers(0, 256, (n, 3))
        samples = rng.integers(0, n, (h, w, 1))
        rgb = palette[samples[..., 0]].astype(np.uint8)
        if trns:
            trns_bytes = bytes(rng.integers(0, 256, n // 2).astype(np.uint8))
    else:
        samples = rng.integers(0, top + 1, (h, w, spp))
        if trns:
            trns_bytes = struct.pack(">" + "H" * spp, *samples[0, 0])  # the first pixel's color is transparent
        # libpng's expansion of 1, 2, 4-bit gray (v * 255 / top, exact) and png_set_strip_16 (the high byte).
        eight = samples >> 8 if depth == 16 else samples * (255 // top)
        color = eight[..., :3] if color_type in (2, 6) else np.repeat(eight[..., :1], 3, axis=2)
        rgb = color.astype(np.uint8)
    gray = luma(rgb) if color_type in (2, 3, 6) else rgb[..., :1]
    data = encode_png(samples, color_type, depth, palette, trns_bytes, interlace)
    name = f"t{color_type}_d{depth:02d}{'_trns' if trns else ''}{'_adam7' if interlace else ''}_s{seed}"
    return name, data, rgb, gray


def all_cases(**kw):
    kinds = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8), (4, 8),
             (4, 16), (6, 8), (6, 16)]
    out = [case(t, d, **kw) for t, d in kinds]
    out += [case(t, d, trns=True, **kw) for t, d in [(0, 2), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 4), (3, 8)]]
    return out


def write_folder(root, cases):
    (root / "a").mkdir(parents=True)
    for name, data, _, _ in cases:
        (root / "a" / f"{name}.png").write_bytes(data)
    return sorted(cases, key=lambda c: c[0])


def batch(source, n, **kw):
    (x, y), = list(D.Loader(source, batch_size=n, transforms=[D.PILToTensor(channels_last=True)], num_workers=2,
                            **kw))
    return x.numpy().transpose(0, 2, 3, 1), y.numpy()  # (N, H, W, C): the NHWC memory of channels-last batches


@pytest.mark.parametrize("interlace", [False, True])
def test_every_color_type_and_depth_decodes_as_written(tmp_path, interlace):
    cases = write_folder(tmp_path / "tree", all_cases(interlace=interlace))
    folder = D.ImageFolder(tmp_path / "tree")
    assert len(folder) == len(cases) and folder.skipped_images == 0
    for channels, which in ((3, 2), (1, 3)):
        x, y = batch(folder, len(cases), channels=channels)
        assert x.shape == (len(cases), 11, 13, channels) and not y.any()
        for k, c in enumerate(cases):
            np.testing.assert_array_equal(x[k], c[which], err_msg=c[0])


def test_interlaced_images_smaller_than_a_pass(tmp_path):
    """Images of 1 to 3 pixels a side leave some Adam7 passes empty (no scanlines at all)."""
    for h, w in ((1, 1), (1, 3), (3, 1), (2, 2), (3, 3), (1, 9)):
        root = tmp_path / f"tree{h}x{w}"
        cases = write_folder(root, [case(t, d, h=h, w=w, interlace=True) for t, d in ((0, 1), (2, 8), (3, 2),
                                                                                        (6, 16))])
        x, _ = batch(D.ImageFolder(root), len(cases))
        for k, c in enumerate(cases):
            np.testing.assert_array_equal(x[k], c[2], err_msg=f"{c[0]} {h}x{w}")


def test_png_and_jpeg_mix_and_transforms_apply(tmp_path):
    """A folder of both kinds; PNG goes through the same resize as a raw image of its pixels, and the decoded
    cache keeps the same pixels."""
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir(parents=True)
    name, data, rgb, _ = case(2, 8, h=40, w=30)
    (root / "a" / "x.png").write_bytes(data)
    (root / "b" / "y.jpg").write_bytes(D.encode_jpeg(np.full((40, 30, 3), 128, np.uint8)))
    transforms = [D.Resize((20, 15)), D.PILToTensor(channels_last=True)]
    raw = D.Loader((rgb[None], np.zeros(1, np.int64)), transforms=transforms, num_workers=1)
    (want, _), = list(raw)
    for cache in (None, "decoded", "encoded"):
        loader = D.Loader(D.ImageFolder(root), batch_size=2, transforms=transforms, num_workers=1, cache=cache)
        for _ in range(2):  # the second epoch reads the cache
            (x, y), = list(loader)
            np.testing.assert_array_equal(x.numpy()[0], want.numpy()[0])
            assert list(y.numpy()) == [0, 1]


def test_a_file_decodes_by_its_contents_whatever_its_extension(tmp_path):
    """A PNG named .jpg and a JPEG named .png (ImageNet has PNG files named .JPEG; Pillow, and so torchvision,
    reads them) decode as what they are, in a folder and in tar shards; a file of neither format is refused as
    what its name says."""
    _, png, rgb, _ = case(2, 8, h=6, w=5)
    jpeg_rgb = np.full((6, 5, 3), 90, np.uint8)
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "png.jpg").write_bytes(png)
    (root / "a" / "jpeg.png").write_bytes(D.encode_jpeg(jpeg_rgb))
    x, _ = batch(D.ImageFolder(root), 2)
    np.testing.assert_array_equal(x[0], np.full((6, 5, 3), 90, np.uint8))  # jpeg.png: flat gray survives JPEG
    np.testing.assert_array_equal(x[1], rgb)
    path = tmp_path / "shard-0.tar"
    with tarfile.open(path, "w") as tar:
        for key, suffix, payload in (("0", ".jpg", png), ("0", ".cls", b"1")):
            info = tarfile.TarInfo(key + suffix)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    x, y = batch(D.TarShards([str(path)]), 1)
    np.testing.assert_array_equal(x[0], rgb)
    (root / "a" / "zz.jpg").write_bytes(b"GIF89a, neither")
    with pytest.raises(ValueError, match=r"zz\.jpg.*not a JPEG file"):
        batch(D.ImageFolder(root), 3)


def test_tar_shards_take_png_members(tmp_path):
    cases = all_cases(h=5, w=7)[:6]
    path = tmp_path / "shard-0.tar"
    with tarfile.open(path, "w") as tar:
        for k, (name, data, _, _) in enumerate(cases):
            for suffix, payload in ((".png", data), (".cls", str(k).encode())):
                info = tarfile.TarInfo(f"{k:03d}{suffix}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    source = D.TarShards([str(path)])
    assert source.get(0)[0] == "png"
    x, y = batch(source, len(cases))
    assert list(y) == list(range(len(cases)))
    for k, c in enumerate(cases):
        np.testing.assert_array_equal(x[k], c[2], err_msg=c[0])
    with pytest.raises(ValueError, match="PNG file, which record files do not store"):
        D.write_records(tmp_path / "out.rec", source)


def damaged_files():
    _, good, _, _ = case(2, 8, h=16, w=16)
    idat = good.index(b"IDAT")
    n = struct.unpack(">I", good[idat - 4: idat])[0]
    crc_flip = bytearray(good)
    crc_flip[idat + 4 + n] ^= 0x40  # the data intact, its CRC wrong
    zlib_bad = bytearray(good)
    garbage = bytes(i % 256 for i in range(n))
    zlib_bad[idat + 4: idat + 4 + n] = garbage
    zlib_bad[idat + 4 + n: idat + 8 + n] = struct.pack(">I", zlib.crc32(b"IDAT" + garbage))
    text = chunk(b"tEXt", b"Comment\0hello")
    bad_ancillary = good[:idat - 4] + text[:-1] + bytes([text[-1] ^ 1]) + good[idat - 4:]
    huge = SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)) + good[33:]
    return good, {
        "truncated_in_idat": (good[: idat + 20], "truncated file"),
        "truncated_after_header": (good[:40], "cannot decode PNG"),
        "header_only": (good[:33], "truncated file"),
        "idat_crc": (bytes(crc_flip), "CRC"),
        "bad_zlib": (bytes(zlib_bad), "cannot decode PNG: IDAT"),
        "ancillary_crc": (bad_ancillary, "CRC"),
        "not_png": (b"GIF89a, not a PNG at all", "not a PNG file"),
        "bad_color_type": (SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 5, 0, 0, 0)) + good[33:],
                           "color type 5"),
        "too_large": (huge, "larger than the"),
    }


@pytest.mark.parametrize("name", list(damaged_files()[1]))
def test_damaged_files_raise_naming_the_file(tmp_path, name):
    good, bad = damaged_files()
    data, message = bad[name]
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "0_good.png").write_bytes(good)
    (root / "a" / f"1_{name}.png").write_bytes(data)
    (root / "a" / "2_good.png").write_bytes(good)
    with pytest.raises(ValueError, match=rf"1_{name}\.png: .*{message}"):
        list(D.Loader(D.ImageFolder(root), batch_size=3, transforms=[D.CenterCrop(8)], num_workers=2))
    loader = D.Loader(D.ImageFolder(root), batch_size=3, transforms=[D.CenterCrop(8)], num_workers=2,
                      on_error="skip")
    assert sum(len(y) for _, y in loader) == 2
    assert f"1_{name}.png" in loader.stats()["last_error"]


def test_the_first_sample_fixing_the_shape_can_be_damaged(tmp_path):
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "bad.png").write_bytes(SIGNATURE + b"\0\0\0\x0dIHDR")
    with pytest.raises(ValueError, match=r"bad\.png"):
        D.Loader(D.ImageFolder(root))


def test_what_libpng_only_warns_about_decodes(tmp_path):
    """Not errors: image data split over several IDAT chunks, private and misplaced ancillary chunks, a gAMA
    of the wrong length (libpng warns and ignores it), bytes after IEND, no IEND (not read: decoding stops
    after the last row). An unknown critical chunk is an error."""
    _, good, rgb, _ = case(2, 8, h=6, w=5)
    idat, iend = good.index(b"IDAT") - 4, good.index(b"IEND") - 4
    z = good[idat + 8: iend - 4]
    split = good[:idat] + chunk(b"IDAT", z[:5]) + chunk(b"IDAT", z[5:9]) + chunk(b"IDAT", z[9:]) + good[iend:]
    files = {
        "split_idat": split,
        "private_chunk": good[:idat] + chunk(b"prVt", b"abc") + good[idat:],
        "bad_gama_length": good[:idat] + chunk(b"gAMA", b"\0\0\1") + good[idat:],
        "gama_after_idat": good[:iend] + chunk(b"gAMA", struct.pack(">I", 45000)) + good[iend:],
        "trailing_bytes": good + b"more bytes after the end",
        "no_iend": good[:iend],
    }
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    for name, data in files.items():
        (root / "a" / f"{name}.png").write_bytes(data)
    x, _ = batch(D.ImageFolder(root), len(files))
    for k in range(len(files)):
        np.testing.assert_array_equal(x[k], rgb)
    (root / "a" / "z_critical.png").write_bytes(good[:idat] + chunk(b"CRIT", b"") + good[idat:])
    with pytest.raises(ValueError, match=r"z_critical\.png: cannot decode PNG: CRIT: unhandled critical chunk"):
        batch(D.ImageFolder(root), len(files) + 1)
