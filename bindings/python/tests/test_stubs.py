"""The type stubs (``l3toolkit/__init__.pyi``) against the package as it runs: every public name is in the
stubs, and every function's and method's parameters — names, kinds (positional, keyword-only, ``*args``)
and defaults — are those of the runtime signature PyO3 exposes (``__text_signature__``)."""

import ast
import inspect
import types
from pathlib import Path

import pytest

import l3toolkit as l3

STUBS = Path(l3.__file__).with_name("__init__.pyi")
TREE = ast.parse(STUBS.read_text())

KINDS = {
    "posonly": inspect.Parameter.POSITIONAL_ONLY,
    "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "vararg": inspect.Parameter.VAR_POSITIONAL,
    "kwonly": inspect.Parameter.KEYWORD_ONLY,
    "kwarg": inspect.Parameter.VAR_KEYWORD,
}


def stub_parameters(fn: ast.FunctionDef):
    """``(name, kind, default)`` of a stub's parameters; ``default`` is an ``ast`` node or None."""
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(positional, defaults):
        kind = "posonly" if arg in a.posonlyargs else "args"
        out.append((arg.arg, KINDS[kind], default))
    if a.vararg:
        out.append((a.vararg.arg, KINDS["vararg"], None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, KINDS["kwonly"], default))
    if a.kwarg:
        out.append((a.kwarg.arg, KINDS["kwarg"], None))
    return out


def same_default(stub, runtime) -> bool:
    if stub is None:
        return runtime is inspect.Parameter.empty
    if runtime is inspect.Parameter.empty:
        return False
    if isinstance(stub, ast.Constant) and stub.value is Ellipsis:
        return True  # the stub does not say which default
    if runtime is Ellipsis:
        return True  # the runtime signature does not say (a default PyO3 cannot show)
    try:
        return ast.literal_eval(stub) == runtime
    except ValueError:
        return ast.unparse(stub) == repr(runtime)


def compare(where: str, fn: ast.FunctionDef, runtime_obj, method: bool):
    try:
        sig = inspect.signature(runtime_obj)
    except (TypeError, ValueError) as e:
        return [f"{where}: the runtime object has no signature ({e})"]
    stub = stub_parameters(fn)
    run = list(sig.parameters.values())
    if method:
        # `self` (positional-only at run time for slot methods) is not compared.
        stub = stub[1:]
        if run and run[0].name in ("self", "$self"):
            run = run[1:]
    problems = []
    # `*args` and `**kwargs` are never passed by name: `*_args` at run time is `*args` in the stubs.
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    stub_names = [n.lstrip("_") if k in variadic else n for n, k, _ in stub]
    run_names = [p.name.lstrip("_") if p.kind in variadic else p.name for p in run]
    if stub_names != run_names:
        return [f"{where}: stub parameters {stub_names} but runtime {run_names}"]
    for (name, kind, default), p in zip(stub, run):
        # A slot method's parameters are positional-only at run time; the stub's plain ones match them.
        kinds_match = kind == p.kind or (
            kind == inspect.Parameter.POSITIONAL_OR_KEYWORD and p.kind == inspect.Parameter.POSITIONAL_ONLY
        )
        if not kinds_match:
            problems.append(f"{where}({name}): stub kind {kind.description}, runtime {p.kind.description}")
        if not same_default(default, p.default):
            shown = "none" if default is None else ast.unparse(default)
            problems.append(f"{where}({name}): stub default {shown}, runtime {p.default!r}")
    return problems


def is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def test_every_public_name_is_in_the_stubs():
    names = set()
    for node in TREE.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    missing = sorted(set(l3.__all__) - names)
    assert not missing, f"public names missing from {STUBS.name}: {missing}"


def test_functions_match_the_runtime_signatures():
    problems = []
    for node in TREE.body:
        if isinstance(node, ast.FunctionDef):
            problems += compare(node.name, node, getattr(l3, node.name), method=False)
    assert not problems, "\n".join(problems)


def test_classes_and_methods_match_the_runtime():
    problems = []
    for cls in (n for n in TREE.body if isinstance(n, ast.ClassDef)):
        runtime = getattr(l3, cls.name)
        if issubclass(runtime, BaseException):
            continue  # the exception classes are plain Python, checked by their own tests
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            where = f"{cls.name}.{fn.name}"
            if not hasattr(runtime, fn.name):
                problems.append(f"{where}: in the stubs, not at run time")
            elif is_property(fn):
                # PyO3's getters are getset descriptors, its `#[pyo3(get)]` fields member descriptors.
                descriptors = (property, types.GetSetDescriptorType, types.MemberDescriptorType)
                if not isinstance(inspect.getattr_static(runtime, fn.name), descriptors):
                    problems.append(f"{where}: a property in the stubs, not at run time")
            elif fn.name == "__init__":
                problems += compare(where, fn, runtime, method=True)
            else:
                problems += compare(where, fn, getattr(runtime, fn.name), method=True)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ["Model", "StyleModel", "Loader"])
def test_constructors_have_runtime_signatures(name):
    # PyO3 exposes a class's constructor signature through `__text_signature__`; without it the
    # comparison above would have nothing to compare the stubs with.
    inspect.signature(getattr(l3, name))
