"""The data pipeline: sources, torchvision-style transforms, and a Loader whose
worker threads (C, no GIL, no processes) decode, augment and batch samples.

    import fasttrain as ft
    train = ft.data.FashionMNIST(train=True)
    loader = ft.data.Loader(train, batch_size=256, shuffle=True, num_workers=2,
                            transforms=[ft.data.RandomCrop(28, padding=2),
                                        ft.data.RandomHorizontalFlip(),
                                        ft.data.Normalize(0.286, 0.353)])
    for images, labels in loader:     # (256, 1, 28, 28) float32, (256,) int64
        ...

Randomness is a pure function of (seed, epoch, sample index): batches are
bitwise identical for any num_workers. docs/data.md has the details.
"""
import glob as _glob
import json
import math
import numbers
import operator
import os
import warnings
import weakref

import numpy as np

from . import _C
from ._types import _BY_NAME, as_device, as_dtype
from .creation import _check_int64_range, from_numpy
from .random import _check_seed, initial_seed

__all__ = [
    "Loader", "Source", "RecordFile", "ImageFolder", "TarShards", "ArraySource", "from_arrays", "FashionMNIST",
    "RecordWriter", "write_records", "decode_jpeg", "encode_jpeg", "jpeg_info",
    "RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip",
    "Normalize", "RandomErasing", "Cutout", "ToTensor", "PILToTensor",
]

# ---------------------------------------------------------------- transforms

# Transform kinds and padding modes as csrc/data/augment.h numbers them.
_RRC, _RESIZE, _CENTER, _RCROP, _HFLIP, _VFLIP, _NORMALIZE, _ERASE, _CUTOUT = range(1, 10)
_PAD_MODES = {"constant": 0, "edge": 1, "reflect": 2, "symmetric": 3}


def _pair(size, what):
    if isinstance(size, numbers.Integral):
        return int(size), int(size)
    size = tuple(int(s) for s in size)
    if len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError(f"{what}: size must be an int or (h, w), got {size}")
    return size


def _check_interpolation(interpolation, antialias, what):
    name = getattr(interpolation, "value", interpolation)
    if str(name).lower() not in ("bilinear", "2"):
        raise ValueError(f"{what}: only bilinear interpolation is implemented, got {interpolation!r}")
    if antialias is False:
        raise ValueError(f"{what}: resizing is always antialiased (as torchvision on PIL images)")


class Transform:
    """Base of the transforms: each describes itself to the C pipeline."""

    def _spec(self):
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class RandomResizedCrop(Transform):
    """torchvision.transforms.RandomResizedCrop: a random area fraction in `scale` and aspect ratio in `ratio`
    (log-uniform), 10 attempts then a central crop, resized to `size` (bilinear, antialiased)."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation="bilinear",
                 antialias=True):
        _check_interpolation(interpolation, antialias, "RandomResizedCrop")
        self.size = _pair(size, "RandomResizedCrop")
        self.scale = tuple(float(s) for s in scale)
        self.ratio = tuple(float(r) for r in ratio)

    def _spec(self):
        return {"kind": _RRC, "height": self.size[0], "width": self.size[1], "scale": self.scale,
                "ratio": self.ratio}


class Resize(Transform):
    """torchvision.transforms.Resize: an int matches the shorter edge (keeping the aspect ratio, `max_size`
    caps the longer one); (h, w) resizes to exactly that. Bilinear, antialiased, exactly as Pillow."""

    def __init__(self, size, interpolation="bilinear", max_size=None, antialias=True):
        _check_interpolation(interpolation, antialias, "Resize")
        if isinstance(size, numbers.Integral) or len(size) == 1:
            self.size = int(size) if isinstance(size, numbers.Integral) else int(size[0])
        else:
            self.size = _pair(size, "Resize")
            if max_size is not None:
                raise ValueError("Resize: max_size is only allowed when size is a single int")
        self.max_size = max_size

    def _spec(self):
        if isinstance(self.size, int):
            return {"kind": _RESIZE, "height": self.size, "width": 0, "max_size": self.max_size or 0}
        return {"kind": _RESIZE, "height": self.size[0], "width": self.size[1]}


class CenterCrop(Transform):
    """torchvision.transforms.CenterCrop (pads with zeros when the crop is larger than the image)."""

    def __init__(self, size):
        self.size = _pair(size, "CenterCrop")

    def _spec(self):
        return {"kind": _CENTER, "height": self.size[0], "width": self.size[1]}


def _padding4(padding):
    if padding is None:
        return (0, 0, 0, 0)
    if isinstance(padding, numbers.Integral):
        return (int(padding),) * 4
    padding = tuple(int(p) for p in padding)
    if len(padding) == 1:
        return padding * 4
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    if len(padding) == 4:
        return padding
    raise ValueError(f"padding must be an int or 1, 2 or 4 ints, got {padding}")


def _fill(value, what):
    if isinstance(value, numbers.Number):
        return (float(value),)
    value = tuple(float(v) for v in value)
    if len(value) not in (1, 3):
        raise ValueError(f"{what}: give one fill value or one per channel, got {value}")
    return value


class RandomCrop(Transform):
    """torchvision.transforms.RandomCrop: optional padding (left, top, right, bottom rules of F.pad) with
    padding_mode constant (fill), edge, reflect or symmetric, pad_if_needed, then a random crop."""

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        if padding_mode not in _PAD_MODES:
            raise ValueError(f"padding_mode must be one of {sorted(_PAD_MODES)}, got {padding_mode!r}")
        self.size = _pair(size, "RandomCrop")
        self.padding = padding
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = fill
        self.padding_mode = padding_mode

    def _spec(self):
        return {"kind": _RCROP, "height": self.size[0], "width": self.size[1], "padding": _padding4(self.padding),
                "pad_if_needed": self.pad_if_needed, "padding_mode": _PAD_MODES[self.padding_mode],
                "fill": _fill(self.fill, "RandomCrop")}


class RandomHorizontalFlip(Transform):
    """torchvision.transforms.RandomHorizontalFlip: mirrors the image left to right with probability p."""

    def __init__(self, p=0.5):
        self.p = float(p)

    def _spec(self):
        return {"kind": _HFLIP, "p": self.p}


class RandomVerticalFlip(Transform):
    """torchvision.transforms.RandomVerticalFlip: flips the image upside down with probability p."""

    def __init__(self, p=0.5):
        self.p = float(p)

    def _spec(self):
        return {"kind": _VFLIP, "p": self.p}


def _per_channel(v, what):
    if isinstance(v, numbers.Number):
        return (float(v),) * 3
    v = tuple(float(x) for x in v)
    if len(v) == 1:
        return v * 3
    if len(v) != 3:
        raise ValueError(f"{what} needs 1 or 3 values, got {len(v)}")
    return v


class Normalize(Transform):
    """torchvision.transforms.Normalize on the [0, 1] values: (x - mean) / std per channel, in float32.

    inplace is torchvision's argument: the pipeline always works in place on a sample no caller sees
    (torchvision's inplace=True), so both values give the same batches."""

    def __init__(self, mean, std, inplace=False):
        self.mean = _per_channel(mean, "Normalize mean")
        self.std = _per_channel(std, "Normalize std")

    def _spec(self):
        return {"kind": _NORMALIZE, "mean": self.mean, "std": self.std}


class RandomErasing(Transform):
    """torchvision.transforms.RandomErasing on the output tensor; value is a number, one per channel, or
    'random' (standard normal noise from Philox). inplace: as Normalize's, both values give the same batches."""

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace=False):
        self.p = float(p)
        self.scale = tuple(float(s) for s in scale)
        self.ratio = tuple(float(r) for r in ratio)
        if isinstance(value, str) and value != "random":
            raise ValueError("RandomErasing: value must be a number, a sequence or 'random'")
        self.value = value

    def _spec(self):
        spec = {"kind": _ERASE, "p": self.p, "scale": self.scale, "ratio": self.ratio}
        if self.value == "random":
            spec["random_fill"] = True
        else:
            spec["fill"] = _fill(self.value, "RandomErasing")
        return spec


class Cutout(Transform):
    """Cutout (DeVries & Taylor 2017): `holes` squares of side `size`, centred at uniform random pixels and
    clipped at the borders, set to `value` on the output tensor."""

    def __init__(self, size, holes=1, p=1.0, value=0):
        self.size = int(size)
        self.holes = int(holes)
        self.p = float(p)
        self.value = value

    def _spec(self):
        return {"kind": _CUTOUT, "length": self.size, "holes": self.holes, "p": self.p,
                "fill": _fill(self.value, "Cutout")}


class ToTensor:
    """Marks the conversion of the pipeline's uint8 pixels to the batch: values / 255 in `dtype` (float32,
    bfloat16 or float16), (N, C, H, W) in NCHW memory, or with channels_last in NHWC memory (PyTorch's
    channels_last memory format: the same shape, NHWC strides). Without it the Loader's own dtype/channels_last
    arguments apply (float32, NCHW by default)."""

    def __init__(self, dtype="float32", channels_last=False):
        self.dtype = as_dtype(dtype)
        self.channels_last = bool(channels_last)

    def __repr__(self):
        return f"ToTensor(dtype={self.dtype!r}, channels_last={self.channels_last})"


class PILToTensor(ToTensor):
    """Keeps uint8 pixel values (torchvision's PILToTensor), (N, C, H, W) in NCHW memory unless channels_last."""

    def __init__(self, channels_last=False):
        super().__init__("uint8", channels_last)


# ---------------------------------------------------------------- sources

class Source(_C.DataSource):
    """A collection of samples the Loader reads from C: len(source), source.get(i)."""

    def __repr__(self):
        return f"<{type(self).__name__} of {len(self)} samples ({self.kind})>"


class RecordFile(Source):
    """A fasttrain record file (docs/record-format.md), read with pread. With recover=True a file cut short
    (its index lost) is read by walking its records and keeping those whose checksum holds."""

    def __new__(cls, path, recover=False):
        self = super().__new__(cls, "record", os.fspath(path), bool(recover))
        self.path = os.fspath(path)
        return self

    def __init__(self, path, recover=False):
        pass

    @property
    def metadata(self):
        """The writer's metadata dict ({} when none)."""
        m = self.meta
        return json.loads(m.decode()) if m else {}

    @property
    def class_names(self):
        """The class names stored in the file's metadata under 'classes' ([] when none)."""
        return self.metadata.get("classes", [])


class ImageFolder(Source):
    """torchvision's ImageFolder layout, read directly: root/<class>/.../*.jpg; classes sorted by name and
    numbered from 0; .jpg/.jpeg and .png files are samples. A class directory without any is refused, as by
    torchvision, unless allow_empty=True (its label is then never drawn)."""

    def __new__(cls, root, allow_empty=False):
        if not os.path.isdir(root):  # FileNotFoundError, as torchvision raises
            raise FileNotFoundError(f"ImageFolder root {os.fspath(root)} is not a directory")
        self = super().__new__(cls, "image_folder", os.fspath(root))
        self.root = os.fspath(root)
        empty = [name for name, n in zip(self.classes, self.class_counts) if n == 0]
        if empty and not allow_empty:
            raise FileNotFoundError(f"ImageFolder {self.root}: no .jpg, .jpeg or .png file for the class"
                                    f"{'es' if len(empty) > 1 else ''} {', '.join(map(repr, empty))} (pass "
                                    "allow_empty=True to keep such classes, as torchvision's allow_empty)")
        if self.skipped_images:
            warnings.warn(f"ImageFolder {self.root}: {self.skipped_images} image files that are not JPEG or PNG "
                          f"(.bmp, .webp, ...) are skipped; only .jpg, .jpeg and .png files are samples", stacklevel=2)
        return self

    def __init__(self, root, allow_empty=False):
        pass

    @property
    def class_names(self):
        """The class folder names, sorted: label i is class_names[i]."""
        return self.classes

    @property
    def class_to_idx(self):
        """{class folder name: its label}, as torchvision's."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self):
        """The label of each sample, in order (the samples are grouped by class), as torchvision's."""
        return [label for label, n in enumerate(self.class_counts) for _ in range(n)]

    @property
    def samples(self):
        """[(path, label)] of each sample, in order, as torchvision's (and its alias imgs)."""
        return [(self.describe(i), label) for i, label in enumerate(self.targets)]

    imgs = samples


class TarShards(Source):
    """WebDataset tar shards: members KEY.jpg (or .jpeg, .png) with KEY.cls (decimal label), grouped by key.
    `shards` is a path, a glob pattern, or a list of paths."""

    def __new__(cls, shards):
        if isinstance(shards, (str, os.PathLike)):
            pattern = os.fspath(shards)
            paths = sorted(_glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        else:
            paths = [os.fspath(p) for p in shards]
        if not paths:
            raise FileNotFoundError(f"no tar shards match {shards!r}")
        self = super().__new__(cls, "tar", paths)
        self.paths = paths
        return self

    def __init__(self, shards):
        pass


def _host_tensor(a, what):
    """a (a NumPy array, a CPU tensor, another library's through DLPack (PyTorch's bfloat16 too), nested lists) as
    a tensor sharing its memory where it can."""
    from .creation import as_tensor
    if not isinstance(a, (np.ndarray, _C.TensorBase)) and not hasattr(a, "__dlpack__"):
        a = np.asarray(a)
    if isinstance(a, np.ndarray) and not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    t = as_tensor(a)
    if t.device.type != "cpu":
        raise ValueError(f"{what} are on {t.device}: a loader reads arrays in host memory (move them with .cpu())")
    return t


class ArraySource(Source):
    """Arrays shared without a copy (NumPy arrays or CPU fasttrain tensors), of one of two kinds:

    - uint8 images (N, H, W) or (N, H, W, C) and integer labels (N,): decoded and transformed as images;
    - features of a floating dtype (float32, float64, bfloat16, float16) or integers (token ids, which batches
      give as int64) of any shape (N, ...) and targets (N, ...): integers (class labels), which batches give as
      int64, or floats (regression targets), which batches give as float32. The Loader batches their rows as
      they are: no transforms.
    """

    def __new__(cls, images, labels):
        if isinstance(labels, (tuple, list)) and labels and all(hasattr(a, "shape") for a in labels):
            raise TypeError(f"a Loader's batches hold one label array, got a {type(labels).__name__} of "
                            f"{len(labels)}: a program of several targets takes (x, (y1, ..., y{len(labels)})) "
                            "arrays in ft.fit, or an iterable of such batches")
        x, y = _host_tensor(images, "the images"), _host_tensor(labels, "the labels")
        if x.dtype.name == "uint8":
            if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype.name == "bool":
                raise TypeError(f"labels of uint8 images must be integers, got {y.dtype.name}")
            kind = "arrays"
        elif x.dtype.is_floating_point or not (x.dtype.is_complex or x.dtype.name == "bool"):
            kind = "tensors"
            if not x.dtype.is_floating_point:
                _check_int64_range(x, "integer features")
        else:
            raise TypeError(f"arrays must be uint8 images, floating-point features or integer ones (token ids), got "
                            f"{x.dtype.name}")
        if not (y.dtype.is_floating_point or y.dtype.is_complex):
            _check_int64_range(y, "labels")
        self = super().__new__(cls, kind, (x, y))
        self.images = images
        self.labels = labels
        return self

    def __init__(self, images, labels):
        pass


def from_arrays(images, labels):
    """A source over arrays, shared without a copy (NumPy arrays or CPU tensors): uint8 images (N, H, W[, C]) with
    integer labels (N,), or floating-point features (N, ...) with integer or floating targets (N, ...); see
    ArraySource."""
    return ArraySource(images, labels)


def _as_source(source):
    if isinstance(source, _C.DataSource):
        return source
    if isinstance(source, tuple) and len(source) == 2:
        return ArraySource(*source)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            return ImageFolder(path)
        if path.endswith(".tar") or any(c in path for c in "*?["):
            return TarShards(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file or directory (a Loader reads an ImageFolder directory, "
                                    "a record file, .tar shards or a glob of them)")
        return RecordFile(path)
    raise TypeError(f"cannot read samples from {type(source).__name__}: give a Source, a path, (images, labels) "
                    f"or (features, targets) arrays; a dataset of Python samples (__getitem__ and __len__, "
                    f"torch's Dataset) is batched by ft.utils.data.DataLoader(dataset, batch_size=...)")


# ---------------------------------------------------------------- Fashion-MNIST

_FASHION_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]


def _data_home():
    return os.environ.get("FASTTRAIN_DATA") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fasttrain")


def _unpacked_idx(gz_path, cache_dir):
    """The IDX file decompressed once into the cache (written atomically), so that it can be mapped."""
    out = os.path.join(cache_dir, os.path.basename(gz_path)[:-3])
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(gz_path):
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{out}.tmp{os.getpid()}"
        import gzip  # here, not at the top: only Fashion-MNIST's first use needs it, not import fasttrain
        with gzip.open(gz_path, "rb") as src, open(tmp, "wb") as dst:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                dst.write(chunk)
        os.replace(tmp, out)
    return out


def _map_idx(path):
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or head[:2] != b"\0\0" or head[2] != 0x08:
            raise ValueError(f"{path} is not an IDX file of unsigned bytes")
        ndim = head[3]
        dims = [int.from_bytes(f.read(4), "big") for _ in range(ndim)]
    return np.memmap(path, dtype=np.uint8, mode="r", offset=4 + 4 * ndim, shape=tuple(dims))


class FashionMNIST(ArraySource):
    """Fashion-MNIST from Debian's dataset-fashion-mnist package: 60000 training or 10000 test images
    (N, 28, 28) uint8 and labels (N,) uint8, memory-mapped (the gzip files are unpacked once into
    $FASTTRAIN_DATA or ~/.cache/fasttrain) and shared with the loader without a copy."""

    classes_names = FASHION_MNIST_CLASSES

    def __new__(cls, train=True, root=None):
        src_dir = root or next((d for d in _FASHION_DIRS if os.path.isdir(d)), None)
        if src_dir is None:
            raise FileNotFoundError("Fashion-MNIST not found: install Debian's dataset-fashion-mnist "
                                    "(apt-get install dataset-fashion-mnist) or pass root=")
        prefix = "train" if train else "t10k"
        cache_dir = os.path.join(_data_home(), "fashion-mnist")
        paths = []
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            raw = os.path.join(src_dir, f"{prefix}-{kind}")
            paths.append(raw if os.path.exists(raw) else _unpacked_idx(raw + ".gz", cache_dir))
        images, labels = _map_idx(paths[0]), _map_idx(paths[1])
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(f"unexpected Fashion-MNIST shapes {images.shape} and {labels.shape}")
        self = super().__new__(cls, images, labels)
        self.train = bool(train)
        return self

    def __init__(self, train=True, root=None):
        pass

    @property
    def class_names(self):
        """Fashion-MNIST's ten class names: label i is class_names[i]."""
        return FASHION_MNIST_CLASSES

    def to_records(self, path, quality=None):
        """Writes the split to a record file (raw pixels, or JPEG at `quality`); returns a RecordFile."""
        return write_records(path, self, quality=quality, meta={"classes": FASHION_MNIST_CLASSES,
                                                                 "dataset": "fashion-mnist",
                                                                 "split": "train" if self.train else "test"})


# ---------------------------------------------------------------- writing records

def _label(label):
    """An integer label as an int: 1.5 or True are refused, not truncated."""
    if isinstance(label, (bool, np.bool_)):
        raise TypeError(f"a label must be an integer, got {label!r}")
    try:
        return operator.index(label)
    except TypeError:
        raise TypeError(f"a label must be an integer, got {type(label).__name__} {label!r}") from None


class RecordWriter(_C.RecordWriterBase):
    """Writes a record file; use as a context manager (a writer left without close() removes its partial
    file). add_jpeg(bytes, label) stores encoded JPEG; add_image(uint8 (H, W) or (H, W, C), label) raw pixels."""

    def __init__(self, path):
        super().__init__(os.fspath(path))
        self.path = os.fspath(path)

    def add_jpeg(self, data, label):
        """Appends a sample stored as encoded JPEG bytes, with its integer label."""
        if bytes(memoryview(data)[:2]) != b"\xff\xd8":  # what readers would refuse only when they decode it
            raise ValueError("add_jpeg: the data is no JPEG (it does not start with the marker FF D8); store raw "
                             "pixels with add_image")
        self._add(1, data, _label(label))

    def add_image(self, pixels, label):
        """Appends a sample stored as raw uint8 pixels (H, W), (H, W, 1) or (H, W, 3), with its integer label."""
        a = np.ascontiguousarray(_uint8_pixels(pixels, "add_image"))
        if a.ndim == 2:
            a = a[:, :, None]
        if a.ndim != 3 or a.shape[2] not in (1, 3):
            raise ValueError(f"an image must be (H, W), (H, W, 1) or (H, W, 3) uint8, got shape {a.shape}")
        self._add(2, a, _label(label), a.shape[0], a.shape[1], a.shape[2])

    def close(self, meta=None):
        super().close(json.dumps(meta).encode() if meta is not None else b"")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close(getattr(self, "meta", None))
        else:
            self.abort()
        return False


def write_records(path, source, quality=None, meta=None):
    """Converts any source (a Source, a directory in ImageFolder layout, tar shards, or (images, labels)
    arrays) into one record file. JPEG samples are copied as they are; raw pixels are stored raw, or encoded
    as JPEG when `quality` is given; a PNG sample is refused (record files do not store PNG). The class names
    go into the file's metadata. Returns a RecordFile."""
    src = _as_source(source)
    if meta is None:
        meta = {}
        names = getattr(src, "class_names", None) or getattr(src, "classes", None)
        if names:
            meta["classes"] = list(names)
    with RecordWriter(path) as w:
        w.meta = meta
        for i in range(len(src)):
            kind, data, label, h, wd, c = src.get(i)
            if kind == "jpeg":
                w.add_jpeg(data, label)
            elif kind == "png":
                raise ValueError(f"sample {i} is a PNG file, which record files do not store (JPEG or raw pixels)")
            elif quality is not None:
                px = np.frombuffer(data, np.uint8).reshape(h, wd, c)
                w.add_jpeg(encode_jpeg(px, quality=quality), label)
            else:
                w._add(2, data, label, h, wd, c)
    return RecordFile(path)


# ---------------------------------------------------------------- JPEG helpers

def jpeg_info(data):
    """{'height', 'width', 'components', 'progressive'} of a JPEG file's bytes."""
    return _C.jpeg_info(data)


def decode_jpeg(data, scale=1, mode="RGB"):
    """Decodes JPEG bytes with TurboJPEG as the loader does: (H, W, 3) uint8 for mode 'RGB', (H, W, 1) for
    'L' (libjpeg's luma); scale 1, 1/2, 1/4, 1/8 (any n/8) decodes in the DCT domain at that size."""
    num = round(float(scale) * 8)
    if not 1 <= num <= 16 or abs(num / 8 - float(scale)) > 1e-9:
        raise ValueError(f"scale must be n/8 for n in 1..16, got {scale}")
    return _C.jpeg_decode(data, num, {"RGB": 3, "L": 1}[mode])


def encode_jpeg(pixels, quality=90, subsampling="420", progressive=False):
    """Encodes uint8 (H, W) or (H, W, 1|3) pixels with TurboJPEG; returns bytes."""
    return _C.jpeg_encode(_uint8_pixels(pixels, "encode_jpeg"), quality, subsampling, progressive)


def _uint8_pixels(pixels, op):
    """pixels as a uint8 array; another dtype is a TypeError (as torchvision's encode_jpeg), never wrapped modulo 256
    (float pixels in [0, 1] would all be 0)."""
    a = np.asarray(pixels)
    if a.dtype != np.uint8:
        raise TypeError(f"{op}: pixels must be uint8 (0-255), got {a.dtype}: convert them first (float pixels in "
                        "[0, 1]: (x * 255).round().astype(np.uint8))")
    return a


# ---------------------------------------------------------------- Loader

_ON_ERROR = {"raise": 0, "skip": 1}
_CACHE = {None: 0, "none": 0, "encoded": 1, "decoded": 2}


def _cache_config(cache):
    if cache is None or cache is False:
        return 0, 0
    mode, budget = cache, None
    if isinstance(cache, dict):
        mode, budget = cache.get("mode", "decoded"), cache.get("bytes")
    elif isinstance(cache, (tuple, list)):
        mode, budget = cache
    elif isinstance(cache, numbers.Integral) and not isinstance(cache, bool):
        mode, budget = "decoded", int(cache)
    if mode not in ("encoded", "decoded"):
        raise ValueError(f"cache must be None, 'encoded', 'decoded', (mode, bytes) or a byte budget, got {cache!r}")
    if budget is None:
        budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    return _CACHE[mode], int(budget)


class _LoaderIterator:
    """One pass over a Loader. A batch that fails (on_error='raise') raises from next() and the pass goes on
    with the following batch: calling next() again, or a new `for` loop over the loader, continues there."""

    def __init__(self, loader):
        self._loader = loader
        self._done = self._ended = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        if self._ended:
            raise RuntimeError("this pass over the Loader was ended by a newer one (a nested loop over the same "
                               "Loader, a second iter(), set_epoch or load_state_dict): a Loader has one position; "
                               "iterate a second Loader for two passes at once")
        loader = self._loader
        try:
            item = loader._next()
        except (ValueError, OSError):
            # The C loader has moved past the bad batch: a new pass resumes after it instead of replaying it.
            loader._resume = True
            raise
        if item is None:
            self._done = True
            loader._resume, loader._tally = False, None
            loader.epoch = loader._position()[0]  # the next one's, where C now stands
            raise StopIteration
        # No reference to the batch stays here: once the consumer drops it, its buffer can be reused.
        return item[0], item[1]


class Loader(_C.LoaderBase):
    """Batches from a source, made by C worker threads.

    Iterating gives (images, labels): images (N, C, H, W) float32 (or the ToTensor dtype / layout), labels (N,)
    int64, in order, N = batch_size except in a last partial batch (or when on_error='skip' dropped samples).
    Feature arrays (from_arrays) give (features, targets): their rows as they are, the features float32 (or
    `dtype`: bfloat16, float16), the targets int64 or float32; they take no transforms and no image options.
    `epoch` counts the epochs whose batches are all done (set_epoch sets it, as DistributedSampler's). The
    transforms are given torchvision-style; their random parameters are a pure function of
    (seed, epoch, sample index), so results do not depend on num_workers.

    source: a Source, a path (record file, ImageFolder directory, .tar shard or glob), or (images, labels) or
    (features, targets) arrays.
    num_workers: C threads (0 runs the pipeline in the calling thread). prefetch: batches prepared ahead.
    pin_memory: page-locked batch buffers when a CUDA device is present. device='cuda' copies each batch to
    the device asynchronously. rank/world_size shard the samples as DistributedSampler does, with the same
    number of batches on every rank. cache: None, 'encoded', 'decoded', (mode, bytes) or a byte budget.
    on_error: 'raise' (an exception naming the sample; iterating again continues with the next batch) or
    'skip' (counted in stats()). seed: the seed of shuffling and augmentation; by default the global seed
    (ft.seed_everything, ft.manual_seed) at construction.
    """

    def __init__(self, source, batch_size=1, transforms=(), shuffle=False, seed=None, num_workers=None, prefetch=2,
                 pin_memory=True, device="cpu", drop_last=False, cache=None, on_error="raise", *, rank=None,
                 world_size=None, dtype=None, channels_last=None, channels=None, image_size=None, dct_scale=True,
                 verify=True):
        src = _as_source(source)
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if num_workers is None:
            num_workers = min(4, os.cpu_count() or 1)
        for name, value in (("num_workers", num_workers), ("prefetch", prefetch), ("rank", rank),
                            ("world_size", world_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise TypeError(f"Loader: {name} must be an int, got {value!r}")
        if isinstance(transforms, bool):  # DataLoader(ds, 32, True) is torch's shuffle
            raise TypeError("Loader: the third argument is transforms (a list), not shuffle: give shuffle=True by "
                            "name")
        out_dtype, layout, ops = _BY_NAME["float32"], False, []
        for t in transforms:
            if isinstance(t, ToTensor):
                out_dtype, layout = t.dtype, t.channels_last
            elif isinstance(t, Transform):
                ops.append(t._spec())
            else:
                raise TypeError(f"{t!r} is not a fasttrain.data transform (torchvision objects are not accepted: "
                                f"use ft.data.{type(t).__name__} when it exists)")
        if dtype is not None:
            out_dtype = as_dtype(dtype)
        if channels_last is not None:
            layout = bool(channels_last)
        if out_dtype.name not in ("float32", "bfloat16", "float16", "uint8"):
            raise TypeError(f"batches can be float32, bfloat16, float16 or uint8, not {out_dtype.name}")
        if out_dtype.name == "uint8" and any(isinstance(t, Normalize) for t in transforms):
            raise ValueError("Normalize needs a floating-point output dtype, not uint8 (PILToTensor): end with "
                             "ToTensor() instead, or normalize the uint8 batches after they arrive")
        dev = as_device(device)
        height = width = 0
        if image_size is not None:
            height, width = _pair(image_size, "image_size")
        cache_mode, cache_bytes = _cache_config(cache)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
            raise TypeError(f"Loader: batch_size must be an int, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        # Without a seed of its own the loader follows ft.seed_everything / ft.manual_seed, so that a seed
        # sweep also varies the data order and augmentations.
        self.seed = initial_seed() if seed is None else _check_seed(seed)
        self.num_workers = int(num_workers)
        self.prefetch = int(prefetch)
        self.device = dev
        from . import distributed
        self.rank = distributed.get_rank() if rank is None else int(rank)
        self.world_size = distributed.get_world_size() if world_size is None else int(world_size)
        self.on_error = on_error
        self.transforms = list(transforms)
        self.dtype = out_dtype
        self.epoch = 0
        self._resume = False
        # the training tally of the epoch's steps a stopped fit ran, (loss * weight, weight, correct, labelled),
        # which the fit finishing the epoch adds its own to (or None)
        self._tally = None
        self._pass = None  # a weak reference to the iterator of the pass under way
        super().__init__(
            src, ops,
            {"dtype": out_dtype._code, "channels_last": layout, "channels": int(channels or 0), "height": height,
             "width": width, "dct_scale": bool(dct_scale)},
            {"batch_size": self.batch_size, "shuffle": self.shuffle, "drop_last": self.drop_last,
             "seed": self.seed if self.seed < (1 << 63) else self.seed - (1 << 64),
             "num_workers": self.num_workers, "prefetch": self.prefetch, "pin_memory": bool(pin_memory),
             "device_type": 2 if dev.type == "cuda" else 1, "device_index": dev.index or 0, "rank": self.rank,
             "world_size": self.world_size, "on_error": _ON_ERROR[on_error], "cache": cache_mode,
             "cache_bytes": cache_bytes, "verify": bool(verify)})
        info = self._info()
        self.batch_shape = info["batch_shape"]
        self.num_samples = info["num_samples"]
        self._num_batches = info["num_batches"]
        # this rank's samples but those a sharded epoch repeats at its end to give every rank as many
        self._unique_samples = info["unique_samples"]

    def __len__(self):
        return self._num_batches

    @property
    def dataset(self):
        """The source it batches, whose len() is the number of samples (as torch's DataLoader.dataset)."""
        return self.source

    def _end_pass(self):
        """Ends the pass under way, if any: the Loader has one position in C, which a new pass (or a seek) takes
        over, so the old iterator raises instead of sharing it (a nested loop would restart its outer loop)."""
        live = self._pass and self._pass()
        if live is not None:
            live._ended = True
        self._pass = None

    def __iter__(self):
        self._end_pass()
        if self._resume and self._position()[1] >= len(self):  # restored at an epoch's end: its batches are done
            self._resume, self._tally = False, None
        if not self._resume:  # else the pass goes on from the position a stopped fit or load_state_dict left,
            self._set_epoch(self.epoch)  # which stays the one to go on from until the epoch ends
        it = _LoaderIterator(self)
        self._pass = weakref.ref(it)
        return it

    def set_epoch(self, epoch):
        """The epoch the next pass runs (its shuffle order and augmentations); preparation starts now."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or not 0 <= epoch < 2 ** 63:
            raise ValueError(f"set_epoch: the epoch must be an int in [0, 2**63), got {epoch!r}")
        epoch = int(epoch)
        self._set_epoch(epoch)
        self.epoch = epoch
        self._resume, self._tally = False, None
        self._end_pass()

    def state_dict(self):
        """Where iteration stands: load_state_dict on a loader built the same way resumes exactly there. Between
        passes that is where the next pass starts: after a loop left early (break), the start of its epoch again,
        as the next `for` starts it."""
        epoch, batch = self._position()
        if not self._resume and self._pass is not None and self._pass() is None:  # a dropped pass
            epoch, batch = self.epoch, 0
        state = {"epoch": epoch, "batch": batch, "seed": self.seed, "num_samples": len(self.source),
                 "batch_size": self.batch_size, "shuffle": self.shuffle, "drop_last": self.drop_last,
                 "rank": self.rank, "world_size": self.world_size}
        if self._tally is not None:  # fit's metrics of the epoch so far
            state["tally"] = list(self._tally)
        return state

    def load_state_dict(self, state):
        """Resumes from state_dict(): the next iteration starts at the saved epoch and batch. The state must come from a
        loader built the same way (seed, number of samples, batch size, shuffle, drop_last and world size), else
        ValueError; every rank resumes from rank 0's state (all ranks are at the same batch)."""
        for key in ("seed", "num_samples", "batch_size", "shuffle", "drop_last", "world_size"):
            mine = self.state_dict()[key] if key == "num_samples" else getattr(self, key)
            if key in state and state[key] != mine:
                raise ValueError(f"the state is for {key}={state[key]!r} but this loader has {key}={mine!r}")
        epoch, batch = state["epoch"], state["batch"]
        for name, v in (("epoch", epoch), ("batch", batch)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v < 2 ** 63:
                raise ValueError(f"the state's {name} must be an integer in [0, 2**63), got {v!r}")
        tally = state.get("tally")
        if tally is not None and not (isinstance(tally, (list, tuple)) and len(tally) == 4 and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in tally)
                and tally[1] >= 0 and all(float(v).is_integer() and v >= 0 for v in tally[2:])):
            raise ValueError(f"the state's tally must be [loss * weight, weight, correct, labelled], got {tally!r}")
        self._seek(int(epoch), int(batch))
        self.epoch = int(epoch) + (batch >= len(self))  # a position at an epoch's end: its batches are done
        self._resume = True
        self._tally = None if tally is None else (float(tally[0]), float(tally[1]), int(tally[2]), int(tally[3]))
        self._end_pass()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else f"{len(self)} batches of {tuple(self.batch_shape)} {self.dtype.name}"
        return f"<fasttrain.data.Loader {state}, {self.num_workers} workers>"
