"""Exponential moving average of weights, updated for every param in one fused C pass."""
import numpy as np

from .. import _C
from .._C import TensorBase
from .optimizer import _check_param


class EMA:
    """``shadow = lerp(shadow, param, 1 - decay)`` for every param after each ``update()``: the average
    ``torch.optim.swa_utils.get_ema_multi_avg_fn(decay)`` keeps (timm's ModelEmaV2 likewise). The averages
    start as copies of the params (torch's AveragedModel copies them at its first update instead: a first
    ``update(decay=0.0)``) and live in one flat buffer on the params' device; ``shadow`` holds a view per param.

    ``update(decay=None)`` uses ``self.decay`` unless given one (for a warmup schedule of the decay);
    ``copy_to(params=None)`` writes the averages into the params (for evaluation)."""

    def __init__(self, params, decay=0.999):
        if isinstance(params, TensorBase):
            raise TypeError("params must be an iterable of Tensors, but got a Tensor")
        self.params = list(params)
        for i, p in enumerate(self.params):
            _check_param(p, f"param {i}")
        self.decay = self._check_decay(decay)
        self.num_updates = 0
        self._build()

    def _build(self):
        """The C pass over the params where they are now, its averages starting as their values."""
        self._c = _C.EMA(self.params)
        self._at = [p.data_ptr() for p in self.params]
        flat = self._c.average()
        self.shadow = [flat[o:o + p.numel()].view(p.shape) for o, p in zip(self._c.offsets, self.params)]

    @staticmethod
    def _check_decay(decay):
        decay = float(decay)
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
        return decay

    def update(self, decay=None):
        """Moves every average towards its param: shadow = lerp(shadow, param, 1 - decay), with self.decay unless decay
        is given; counts num_updates. Params moved since (into a compiled program's flat buffer, by compile after the
        EMA was built) are followed, the averages kept."""
        self._follow()
        self._c.update(self.decay if decay is None else self._check_decay(decay))
        self.num_updates += 1

    def __getstate__(self):
        """For copy.deepcopy and pickle: the params (copied with it) and state_dict()."""
        return {"params": self.params, "state": self.state_dict()}

    def __setstate__(self, state):
        self.params, self.decay, self.num_updates = state["params"], 0.0, 0
        self._build()
        self.load_state_dict(state["state"])

    def _follow(self):
        """The C pass over the params where they are now (a compile moves them into its flat buffer), the averages
        kept: what update() and ft.fit's C epoch, which updates it after every step, run."""
        if [p.data_ptr() for p in self.params] != self._at:
            averages = [np.array(s.cpu().numpy()) for s in self.shadow]
            self._build()
            for a, s in zip(averages, self.shadow):
                s.copy_(a)

    def copy_to(self, params=None):
        """Copies the averages into params (default: the params the EMA was built on), which must have their shapes; for
        evaluating with the averaged weights."""
        params = self.params if params is None else list(params)
        if len(params) != len(self.shadow):
            raise ValueError(f"copy_to got {len(params)} params for {len(self.shadow)} averages")
        for i, (p, s) in enumerate(zip(params, self.shadow)):
            if tuple(p.shape) != tuple(s.shape):
                raise ValueError(f"param {i} has shape {tuple(p.shape)}, its average {tuple(s.shape)}")
        for p, s in zip(params, self.shadow):
            p.copy_(s)

    def state_dict(self):
        """The decay, the number of updates and a NumPy copy of each average."""
        return {"decay": self.decay, "num_updates": self.num_updates,
                "shadow": [np.array(s.cpu().numpy()) for s in self.shadow]}

    def load_state_dict(self, state_dict):
        """Restores a state_dict() into this EMA; the averages' count and shapes are checked before anything changes."""
        shadow = [np.asarray(a, dtype=np.float32) for a in state_dict["shadow"]]
        if len(shadow) != len(self.shadow):
            raise ValueError(f"the state_dict has {len(shadow)} averages, the EMA {len(self.shadow)}")
        for i, (a, s) in enumerate(zip(shadow, self.shadow)):
            if a.shape != tuple(s.shape):
                raise ValueError(f"average {i} has shape {a.shape} in the state_dict, but the param has shape "
                                 f"{tuple(s.shape)}")
        decay = self._check_decay(state_dict["decay"])
        for a, s in zip(shadow, self.shadow):
            s.copy_(a)
        self.decay, self.num_updates = decay, int(state_dict["num_updates"])
