"""NumPy references for the data pipeline, written from the documented rules
(docs/data.md, torchvision, Pillow) rather than from the C code: Philox draws,
the shuffle, Pillow's resampling and each transform."""
import math

import numpy as np

M32 = 0xFFFFFFFF


def philox(seed, stream, block):
    """Philox4x32-10 of counter (block lo, block hi, stream lo, stream hi) and key (seed lo, seed hi)."""
    c = [block & M32, block >> 32 & M32, stream & M32, stream >> 32 & M32]
    k0, k1 = seed & M32, seed >> 32 & M32
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


def uniform64(v0, v1):
    return ((v1 << 32 | v0) >> 11) * (1.0 / 9007199254740992.0)


class Draws:
    """Draw n of sample `index` in `epoch`: Philox block (epoch << 32 | n) of stream index."""

    def __init__(self, seed, epoch, index):
        self.seed, self.epoch, self.index, self.n = seed, epoch, index, 0

    def u(self):
        b = philox(self.seed, self.index, self.epoch << 32 | self.n)
        self.n += 1
        return uniform64(b[0], b[1])

    def randint(self, lo, hi):
        return lo + math.floor(self.u() * (hi - lo))


def shuffle_order(n, seed, epoch):
    p = list(range(n))
    for k in range(n - 1):
        i = n - 1 - k
        b = philox(seed, (1 << 64) - 1, epoch << 32 | k)
        r = b[0] | b[1] << 32
        j = (r * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


def rank_order(n, seed, epoch, shuffle, rank, world, drop_last):
    order = shuffle_order(n, seed, epoch) if shuffle else list(range(n))
    if world == 1:
        return order
    per = n // world if drop_last else -(-n // world)
    return [order[(rank + k * world) % n] for k in range(per)]


# ---- Pillow's bilinear resampling (libImaging/Resample.c) ----

PRECISION = 22


def _coeffs(in_size, in0, in1, out_size):
    scale = (in1 - in0) / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    bounds, kk = [], np.zeros((out_size, ksize), np.int64)
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        ws = []
        for x in range(xmax):
            t = abs((x + xmin - center + 0.5) * ss)
            ws.append(1.0 - t if t < 1.0 else 0.0)
        acc = 0.0
        for w in ws:
            acc += w
        ww = acc
        for x, w in enumerate(ws):
            if ww != 0.0:
                w /= ww
            f = w * (1 << PRECISION)
            kk[xx, x] = int(-0.5 + f) if w < 0 else int(0.5 + f)
        bounds.append((xmin, xmax))
    return bounds, kk


def _clip8(acc):
    return np.clip(acc >> PRECISION, 0, 255).astype(np.uint8)


def _hpass(img, bounds, kk):
    out = np.empty((img.shape[0], len(bounds), img.shape[2]), np.uint8)
    src = img.astype(np.int64)
    for x, (xmin, n) in enumerate(bounds):
        acc = np.full((img.shape[0], img.shape[2]), 1 << (PRECISION - 1), np.int64)
        for t in range(n):
            acc += src[:, xmin + t, :] * kk[x, t]
        out[:, x, :] = _clip8(acc)
    return out


def _vpass(img, bounds, kk):
    out = np.empty((len(bounds), img.shape[1], img.shape[2]), np.uint8)
    src = img.astype(np.int64)
    for y, (ymin, n) in enumerate(bounds):
        acc = np.full(img.shape[1:], 1 << (PRECISION - 1), np.int64)
        for t in range(n):
            acc += src[ymin + t] * kk[y, t]
        out[y] = _clip8(acc)
    return out


def pil_resize(img, out_h, out_w):
    """Image.resize((out_w, out_h), BILINEAR) of an (H, W, C) uint8 array."""
    h, w = img.shape[:2]
    need_h, need_v = out_w != w, out_h != h
    if not need_h and not need_v:
        return img.copy()
    vb, vk = _coeffs(h, 0.0, float(h), out_h)
    if need_h:
        hb, hk = _coeffs(w, 0.0, float(w), out_w)
        if need_v:
            first, last = vb[0][0], vb[-1][0] + vb[-1][1]
            tmp = _hpass(img[first:last], hb, hk)
            return _vpass(tmp, [(a - first, n) for a, n in vb], vk)
        return _hpass(img, hb, hk)
    return _vpass(img, vb, vk)


# ---- torchvision transforms on (H, W, C) uint8 ----

def resized_size(h, w, size, max_size=None):
    if not isinstance(size, int):
        return size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if w <= h else (new_short, new_long)


def pad(img, l, t, r, b, mode, fill):
    if mode == "constant":
        out = np.empty((img.shape[0] + t + b, img.shape[1] + l + r, img.shape[2]), np.uint8)
        out[...] = np.asarray(fill, np.uint8).reshape(-1)[:img.shape[2]] if np.ndim(fill) else fill
        out[t:t + img.shape[0], l:l + img.shape[1]] = img
        return out
    return np.pad(img, ((t, b), (l, r), (0, 0)), mode=mode)


def geometric(img, ops, d):
    """Applies (name, params) ops in order with draws d; returns the uint8 image."""
    for name, p in ops:
        H, W = img.shape[:2]
        if name == "RandomResizedCrop":
            area = H * W
            lr0, lr1 = math.log(p["ratio"][0]), math.log(p["ratio"][1])
            for _ in range(10):
                target = area * (p["scale"][0] + (p["scale"][1] - p["scale"][0]) * d.u())
                aspect = math.exp(lr0 + (lr1 - lr0) * d.u())
                w = int(round(math.sqrt(target * aspect)))
                h = int(round(math.sqrt(target / aspect)))
                if 0 < w <= W and 0 < h <= H:
                    i = d.randint(0, H - h + 1)
                    j = d.randint(0, W - w + 1)
                    break
            else:
                in_ratio = W / H
                if in_ratio < min(p["ratio"]):
                    w, h = W, int(round(W / min(p["ratio"])))
                elif in_ratio > max(p["ratio"]):
                    h, w = H, int(round(H * max(p["ratio"])))
                else:
                    w, h = W, H
                i, j = (H - h) // 2, (W - w) // 2
            img = pil_resize(img[i:i + h, j:j + w], *p["size"])
        elif name == "Resize":
            img = pil_resize(img, *resized_size(H, W, p["size"], p.get("max_size")))
        elif name == "CenterCrop":
            ch, cw = p["size"]
            if cw > W or ch > H:
                img = pad(img, (cw - W) // 2 if cw > W else 0, (ch - H) // 2 if ch > H else 0,
                          (cw - W + 1) // 2 if cw > W else 0, (ch - H + 1) // 2 if ch > H else 0, "constant", 0)
                H, W = img.shape[:2]
            top, left = int(round((H - ch) / 2.0)), int(round((W - cw) / 2.0))
            img = img[top:top + ch, left:left + cw]
        elif name == "RandomCrop":
            th, tw = p["size"]
            mode, fill = p.get("padding_mode", "constant"), p.get("fill", 0)
            if p.get("padding"):
                l, t, r, b = p["padding"]
                img = pad(img, l, t, r, b, mode, fill)
            if p.get("pad_if_needed") and img.shape[1] < tw:
                k = tw - img.shape[1]
                img = pad(img, k, 0, k, 0, mode, fill)
            if p.get("pad_if_needed") and img.shape[0] < th:
                k = th - img.shape[0]
                img = pad(img, 0, k, 0, k, mode, fill)
            H, W = img.shape[:2]
            i = j = 0
            if not (H == th and W == tw):
                i = d.randint(0, H - th + 1)
                j = d.randint(0, W - tw + 1)
            img = img[i:i + th, j:j + tw]
        elif name == "RandomHorizontalFlip":
            if d.u() < p.get("p", 0.5):
                img = img[:, ::-1]
        elif name == "RandomVerticalFlip":
            if d.u() < p.get("p", 0.5):
                img = img[::-1]
        else:
            raise ValueError(name)
    return np.ascontiguousarray(img)


def to_tensor(img, normalizes):
    """(C, H, W) float32: values / 255 then each Normalize, all in float32."""
    x = img.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    for mean, std in normalizes:
        x = (x - np.asarray(mean, np.float32)[:, None, None]) / np.asarray(std, np.float32)[:, None, None]
    return x


def erasing(x, p, d, seed, epoch, index, op, later_normalizes):
    """RandomErasing on (C, H, W) float32, value given (per channel) or 'random'."""
    if not d.u() < p["p"]:
        return x
    C, H, W = x.shape
    area = H * W
    lr0, lr1 = math.log(p["ratio"][0]), math.log(p["ratio"][1])
    for _ in range(10):
        ea = area * (p["scale"][0] + (p["scale"][1] - p["scale"][0]) * d.u())
        ar = math.exp(lr0 + (lr1 - lr0) * d.u())
        h = int(round(math.sqrt(ea * ar)))
        w = int(round(math.sqrt(ea / ar)))
        if not (h < H and w < W):
            continue
        i = d.randint(0, H - h + 1)
        j = d.randint(0, W - w + 1)
        if p["value"] == "random":
            v = np.empty(C * h * w, np.float32)
            for k in range(0, C * h * w, 2):
                b = philox(seed, index, epoch << 32 | 1 << 31 | op << 24 | k // 2)
                u1, u2 = uniform64(b[0], b[1]), uniform64(b[2], b[3])
                r = math.sqrt(-2.0 * math.log(1.0 - u1))
                v[k] = r * math.cos(2.0 * math.pi * u2)
                if k + 1 < C * h * w:
                    v[k + 1] = r * math.sin(2.0 * math.pi * u2)
            v = v.reshape(C, h, w)
        else:
            vals = p["value"] if isinstance(p["value"], (list, tuple)) else [p["value"]]
            v = np.empty((C, h, w), np.float32)
            for c in range(C):
                v[c] = np.float32(vals[0] if len(vals) == 1 else vals[c])
        for mean, std in later_normalizes:
            v = (v - np.asarray(mean, np.float32)[:, None, None]) / np.asarray(std, np.float32)[:, None, None]
        x = x.copy()
        x[:, i:i + h, j:j + w] = v
        return x
    return x


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns, round to nearest even (NaN not handled)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def pil_resize_box(img, out_h, out_w, box):
    """Image.resize((out_w, out_h), BILINEAR, box=(x0, y0, x1, y1)) with fractional box edges."""
    x0, y0, x1, y1 = box
    h, w = img.shape[:2]
    vb, vk = _coeffs(h, y0, y1, out_h)
    hb, hk = _coeffs(w, x0, x1, out_w)
    first, last = vb[0][0], vb[-1][0] + vb[-1][1]
    tmp = _hpass(img[first:last], hb, hk)
    return _vpass(tmp, [(a - first, n) for a, n in vb], vk)


def read_pnm(data):
    """(H, W, C) uint8 from binary PGM/PPM bytes (djpeg's output)."""
    fields, pos = [], 0
    while len(fields) < 4:
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos)
            continue
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    magic, w, h = fields[0], int(fields[1]), int(fields[2])
    c = {b"P5": 1, b"P6": 3}[magic]
    return np.frombuffer(data, np.uint8, offset=pos + 1, count=w * h * c).reshape(h, w, c)
