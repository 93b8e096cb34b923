"""python/fasttrain/_C.pyi names what the built extension exports: every function, type and constant of
fasttrain._C, and every member of each type, no more and no less. A name bound in C without a line in the
stub (or a stub line whose C binding went away) fails here, named."""
import ast
import os
import subprocess
import sys

import fasttrain
from fasttrain import _C

STUB = os.path.join(os.path.dirname(fasttrain.__file__), "_C.pyi")
# what Python itself gives every type, or the constructor the stub describes by __new__ / __init__
IMPLICIT = {"__doc__", "__module__", "__new__", "__init__"}


def stub_names():
    """({top-level name}, {class name: {member}}); `X = ...` aliases are the stub's own, not the module's."""
    tree = ast.parse(open(STUB).read(), STUB)
    top, members = set(), {}

    def name_of(node):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return node.name
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return node.target.id
        return None

    for node in tree.body:
        name = name_of(node)
        if name:
            top.add(name)
        if isinstance(node, ast.ClassDef):
            members[name] = {n for n in map(name_of, node.body) if n} - IMPLICIT
    return top, members


def differences(what, built, stub):
    missing, stale = sorted(built - stub), sorted(stub - built)
    out = []
    if missing:
        out.append(f"{what}: in the extension but not in _C.pyi: {missing}")
    if stale:
        out.append(f"{what}: in _C.pyi but not in the extension: {stale}")
    return out


def test_stub_names_what_the_extension_exports():
    top, members = stub_names()
    built = {n for n in dir(_C) if not (n.startswith("__") and n.endswith("__"))}
    problems = differences("fasttrain._C", built, top)
    for name in sorted(built & top):
        obj = getattr(_C, name)
        if isinstance(obj, type):
            if name not in members:
                problems.append(f"fasttrain._C.{name} is a type; _C.pyi does not describe it as a class")
                continue
            problems += differences(f"fasttrain._C.{name}", set(vars(obj)) - IMPLICIT, members[name])
        elif name in members:
            problems.append(f"fasttrain._C.{name} is not a type; _C.pyi describes it as a class")
    assert not problems, "\n".join(problems)


def test_stub_and_marker_are_packaged(tmp_path):
    """setup.py's build_py, the step that fills a wheel with the Python files, copies both."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in ("_C.pyi", "py.typed"):
        assert (tmp_path / "fasttrain" / name).is_file(), name
