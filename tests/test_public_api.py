"""Every public function and class of fasttrain's public namespaces has a docstring, and so has every public
method or property a class defines itself. An override may take its base's docstring (inspect.getdoc follows
inheritance), so forward, extra_repr and the like are documented once, on Module. A name without one fails
here, named."""
import importlib
import inspect
import types

NAMESPACES = ["fasttrain", "fasttrain.nn", "fasttrain.nn.functional", "fasttrain.nn.init", "fasttrain.optim",
              "fasttrain.optim.lr_scheduler", "fasttrain.data", "fasttrain.backends", "fasttrain.cuda",
              "fasttrain.ops", "fasttrain.utils", "fasttrain.accelerator", "fasttrain.nn.utils",
              "fasttrain.nn.utils.parametrizations"]


def is_ours(obj):
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] == "fasttrain"


def is_function(obj):
    # unwrap: functools.cache and the like wrap a function in a callable object
    return inspect.isroutine(inspect.unwrap(obj))


def public_objects():
    """{qualified name: object} for each public function and class fasttrain defines, reached from any of
    NAMESPACES (a name re-exported by several is listed once, under the first)."""
    found, seen = {}, set()
    for ns in NAMESPACES:
        module = importlib.import_module(ns)
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or isinstance(obj, types.ModuleType) or id(obj) in seen:
                continue
            if (isinstance(obj, type) or is_function(obj)) and is_ours(obj):
                seen.add(id(obj))
                found[f"{ns}.{name}"] = obj
    return found


def members(cls):
    """(name, documented member) for each public method, classmethod, staticmethod or property in the class's
    own __dict__; dunder methods are Python's protocol, documented by Python."""
    for name, attr in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(attr, (staticmethod, classmethod)):
            yield name, attr.__func__
        elif isinstance(attr, property) or is_function(attr):
            # getattr gives the bound method, whose getdoc looks up the same name along the MRO
            yield name, attr if isinstance(attr, property) else getattr(cls, name)


def test_namespaces_exist():
    for ns in NAMESPACES:
        importlib.import_module(ns)


def test_every_public_name_has_a_docstring():
    missing = []
    for qualname, obj in public_objects().items():
        # obj.__doc__, not getdoc: getdoc would give an undocumented class its base class's docstring
        if not (obj.__doc__ or "").strip():
            missing.append(qualname)
        if isinstance(obj, type):
            for name, member in members(obj):
                if not (inspect.getdoc(member) or "").strip():
                    missing.append(f"{qualname}.{name}")
    assert not missing, f"{len(missing)} public names without a docstring:\n  " + "\n  ".join(sorted(missing))
