"""Eager tensor math: PyTorch's operators, elementwise functions, reductions and selection ops on ft.Tensor.

These ops look at values outside a compiled model (metrics, masks, post-processing); a model's training step
runs in C and never calls them. On CPU tensors they compute with NumPy: a tensor is read through a zero-copy NumPy
view of its memory, and the result is a fresh array wrapped without a copy. bfloat16 (which NumPy lacks) and
float16 compute in float32 and round back, as PyTorch's CPU kernels do. On CUDA tensors the elementwise ops and the
reductions run the C ops of csrc/ops/math.c on the device (``_on_device``, ``_reduce``), which compute what the
NumPy path computes; matmul, sorting, unique, nonzero, advanced indexing and the rarer dtype cases of softmax and
cat still copy to the host and back.

Type promotion is PyTorch's, not NumPy's (``result_type``): a Python float with an integer tensor gives float32,
and within a category dimensioned tensors rank above 0-d tensors, which rank above Python scalars.
"""
from __future__ import annotations

import builtins
import functools
import inspect
import math
import operator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import _C
from ._types import CPU, DTYPES, _BY_NAME, as_dtype, device_of_code
from .amp import cast

if TYPE_CHECKING:
    from typing import Any, Callable, Sequence

    from ._tensor import Tensor
    from ._types import DeviceLike, DTypeLike, dtype

    Operand = Tensor | bool | int | float | np.ndarray
    Dims = int | Sequence[int] | None

_Tensor = _C.TensorBase  # every fasttrain tensor is one; _tensor.py (the subclass) imports this module
_BOOL, _UINT8, _INT64 = _BY_NAME["bool"], _BY_NAME["uint8"], _BY_NAME["int64"]
_FLOAT16, _BFLOAT16, _FLOAT32 = _BY_NAME["float16"], _BY_NAME["bfloat16"], _BY_NAME["float32"]
_HALF = (_FLOAT16, _BFLOAT16)
_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def _norm_dim(d, ndim, what="dimension"):
    """d as an index in [0, ndim) (a 0-d tensor accepts 0 and -1, as PyTorch)."""
    d = operator.index(d)
    n = builtins.max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"{what} {d} is out of range for a {ndim}-d tensor (expected in [{-n}, {n - 1}])")
    return d % n


# ---- dtypes: PyTorch's promotion ----

def promote_types(type1: DTypeLike, type2: DTypeLike) -> dtype:
    """The smallest dtype both convert to without losing their category, as torch.promote_types."""
    a, b = as_dtype(type1), as_dtype(type2)
    if a is b:
        return a
    if a.is_complex or b.is_complex:
        raise TypeError(f"promote_types: complex dtypes are storage-only in fasttrain, got {a.name} and {b.name}")
    wide = ("uint16", "uint32", "uint64")
    if a.name in wide or b.name in wide:
        if a.is_floating_point or b.is_floating_point:
            return a if a.is_floating_point else b
        raise TypeError(f"promotion of uint16, uint32 and uint64 with other types is not supported (as in PyTorch), "
                        f"got {a.name} and {b.name}")
    if a is _BOOL or b is _BOOL:
        return b if a is _BOOL else a
    if a.is_floating_point and b.is_floating_point:
        if {a, b} == set(_HALF):
            return _FLOAT32
        return a if a.itemsize > b.itemsize else b
    if a.is_floating_point or b.is_floating_point:
        return a if a.is_floating_point else b
    # the integers NumPy and PyTorch share (uint8, int8 ... int64) promote the same in both
    return _BY_NAME[np.promote_types(a.name, b.name).name]


def _rank(x):
    """(tier, dtype) of an operand: tier 0 for dimensioned tensors, 1 for 0-d tensors, 2 for Python and NumPy
    scalars, which count as bool, int64 or float32 (PyTorch's default dtype)."""
    if isinstance(x, _Tensor):
        return (0 if x.ndim else 1), DTYPES[x._dtype_code]
    if isinstance(x, np.ndarray):
        return (0 if x.ndim else 1), as_dtype(x.dtype)
    if isinstance(x, (bool, np.bool_)):
        return 2, _BOOL
    if isinstance(x, (int, np.integer)):
        return 2, _INT64
    if isinstance(x, (float, np.floating)):
        return 2, _FLOAT32
    raise TypeError(f"expected a tensor, an array or a real number, got {type(x).__name__}")


def _combine(higher, lower):
    """The dtype of a higher tier's result meeting a lower tier's: the lower counts only when it is of a higher
    category (torch's combine_categories)."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if higher.is_floating_point:
        return higher
    if higher is _BOOL or lower.is_floating_point:
        return promote_types(higher, lower)
    return higher


def result_type(*operands: Operand) -> dtype:
    """The dtype PyTorch gives an op of these tensors and scalars: dimensioned tensors, then 0-d tensors, then
    Python scalars (bool, int64, float32), each tier counting only when it raises the category."""
    tiers = [None, None, None]
    for x in operands:
        tier, dt = _rank(_arg(x))
        tiers[tier] = dt if tiers[tier] is None else promote_types(tiers[tier], dt)
    return _combine(tiers[0], _combine(tiers[1], tiers[2]))


def _can_cast(src, dst):
    """Whether an in-place op may store a src result in dst (torch's canCast: no float into integers, nothing
    but bool into bool)."""
    return not (src.is_floating_point and not dst.is_floating_point) and (dst is not _BOOL or src is _BOOL)


def _np(dt):
    """The NumPy dtype that dt computes in: float32 for the 16-bit floats."""
    return np.dtype("float32" if dt in _HALF else dt.name)


# ---- operands and results ----

def _arg(x):
    """Lists and tuples of numbers as arrays (dimensioned operands); everything else as it is."""
    return np.asarray(x) if isinstance(x, (list, tuple)) else x


def _is_operand(x):
    return isinstance(x, (_Tensor, np.ndarray, list, tuple) + _SCALARS)


def _array(x, dt):
    """The values of x in dt's NumPy compute dtype: a zero-copy view of a CPU tensor's memory when the dtypes match.
    Tensors round to a 16-bit dt first, and Python integers wrap around into narrow integer dtypes, as PyTorch
    casts its operands to the result's dtype (only Python floats keep their precision)."""
    if isinstance(x, np.ndarray):
        x = _C.from_numpy(x)
    if isinstance(x, _Tensor):
        if dt in _HALF and x._dtype_code != dt._code:
            x = x.to(dt)
        x = x._host_array()
    else:
        x = np.array(x)
    return x.astype(_np(dt), copy=False)


def _device(name, operands):
    """The device of the tensor operands (a 0-d CPU tensor goes with any device, as in PyTorch)."""
    found = None
    for x in operands:
        if isinstance(x, _Tensor) and not (x.ndim == 0 and not x.is_cuda):
            d = x._device_tuple
            if found is not None and d != found:
                raise RuntimeError(f"{name}: expected all tensors on the same device, but found at least two devices, "
                                   f"{device_of_code(found)} and {device_of_code(d)}")
            found = d
    return CPU if found is None else device_of_code(found)


def _result(array, dt, device):
    """A fresh NumPy result as a tensor of dtype dt on device (bfloat16 rounds from float32)."""
    array = np.asarray(array)
    if dt is _BFLOAT16:
        t = _C.from_numpy(array.astype(np.float32, copy=False)).to(dt)
    else:
        t = _C.from_numpy(array.astype(dt.name, copy=False))
    return t.to(device)


def _broadcast(name, *shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"{name}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together "
                         "(aligned from the last dimension, sizes must match or be 1)") from None


# The device types whose tensors compute with the C ops of csrc/ops/math.c instead of NumPy. CPU tensors keep NumPy
# (zero-copy views, vectorised loops); tests add "cpu" to check the ops' CPU reference loops against NumPy.
_KERNEL_DEVICES = ("cuda",)


def _kernels(device, dtype):
    """Whether values of dtype on device compute with the C ops (complex tensors only join, with NumPy)."""
    return device.type in _KERNEL_DEVICES and not dtype.is_complex


def _on_device(op, operands, compute, device):
    """The C op of elementwise op (csrc/ops/math.c's name) on the operands, computed in compute, on device: tensors
    and arrays go there (a 0-d CPU tensor too), numbers stay numbers; the result has their broadcast shape (the
    callers checked that they broadcast, the C op checks it again)."""
    def operand(x):
        if isinstance(x, np.ndarray):
            x = _C.from_numpy(x)
        if isinstance(x, _Tensor) and x._device_tuple != device._code:
            x = x.to(device)
        return x
    shape = np.broadcast_shapes(*(getattr(x, "shape", ()) for x in operands))
    return _C.math_pointwise(op, [operand(x) for x in operands], compute._code, shape)


def _real(name, *operands):
    """TypeError for a complex operand: complex tensors hold values (copy, view, index, export), no math."""
    for x in operands:
        dt = x.dtype if isinstance(x, (_Tensor, np.ndarray)) else None
        if dt is not None and as_dtype(dt).is_complex:
            raise TypeError(f"{name}: complex tensors are storage-only in fasttrain (copied, viewed, indexed and "
                            f"exported, not computed with); got {as_dtype(dt).name}: use .numpy() for the math")


def _apply(name, fn, operands, compute, out, device=None, op=None):
    """fn of the operands' values in compute's NumPy dtype, as a tensor of dtype out on their device (or device);
    on a CUDA device the elementwise kernel op instead, where one is named."""
    from .nn.graph import _TRACED_HINTS, Common, Symbolic, fail, refuse_eager_parameters
    if builtins.any(isinstance(x, (Symbolic, Common)) for x in operands):  # an eager function in a traced forward
        fail(f"ft.{name} of a traced value", _TRACED_HINTS.get(name, "see docs/models.md for what traced values "
                                                                       "support"))
    if name != "cat":  # joining copies, which complex tensors allow
        _real(name, *operands)
    refuse_eager_parameters(name, operands)
    device = _device(name, operands) if device is None else device
    # (numbers alone, as alpha's scaling, have no device to run on)
    if op is not None and _kernels(device, compute) and \
            builtins.any(isinstance(x, _Tensor) for x in operands):
        return _on_device(op, operands, compute, device)
    arrays = [_array(x, compute) for x in operands]
    with np.errstate(all="ignore"):  # inf and nan are results, as in PyTorch, not warnings
        return _result(fn(*arrays), out, device)


def _elementwise(name, fn, operands, compute, out, device=None, op=None):
    """_apply for fn broadcasting its operands: a shape mismatch names the shapes."""
    _broadcast(name, *(getattr(x, "shape", ()) for x in operands))
    return _apply(name, fn, operands, compute, out, device, op)


def _binary(name, fn, a, b, div=False, op=None, alpha=1):
    """fn(a, alpha * b) elementwise in the promoted dtype of a and b (float32 for integers when div: true
    division), alpha * b computed in it too; op names the device kernel when it is not name."""
    a, b = _arg(a), _arg(b)
    dt = result_type(a, b)
    if div and not dt.is_floating_point:
        dt = _FLOAT32
    if dt is _BOOL and name in _NOT_FOR_BOOL:
        raise TypeError(_NOT_FOR_BOOL[name])
    if name == "sub" and (_rank(a)[1] is _BOOL or _rank(b)[1] is _BOOL):
        raise TypeError("sub: subtraction, the `-` operator, with a bool tensor is not supported; to invert a mask "
                        "use the `~` operator")
    if alpha != 1:
        if isinstance(alpha, (float, np.floating)) and not dt.is_floating_point:
            raise TypeError(f"{name}: for integral input tensors, argument alpha must not be a floating point number")
        b = mul(b.to(dt), alpha).to(dt) if isinstance(b, _Tensor) else \
            _array(b, dt) * alpha if isinstance(b, np.ndarray) else alpha * b
    op = op or name
    if op in ("trunc_divide", "floor_divide") and dt in _HALF:
        fn, op = _half_division(op, dt), None
    if op in _DIVISIONS and not dt.is_floating_point:
        device = _device(name, [a, b])
        empty = 0 in _broadcast(name, getattr(a, "shape", ()), getattr(b, "shape", ()))
        if not empty and _kernels(device, dt) and _has_zero(b, dt, device):
            raise ZeroDivisionError(_ZERO_DIVISION)
    return _elementwise(name, fn, [a, b], dt, dt, op=op)


_NOT_FOR_BOOL = {
    "neg": "neg: negation, the `-` operator, on a bool tensor is not supported; to invert a mask use the `~` operator",
    "abs": "abs: not supported for bool tensors",
    "relu": "relu: not supported for bool tensors",
    "floor_divide": "floor_divide: not supported for bool tensors",
    "remainder": "remainder: not supported for bool tensors",
    "pow": "pow: not supported for bool tensors",
}


_ZERO_DIVISION = "integer division or modulo by zero"
_DIVISIONS = ("trunc_divide", "floor_divide", "remainder")  # the device kernels _nonzero_divisor guards


def _nonzero_divisor(fn):
    """fn refusing integer division by zero, which NumPy would answer with 0 (PyTorch raises)."""
    def checked(x, y):
        if x.dtype.kind in "iub" and np.broadcast(x, y).size and np.any(y == 0):
            raise ZeroDivisionError(_ZERO_DIVISION)
        return fn(x, y)
    return checked


def _has_zero(y, dt, device):
    """Whether divisor y holds a zero once cast to dt (a narrow integer type wraps), on device: the check
    _nonzero_divisor makes on the host, as two small kernels and one value read back."""
    if not isinstance(y, (_Tensor, np.ndarray)):
        return bool(np.array(y).astype(_np(dt)) == 0)
    zero = _on_device("eq", [y, 0], dt, device)
    return bool(_C.math_reduce("any", zero, (1,) * zero.ndim, _BOOL._code, _BOOL._code).item())


def _trunc_divide(x, y):
    if x.dtype.kind == "f":
        return np.trunc(x / y)
    q = np.floor_divide(x, y)
    return q + ((np.remainder(x, y) != 0) & ((x < 0) != (y < 0)))  # floor -> toward zero where signs differ


def _half_division(op, dt):
    """The trunc_divide or floor_divide of float32 values as PyTorch's CPU kernels compute them in a 16-bit dt:
    every step rounded to dt (trunc of the rounded quotient; floor by Python's divmod, which NumPy's float
    floor_divide follows, a step at a time). No device kernel rounds so: these compute on the host."""
    def rounded(v):
        return _C.from_numpy(np.asarray(v, np.float32)).to(dt)._host_array().astype(np.float32)

    def trunc_divide(x, y):
        return np.trunc(rounded(x / y))

    def floor_divide(x, y):
        mod = rounded(np.fmod(x, y))
        q = rounded(rounded(x - mod) / y)
        q = np.where((mod != 0) & ((y < 0) != (mod < 0)), rounded(q - 1), q)
        floor = np.floor(q)
        floor = np.where(q - floor > 0.5, floor + 1, floor)
        return np.where(y == 0, x / y, np.where(q == 0, np.copysign(0, x / y), floor))
    return trunc_divide if op == "trunc_divide" else floor_divide


# ---- arithmetic ----

def add(input: Operand, other: Operand, *, alpha: int | float = 1) -> Tensor:
    """input + alpha * other, broadcast, in PyTorch's promoted dtype (bool + bool is logical or)."""
    return _binary("add", np.add, input, other, alpha=alpha)


def sub(input: Operand, other: Operand, *, alpha: int | float = 1) -> Tensor:
    """input - alpha * other, broadcast, in PyTorch's promoted dtype."""
    return _binary("sub", np.subtract, input, other, alpha=alpha)


def mul(input: Operand, other: Operand) -> Tensor:
    """input * other elementwise, broadcast, in PyTorch's promoted dtype (bool * bool is logical and)."""
    return _binary("mul", np.multiply, input, other)


multiply = mul


def div(input: Operand, other: Operand, *, rounding_mode: str | None = None) -> Tensor:
    """input / other: true division (float32 for integer operands) or, with rounding_mode 'trunc' or 'floor',
    rounded division in the promoted dtype."""
    if rounding_mode is None:
        return _binary("div", np.true_divide, input, other, div=True)
    fns = {"trunc": _trunc_divide, "floor": np.floor_divide}
    if rounding_mode not in fns:
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    return _binary("div", _nonzero_divisor(fns[rounding_mode]), input, other, op=f"{rounding_mode}_divide")


divide = div  # PyTorch's other name


def floor_divide(input: Operand, other: Operand) -> Tensor:
    """input // other: division rounded toward minus infinity, as Python's (and PyTorch's) //."""
    return _binary("floor_divide", _nonzero_divisor(np.floor_divide), input, other)


def remainder(input: Operand, other: Operand) -> Tensor:
    """input % other with the sign of other, as Python's (and PyTorch's) %."""
    return _binary("remainder", _nonzero_divisor(np.remainder), input, other)


def _power(x, y):
    if x.dtype.kind not in "iu" or not np.any(y < 0):
        return np.power(x, y)
    # PyTorch truncates integer powers with negative exponents: 1 stays 1, -1 alternates, every other base gives 0
    negative = y < 0
    unit = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 != 0, -1, 1), 0))
    return np.where(negative, unit, np.power(x, np.where(negative, 0, y))).astype(x.dtype)


def pow(input: Operand, exponent: Operand) -> Tensor:
    """input ** exponent elementwise in the promoted dtype (an integer tensor to a float power gives float32);
    a negative Python integer exponent of an integer tensor is refused, as in PyTorch, and so is a number exponent
    the result dtype cannot hold (but a float32 or float64 tensor's, which PyTorch takes as a double)."""
    dt = result_type(input, exponent)
    negative = isinstance(exponent, (int, np.integer)) and not isinstance(exponent, bool) and exponent < 0
    if negative and not dt.is_floating_point:
        raise ValueError("pow: integers to negative integer powers are not allowed")
    if isinstance(exponent, _SCALARS) and dt not in (_FLOAT32, _BY_NAME["float64"]):
        checked_number(exponent, dt)
    return _binary("pow", _power, input, exponent)


def maximum(input: Operand, other: Operand) -> Tensor:
    """The elementwise maximum of two broadcast tensors; NaN wins, as in PyTorch."""
    return _binary("maximum", np.maximum, input, other)


def minimum(input: Operand, other: Operand) -> Tensor:
    """The elementwise minimum of two broadcast tensors; NaN wins, as in PyTorch."""
    return _binary("minimum", np.minimum, input, other)


def _bitwise(name, fn, a, b):
    dt = result_type(a, b)
    if dt.is_floating_point:
        raise TypeError(f"{name}: bitwise operations need bool or integer tensors, got {dt.name}")
    return _binary(name, fn, a, b)


def bitwise_and(input: Operand, other: Operand) -> Tensor:
    """input & other: logical and of bool tensors, bitwise and of integer ones."""
    return _bitwise("bitwise_and", np.bitwise_and, input, other)


def bitwise_or(input: Operand, other: Operand) -> Tensor:
    """input | other: logical or of bool tensors, bitwise or of integer ones."""
    return _bitwise("bitwise_or", np.bitwise_or, input, other)


def bitwise_xor(input: Operand, other: Operand) -> Tensor:
    """input ^ other: logical xor of bool tensors, bitwise xor of integer ones."""
    return _bitwise("bitwise_xor", np.bitwise_xor, input, other)


def _shift(name, fn, a, b):
    a, b = _arg(a), _arg(b)
    dt = result_type(a, b)
    if dt.is_floating_point or dt is _BOOL:
        raise TypeError(f"{name}: shifts need integer tensors, got {dt.name}")
    return _elementwise(name, fn, [a, b], dt, dt)  # NumPy's (PyTorch's) shifts past the width: 0, or -1 right


def bitwise_left_shift(input: Operand, other: Operand) -> Tensor:
    """input << other of integer tensors."""
    return _shift("bitwise_left_shift", np.left_shift, input, other)


def bitwise_right_shift(input: Operand, other: Operand) -> Tensor:
    """input >> other of integer tensors: arithmetic for signed ones."""
    return _shift("bitwise_right_shift", np.right_shift, input, other)


def bitwise_not(input: Tensor) -> Tensor:
    """~input: logical not of a bool tensor, bitwise not of an integer one."""
    if input.dtype.is_floating_point:
        raise TypeError(f"bitwise_not: bitwise operations need bool or integer tensors, got {input.dtype.name}")
    return _apply("bitwise_not", np.invert, [input], input.dtype, input.dtype,
                  op="logical_not" if input.dtype is _BOOL else "bitwise_not")


def _comparison(name, fn, symbol):
    def compare(input: Operand, other: Operand) -> Tensor:
        a, b = _arg(input), _arg(other)
        return _elementwise(name, fn, [a, b], result_type(a, b), _BOOL, op=name)
    compare.__name__ = compare.__qualname__ = name
    compare.__doc__ = f"input {symbol} other elementwise, as a bool tensor; compared in PyTorch's promoted dtype."
    return compare


eq = _comparison("eq", np.equal, "==")
ne = _comparison("ne", np.not_equal, "!=")
lt = _comparison("lt", np.less, "<")
le = _comparison("le", np.less_equal, "<=")
gt = _comparison("gt", np.greater, ">")
ge = _comparison("ge", np.greater_equal, ">=")


def matmul(input: Tensor, other: Tensor) -> Tensor:
    """The matrix product of two tensors (or NumPy arrays) of one dtype, as torch.matmul: 1-d operands are vectors,
    leading dimensions broadcast as batches. Under ft.autocast float32 operands are multiplied as its dtype (mm,
    bmm and an einsum that contracts likewise; mv and dot not, as torch.autocast's)."""
    input, other = (_C.from_numpy(x) if isinstance(x, np.ndarray) else x for x in (input, other))
    for x in (input, other):
        if not isinstance(x, _Tensor):
            raise TypeError(f"matmul: expected tensors or arrays, got {type(x).__name__}")
    return _matmul(*cast(input, other))


def _matmul(input: Tensor, other: Tensor) -> Tensor:
    """matmul of tensors as given (mv and dot, which torch.autocast leaves in their dtype)."""
    if input.ndim == 0 or other.ndim == 0:
        raise ValueError(f"matmul: both arguments need to be at least 1-d, but they are {input.ndim}-d and "
                         f"{other.ndim}-d")
    if input.dtype is not other.dtype:
        raise TypeError(f"matmul: expected both operands to have the same dtype, got {input.dtype.name} and "
                        f"{other.dtype.name}")
    if input.dtype is _BOOL:
        raise TypeError("matmul: not supported for bool tensors")

    def product(a, b):
        try:
            return np.matmul(a, b)
        except ValueError:
            raise ValueError(f"matmul: shapes {input.shape} and {other.shape} cannot be multiplied") from None
    return _apply("matmul", product, [input, other], input.dtype, input.dtype)


# ---- elementwise functions of one tensor ----

def neg(input: Tensor) -> Tensor:
    """-input elementwise (integers wrap around, as in PyTorch)."""
    if input.dtype is _BOOL:
        raise TypeError(_NOT_FOR_BOOL["neg"])
    return _apply("neg", np.negative, [input], input.dtype, input.dtype, op="neg")


def abs(input: Tensor) -> Tensor:
    """|input| elementwise, in input's dtype."""
    if input.dtype is _BOOL:
        raise TypeError(_NOT_FOR_BOOL["abs"])
    return _apply("abs", np.abs, [input], input.dtype, input.dtype, op="abs")


def _integral(name, fn):
    def rounded(input: Tensor) -> Tensor:
        _real(name, input)
        if input.dtype is _BOOL:
            raise TypeError(f"{name}: not supported for bool tensors")
        return _apply(name, fn if input.dtype.is_floating_point else np.copy, [input], input.dtype, input.dtype)
    rounded.__name__ = rounded.__qualname__ = name
    rounded.__doc__ = f"{name} of input elementwise in its dtype (integers as they are; round: half to even)."
    return rounded


floor = _integral("floor", np.floor)
ceil = _integral("ceil", np.ceil)
trunc = _integral("trunc", np.trunc)
_round = _integral("round", np.round)


def round(input: Tensor, *, decimals: int = 0) -> Tensor:
    """input rounded half to even in its dtype, to `decimals` decimal places (negative: to tens, hundreds, ...), as
    torch.round; integers as they are."""
    if not decimals:
        return _round(input)
    if not input.dtype.is_floating_point:
        raise TypeError(f"round: decimals takes floating-point tensors, got {input.dtype.name}")
    return _apply("round", lambda a: np.round(a, decimals), [input], input.dtype, input.dtype)


def sign(input: Tensor) -> Tensor:
    """-1, 0 or 1 by the sign of input, in its dtype; 0 for NaN, as PyTorch (a bool tensor is itself)."""
    if input.dtype is _BOOL:
        return input.clone()
    return _apply("sign", lambda x: np.where(x == x, np.sign(x), 0), [input], input.dtype, input.dtype)


def _test(name, fn):
    def test(input: Tensor) -> Tensor:
        return _apply(name, fn, [input], input.dtype, _BOOL)
    test.__name__ = test.__qualname__ = name
    test.__doc__ = f"Where input is {name.removeprefix('is')}, as a bool tensor."
    return test


isnan = _test("isnan", np.isnan)
isinf = _test("isinf", np.isinf)
isfinite = _test("isfinite", np.isfinite)


def flip(input: Tensor, *dims: int | Sequence[int]) -> Tensor:
    """A copy of input with the order of dims reversed: flip(x, (0, 1)), or x.flip(0, 1) as PyTorch's method."""
    axes = _axes("flip", input, dims[0] if len(dims) == 1 else dims)
    return _apply("flip", lambda a: np.flip(a, axes) if axes else a.copy(), [input], input.dtype, input.dtype)


def roll(input: Tensor, shifts: int | Sequence[int], dims: Dims = None) -> Tensor:
    """A copy of input shifted cyclically by shifts along dims, one shift per dim (the flattened tensor by one shift
    without dims; a dimension given twice rolls by both shifts, as PyTorch's)."""
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    dims = () if dims is None else (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if not shifts:
        raise ValueError("roll: `shifts` required")
    if len(shifts) != builtins.max(len(dims), 1):
        raise ValueError(f"roll: shifts and dimensions must align, as in PyTorch; got {len(shifts)} shifts and "
                         f"{len(dims)} dims")
    axes = tuple(_norm_dim(d, input.ndim, "roll: dim") for d in dims) or None
    return _apply("roll", lambda a: np.roll(a, shifts if axes else shifts[0], axes), [input], input.dtype,
                  input.dtype)


def largest_finite(dt: dtype) -> float:
    """The largest finite value of a floating-point dtype (bfloat16's too, which NumPy lacks)."""
    return 3.3895313892515355e38 if dt is _BFLOAT16 else float(np.finfo(dt.name).max)


def checked_number(value: bool | int | float, dt: dtype) -> None:
    """Fails where PyTorch's checked conversion of a Python number into dt fails (fill_, full, masked_fill, advanced-
    index assignment, clamp's bounds, where's and pow's numbers where PyTorch checks them): out of an integer dtype's
    range (the C conversion's check; a negative int wraps into uint8 ... uint32), or finite beyond a float dtype's
    largest value (inf and NaN pass)."""
    _C.tensor_from_data(value, dt._code)
    if dt.is_floating_point and math.isfinite(value) and builtins.abs(value) > largest_finite(dt):
        raise OverflowError(f"value {value} cannot be converted to type {dt.name} without overflow")


def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """A copy of input with NaN replaced by nan, +inf by posinf and -inf by neginf (by default the dtype's largest
    and lowest finite values), as torch.nan_to_num; integer and bool tensors are copied as they are."""
    if not input.dtype.is_floating_point:
        return input.clone()
    largest = largest_finite(input.dtype)
    posinf, neginf = largest if posinf is None else posinf, -largest if neginf is None else neginf
    return _apply("nan_to_num", lambda a: np.nan_to_num(a, nan=nan, posinf=posinf, neginf=neginf), [input],
                  input.dtype, input.dtype)


def _running(fn, a, axis):
    """np.cumsum or np.cumprod along axis; floats carried in float64, as PyTorch's CPU kernels do (a float32 running
    sum stops growing at 2**24), each result rounded once."""
    if not a.ndim:
        return a.copy()
    return fn(a, axis=axis, dtype={"f": np.float64, "c": np.complex128}.get(a.dtype.kind))


def cumsum(input: Tensor, dim: int, *, dtype: DTypeLike | None = None) -> Tensor:
    """The running sums along dim, in dtype if given, else int64 for bool and integer tensors and input's dtype."""
    out = as_dtype(dtype) if dtype is not None else input.dtype if input.dtype.is_floating_point else _INT64
    d = _norm_dim(dim, input.ndim, "cumsum: dim")
    return _apply("cumsum", lambda a: _running(np.cumsum, a, d), [input], out, out)


def select(input: Tensor, dim: int, index: int) -> Tensor:
    """The view of input at index along dim, that dimension dropped, as torch.select."""
    return input.select(dim, index)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The views of input at each index along dim, as torch.unbind."""
    return input.unbind(dim)


def reshape(input: Tensor, shape: Sequence[int]) -> Tensor:
    """input.reshape(shape), as torch.reshape."""
    return input.reshape(shape)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """input.transpose(dim0, dim1), as torch.transpose."""
    return input.transpose(dim0, dim1)


def permute(input: Tensor, dims: Sequence[int]) -> Tensor:
    """input.permute(dims), as torch.permute."""
    return input.permute(*dims)


def movedim(input: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """input.movedim(source, destination), as torch.movedim (and moveaxis)."""
    return input.movedim(source, destination)


def squeeze(input: Tensor, dim: Dims = None) -> Tensor:
    """input.squeeze(dim) (every dimension of size 1 without dim), as torch.squeeze."""
    return input.squeeze() if dim is None else input.squeeze(dim)


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    """input.unsqueeze(dim), as torch.unsqueeze."""
    return input.unsqueeze(dim)


def t(input: Tensor) -> Tensor:
    """input.t(): a 2-d tensor transposed (0-d and 1-d as they are), as torch.t."""
    return input.t()


def numel(input: Tensor) -> int:
    """The element count, as torch.numel."""
    return input.numel()


def take(input: Tensor, index: Tensor) -> Tensor:
    """The elements of input, read as one row in C order, at index (of index's shape), as torch.take."""
    return input.reshape(-1)[index]


def argwhere(input: Tensor) -> Tensor:
    """The indices of the nonzero elements, (count, ndim) int64, as torch.argwhere."""
    return nonzero(input)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of ceil(size / chunks) along dim (the last shorter), as torch.chunk."""
    return input.chunk(chunks, dim)


def split(tensor: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of split_size along dim (the last shorter), or of the sizes listed, as torch.split."""
    return tensor.split(split_size_or_sections, dim)


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows; each branch is exact where it is taken
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _floating(name, fn, on_device=True):
    def unary(input: Tensor) -> Tensor:
        dt = input.dtype if input.dtype.is_floating_point else _FLOAT32
        return _apply(name, fn, [input], dt, dt, op=name if on_device else None)
    unary.__name__ = unary.__qualname__ = name
    unary.__doc__ = f"{name} of input elementwise, in input's floating dtype (float32 for bool and integer tensors)."
    return unary


# (on CUDA tensors, those without a C op compute on the host)
log1p = _floating("log1p", np.log1p, on_device=False)
expm1 = _floating("expm1", np.expm1, on_device=False)
exp = _floating("exp", np.exp)
log = _floating("log", np.log)
sqrt = _floating("sqrt", np.sqrt)
rsqrt = _floating("rsqrt", lambda x: 1 / np.sqrt(x))
tanh = _floating("tanh", np.tanh)
sigmoid = _floating("sigmoid", _sigmoid)


def relu(input: Tensor) -> Tensor:
    """max(input, 0) elementwise, in input's dtype."""
    if input.dtype is _BOOL:
        raise TypeError(_NOT_FOR_BOOL["relu"])
    return _apply("relu", lambda x: np.maximum(x, x.dtype.type(0)), [input], input.dtype, input.dtype, op="relu")


def _clamp_bound(which, bound, dt):
    """A number bound of clamp in dt, as PyTorch's: refused where a float dtype cannot hold it, or where it lies
    beyond an integer dtype's range on the side that would clamp every element; clipped into that range otherwise
    (beyond it on the other side it clamps nothing)."""
    if not isinstance(bound, _SCALARS) or dt is _BOOL:
        return bound
    if dt.is_floating_point:
        checked_number(bound, dt)
        return bound
    info = np.iinfo(dt.name)
    if (bound < info.min) if which == "max" else (bound > info.max):
        raise OverflowError(f"clamp: {which} value {bound} is outside the representable range of {dt.name}")
    return info.min if bound < info.min else info.max if bound > info.max else bound


def clamp(input: Tensor, min: Operand | None = None, max: Operand | None = None) -> Tensor:
    """input limited to [min, max] elementwise (numbers or broadcast tensors; either may be None), in the dtype
    promoted with the bounds, as torch.clamp; NaN stays NaN. Beside a number bound a 0-d tensor bound counts as a
    number, as PyTorch reads it then (its clamp(Tensor, Scalar?, Scalar?))."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of 'min' or 'max' must not be None")
    _real("clamp", input, min, max)
    lo, hi = _arg(min), _arg(max)
    if isinstance(lo, _SCALARS) or isinstance(hi, _SCALARS):
        lo, hi = (b.item() if isinstance(b, (_Tensor, np.ndarray)) and b.ndim == 0 else b for b in (lo, hi))
    given = [b for b in (lo, hi) if b is not None]
    dt = result_type(input, *given)
    given = [_clamp_bound(which, b, dt) for which, b in (("min", lo), ("max", hi)) if b is not None]

    def clip(x, *bounds):
        b = iter(bounds)
        if lo is not None:
            x = np.maximum(x, next(b))
        return x if hi is None else np.minimum(x, next(b))
    op = "clamp" if len(given) == 2 else "maximum" if lo is not None else "minimum"  # the same steps on the device
    return _elementwise("clamp", clip, [input, *given], dt, dt, op=op)


clip = clamp


def clamp_min(input: Tensor, min: Operand) -> Tensor:
    """clamp(input, min=min)."""
    return clamp(input, min=min)


def clamp_max(input: Tensor, max: Operand) -> Tensor:
    """clamp(input, max=max)."""
    return clamp(input, max=max)


def square(input: Tensor) -> Tensor:
    """input * input (of a bool tensor in int64, as PyTorch's pow(input, 2))."""
    return mul(input.to(_INT64), input) if input.dtype is _BOOL else mul(input, input)


def logsumexp(input: Tensor, dim: Dims, keepdim: bool = False) -> Tensor:
    """log(sum(exp(input))) over dim, computed from the largest value (no overflow), in float32 for integers."""
    dt = input.dtype if input.dtype.is_floating_point else _BY_NAME["float32"]

    def lse(x, axis, keepdims):
        if x.size == 0:  # the log of an empty sum
            return np.full(np.sum(x, axis=axis, keepdims=keepdims).shape, -np.inf, x.dtype)
        top = np.max(x, axis=axis, keepdims=True)
        top = np.where(np.isfinite(top), top, 0)  # rows of -inf stay -inf, +inf and NaN propagate
        out = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
        return out if keepdims else np.squeeze(out, axis=axis)
    axes = _axes("logsumexp", input, dim)
    return _apply("logsumexp", lambda x: lse(x, axes, keepdim), [input], dt, dt)


def where(condition: Tensor, input: Operand | None = None, other: Operand | None = None) -> Tensor | tuple[Tensor, ...]:
    """input where condition (a bool tensor) holds, else other, broadcast, in their promoted dtype; where(condition)
    alone gives the indices of its nonzero (True) elements, one int64 tensor per dimension, as torch.nonzero
    with as_tuple=True (condition of any dtype)."""
    alone = input is None and other is None
    if not isinstance(condition, _Tensor) or (condition.dtype is not _BOOL and not alone):
        got = f"a tensor with dtype {condition.dtype.name}" if isinstance(condition, _Tensor) else \
            type(condition).__name__
        raise TypeError(f"where: expected condition to be a bool tensor, got {got}")
    if alone:
        _real("where", condition)
        c = condition._host_array()
        device = condition.device
        return tuple(_result(i, _INT64, device) for i in np.nonzero(c.reshape(c.shape or (1,))))
    if input is None or other is None:
        raise TypeError("where: give both input and other, or neither")
    a, b = _arg(input), _arg(other)
    device = _device("where", [condition, a, b])
    _broadcast("where", condition.shape, *(getattr(x, "shape", ()) for x in (a, b)))
    dt = result_type(a, b)
    for x in (a, b):
        if isinstance(x, _SCALARS) and dt not in _HALF:  # (PyTorch's scalar_tensor lets 16-bit floats overflow)
            checked_number(x, dt)
    if _kernels(device, dt):
        return _on_device("where", [condition, a, b], dt, device)
    c = condition._host_array()
    return _apply("where", lambda x, y: np.where(c, x, y), [a, b], dt, dt, device)


def masked_fill(input: Tensor, mask: Tensor, value: Operand) -> Tensor:
    """input with value where mask (a bool tensor broadcast to input's shape) holds, in input's dtype."""
    if not isinstance(mask, _Tensor) or mask.dtype is not _BOOL:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got "
                        f"{mask.dtype.name if isinstance(mask, _Tensor) else type(mask).__name__}")
    if _broadcast("masked_fill", input.shape, mask.shape) != tuple(input.shape):
        raise ValueError(f"masked_fill: a mask of shape {tuple(mask.shape)} does not broadcast to the input's "
                         f"{tuple(input.shape)}")
    if isinstance(value, _Tensor):
        if value.ndim:
            raise ValueError(f"masked_fill: only a 0-dimensional value tensor is supported, as in PyTorch, but got "
                             f"one with {value.ndim} dimension(s)")
        value = value.item()  # PyTorch reads a 0-d value as its number
    from .creation import full
    value = full((), value, dtype=input.dtype, device=input.device)  # fill_'s check: a number dtype cannot hold fails
    return where(mask, value, input).to(input.dtype)


# ---- reductions ----

def _axes(name, input, dim):
    """NumPy's axis for dim: None (every dimension) for None or an empty sequence, else a tuple."""
    if dim is None:
        return None
    try:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    except TypeError:
        raise TypeError(f"{name}: dim must be an int or a sequence of ints, got {type(dim).__name__}") from None
    if not dims:
        return None
    axes = [_norm_dim(d, input.ndim, f"{name}: dim") for d in dims]
    for i, d in enumerate(axes):
        if d in axes[:i]:
            raise ValueError(f"{name}: dim {d} appears multiple times in the list of dims")
    return tuple(d for d in axes if d < input.ndim)  # dim 0 of a 0-d tensor is no dimension of its array


def _count(shape, axes):
    return math.prod(shape) if axes is None else math.prod(shape[d] for d in axes)


def _reduce(name, fn, input, axes, keepdim, compute, out, correction=0.0):
    """fn(x, axis=axes, keepdims=keepdim) of input's values in compute's NumPy dtype, as a tensor of dtype out; on a
    device of _KERNEL_DEVICES the reduction `name` of csrc/ops/math.c instead (correction: var and std)."""
    if not _kernels(input.device, input.dtype):
        return _apply(name, lambda x: fn(x, axis=axes, keepdims=keepdim), [input], compute, out)
    reduced = range(input.ndim) if axes is None else axes
    kept = tuple(1 if d in reduced else n for d, n in enumerate(input.shape))
    r = _C.math_reduce(name, input, kept, compute._code, out._code, correction)
    return r if keepdim else r.reshape(tuple(n for d, n in enumerate(input.shape) if d not in reduced))


def sum(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: DTypeLike | None = None) -> Tensor:
    """The sum over dim (an int or a tuple; all dimensions by default), in dtype if given, else int64 for bool and
    integer tensors and input's dtype otherwise."""
    out = as_dtype(dtype) if dtype is not None else input.dtype if input.dtype.is_floating_point else _INT64
    return _reduce("sum", np.sum, input, _axes("sum", input, dim), keepdim, out, out)


def mean(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: DTypeLike | None = None) -> Tensor:
    """The mean over dim (all dimensions by default) of a floating tensor (or in a floating dtype); an empty
    reduction gives NaN."""
    _real("mean", input)
    out = as_dtype(dtype) if dtype is not None else input.dtype
    if not out.is_floating_point:
        raise TypeError("mean(): could not infer output dtype. Input dtype must be either a floating point or complex "
                        f"dtype. Got: {out.name}")
    axes = _axes("mean", input, dim)
    n = _count(input.shape, axes)
    return _reduce("mean", lambda x, **kw: np.sum(x, **kw) / n, input, axes, keepdim, out, out)


def _moments(name, input, dim, unbiased, keepdim, correction):
    if isinstance(dim, bool):  # the legacy call var(unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}: give correction or unbiased, not both")
    if not input.dtype.is_floating_point:
        raise TypeError(f"{name}: std and var only support floating point dtypes, got {input.dtype.name}")
    c = correction if correction is not None else 0 if unbiased is False else 1
    axes = _axes(name, input, dim)
    n = _count(input.shape, axes)

    def variance(x, axis, keepdims):
        d = x - np.sum(x, axis=axis, keepdims=True) / n
        v = np.sum(d * d, axis=axis, keepdims=keepdims) / builtins.max(n - c, 0)
        return np.sqrt(v) if name == "std" else v
    return _reduce(name, variance, input, axes, keepdim, _BY_NAME["float64"], input.dtype, c)


def var(input: Tensor, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: int | float | None = None) -> Tensor:
    """The variance over dim (all dimensions by default), divided by N - correction (1 by default, Bessel's
    correction, as PyTorch; unbiased=False means 0); computed in float64, returned in input's dtype."""
    return _moments("var", input, dim, unbiased, keepdim, correction)


def std(input: Tensor, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: int | float | None = None) -> Tensor:
    """The standard deviation over dim, the square root of var with the same arguments."""
    return _moments("std", input, dim, unbiased, keepdim, correction)


def var_mean(input: Tensor, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction: int | float | None = None) -> tuple[Tensor, Tensor]:
    """(var, mean) over dim, as torch.var_mean; of a traced value too."""
    return var(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def std_mean(input: Tensor, dim: Dims = None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction: int | float | None = None) -> tuple[Tensor, Tensor]:
    """(std, mean) over dim, as torch.std_mean; of a traced value too."""
    return std(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def _truth(name, fn, input, dim, keepdim):
    out = _UINT8 if input.dtype is _UINT8 else _BOOL  # uint8 in, uint8 out: PyTorch keeps it for old masks
    if dim is not None and not isinstance(dim, (int, np.integer)) and not tuple(dim):
        # no dimension to reduce: each element's truth, as torch.all/any (where sum(dim=()) reduces all)
        return _apply(name, lambda x: x != 0, [input], input.dtype, out)
    return _reduce(name, fn, input, _axes(name, input, dim), keepdim, input.dtype, out)


def all(input: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:
    """Whether every element over dim (all dimensions by default) is nonzero, as a bool tensor."""
    return _truth("all", np.all, input, dim, keepdim)


def any(input: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:
    """Whether some element over dim (all dimensions by default) is nonzero, as a bool tensor."""
    return _truth("any", np.any, input, dim, keepdim)


class ValuesIndices(NamedTuple):
    """(values, indices), as PyTorch's torch.return_types of max, min, sort and topk."""
    values: Tensor
    indices: Tensor


def _extreme(name, input, dim, keepdim, arg):
    """ValuesIndices of the first maximum (arg=np.argmax) or minimum along dim; NaN counts as the extreme."""
    _real(name, input)
    d = _norm_dim(dim, input.ndim, f"{name}: dim")
    if input.ndim and input.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
    shape = input.shape[:d] + ((1,) if keepdim else ()) + input.shape[d + 1:] if input.ndim else ()
    if _kernels(input.device, input.dtype):
        kept = input.shape[:d] + (1,) + input.shape[d + 1:] if input.ndim else ()
        code = input.dtype._code
        found = _C.math_reduce(name.removeprefix("arg"), input, kept, code, code, indices=True)
        return ValuesIndices(*(t.reshape(shape) for t in found))
    a = input._host_array()
    a = a.reshape(a.shape or (1,))
    idx = arg(a, axis=d, keepdims=True)
    values = np.take_along_axis(a, idx, d)
    device = input.device
    return ValuesIndices(_result(values.reshape(shape), input.dtype, device),
                         _result(idx.reshape(shape), _INT64, device))


def _max_or_min(name, input, dim, keepdim, arg, whole, elementwise):
    if dim is None:
        if input.numel() == 0:
            raise ValueError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
                             "reduction dim with the 'dim' argument.")
        return _reduce(name, lambda x, **kw: whole(x), input, None, False, input.dtype, input.dtype)
    if isinstance(dim, _Tensor):
        return elementwise(input, dim)
    return _extreme(name, input, dim, keepdim, arg)


def max(input: Tensor, dim: int | Tensor | None = None, keepdim: bool = False) -> Tensor | ValuesIndices:
    """The largest element (a 0-d tensor); with dim, the (values, indices) of the first largest along dim; with a
    tensor, maximum(input, other). NaN is the largest, as in PyTorch."""
    return _max_or_min("max", input, dim, keepdim, np.argmax, np.max, maximum)


def min(input: Tensor, dim: int | Tensor | None = None, keepdim: bool = False) -> Tensor | ValuesIndices:
    """The smallest element (a 0-d tensor); with dim, the (values, indices) of the first smallest along dim; with a
    tensor, minimum(input, other). NaN is the smallest, as in PyTorch."""
    return _max_or_min("min", input, dim, keepdim, np.argmin, np.min, minimum)


def _extremes(name, fn, input, dim, keepdim):
    _real(name, input)
    axes = _axes(name, input, dim)
    for d in range(input.ndim) if axes is None else axes:
        if input.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
    return _reduce(name.removeprefix("a"), fn, input, axes, keepdim, input.dtype, input.dtype)


def amax(input: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    """The largest values over dim (an int or a tuple; every dimension by default), as torch.amax; NaN is the
    largest."""
    return _extremes("amax", np.max, input, dim, keepdim)


def amin(input: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    """The smallest values over dim (an int or a tuple; every dimension by default), as torch.amin; NaN is the
    smallest."""
    return _extremes("amin", np.min, input, dim, keepdim)


def norm(input: Tensor, p: float | str = "fro", dim: Dims = None, keepdim: bool = False,
         dtype: DTypeLike | None = None) -> Tensor:
    """The vector norm over dim (every element by default) of a floating tensor, as torch.linalg.vector_norm:
    p = 'fro' or 2, 1, inf, -inf, 0 (the count of nonzeros) or any other number ((sum |x|^p)^(1/p)); computed in
    float64, returned in input's dtype (or dtype)."""
    _real("norm", input)
    if not input.dtype.is_floating_point:
        raise TypeError(f"norm(): input dtype should be floating point, got {input.dtype.name}")
    p = 2 if p == "fro" else p
    if isinstance(p, str) or isinstance(p, bool) or not isinstance(p, (int, float)):
        raise ValueError(f"norm: p must be a number or 'fro', got {p!r}")
    axes = _axes("norm", input, dim)
    out = input.dtype if dtype is None else as_dtype(dtype)

    def vector_norm(x):
        a = np.abs(x)
        if p == math.inf:
            return np.max(a, axis=axes, keepdims=keepdim, initial=0.0)
        if p == -math.inf:
            return np.min(a, axis=axes, keepdims=keepdim, initial=math.inf)
        if p == 0:
            return np.sum(a != 0, axis=axes, keepdims=keepdim)
        return np.sum(a ** p, axis=axes, keepdims=keepdim) ** (1.0 / p)
    return _apply("norm", vector_norm, [input], _BY_NAME["float64"], out)


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """out[i][j][k] = input[index[i][j][k]][j][k] for dim 0 (and so on), as torch.gather: index is an integer tensor
    of input's rank, no larger than input along the other dimensions; each index lies in [0, input.size(dim))."""
    _real("gather", input)
    if not isinstance(index, _Tensor) or index.dtype.is_floating_point or index.dtype is _BOOL:
        raise TypeError(f"gather(): Expected dtype int64 for index, got "
                        f"{index.dtype.name if isinstance(index, _Tensor) else type(index).__name__}")
    d = _norm_dim(dim, input.ndim, "gather: dim")
    if index.ndim != input.ndim:
        raise ValueError(f"gather: index has {index.ndim} dimensions and input {input.ndim}; they must have as many")
    if builtins.any(k != d and m > n for k, (m, n) in enumerate(zip(index.shape, input.shape))):
        raise ValueError(f"gather: index {tuple(index.shape)} is larger than input {tuple(input.shape)} outside "
                         f"dimension {d}")
    _device("gather", [input, index])
    a, idx = input._host_array(), np.asarray(index._host_array(), dtype=np.int64)
    n = a.shape[d] if a.ndim else 1
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)].flat[0]
        raise IndexError(f"gather: index {bad} is out of bounds for dimension {d} with size {n}")
    if a.ndim:
        a = a[tuple(slice(None) if k == d else slice(0, m) for k, m in enumerate(idx.shape))]
        a = np.take_along_axis(a, idx, d)
    return _result(np.array(a).reshape(idx.shape), input.dtype, input.device)


def _arg_extreme(name, input, dim, keepdim, arg):
    if dim is not None:
        return _extreme(name, input, dim, keepdim, arg).indices
    _real(name, input)
    if input.numel() == 0:
        raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
    shape = (1,) * input.ndim if keepdim else ()
    if _kernels(input.device, input.dtype):
        code = input.dtype._code
        return _C.math_reduce(name.removeprefix("arg"), input, (1,) * input.ndim, code, code, indices=True)[1] \
            .reshape(shape)
    flat = np.asarray(arg(input._host_array()))
    return _result(flat.reshape(shape), _INT64, input.device)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The index (int64) of the first largest element along dim, or in the flattened tensor without dim."""
    return _arg_extreme("argmax", input, dim, keepdim, np.argmax)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The index (int64) of the first smallest element along dim, or in the flattened tensor without dim."""
    return _arg_extreme("argmin", input, dim, keepdim, np.argmin)


# ---- softmax ----

def _softmax(name, input, dim, dtype, log):
    from .nn import functional as F
    if isinstance(input, _Tensor):
        if dtype is not None:
            input = input.to(dtype)
        if input.dtype not in (_FLOAT32, _BFLOAT16) and not (input.dtype is _FLOAT16 and input.is_cuda):
            if not input.dtype.is_floating_point:
                raise TypeError(f"{name}: input must be a floating point tensor, got {input.dtype.name}")
            d = _norm_dim(dim, input.ndim, f"{name}: dim")

            def rows(x):
                x = x.reshape(x.shape or (1,))
                shifted = x - np.max(x, axis=d, keepdims=True, initial=-np.inf)
                total = np.sum(np.exp(shifted), axis=d, keepdims=True)
                return (shifted - np.log(total) if log else np.exp(shifted) / total).reshape(input.shape)
            return _apply(name, rows, [input], input.dtype, input.dtype)
    # the C kernel on the tensor's own device (float32, bfloat16, float16 on CUDA); a traced value records the layer
    if isinstance(input, _Tensor):
        return getattr(_C, name + "_forward")(None, input, dim)
    return getattr(F, name)(input, dim)


def softmax(input: Tensor, dim: int, dtype: DTypeLike | None = None) -> Tensor:
    """exp(input) normalized to sum 1 along dim (input converted to dtype first, if given), for floating tensors."""
    return _softmax("softmax", input, dim, dtype, log=False)


def log_softmax(input: Tensor, dim: int, dtype: DTypeLike | None = None) -> Tensor:
    """log(softmax(input, dim)), computed without forming the softmax."""
    return _softmax("log_softmax", input, dim, dtype, log=True)


# ---- sorting and selection ----

def _order(a, axis, descending):
    """Stable sorting indices along axis; NaN sorts as the largest value (last ascending, first descending)."""
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    # sorting the reversed values stably and reversing the order keeps equal values in their original order
    n = a.shape[axis]
    return (n - 1) - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)


def _sorted_along(name, input, dim, descending, k=None):
    _real(name, input)
    d = _norm_dim(dim, input.ndim, f"{name}: dim")
    a = input._host_array()
    a = a.reshape(a.shape or (1,))
    n = a.shape[d]
    if k is not None and not 0 <= k <= n:
        raise IndexError(f"{name}: k ({k}) is out of range for dimension {d} of size {n}")
    idx = _order(a, d, descending)
    if k is not None:
        idx = np.take(idx, np.arange(k), axis=d)
    values = np.take_along_axis(a, idx, d)
    if input.ndim == 0:  # itself, as PyTorch's (topk(0) too)
        values, idx = a.reshape(()), np.zeros((), np.int64)
    return ValuesIndices(_result(values, input.dtype, input.device), _result(idx, _INT64, input.device))


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
    """(values, indices) sorted along dim; always stable (equal values keep their order, whatever stable says),
    NaN last ascending and first descending, as PyTorch."""
    return _sorted_along("sort", input, dim, descending)


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The indices (int64) that sort input along dim, stably: sort(...).indices."""
    return _sorted_along("argsort", input, dim, descending).indices


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """(values, indices) of the k largest (or smallest) elements along dim, always in sorted order; equal values
    come in index order, NaN counts as the largest."""
    return _sorted_along("topk", input, dim, largest, operator.index(k))


def _triangle(name, keep):
    def triangle(input: Tensor, diagonal: int = 0) -> Tensor:
        if input.ndim < 2:
            raise ValueError(f"{name}: input must have at least 2 dimensions, got {input.ndim}")
        if isinstance(diagonal, bool) or not isinstance(diagonal, int):
            raise TypeError(f"{name}: diagonal must be an int, got {diagonal!r}")
        return _apply(name, lambda a: keep(a, diagonal), [input], input.dtype, input.dtype)
    triangle.__name__ = triangle.__qualname__ = name
    return triangle


tril = _triangle("tril", lambda a, k: np.tril(a, k))
tril.__doc__ = """The elements on and below the diagonal-th diagonal of the last two dimensions; the others 0."""
triu = _triangle("triu", lambda a, k: np.triu(a, k))
triu.__doc__ = """The elements on and above the diagonal-th diagonal of the last two dimensions; the others 0."""


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False,
           dim: int | None = None) -> Tensor | tuple[Tensor, ...]:
    """The distinct values (or, with dim, distinct slices along dim), always sorted; with return_inverse the index
    of each element's value (int64, input's shape), with return_counts how often each occurs. NaNs stay apart, as
    in PyTorch."""
    _real("unique", input)
    a = input._host_array()
    if dim is None:
        values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True, equal_nan=False)
        inverse = inverse.reshape(input.shape)
    else:
        d = _norm_dim(dim, input.ndim, "unique: dim")
        values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True, axis=d, equal_nan=False)
        inverse = inverse.reshape(-1)
    device = input.device
    out = [_result(values, input.dtype, device)]
    if return_inverse:
        out.append(_result(inverse, _INT64, device))
    if return_counts:
        out.append(_result(counts, _INT64, device))
    return out[0] if len(out) == 1 else tuple(out)


# ---- joining ----

def _tensors(name, tensors):
    if not tensors:
        raise ValueError(f"{name}: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, _Tensor):
            raise TypeError(f"{name}: expected a sequence of tensors, got {type(t).__name__} at position {i}")


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The tensors joined along dim (their other sizes equal), in their promoted dtype, as torch.cat; empty 1-d
    tensors are skipped, as PyTorch does. While a model is traced it records the concatenation."""
    from .nn.graph import Common, Symbolic, cat as traced_cat, read_by_op
    tensors = read_by_op("cat", list(tensors), True)  # in a traced forward: parameters joined (BEiT's biases) train
    if builtins.any(isinstance(t, (Symbolic, Common)) for t in tensors):
        return traced_cat(tensors, dim)
    _tensors("cat", tensors)
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise ValueError(f"cat: zero-dimensional tensor (at position {i}) cannot be concatenated")
    dt = result_type(*tensors)
    parts = [(i, t) for i, t in enumerate(tensors) if t.shape != (0,)] or [(0, tensors[0])]
    first = parts[0][1]
    d = _norm_dim(dim, first.ndim, "cat: dim")
    for i, t in parts:
        if t.ndim != first.ndim or builtins.any(a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != d):
            raise ValueError(f"cat: sizes of tensors must match except in dimension {d}, but got shapes "
                             f"{first.shape} and {t.shape} (at position {i})")
    parts = [t for _, t in parts]
    if dt in (_FLOAT32, _BFLOAT16) and builtins.all(t.dtype is dt for t in parts):
        return _C.concat_forward(None, parts, d)  # the C copy, on the tensors' own device
    return _apply("cat", lambda *arrays: np.concatenate(arrays, axis=d), parts, dt, dt)


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    """The tensors joined along their first dimension when they are 1-d (0-d ones as 1-d), else their second, as
    torch.hstack."""
    tensors = [t.reshape(1) if t.ndim == 0 else t for t in tensors]
    return cat(tensors, 0 if tensors and tensors[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    """The tensors joined along their first dimension, a 1-d (or 0-d) one as a row, as torch.vstack."""
    return cat([t.reshape(1, -1) if t.ndim < 2 else t for t in tensors], 0)


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """The sum of products the equation names (NumPy's and PyTorch's subscripts: ``"bij,bjk->bik"``; the operands may
    come as one list), of tensors of one dtype. While a model is traced it records matmuls, or products and sums
    (see nn/graph.py's einsum)."""
    from .nn.graph import Common, Symbolic, read_by_op
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TypeError(f"einsum: the equation must be a str, got {type(equation).__name__}")
    equation = equation.replace(" ", "")
    if not builtins.any(isinstance(x, Symbolic) for x in operands):  # parameters alone in a traced forward
        operands = read_by_op("einsum", list(operands), True)
    if builtins.any(isinstance(x, (Symbolic, Common)) for x in operands):
        from .nn.graph import einsum as traced_einsum
        return traced_einsum(equation, operands)
    _tensors("einsum", operands)
    inputs, arrow, out = equation.partition("->")
    subs = inputs.split(",")
    if not arrow:  # implicit: the indices appearing once
        out = "".join(c for c in set(inputs) if inputs.count(c) == 1)
    if builtins.any(c not in out and builtins.sum(c in s for s in subs) > 1 for c in set(inputs) - {","}):
        operands = cast(*operands)  # a contraction: torch.autocast's einsum runs it as bmm, in its dtype
    dtypes = {x.dtype for x in operands}
    if len(dtypes) != 1:
        raise TypeError(f"einsum: expected operands of one dtype, got {', '.join(sorted(d.name for d in dtypes))}")
    dt = dtypes.pop()
    if len(operands) == 1 and not dt.is_floating_point and set(subs[0]) - set(out) - {"."}:
        dt = _INT64  # one operand summed over an index: torch.sum's int64 for bool and integers, as torch.einsum

    def contract(*arrays):
        try:
            return np.einsum(equation, *arrays)
        except ValueError as e:
            raise ValueError(f"einsum: {e} (equation {equation!r}, shapes "
                             f"{', '.join(str(tuple(x.shape)) for x in operands)})") from None
    return _apply("einsum", contract, list(operands), dt, dt)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Equally shaped tensors joined along a new dimension dim, as torch.stack."""
    from .nn.graph import Common, Symbolic, cat as traced_cat, read_by_op
    tensors = read_by_op("stack", list(tensors), True)  # parameters stacked in a traced forward train
    if builtins.any(isinstance(t, (Symbolic, Common)) for t in tensors):  # traced: each as a new dimension, joined
        if dim == 0 and builtins.all(isinstance(t, Symbolic) for t in tensors):
            from .nn.graph import Layered
            return Layered(tensors)  # before the batch: RNN states, one per layer
        return traced_cat([t.unsqueeze(dim) for t in tensors], dim)
    _tensors("stack", tensors)
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack expects each tensor to be equal size, but got {tensors[0].shape} at entry 0 and "
                             f"{t.shape} at entry {i}")
    n = tensors[0].ndim + 1
    if not -n <= operator.index(dim) < n:
        raise IndexError(f"stack: dim {dim} is out of range for stacking {n - 1}-d tensors (expected in [{-n}, "
                         f"{n - 1}])")
    d = _norm_dim(dim, n)
    # a reshape's size-1 dimension has the stride of a contiguous tensor's (unsqueeze's 0 would lay the result
    # out with that dimension innermost)
    return cat([t.reshape(*t.shape[:d], 1, *t.shape[d:]) for t in tensors], d)


# ---- Tensor methods: operators, in-place forms, advanced indexing ----

def operator_method(fn: Callable, reflected: bool = False) -> Callable:
    """fn as a Tensor operator: NotImplemented for an operand it does not know, so that the other side (a traced
    value, say) answers."""
    def op(self, other):
        if not _is_operand(other):
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)
    op.__name__ = op.__qualname__ = fn.__name__
    return op


def in_place(fn: Callable) -> Callable:
    """fn as an in-place Tensor method: the result is written into self's own memory (same tensor, same storage),
    refused when its dtype cannot be stored in self's or its shape is not self's."""
    name = fn.__name__ + "_"

    def method(self, *args, **kwargs):
        from ._tensor import _refuse_traced_write
        _refuse_traced_write(self, name)
        out = fn(self, *args, **kwargs)
        if not _can_cast(out.dtype, self.dtype):
            raise TypeError(f"{name}: result type {out.dtype.name} can't be cast to the desired output type "
                            f"{self.dtype.name}")
        if out.shape != self.shape:
            raise ValueError(f"{name}: output with shape {self.shape} doesn't match the broadcast shape {out.shape}")
        try:
            return self.copy_(out)
        except ValueError as e:  # self refused as a destination: say so of the op the user called
            raise ValueError(str(e).replace("copy_:", f"{name}:", 1)) from None
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{fn.__name__}(self, ...) written into self's own memory; returns self."
    return method


def _index_item(item):
    """An advanced index item as NumPy reads it: tensors as their values (uint8 ones as masks, as in PyTorch)."""
    if isinstance(item, _Tensor):
        dt = DTYPES[item._dtype_code]
        if dt.is_floating_point or dt.is_complex:
            raise IndexError(f"tensors used as indices must be integer or bool tensors, got {dt.name}")
        a = item._host_array()
        return a.astype(bool) if dt is _UINT8 else a
    return item


def sequence_as_tuple(index: Any) -> Any:
    """A list index holding a tensor, a sequence, a slice, None or ... as the tuple of indices PyTorch reads it as
    (its treatSequenceAsTuple, NumPy's old rule, for lists shorter than 32): a[[[0], [1]]] is a[[0], [1]]; other
    lists are one index array."""
    if isinstance(index, list) and len(index) < 32 and builtins.any(
            isinstance(i, (_Tensor, list, tuple, np.ndarray, slice)) or i is None or i is Ellipsis
            for i in index):
        return tuple(index)
    return index


def advanced_index(index: Any) -> tuple | None:
    """index as a NumPy index when it holds arrays, lists or tuples, bool or tensors beyond 0-d integer ones
    (advanced indexing, which copies); None when it is a basic index (a view)."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, _Tensor):
            if item.ndim or not (DTYPES[item._dtype_code].name.startswith("int")):
                break
        elif isinstance(item, (list, tuple, np.ndarray, bool, np.bool_)):
            break
    else:
        return None
    return tuple(_index_item(i) for i in items)


def _is_int_index(item: Any) -> bool:
    if isinstance(item, _Tensor):
        return item.ndim == 0 and DTYPES[item._dtype_code].name.startswith("int")
    return isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))


def ints_first(index: Any) -> tuple[tuple, tuple] | None:
    """(basic, rest) for an index mixing integers with arrays, lists or tensors: the integers taken first as a
    basic index (a view), as PyTorch reads them, then rest on that view. NumPy counts an integer as one of the
    arrays, whose dimensions then go first when a slice separates them (x[0, :, [0, 1]] of a (2, 3, 4) x is (3, 2)
    in PyTorch, (2, 3) in NumPy). None when there is nothing to split."""
    items = index if isinstance(index, tuple) else (index,)
    if not builtins.any(_is_int_index(i) for i in items):
        return None
    basic, rest = [], []
    for item in items:
        if _is_int_index(item):
            basic.append(item)
        elif item is None or item is Ellipsis or isinstance(item, slice):
            basic.append(item)
            rest.append(Ellipsis if item is Ellipsis else slice(None))
        else:  # an array index: the dimensions it indexes stay whole in the view (a bool scalar indexes none)
            a = np.asarray(item._host_array() if isinstance(item, _Tensor) else item)
            mask = a.dtype == bool or isinstance(item, _Tensor) and DTYPES[item._dtype_code] is _UINT8
            basic += [slice(None)] * (a.ndim if mask else 1)
            rest.append(item)
    return tuple(basic), tuple(rest)


def _check_masks(shape: tuple, index: tuple) -> None:
    """Fails for a bool mask of other sizes than the dimensions it indexes, as PyTorch does (NumPy takes an empty
    one for a dimension of any size)."""
    items = [np.asarray(i) if isinstance(i, (list, tuple)) else i for i in index]

    def span(i):  # the dimensions item i indexes
        if i is None or isinstance(i, (bool, np.bool_)):
            return 0
        return i.ndim if isinstance(i, np.ndarray) and i.dtype == bool else 1
    at = 0
    for i in items:
        if i is Ellipsis:
            at += len(shape) - builtins.sum(span(k) for k in items if k is not Ellipsis)
            continue
        n = span(i)
        if isinstance(i, np.ndarray) and i.dtype == bool and tuple(shape[at:at + n]) != i.shape:
            raise IndexError(f"the shape of the mask {list(i.shape)} at index {at} does not match the shape "
                             f"{list(shape[at:at + n])} of the indexed tensor there")
        at += n


def getitem(input: Tensor, index: tuple) -> Tensor:
    """input[index] for an advanced (NumPy) index: a new tensor on input's device."""
    _check_masks(tuple(input.shape), index)
    a = input._host_array()
    out = a[index]
    if np.may_share_memory(out, a):  # a bool scalar alone indexes as a view in NumPy
        out = out.copy()
    return _result(out, input.dtype, input.device)


def setitem(input: Tensor, index: tuple, value: Any) -> None:
    """input[index] = value for an advanced (NumPy) index, written into input's memory. Numbers are checked as fill_
    checks them, arrays and lists convert by the casts' rules (tensors.md); a tensor of another dtype is refused, as
    PyTorch's index_put_ refuses it, but for one value written by a mask (PyTorch's masked_fill_ then)."""
    _check_masks(tuple(input.shape), index)
    if isinstance(value, _Tensor) and value.dtype is not input.dtype:
        arrays = [i for i in index if isinstance(i, (np.ndarray, list, tuple))]
        by_mask = len(arrays) == 1 and np.asarray(arrays[0]).dtype == bool and np.ndim(arrays[0])
        if arrays and not (by_mask and value.numel() == 1):
            raise TypeError(f"index put requires the source and destination dtypes to match, as in PyTorch: got "
                            f"{input.dtype.name} for the destination and {value.dtype.name} for the source")
    if isinstance(value, np.ndarray):
        value = _C.from_numpy(value)
    elif not isinstance(value, _Tensor):
        if isinstance(value, _SCALARS):
            checked_number(value, input.dtype)
        value = _C.tensor_from_data(value, input.dtype._code)
    value = value.to(input.dtype)._host_array()
    if not input.is_cuda and input.dtype is not _BFLOAT16 and not input._readonly:
        target = input.numpy()
        if np.may_share_memory(target, value):  # t[mask] = t[:3]: NumPy's masked write reads as it writes
            value = value.copy()
        target[index] = value  # straight into the tensor's memory
        return
    host = np.array(input._host_array())  # a copy: written, then copied back whole (copy_ converts, moves, checks)
    host[index] = value
    input.copy_(_C.from_numpy(host))


# ---- more of PyTorch's everyday functions: NumPy computes them (a CUDA tensor's on the host) ----

log2 = _floating("log2", np.log2, on_device=False)
log10 = _floating("log10", np.log10, on_device=False)
exp2 = _floating("exp2", np.exp2, on_device=False)
sin = _floating("sin", np.sin, on_device=False)
cos = _floating("cos", np.cos, on_device=False)
tan = _floating("tan", np.tan, on_device=False)
asin = _floating("asin", np.arcsin, on_device=False)
acos = _floating("acos", np.arccos, on_device=False)
atan = _floating("atan", np.arctan, on_device=False)
sinh = _floating("sinh", np.sinh, on_device=False)
cosh = _floating("cosh", np.cosh, on_device=False)
reciprocal = _floating("reciprocal", np.reciprocal, on_device=False)
erf = _floating("erf", np.vectorize(math.erf, otypes=[np.float64]), on_device=False)
erfc = _floating("erfc", np.vectorize(math.erfc, otypes=[np.float64]), on_device=False)


def _host_binary(name, fn, input, other, floating=False, out=None):
    """fn(input, other) broadcast, in their promoted dtype (float32 for integers when floating), as dtype out (the
    computed one by default)."""
    a, b = _arg(input), _arg(other)
    dt = result_type(a, b)
    if floating and not dt.is_floating_point:
        dt = _FLOAT32
    return _elementwise(name, fn, [a, b], dt, out or dt)


def atan2(input: Operand, other: Operand) -> Tensor:
    """The angle of (other, input) elementwise, as torch.atan2."""
    return _host_binary("atan2", np.arctan2, input, other, floating=True)


def hypot(input: Operand, other: Operand) -> Tensor:
    """sqrt(input ** 2 + other ** 2) elementwise, without overflow, as torch.hypot."""
    return _host_binary("hypot", np.hypot, input, other, floating=True)


def logaddexp(input: Operand, other: Operand) -> Tensor:
    """log(exp(input) + exp(other)) elementwise, without overflow, as torch.logaddexp."""
    return _host_binary("logaddexp", np.logaddexp, input, other, floating=True)


def fmod(input: Operand, other: Operand) -> Tensor:
    """The remainder of input / other with the sign of input (C's fmod), as torch.fmod; % has other's sign."""
    if result_type(_arg(input), _arg(other)) is _BOOL:
        raise TypeError("fmod: not supported for bool tensors")
    return _host_binary("fmod", _nonzero_divisor(np.fmod), input, other)


def fmax(input: Operand, other: Operand) -> Tensor:
    """The elementwise maximum where NaN loses to a number, as torch.fmax (maximum propagates NaN)."""
    return _host_binary("fmax", np.fmax, input, other)


def fmin(input: Operand, other: Operand) -> Tensor:
    """The elementwise minimum where NaN loses to a number, as torch.fmin (minimum propagates NaN)."""
    return _host_binary("fmin", np.fmin, input, other)


def logical_and(input: Operand, other: Operand) -> Tensor:
    """Whether both are nonzero, elementwise, as a bool tensor."""
    return _host_binary("logical_and", np.logical_and, input, other, out=_BOOL)


def logical_or(input: Operand, other: Operand) -> Tensor:
    """Whether either is nonzero, elementwise, as a bool tensor."""
    return _host_binary("logical_or", np.logical_or, input, other, out=_BOOL)


def logical_xor(input: Operand, other: Operand) -> Tensor:
    """Whether exactly one is nonzero, elementwise, as a bool tensor."""
    return _host_binary("logical_xor", np.logical_xor, input, other, out=_BOOL)


def logical_not(input: Tensor) -> Tensor:
    """Whether input is zero, elementwise, as a bool tensor."""
    return _apply("logical_not", np.logical_not, [input], input.dtype, _BOOL)


def lerp(input: Tensor, end: Operand, weight: Operand) -> Tensor:
    """input + weight * (end - input) where |weight| < 0.5, else end - (end - input) * (1 - weight): torch.lerp's two
    forms, exact at both ends (a weight of 1 gives end, an infinite end too). Of floating tensors: end (a tensor)
    and a weight of dimensions must have input's dtype, as in PyTorch."""
    if not isinstance(input, _Tensor) or not input.dtype.is_floating_point:
        got = input.dtype.name if isinstance(input, _Tensor) else type(input).__name__
        raise TypeError(f"lerp: expected a floating point tensor, got {got}")
    for name, x in (("end", end), ("weight", weight)):
        if isinstance(x, _Tensor) and x.dtype is not input.dtype and (name == "end" or x.ndim):
            raise TypeError(f"lerp: expected dtype {input.dtype.name} for `{name}` but got dtype {x.dtype.name}")
    operands, out = (input, end, weight), result_type(input, end, weight)
    if out.is_floating_point and builtins.any(isinstance(x, _C.TensorBase) and x.dtype.is_floating_point and
                                              x.dtype.itemsize == 2 for x in operands):
        # 16-bit operands in float32, the result rounded once, as PyTorch's opmath
        return lerp(*[x.float() if isinstance(x, _C.TensorBase) else x for x in operands]).to(out)
    diff = sub(end, input)
    low, high = add(input, mul(weight, diff)), sub(end, mul(diff, sub(1.0, weight)))
    if isinstance(weight, _C.TensorBase):
        return where(abs(weight) < 0.5, low, high)
    return low if builtins.abs(weight) < 0.5 else high


def isclose(input: Operand, other: Operand, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> Tensor:
    """Whether |input - other| <= atol + rtol |other| elementwise (infinities equal only to themselves), as a bool
    tensor, as torch.isclose."""
    return _host_binary("isclose", lambda x, y: np.isclose(x, y, rtol, atol, equal_nan), input, other, out=_BOOL)


def allclose(input: Operand, other: Operand, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """Whether isclose holds everywhere, as torch.allclose."""
    return bool(isclose(input, other, rtol, atol, equal_nan).all())


def equal(input: Tensor, other: Tensor) -> bool:
    """Whether the two have the same shape and elements, as torch.equal."""
    return tuple(input.shape) == tuple(other.shape) and bool(eq(input, other).all())


def _total_dtype(input, dtype):
    return as_dtype(dtype) if dtype is not None else input.dtype if input.dtype.is_floating_point else _INT64


def prod(input: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: DTypeLike | None = None) -> Tensor:
    """The product over dim (all dimensions by default), in dtype if given, else int64 for bool and integer tensors
    and input's dtype otherwise, as torch.prod."""
    out = _total_dtype(input, dtype)
    axes = _axes("prod", input, dim)
    return _apply("prod", lambda a: np.prod(a, axis=axes, keepdims=keepdim), [input], out, out)


def cumprod(input: Tensor, dim: int, *, dtype: DTypeLike | None = None) -> Tensor:
    """The running products along dim, in dtype if given, else int64 for bool and integer tensors and input's
    dtype, as torch.cumprod."""
    out = _total_dtype(input, dtype)
    d = _norm_dim(dim, input.ndim, "cumprod: dim")
    return _apply("cumprod", lambda a: _running(np.cumprod, a, d), [input], out, out)


def nansum(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: DTypeLike | None = None) -> Tensor:
    """The sum over dim with NaN counted as zero, as torch.nansum."""
    out = _total_dtype(input, dtype)
    axes = _axes("nansum", input, dim)
    return _apply("nansum", lambda a: np.nansum(a, axis=axes, keepdims=keepdim), [input], out, out)


def nanmean(input: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:
    """The mean over dim of the values that are not NaN (NaN where there are none), as torch.nanmean."""
    if not input.dtype.is_floating_point:
        raise TypeError(f"nanmean: expected a floating point tensor, got {input.dtype.name}")
    axes = _axes("nanmean", input, dim)

    def mean_of(a):
        kept = ~np.isnan(a)
        return np.sum(np.where(kept, a, 0), axis=axes, keepdims=keepdim) / np.sum(kept, axis=axes, keepdims=keepdim)
    return _apply("nanmean", mean_of, [input], input.dtype, input.dtype)


def count_nonzero(input: Tensor, dim: Dims = None) -> Tensor:
    """The number of nonzero elements over dim (all by default), as an int64 tensor."""
    axes = _axes("count_nonzero", input, dim)
    return _apply("count_nonzero", lambda a: np.count_nonzero(a, axis=axes), [input], input.dtype, _INT64)


def median(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor | ValuesIndices:
    """The lower of the two middle values (not their mean) over all elements, or (values, indices) along dim, as
    torch.median; NaN where a NaN is among them."""
    _real("median", input)
    a = input._host_array()
    if dim is None:
        if a.size == 0:
            return _result(np.array(np.nan), input.dtype, input.device)
        flat = np.sort(a.reshape(-1), kind="stable")  # NaN sorts last
        return _result(flat[-1] if np.isnan(flat[-1]) else flat[(flat.size - 1) // 2], input.dtype, input.device)
    d = _norm_dim(dim, input.ndim, "median: dim")
    a = a.reshape(a.shape or (1,))
    if a.shape[d] == 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    order = np.argsort(a, axis=d, kind="stable")
    middle = np.take_along_axis(order, np.full((1,) * a.ndim, (a.shape[d] - 1) // 2), axis=d)
    nan = np.isnan(a)
    indices = np.where(nan.any(axis=d, keepdims=True), np.argmax(nan, axis=d, keepdims=True), middle)  # first NaN
    values = np.take_along_axis(a, indices, axis=d)
    if not keepdim:
        values, indices = values.squeeze(d), indices.squeeze(d)
    if input.ndim == 0:
        values, indices = values.reshape(()), indices.reshape(())
    return ValuesIndices(_result(values, input.dtype, input.device), _result(indices, _INT64, input.device))


def quantile(input: Tensor, q: float | Tensor, dim: int | None = None, keepdim: bool = False, *,
             interpolation: str = "linear") -> Tensor:
    """The q-th quantiles (q in [0, 1], a number or a 1-d tensor whose quantiles come first) over dim (all elements
    by default) of a floating tensor, interpolated as interpolation says, as torch.quantile."""
    if not input.dtype.is_floating_point:
        raise TypeError(f"quantile: input must be a floating point tensor, got {input.dtype.name}")
    if interpolation not in ("linear", "lower", "higher", "midpoint", "nearest"):
        raise ValueError(f"quantile: interpolation must be one of linear, lower, higher, midpoint or nearest, got "
                         f"{interpolation!r}")
    qs = np.asarray(q._host_array() if isinstance(q, _Tensor) else q, np.float64)
    if qs.ndim > 1 or np.any((qs < 0) | (qs > 1)):
        raise ValueError("quantile: q must be a scalar or 1-d with values in [0, 1]")
    axis = None if dim is None else _norm_dim(dim, input.ndim, "quantile: dim")
    if not input.ndim:  # dim 0 (or -1) of a 0-d tensor: its one value
        axis = None
    if (input.numel() if axis is None else input.shape[axis]) == 0:
        raise ValueError("quantile: the values to take quantiles of are empty")
    return _apply("quantile", lambda a: np.quantile(a, qs, axis=axis, keepdims=keepdim, method=interpolation),
                  [input], input.dtype, input.dtype)


def linspace(start: float, end: float, steps: int, *, dtype: DTypeLike | None = None,
             device: DeviceLike = None) -> Tensor:
    """steps values evenly spaced from start to end (both included), float32 by default, as torch.linspace."""
    if steps < 0:
        raise ValueError(f"linspace: number of steps must be non-negative, got {steps}")
    return _result(np.linspace(start, end, steps), as_dtype(dtype or "float32"), device or CPU)


def eye(n: int, m: int | None = None, *, dtype: DTypeLike | None = None, device: DeviceLike = None) -> Tensor:
    """The n x m (n x n) identity matrix, float32 by default, as torch.eye."""
    return _result(np.eye(n, m), as_dtype(dtype or "float32"), device or CPU)


def _triangle_indices(name, numpy_fn, row, col, offset, dtype, device):
    if row < 0 or col < 0:
        raise ValueError(f"{name}: row and col must be non-negative, got {row} and {col}")
    return _result(np.stack(numpy_fn(row, offset, col)).reshape(2, -1), as_dtype(dtype or "int64"), device or CPU)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype: DTypeLike | None = None,
                 device: DeviceLike = None) -> Tensor:
    """The (2, K) row and column indices of a row x col matrix's lower triangle (on and below diagonal offset),
    row by row, as torch.tril_indices (DLRM's pairs of features: Z[:, li, lj])."""
    return _triangle_indices("tril_indices", np.tril_indices, row, col, offset, dtype, device)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype: DTypeLike | None = None,
                 device: DeviceLike = None) -> Tensor:
    """The (2, K) row and column indices of a row x col matrix's upper triangle (on and above diagonal offset),
    row by row, as torch.triu_indices."""
    return _triangle_indices("triu_indices", np.triu_indices, row, col, offset, dtype, device)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """The outer product of two 1-d tensors, in their promoted dtype, as torch.outer."""
    if input.ndim != 1 or vec2.ndim != 1:
        raise ValueError(f"outer: expected two 1-d tensors, got {input.ndim}-d and {vec2.ndim}-d")
    return mul(input.unsqueeze(1), vec2.unsqueeze(0))


def _product(name, ndims, input, other):
    if (input.ndim, other.ndim) != ndims:
        raise ValueError(f"{name}: expected {ndims[0]}-d and {ndims[1]}-d tensors, got {input.ndim}-d and "
                         f"{other.ndim}-d")
    return matmul(input, other) if name in ("mm", "bmm") else _matmul(input, other)


def dot(input: Tensor, other: Tensor) -> Tensor:
    """The dot product of two 1-d tensors of one dtype, as torch.dot."""
    return _product("dot", (1, 1), input, other)


def mv(input: Tensor, vec: Tensor) -> Tensor:
    """A matrix (2-d) times a vector (1-d), as torch.mv."""
    return _product("mv", (2, 1), input, vec)


def mm(input: Tensor, mat2: Tensor) -> Tensor:
    """The product of two matrices (2-d), as torch.mm."""
    return _product("mm", (2, 2), input, mat2)


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Operand = 1, alpha: Operand = 1) -> Tensor:
    """beta * input + alpha * (mat1 @ mat2), input broadcasting to the product (a bias), as torch.addmm (input not
    read where beta is 0). Traced, of rows merged from the batch too (GPT-2's Conv1D: addmm(b, x.view(-1, C), W))."""
    return _scaled_sum(input, mat1 @ mat2, beta, alpha)


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Operand = 1, alpha: Operand = 1) -> Tensor:
    """beta * input + alpha * (batch1 @ batch2) of batches of matrices, as torch.baddbmm."""
    return _scaled_sum(input, batch1 @ batch2, beta, alpha)


def _scaled_sum(input, product, beta, alpha):
    out = product if alpha == 1 else product * alpha
    return out if beta == 0 else out + (input if beta == 1 else input * beta)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """The products of two batches of matrices (3-d, the same batch size), as torch.bmm."""
    if input.ndim == 3 and mat2.ndim == 3 and input.shape[0] != mat2.shape[0]:
        raise ValueError(f"bmm: batch sizes differ: {input.shape[0]} and {mat2.shape[0]}")
    return _product("bmm", (3, 3), input, mat2)


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The view of the diagonal of dimensions dim1 and dim2 (offset above it when positive, below when negative),
    appended as the last dimension, as torch.diagonal."""
    a, b = _norm_dim(dim1, input.ndim, "diagonal: dim1"), _norm_dim(dim2, input.ndim, "diagonal: dim2")
    if a == b:
        raise ValueError(f"diagonal: dim1 and dim2 must differ, both are {a}")
    shape, strides = list(input.shape), list(input.stride())
    n = builtins.max(builtins.min(shape[a] + builtins.min(offset, 0), shape[b] - builtins.max(offset, 0)), 0)
    start = input.storage_offset() + (offset * strides[b] if offset >= 0 else -offset * strides[a]) * (n > 0)
    keep = [d for d in range(input.ndim) if d not in (a, b)]
    return input.as_strided([shape[d] for d in keep] + [n], [strides[d] for d in keep] + [strides[a] + strides[b]],
                            start)


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """Of a 1-d tensor, the square matrix with it on the diagonal-th diagonal; of a 2-d one, that diagonal (a copy),
    as torch.diag."""
    if input.ndim == 1:
        return _apply("diag", lambda v: np.diag(v, diagonal), [input], input.dtype, input.dtype)
    if input.ndim != 2:
        raise ValueError(f"diag: expected a 1-d or 2-d tensor, got {input.ndim}-d")
    return input.diagonal(diagonal).clone()


def trace(input: Tensor) -> Tensor:
    """The sum of a matrix's diagonal, as torch.trace."""
    if input.ndim != 2:
        raise ValueError(f"trace: expected a 2-d tensor, got {input.ndim}-d")
    return sum(diagonal(input))


def nonzero(input: Tensor, *, as_tuple: bool = False) -> Tensor | tuple[Tensor, ...]:
    """The indices of the nonzero elements: an int64 (count, ndim) tensor, or one per dimension with as_tuple, as
    torch.nonzero."""
    if as_tuple:
        return where(input)
    _real("nonzero", input)
    return _result(np.argwhere(input._host_array()), _INT64, input.device)


def _index_vector(name, index):
    if not isinstance(index, _Tensor) or index.ndim > 1 or index.dtype.is_floating_point or index.dtype is _BOOL:
        raise TypeError(f"{name}: index must be a 0-d or 1-d integer tensor")
    return index._host_array().reshape(-1)


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries along dim at index (a 1-d integer tensor), a copy, as torch.index_select."""
    d = _norm_dim(dim, input.ndim, "index_select: dim")
    i = _index_vector("index_select", index)
    size = input.shape[d] if input.ndim else 1
    if i.size and (i.min() < 0 or i.max() >= size):
        raise IndexError(f"index_select: index out of range for dimension {d} of size {size}")
    if not input.ndim and i.size != 1:
        raise IndexError(f"index_select: a 0-d tensor takes an index of one value, got {i.size}")
    return _apply("index_select", lambda a: np.take(a.reshape(a.shape or (1,)), i, axis=d).reshape(
        [*a.shape[:d], i.size, *a.shape[d + 1:]] if input.ndim else ()), [input], input.dtype, input.dtype)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Operand = 1) -> Tensor:
    """A copy of input with alpha * source's entries along dim added at index (a 1-d integer tensor; repeated
    entries add up), as torch.index_add: source of input's dtype."""
    if source.dtype is not input.dtype:
        raise TypeError(f"index_add: expected source of input's dtype {input.dtype.name}, got {source.dtype.name}")
    d = _norm_dim(dim, input.ndim, "index_add: dim")
    i = _index_vector("index_add", index)
    size = input.shape[d] if input.ndim else 1
    want = tuple(input.shape[:d]) + (i.size,) + tuple(input.shape[d + 1:])
    if tuple(source.shape) != want:
        raise ValueError(f"index_add: source must have shape {want} (input's, with index's length along dim {d}), "
                         f"got {tuple(source.shape)}")
    if i.size and (i.min() < 0 or i.max() >= size):
        raise IndexError(f"index_add: index out of range for dimension {d} of size {size}")

    def added(a, s):
        out = a.copy()
        np.add.at(np.moveaxis(out, d, 0), i, np.moveaxis(s, d, 0) * alpha)
        return out
    return _apply("index_add", added, [input, source], input.dtype, input.dtype)


def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The elements where mask (a bool tensor, broadcast) holds, as a 1-d copy, as torch.masked_select."""
    if not isinstance(mask, _Tensor) or mask.dtype is not _BOOL:
        raise TypeError("masked_select: mask must be a bool tensor")
    shape = _broadcast("masked_select", input.shape, mask.shape)
    m = np.broadcast_to(mask._host_array(), shape)
    return _apply("masked_select", lambda a: np.broadcast_to(a, shape)[m], [input], input.dtype, input.dtype)


def _scattered(name, input, dim, index, src, add_at):
    """scatter or scatter_add (add_at) of src (a tensor of input's dtype, or a number), 0-d tensors taken as 1-d,
    as PyTorch's."""
    d = _norm_dim(dim, input.ndim, f"{name}: dim")
    if not isinstance(index, _Tensor) or index.dtype is not _INT64 or builtins.max(index.ndim, 1) != \
            builtins.max(input.ndim, 1):
        raise TypeError(f"{name}: index must be an int64 tensor with as many dimensions as input")
    if isinstance(src, _Tensor) and src.dtype is not input.dtype:
        raise TypeError(f"{name}: expected src of input's dtype {input.dtype.name}, got {src.dtype.name}")
    shape = input.shape or (1,)
    i = index._host_array().reshape(index.shape or (1,))
    if i.size and (i.min() < 0 or i.max() >= shape[d]):
        raise IndexError(f"{name}: index out of range for dimension {d} of size {shape[d]}")
    if builtins.any(n > m for k, (n, m) in enumerate(zip(i.shape, shape)) if k != d):
        raise ValueError(f"{name}: index of shape {tuple(i.shape)} is larger than input {tuple(input.shape)} outside "
                         f"dimension {d}")
    values = np.asarray(_array(src, input.dtype))
    if values.ndim:
        if builtins.any(n > m for n, m in zip(i.shape, values.shape)):
            raise ValueError(f"{name}: index of shape {tuple(i.shape)} is larger than src {tuple(values.shape)}")
        values = values[tuple(slice(n) for n in i.shape)]
    out = np.array(_array(input, input.dtype)).reshape(shape)
    where_ = tuple(i if k == d else np.arange(n).reshape([-1 if j == k else 1 for j in range(i.ndim)])
                   for k, n in enumerate(i.shape))
    if add_at:
        np.add.at(out, where_, np.broadcast_to(values, i.shape))
    else:
        out[where_] = np.broadcast_to(values, i.shape)
    return _result(out.reshape(input.shape), input.dtype, input.device)


def scatter(input: Tensor, dim: int, index: Tensor, src: Operand = None, *, value: Operand = None) -> Tensor:
    """A copy of input with src (a tensor, or value) written at index along dim: out[index[i][j]][j] = src[i][j]
    for dim 0, as torch.scatter (where index repeats a place, one of the writes is kept)."""
    return _scattered("scatter", input, dim, index, value if src is None else src, False)


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of input with src added at index along dim (repeated places add up), as torch.scatter_add."""
    return _scattered("scatter_add", input, dim, index, src, True)


def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """The count (or weights' sum) of each value of a 1-d non-negative integer tensor, as torch.bincount."""
    if input.ndim != 1 or input.dtype.is_floating_point or input.dtype is _BOOL:
        raise TypeError("bincount: input must be a 1-d integer tensor")
    a = input._host_array()
    if a.size and a.min() < 0:
        raise ValueError("bincount: input must be non-negative")
    w = None if weights is None else weights._host_array().astype(np.float64)
    out = _INT64 if weights is None else weights.dtype if weights.dtype.is_floating_point else _BY_NAME["float64"]
    return _result(np.bincount(a, w, minlength), out, input.device)


def diff(input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """The n-th forward differences along dim (after prepend and append joined there), as torch.diff; of a bool
    tensor, whether neighbours differ."""
    x = cat([t for t in (prepend, input, append) if t is not None], dim) if prepend is not None or \
        append is not None else input
    d = _norm_dim(dim, x.ndim, "diff: dim")
    return _apply("diff", lambda a: np.diff(a, n, axis=d), [x], x.dtype, x.dtype)  # of bools NumPy's too xors


def isin(elements: Operand, test_elements: Operand, *, invert: bool = False) -> Tensor:
    """Whether each element of elements is among test_elements, as a bool tensor, as torch.isin."""
    device = _device("isin", [elements, test_elements])
    dt = result_type(_arg(elements), _arg(test_elements))
    return _result(np.isin(_array(_arg(elements), dt), _array(_arg(test_elements), dt), invert=invert), _BOOL,
                   device)


def searchsorted(sorted_sequence: Tensor, input: Operand, *, right: bool = False, side: str | None = None) -> Tensor:
    """Where each value of input would go in the last dimension of sorted_sequence to keep it sorted (the first
    such place, or the last with right=True or side='right'), as int64, as torch.searchsorted."""
    right = right or side == "right"
    seq = sorted_sequence._host_array()
    values = np.asarray(_array(_arg(input), result_type(sorted_sequence, _arg(input))))
    side = "right" if right else "left"
    if seq.ndim <= 1:
        out = np.searchsorted(seq, values, side=side)
    else:
        if values.shape[:-1] != seq.shape[:-1]:
            raise ValueError(f"searchsorted: the leading dimensions of sorted_sequence {seq.shape} and input "
                             f"{values.shape} differ")
        rows = [np.searchsorted(s, v, side=side) for s, v in zip(seq.reshape(-1, seq.shape[-1]),
                                                                  values.reshape(-1, values.shape[-1]))]
        out = np.array(rows).reshape(values.shape)
    return _result(out, _INT64, sorted_sequence.device)


def bucketize(input: Operand, boundaries: Tensor, *, right: bool = False) -> Tensor:
    """The bucket of each value of input among the 1-d sorted boundaries (boundaries[i-1] < x <= boundaries[i];
    with right=True boundaries[i-1] <= x < boundaries[i]), as int64, as torch.bucketize."""
    if boundaries.ndim != 1:
        raise ValueError(f"bucketize: boundaries must be 1-d, got {boundaries.ndim}-d")
    return searchsorted(boundaries, input, right=right)


def repeat_interleave(input: Tensor, repeats: int | Tensor, dim: int | None = None) -> Tensor:
    """Each element repeated repeats times (a number, or one count per element along dim) along dim (of the
    flattened input when dim is None), as torch.repeat_interleave."""
    r = repeats._host_array() if isinstance(repeats, _Tensor) else repeats
    if np.any(np.asarray(r) < 0):
        raise ValueError("repeat_interleave: repeats must be non-negative")
    d = None if dim is None else _norm_dim(dim, input.ndim, "repeat_interleave: dim")
    return _apply("repeat_interleave", lambda a: np.repeat(a, r, axis=d), [input], input.dtype, input.dtype)


def meshgrid(*tensors: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Views of the 1-d tensors expanded over the grid of all of them ('ij': the first varies along the first
    dimension; 'xy': the first two swapped), as torch.meshgrid."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if builtins.any(t.ndim != 1 for t in tensors):
        raise ValueError("meshgrid: expects 1-d tensors")
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        order[0], order[1] = 1, 0
    shape = [tensors[k].shape[0] for k in order]
    return tuple(t.reshape([-1 if order[j] == i else 1 for j in range(len(tensors))]).expand(shape)
                 for i, t in enumerate(tensors))


# ---- the same functions on traced values ----
# While model.compile traces a forward, these functions meet traced values (nn/graph.py's Symbolic) and record
# nodes through the value's operators and methods, so a forward written with ft.exp, ft.sum, ... compiles.

def _on_traced(fn: Callable, traced: Callable) -> Callable:
    """fn, or on a traced value traced. A trainable parameter that a traced forward (or loss) reads becomes a value
    of its own shape computed once per step (graph.read_by_op)."""
    def call(*args, **kwargs):
        from .nn.graph import Common, Layered, Symbolic, read_by_op
        args = read_by_op(fn.__name__, args, True)
        if builtins.any(isinstance(a, (Symbolic, Common, Layered)) for a in args):
            return traced(*args, **kwargs)
        return fn(*args, **kwargs)
    return functools.update_wrapper(call, fn)


_NUMPY_NAMES = (("axis", "dim"), ("keepdims", "keepdim"))


def numpy_names(fn: Callable) -> Callable:
    """fn taking NumPy's names for its dimension arguments too, as PyTorch's functions and methods do: axis for
    dim, keepdims for keepdim (fn itself when it has neither)."""
    if getattr(fn, "_numpy_names", False):
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C function
        return fn
    aliases = [(a, d) for a, d in _NUMPY_NAMES if d in params and a not in params]
    if not aliases:
        return fn

    def call(*args, **kwargs):
        for alias, name in aliases:
            if alias in kwargs:
                if name in kwargs:
                    raise TypeError(f"{fn.__name__}() got both {name} and its alias {alias}")
                kwargs[name] = kwargs.pop(alias)
        return fn(*args, **kwargs)
    call._numpy_names = True
    return functools.update_wrapper(call, fn)


def take_numpy_names(namespace: dict | type) -> None:
    """numpy_names over the public functions of a module's globals() or a class's own methods, in place."""
    items = vars(namespace) if isinstance(namespace, type) else namespace
    for name, value in list(items.items()):
        if not name.startswith("_") and inspect.isfunction(value):
            if isinstance(namespace, type):
                setattr(namespace, name, numpy_names(value))
            else:
                namespace[name] = numpy_names(value)


def _traced_div(input, other, *, rounding_mode=None):
    if rounding_mode is not None:
        from .nn.graph import fail
        fail(f"div(..., rounding_mode={rounding_mode!r}) of a traced value", "divide without rounding")
    return input / other


_TRACED = {
    "neg": operator.neg, "exp": lambda x: x.exp(), "erf": lambda x: x.erf(), "log": lambda x: x.log(),
    "sin": lambda x: x.sin(), "cos": lambda x: x.cos(),
    "sqrt": lambda x: x.sqrt(), "isnan": lambda x: x.isnan(), "isinf": lambda x: x.isinf(),
    "isfinite": lambda x: x.isfinite(),
    "rsqrt": lambda x: x.rsqrt(),
    "abs": lambda x: x.abs(), "relu": lambda x: x.relu(), "sigmoid": lambda x: x.sigmoid(),
    "tanh": lambda x: x.tanh(), "pow": operator.pow, "mul": operator.mul, "matmul": operator.matmul,
    "add": lambda a, b, *, alpha=1: a + b * alpha, "sub": lambda a, b, *, alpha=1: a - b * alpha,
    "div": _traced_div,
    "sum": lambda x, dim=None, keepdim=False, *, dtype=None: x.sum(dim, keepdim),
    "mean": lambda x, dim=None, keepdim=False, *, dtype=None: x.mean(dim, keepdim),
    "var": lambda x, dim=None, unbiased=None, keepdim=False, *, correction=None: x.var(
        dim, True if unbiased is None else unbiased, keepdim, correction=correction),
    "std": lambda x, dim=None, unbiased=None, keepdim=False, *, correction=None: x.std(
        dim, True if unbiased is None else unbiased, keepdim, correction=correction),
    "softmax": lambda x, dim, dtype=None: x.softmax(dim),
    "log_softmax": lambda x, dim, dtype=None: x.log_softmax(dim),
    "clamp": lambda x, min=None, max=None: x.clamp(min, max), "clip": lambda x, min=None, max=None: x.clamp(min, max),
    "clamp_min": lambda x, min: x.clamp(min=min), "clamp_max": lambda x, max: x.clamp(max=max),
    "square": lambda x: x.square(), "logsumexp": lambda x, dim, keepdim=False: x.logsumexp(dim, keepdim),
    "where": lambda condition, input, other: _traced_where(condition, input, other),
    "masked_fill": lambda input, mask, value: input.masked_fill(mask, value),
    # ft.max(tensor, traced) is the traced value's maximum with the tensor (x.max would come back here)
    "max": lambda x, dim=None, keepdim=False: dim.maximum(x) if isinstance(x, _C.TensorBase) else x.max(dim, keepdim),
    "min": lambda x, dim=None, keepdim=False: dim.minimum(x) if isinstance(x, _C.TensorBase) else x.min(dim, keepdim),
    "amax": lambda x, dim=(), keepdim=False: x.amax(dim, keepdim),
    "amin": lambda x, dim=(), keepdim=False: x.amin(dim, keepdim),
    "norm": lambda x, p="fro", dim=None, keepdim=False, dtype=None: x.norm(p, dim, keepdim),
    "gather": lambda x, dim, index: _traced_gather(x, dim, index),
    "index_select": lambda x, dim, index: _traced_index_select(x, dim, index),
    "logical_or": lambda a, b: _traced_logical(a, b, False), "bitwise_or": lambda a, b: _traced_logical(a, b, False),
    "logical_and": lambda a, b: _traced_logical(a, b, True), "bitwise_and": lambda a, b: _traced_logical(a, b, True),
    "maximum": lambda a, b: _traced_extremum(a, b, True), "minimum": lambda a, b: _traced_extremum(a, b, False),
    "roll": lambda x, shifts, dims=None: x.roll(shifts, dims),
    "repeat_interleave": lambda input, repeats, dim=None: input.repeat_interleave(repeats, dim),
    "lerp": lambda input, end, weight: input + weight * (end - input),
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}


def _traced_extremum(a, b, larger):
    """torch.maximum (larger) or minimum of a traced value and another value, in either order."""
    from .nn.graph import Common, Symbolic
    a, b = (a, b) if isinstance(a, (Symbolic, Common)) else (b, a)
    return a.maximum(b) if larger else a.minimum(b)


def _traced_logical(a, b, both):
    """or (both=False) / and of masks while a forward is traced: of a traced mask and another mask."""
    from .nn.graph import Common, Symbolic
    a, b = (a, b) if isinstance(a, (Symbolic, Common)) else (b, a)
    return a.logical_and(b) if both else a.logical_or(b)


def _traced_gather(x, dim, index):
    """gather() while a forward or loss is traced: of a traced value, its own; of a tensor at traced indices (a focal
    loss's per-class weights alpha.gather(0, y)), a 1-d tensor's values at them, as x[index]."""
    from .nn.graph import Symbolic, fail
    if isinstance(x, Symbolic):
        return x.gather(dim, index)
    if x.ndim != 1 or dim not in (0, -1):
        fail(f"gather() of a {x.ndim}-d tensor at traced indices", "pick the values of a 1-d tensor (per-class "
             "weights: alpha.gather(0, y), alpha[y]), or the rows of a 2-d table (F.embedding(ids, table))")
    return x[index]


def _traced_index_select(x, dim, index):
    from .nn.graph import Symbolic, fail
    if isinstance(index, Symbolic):
        fail("ft.index_select at traced indices", "a tensor's rows at traced indices are F.embedding(ids, table)")
    return x.index_select(dim, index)


def _traced_where(condition, input, other):
    from .nn.graph import where
    return where(condition, input, other)
for _name, _traced in _TRACED.items():
    globals()[_name] = _on_traced(globals()[_name], _traced)
del _name, _traced
take_numpy_names(globals())
concat = concatenate = cat  # PyTorch's other names for them
swapaxes = swapdims = transpose
moveaxis = movedim
