"""Symbolic tensors: the functional way to describe a model with branches.

    x = ft.nn.Input((1, 28, 28))
    y = ft.nn.ReLU()(ft.nn.Conv2d(1, 16, 3, padding=1)(x))
    model = ft.nn.Model(x, ft.nn.Linear(16, 10)(ft.nn.Flatten()(ft.nn.AdaptiveAvgPool2d(1)(y))))

Calling a layer on a Symbolic records a node; `a + b` records a residual add
and ft.nn.cat([a, b]) a concatenation along channels."""


class Node:
    __slots__ = ("module", "inputs", "shape")

    def __init__(self, module, inputs, shape):
        self.module, self.inputs, self.shape = module, list(inputs), tuple(shape)


class Symbolic:
    """A tensor that exists only in the model description (its shape has no batch dimension)."""

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    @property
    def shape(self):
        return self.node.shape

    @staticmethod
    def record(module, inputs, shape):
        return Symbolic(Node(module, [x.node for x in inputs], shape))

    def __add__(self, other):
        from .modules import Add
        if not isinstance(other, Symbolic):
            return NotImplemented
        return Add()(self, other)

    def __repr__(self):
        kind = "input" if self.node.module is None else type(self.node.module).__name__
        return f"Symbolic(shape={self.shape}, from={kind})"


def Input(shape):
    """The model's input, of per-sample shape `shape` (e.g. (1, 28, 28))."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(shape) not in (1, 3):
        raise ValueError(f"an input is (features,) or (channels, height, width), got {shape}")
    return Symbolic(Node(None, [], shape))


def cat(tensors, dim=1):
    """Concatenates symbolic tensors along the channel dimension."""
    from .modules import Cat
    return Cat(dim)(*tensors)


def topological(outputs):
    """The nodes that `outputs` depend on, each after its inputs."""
    order, seen = [], set()

    def visit(node):
        stack = [(node, False)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            stack.extend((i, False) for i in reversed(n.inputs) if id(i) not in seen)

    for o in outputs:
        visit(o)
    return order
