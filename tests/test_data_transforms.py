"""Each transform against the NumPy reference of tests/data_reference.py
(Pillow's resampling and torchvision's rules, verified against Pillow 11.3),
through the real loader, with the documented Philox draws."""
import numpy as np
import pytest

import fasttrain as ft
import data_reference as R

D = ft.data
SEED = 77


def arrays(n=6, h=23, w=31, c=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, h, w, c) if c else (n, h, w)
    return rng.integers(0, 256, shape, dtype=np.uint8), np.arange(n, dtype=np.int64) * 3


def run(images, labels, transforms, epoch=0, **kw):
    kw.setdefault("num_workers", 0)
    loader = D.Loader((images, labels), batch_size=len(images), transforms=transforms, seed=SEED, **kw)
    loader.set_epoch(epoch)
    (x, y), = list(loader)
    return x, y


def reference(images, ops, normalizes=(), epoch=0):
    out = []
    for i, img in enumerate(images):
        img = img if img.ndim == 3 else img[:, :, None]
        g = R.geometric(img, ops, R.Draws(SEED, epoch, i))
        out.append(R.to_tensor(g, normalizes))
    return np.stack(out)


def check(images, transforms, ops, normalizes=(), epoch=0, **kw):
    x, y = run(images, np.arange(len(images)), transforms, epoch, **kw)
    want = reference(images, ops, normalizes, epoch)
    got = x.numpy()
    assert got.shape == want.shape
    assert np.array_equal(got, want), f"max diff {np.abs(got - want).max()}"
    return got


@pytest.mark.parametrize("size", [(17, 13), (40, 50), (23, 31), (5, 60)])
def test_resize_exact(size):
    images, _ = arrays()
    check(images, [D.Resize(size)], [("Resize", {"size": size})])


@pytest.mark.parametrize("size,max_size", [(12, None), (40, None), (12, 14), (20, 25)])
def test_resize_shorter_edge(size, max_size):
    images, _ = arrays(h=23, w=31)
    check(images, [D.Resize(size, max_size=max_size)], [("Resize", {"size": size, "max_size": max_size})])


def test_random_resized_crop_across_epochs_and_gray():
    images, _ = arrays(n=8, h=40, w=30)
    for epoch in (0, 5):
        check(images, [D.RandomResizedCrop(16)],
              [("RandomResizedCrop", {"size": (16, 16), "scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3)})],
              epoch=epoch)
    gray, _ = arrays(n=5, h=28, w=28, c=0)
    check(gray, [D.RandomResizedCrop((20, 12), scale=(0.3, 0.9), ratio=(0.5, 2.0))],
          [("RandomResizedCrop", {"size": (20, 12), "scale": (0.3, 0.9), "ratio": (0.5, 2.0)})])


def test_random_resized_crop_fallback():
    # An impossible area forces the central-crop fallback after 10 attempts.
    images, _ = arrays(n=3, h=20, w=60)
    check(images, [D.RandomResizedCrop(8, scale=(5.0, 6.0), ratio=(0.9, 1.1))],
          [("RandomResizedCrop", {"size": (8, 8), "scale": (5.0, 6.0), "ratio": (0.9, 1.1)})])


@pytest.mark.parametrize("size", [(11, 7), (23, 31), (30, 40), (25, 10)])
def test_center_crop(size):
    images, _ = arrays()
    check(images, [D.CenterCrop(size)], [("CenterCrop", {"size": size})])


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_random_crop_padding_modes(mode):
    images, _ = arrays(n=6, h=12, w=10)
    check(images, [D.RandomCrop(12, padding=(3, 1, 2, 4), padding_mode=mode, fill=(10, 20, 30))],
          [("RandomCrop", {"size": (12, 12), "padding": (3, 1, 2, 4), "padding_mode": mode,
                           "fill": (10, 20, 30)})])


def test_random_crop_pad_if_needed_and_flip_combinations():
    images, _ = arrays(n=6, h=9, w=14)
    check(images, [D.RandomHorizontalFlip(0.5), D.RandomCrop((16, 12), padding=2, pad_if_needed=True,
                                                              padding_mode="reflect")],
          [("RandomHorizontalFlip", {"p": 0.5}),
           ("RandomCrop", {"size": (16, 12), "padding": (2, 2, 2, 2), "pad_if_needed": True,
                           "padding_mode": "reflect"})])
    check(images, [D.RandomVerticalFlip(0.7), D.RandomHorizontalFlip(0.5), D.Resize((7, 20))],
          [("RandomVerticalFlip", {"p": 0.7}), ("RandomHorizontalFlip", {"p": 0.5}), ("Resize", {"size": (7, 20)})])


def test_random_crop_too_large_is_an_error():
    images, labels = arrays(n=2, h=8, w=8)
    with pytest.raises(ValueError, match="larger than the input"):
        run(images, labels, [D.RandomCrop(10)], image_size=10)


def test_flip_probability_and_normalize():
    images, _ = arrays(n=16, h=5, w=7)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = check(images, [D.RandomHorizontalFlip(), D.Normalize(mean, std)], [("RandomHorizontalFlip", {"p": 0.5})],
                [(mean, std)])
    flipped = sum(not np.array_equal(got[i], R.to_tensor(images[i], [(mean, std)])) for i in range(16))
    assert 2 <= flipped <= 14


def test_imagenet_style_pipeline():
    images, _ = arrays(n=6, h=50, w=37)
    mean, std = (0.5, 0.25, 0.125), (0.2, 0.3, 0.4)
    check(images, [D.RandomResizedCrop(24), D.RandomHorizontalFlip(), D.Normalize(mean, std)],
          [("RandomResizedCrop", {"size": (24, 24), "scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3)}),
           ("RandomHorizontalFlip", {"p": 0.5})], [(mean, std)], epoch=3)
    check(images, [D.Resize(30), D.CenterCrop(24), D.Normalize(mean, std)],
          [("Resize", {"size": 30}), ("CenterCrop", {"size": (24, 24)})], [(mean, std)])


@pytest.mark.parametrize("value", [0, (0.1, -0.2, 0.3), "random"])
def test_random_erasing(value):
    images, _ = arrays(n=10, h=16, w=20)
    mean, std = (0.4, 0.5, 0.6), (0.3, 0.2, 0.1)
    x, _ = run(images, np.arange(10), [D.Normalize(mean, std), D.RandomErasing(p=0.6, value=value)], epoch=2)
    p = {"p": 0.6, "scale": (0.02, 0.33), "ratio": (0.3, 3.3), "value": value}
    erased = 0
    for i in range(10):
        base = R.to_tensor(images[i], [(mean, std)])
        d = R.Draws(SEED, 2, i)
        want = R.erasing(base, p, d, SEED, 2, i, 1, [])
        erased += not np.array_equal(want, base)
        assert np.array_equal(x.numpy()[i], want)
    assert erased >= 2


def test_erasing_before_normalize_passes_through_it():
    images, _ = arrays(n=8, h=12, w=12)
    mean, std = (0.4, 0.5, 0.6), (0.3, 0.2, 0.1)
    x, _ = run(images, np.arange(8), [D.RandomErasing(p=1.0, value=0.5), D.Normalize(mean, std)])
    p = {"p": 1.0, "scale": (0.02, 0.33), "ratio": (0.3, 3.3), "value": 0.5}
    for i in range(8):
        # The rectangle's draws do not depend on pixels: erase the normalized
        # image with the value passed through the Normalize that follows.
        normalized = R.to_tensor(images[i], [(mean, std)])
        want = R.erasing(normalized, p, R.Draws(SEED, 0, i), SEED, 0, i, 0, [(mean, std)])
        assert np.array_equal(x.numpy()[i], want)


def test_cutout():
    images, _ = arrays(n=6, h=20, w=20)
    x, _ = run(images, np.arange(6), [D.Cutout(8, holes=2)])
    for i in range(6):
        want = R.to_tensor(images[i], [])
        d = R.Draws(SEED, 0, i)
        assert d.u() < 1.0
        for _ in range(2):
            cy, cx = d.randint(0, 20), d.randint(0, 20)
            want[:, max(cy - 4, 0):min(cy + 4, 20), max(cx - 4, 0):min(cx + 4, 20)] = 0
        assert np.array_equal(x.numpy()[i], want)


def test_output_dtypes_and_layouts():
    images, _ = arrays(n=4, h=9, w=11)
    ops = [D.RandomCrop(8, padding=1), D.RandomHorizontalFlip()]
    ref_ops = [("RandomCrop", {"size": (8, 8), "padding": (1, 1, 1, 1)}), ("RandomHorizontalFlip", {"p": 0.5})]
    geo = np.stack([R.geometric(img, ref_ops, R.Draws(SEED, 0, i)) for i, img in enumerate(images)])
    x, _ = run(images, np.arange(4), ops + [D.PILToTensor()])
    assert x.dtype is ft.uint8 and np.array_equal(x.numpy(), geo.transpose(0, 3, 1, 2))
    x, _ = run(images, np.arange(4), ops + [D.PILToTensor(channels_last=True)])
    assert tuple(x.shape) == (4, 3, 8, 8) and x.stride()[1] == 1  # PyTorch's channels_last memory format
    assert np.array_equal(x.numpy().transpose(0, 2, 3, 1), geo)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.6, 0.7)
    x, _ = run(images, np.arange(4), ops + [D.Normalize(mean, std), D.ToTensor("bfloat16", channels_last=True)])
    want = np.stack([R.to_tensor(g, [(mean, std)]) for g in geo]).transpose(0, 2, 3, 1)
    assert x.dtype is ft.bfloat16 and tuple(x.shape) == (4, 3, 8, 8) and x.stride()[1] == 1
    got_bits = np.ascontiguousarray(x.float().numpy().transpose(0, 2, 3, 1)).view(np.uint32) >> 16
    assert np.array_equal(got_bits, R.bf16_bits(want))
    x, _ = run(images, np.arange(4), ops, dtype="float16")
    assert np.array_equal(x.numpy(), np.stack([R.to_tensor(g, []) for g in geo]).astype(np.float16))


def test_gray_to_rgb_and_rgb_to_gray():
    gray, _ = arrays(n=3, h=6, w=5, c=0)
    x, _ = run(gray, np.arange(3), [D.PILToTensor()], channels=3)
    assert np.array_equal(x.numpy(), np.repeat(gray[:, None], 3, axis=1))
    rgb, _ = arrays(n=3, h=6, w=5)
    x, _ = run(rgb, np.arange(3), [D.PILToTensor()], channels=1)
    r, g, b = (rgb[..., k].astype(np.uint32) for k in range(3))
    luma = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
    assert np.array_equal(x.numpy()[:, 0], luma.astype(np.uint8))


def test_bad_transform_arguments():
    images, labels = arrays(n=2)
    with pytest.raises(ValueError, match=r"^Normalize needs a floating-point output dtype, not uint8 \(PILToTensor\)"):
        run(images, labels, [D.Normalize(0.5, 0.5), D.PILToTensor()])  # said of the pipeline, not of a file
    with pytest.raises(ValueError, match="before"):
        run(images, labels, [D.Normalize(0.5, 0.5), D.RandomCrop(4)])
    with pytest.raises(ValueError, match="std"):
        run(images, labels, [D.Normalize(0.5, 0.0)])
    with pytest.raises(ValueError, match="bilinear"):
        D.Resize(8, interpolation="nearest")
    with pytest.raises(TypeError, match="not a fasttrain.data transform"):
        run(images, labels, [object()])
