"""NumPy references of every ft.optim update: the documented update of one param in float64 (torch.optim's, or the
paper's for LAMB and LARS), its state carried in a dict over the steps; h is a full hyperparameter dict (hyper)."""
import math

import numpy as np

import fasttrain as ft


def hyper(cls, **overrides):
    """The full hyperparameter dict of a group of cls given these overrides (the constructor's defaults)."""
    return cls([ft.zeros(1)], **overrides).defaults


def ref_sgd(p, g, st, h):
    d = -g if h["maximize"] else g
    if h["weight_decay"]:
        d = d + h["weight_decay"] * p
    if h["momentum"]:
        st["buf"] = d.copy() if "buf" not in st else h["momentum"] * st["buf"] + (1 - h["dampening"]) * d
        d = d + h["momentum"] * st["buf"] if h["nesterov"] else st["buf"]
    return p - h["lr"] * d


def ref_adamw(p, g, st, h, l2=False):
    g = -g if h["maximize"] else g
    b1, b2 = h["betas"]
    t = st["t"] = st.get("t", 0) + 1
    st.setdefault("m", np.zeros_like(p))
    st.setdefault("v", np.zeros_like(p))
    if l2:  # Adam: the decay joins the gradient
        g = g + h["weight_decay"] * p
    else:
        p = p * (1 - h["lr"] * h["weight_decay"])
    st["m"] = b1 * st["m"] + (1 - b1) * g
    st["v"] = b2 * st["v"] + (1 - b2) * g * g
    v = st["v"]
    if h["amsgrad"]:
        v = st["vmax"] = np.maximum(st.get("vmax", np.zeros_like(p)), v)
    denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + h["eps"]
    return p - h["lr"] / (1 - b1 ** t) * st["m"] / denom


def ref_lamb(p, g, st, h):
    g = -g if h["maximize"] else g
    b1, b2 = h["betas"]
    t = st["t"] = st.get("t", 0) + 1
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
    u = (st["m"] / (1 - b1 ** t)) / (np.sqrt(st["v"] / (1 - b2 ** t)) + h["eps"]) + h["weight_decay"] * p
    wn, un = np.linalg.norm(p), np.linalg.norm(u)
    trust = 1.0 if h["lars_exclude"] or wn == 0 or un == 0 else wn / un
    return p - h["lr"] * trust * u


def ref_lars(p, g, st, h):
    g = -g if h["maximize"] else g
    wn, gn = np.linalg.norm(p), np.linalg.norm(g)
    local = 1.0 if h["lars_exclude"] or wn == 0 or gn == 0 else \
        h["trust_coefficient"] * wn / (gn + h["weight_decay"] * wn + h["eps"])
    st["v"] = h["momentum"] * st.get("v", 0) + h["lr"] * local * (g + h["weight_decay"] * p)
    return p - st["v"]


def ref_rmsprop(p, g, st, h):
    g = -g if h["maximize"] else g
    g = g + h["weight_decay"] * p
    a = h["alpha"]
    st["v"] = a * st.get("v", 0) + (1 - a) * g * g
    v = st["v"]
    if h["centered"]:
        st["a"] = st.get("a", 0) + (1 - a) * (g - st.get("a", 0))
        v = v - st["a"] ** 2
    d = g / (np.sqrt(v) + h["eps"])
    if h["momentum"]:
        d = st["b"] = h["momentum"] * st.get("b", 0) + d
    return p - h["lr"] * d


def ref_adadelta(p, g, st, h):
    g = -g if h["maximize"] else g
    g = g + h["weight_decay"] * p
    rho, eps = h["rho"], h["eps"]
    st["v"] = rho * st.get("v", 0) + (1 - rho) * g * g
    d = np.sqrt(st.get("u", 0) + eps) / np.sqrt(st["v"] + eps) * g
    st["u"] = rho * st.get("u", 0) + (1 - rho) * d * d
    return p - h["lr"] * d


def ref_adagrad(p, g, st, h):
    g = -g if h["maximize"] else g
    g = g + h["weight_decay"] * p
    t = st["t"] = st.get("t", 0) + 1
    st["s"] = st.get("s", h["initial_accumulator_value"]) + g * g
    return p - h["lr"] / (1 + (t - 1) * h["lr_decay"]) * g / (np.sqrt(st["s"]) + h["eps"])


def ref_adamax(p, g, st, h):
    g = -g if h["maximize"] else g
    g = g + h["weight_decay"] * p
    b1, b2 = h["betas"]
    t = st["t"] = st.get("t", 0) + 1
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["u"] = np.maximum(b2 * st.get("u", 0), np.abs(g) + h["eps"])
    return p - h["lr"] / (1 - b1 ** t) * st["m"] / st["u"]


def decayed(p, g, h):
    """NAdam's and RAdam's weight decay: (p, g) after it, L2 or decoupled."""
    if h["decoupled_weight_decay"]:
        return p * (1 - h["lr"] * h["weight_decay"]), g
    return p, g + h["weight_decay"] * p


def ref_nadam(p, g, st, h):
    """Dozat's NAdam as torch.optim.NAdam documents it: the momentum coefficient mu_t warmed up by momentum_decay."""
    p, g = decayed(p, -g if h["maximize"] else g, h)
    b1, b2 = h["betas"]
    t = st["t"] = st.get("t", 0) + 1
    mu, mu_next = (b1 * (1 - 0.5 * 0.96 ** (k * h["momentum_decay"])) for k in (t, t + 1))
    st["mu"] = st.get("mu", 1.0) * mu
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
    denom = np.sqrt(st["v"] / (1 - b2 ** t)) + h["eps"]
    return p - h["lr"] * (1 - mu) / (1 - st["mu"]) * g / denom - h["lr"] * mu_next / (1 - st["mu"] * mu_next) * \
        st["m"] / denom


def ref_radam(p, g, st, h):
    """Liu et al.'s RAdam as torch.optim.RAdam documents it: plain momentum until the variance's length passes 5."""
    p, g = decayed(p, -g if h["maximize"] else g, h)
    b1, b2 = h["betas"]
    t = st["t"] = st.get("t", 0) + 1
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
    m_hat = st["m"] / (1 - b1 ** t)
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
    if rho_t <= 5:
        return p - h["lr"] * m_hat
    rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    return p - h["lr"] * m_hat * rect * math.sqrt(1 - b2 ** t) / (np.sqrt(st["v"]) + h["eps"])


REFS = {ft.optim.SGD: ref_sgd, ft.optim.AdamW: ref_adamw, ft.optim.LAMB: ref_lamb, ft.optim.LARS: ref_lars,
        ft.optim.Adam: lambda p, g, st, h: ref_adamw(p, g, st, h, l2=True), ft.optim.RMSprop: ref_rmsprop,
        ft.optim.Adadelta: ref_adadelta, ft.optim.Adagrad: ref_adagrad, ft.optim.Adamax: ref_adamax,
        ft.optim.NAdam: ref_nadam, ft.optim.RAdam: ref_radam}
