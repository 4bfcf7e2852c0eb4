"""How a module's usage example is checked (tests/fast and tests/integration test_docstrings.py):
the names it binds, the calls it makes against the real signatures, its shell lines, its types.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import shlex


def bound_names(tree: ast.AST) -> set[str]:
    """Names the example itself binds (variables, loop targets, imports, defs)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
            names.update(a.arg for a in node.args.args + node.args.kwonlyargs) if isinstance(
                node, ast.FunctionDef) else None
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def resolve(func: ast.expr, module, bound: set[str]):
    """The object a call's target names in the module, or None when the example made it."""
    chain = []
    while isinstance(func, ast.Attribute):
        chain.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    root = func.id
    if root in bound and not hasattr(module, root):
        return None
    if hasattr(module, root):
        target = getattr(module, root)
    elif hasattr(builtins, root):
        target = getattr(builtins, root)
    elif chain:
        return None  # a method of an object the example takes as given (executor.run(...))
    else:
        raise AssertionError(f"{module.__name__}: the example calls {root}, which the module "
                             "does not have")
    for attr in reversed(chain):
        if inspect.isclass(target) or inspect.ismodule(target):
            assert hasattr(target, attr), (
                f"{module.__name__}: the example calls {root}.{'.'.join(reversed(chain))}, "
                f"but {attr} does not exist")
            target = getattr(target, attr)
        else:
            return None
    return target


def check_call(call: ast.Call, target, module) -> None:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None
                                                                 for k in call.keywords):
        return
    if any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in call.args):
        return  # `f(...)`: the example elides the arguments
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords})
    except TypeError as exc:
        raise AssertionError(f"{module.__name__}: the example's call {ast.unparse(call)} does "
                             f"not fit {getattr(target, '__name__', target)}{signature}: "
                             f"{exc}") from None


def check_shell(line: str, module_name: str) -> None:
    words = shlex.split(line)
    if words[0] == "tpuctl":
        import typer.main

        from launcher.cli import app

        group = typer.main.get_command(app)
        command = group.commands.get(words[1])
        assert command is not None, f"{module_name}: `tpuctl {words[1]}` does not exist"
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for word in words[2:]:
            if word == "--":
                break
            if word.startswith("-"):
                assert word.split("=")[0] in options, (
                    f"{module_name}: `tpuctl {words[1]}` has no option {word}")
    elif words[:3] == ["python", "-m", "payload"]:
        from payload.__main__ import _parser

        parser = _parser()
        options = {o for a in parser._actions for o in a.option_strings}
        commands = next(a.choices for a in parser._actions if a.dest == "stage")
        assert words[3] in commands, f"{module_name}: no payload stage {words[3]!r}"
        for word in words[4:]:
            if word.startswith("-"):
                assert word in options, f"{module_name}: `python -m payload` has no {word}"
    elif words[1:2] == ["-m"]:
        importlib.import_module(words[2])


def returns(target):
    """The class a callable returns, when its annotation names one (else None)."""
    import typing

    if inspect.isclass(target):
        return target
    try:
        hint = typing.get_type_hints(target).get("return")
    except Exception:
        return None
    return hint if inspect.isclass(hint) else None


def fields(kind) -> set[str]:
    """Attributes an instance of `kind` has: class attributes, fields, and what __init__ sets."""
    import re

    names = set(dir(kind))
    names.update(getattr(kind, "__dataclass_fields__", {}))
    names.update(getattr(kind, "model_fields", {}))
    names.update(getattr(kind, "__annotations__", {}))
    init = kind.__dict__.get("__init__")
    if inspect.isfunction(init):
        try:
            source = inspect.getsource(init)
        except OSError:  # generated (dataclasses): its fields are counted above
            source = ""
        names.update(re.findall(r"self\.(\w+)\s*(?::[^=]*)?=", source))
    return names


def check_types(tree: ast.AST, module) -> None:
    """Follow `x = f(...)` to the class f returns: unpacking must fit it, and `x.attr` /
    `x.method(...)` must exist on it (and the method take the arguments shown)."""
    bound = bound_names(tree)
    known: dict[str, type] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        target = resolve(node.value.func, module, bound)
        kind = returns(target) if target is not None else None
        if kind is None:
            continue
        for where in node.targets:
            if isinstance(where, ast.Name):
                known[where.id] = kind
            elif isinstance(where, ast.Tuple) and not issubclass(kind, tuple):
                raise AssertionError(f"{module.__name__}: the example unpacks "
                                     f"{ast.unparse(node.value)}, which returns one "
                                     f"{kind.__name__}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in known):
            kind = known[node.value.id]
            assert node.attr in fields(kind), (
                f"{module.__name__}: the example uses {node.value.id}.{node.attr}, but "
                f"{kind.__name__} has no {node.attr}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in known):
            method = getattr(known[node.func.value.id], node.func.attr, None)
            if inspect.isfunction(method):
                fake = ast.Call(func=node.func, args=[ast.Constant(None), *node.args],
                                keywords=node.keywords)
                check_call(fake, method, module)
