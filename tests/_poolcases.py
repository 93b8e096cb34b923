"""Pooling configurations shared by the CPU and CUDA pooling tests (k kernel, s stride, p padding,
d dilation), and their keyword arguments."""

MAX_CASES = [dict(k=2), dict(k=3, s=2, p=1), dict(k=3, s=2, p=1, ceil=True), dict(k=2, s=1, p=1, d=2),
             dict(k=(3, 2), s=(2, 1), p=(1, 0), d=(1, 2), ceil=True), dict(k=3, s=3, ceil=True)]
AVG_CASES = [dict(k=2), dict(k=3, s=2, p=1), dict(k=3, s=2, p=1, count_include_pad=False),
             dict(k=3, s=2, p=1, ceil=True), dict(k=(3, 2), s=(2, 1), p=(1, 1), ceil=True, count_include_pad=False),
             dict(k=2, s=1, divisor_override=3), dict(k=3, s=2, p=1, ceil=True, count_include_pad=True)]


def max_args(c):
    return dict(kernel_size=c["k"], stride=c.get("s"), padding=c.get("p", 0), dilation=c.get("d", 1),
                ceil_mode=c.get("ceil", False))


def avg_args(c):
    return dict(kernel_size=c["k"], stride=c.get("s"), padding=c.get("p", 0), ceil_mode=c.get("ceil", False),
                count_include_pad=c.get("count_include_pad", True), divisor_override=c.get("divisor_override"))
