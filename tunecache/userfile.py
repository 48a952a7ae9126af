"""Loading ``FILE.py:NAME`` for ``tune --torch`` and ``tune --tvm``: a user's file, by path.

The file is run as a module of its own under a private name (its folder need not be a package,
and it shadows nothing); anything wrong is one line of :class:`InvalidInput` naming the flag.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tunecache.errors import InvalidInput, one_line

_MISSING = object()


def load_name(flag: str, spec: str) -> tuple[ModuleType, Path, Any]:
    """``(module, path, value)`` for ``spec`` = ``FILE.py:NAME``.

    Raises:
        InvalidInput: a malformed spec, no such file, a file that fails to import, no NAME.
    """
    path, name = file_of(flag, spec)
    module = load_file(flag, path)
    value = getattr(module, name, _MISSING)
    if value is _MISSING:
        raise InvalidInput(f"{flag}: {path.name} has no {name!r}")
    return module, path, value


def file_of(flag: str, spec: str) -> tuple[Path, str]:
    """``(file, NAME)`` of ``spec`` = ``FILE.py:NAME``, nothing run: checked before a framework
    is imported (seconds), so a mistyped path, or a file that is not Python, is said at once.

    Raises:
        InvalidInput: a malformed spec, no such Python file, or one that does not compile.
    """
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise InvalidInput(f"{flag} wants FILE.py:NAME (e.g. model.py:Model), not {spec!r}")
    path = Path(path_text)
    if path.suffix != ".py" or not path.is_file():
        typed = path.with_name(path.name + ".py")
        hint = (
            f" (did you mean {typed}:{name}?)" if path.suffix != ".py" and typed.is_file() else ""
        )
        raise InvalidInput(f"{flag}: no Python file {path_text!r}{hint}")
    try:  # compiled, not run: a file that is not Python is said before seconds of imports
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OSError) as exc:
        raise InvalidInput(f"{flag}: importing {path} failed: {one_line(exc)}") from None
    return path, name


def load_file(flag: str, path: Path) -> ModuleType:
    """Runs ``path`` as a fresh module under a private name.

    Raises:
        InvalidInput: the file cannot be loaded or raises while it runs.
    """
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"_tunecache_user_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"{flag}: cannot load {str(path)!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error is bad input, said in one line
        sys.modules.pop(name, None)
        raise InvalidInput(f"{flag}: importing {path} failed: {one_line(exc)}") from None
    return module
