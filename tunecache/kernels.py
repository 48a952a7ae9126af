"""Kernels as values: what identifies a kernel in a cache key, for built-ins and users' own.

A :class:`KernelSpec` is the light description of one kernel: its name, the sources whose hash goes
into the key, its shape parameters and the symbolic shapes of its tensor arguments (so a problem
can be read from a call's arguments), which parameters are rounded to a shape bucket at lookup,
the backends and dtypes it runs in. It needs no framework: the run-time path builds keys from it
and nothing else.

A kernel is found by name: the built-in ones (``matmul``, ``softmax``, …) are registered when
:mod:`tunecache` is imported; a user's kernel is named ``"package.module:qualname"`` (in a job, a
manifest, the CLI) and loaded by importing the module. Whatever the name points to must be a
:class:`KernelSpec` or carry one as ``.spec`` (a tuner-side ``workloads.Workload``).

Example:
    >>> spec = get_kernel("matmul")
    >>> spec.params, spec.bucket
    (('M', 'N', 'K'), ('M',))
    >>> import types
    >>> spec.problem_from_args(types.SimpleNamespace(shape=(8, 16)),
    ...                        types.SimpleNamespace(shape=(16, 32)))
    {'K': 16, 'M': 8, 'N': 32}
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunecache.errors import InvalidInput, one_line

# Every backend tunecache knows, in one place (keys, environments, defaults and registries
# are checked against it).
BACKENDS = ("triton", "tvm", "inductor")
Shape = tuple[str, ...]  # a tensor's symbolic shape: parameter names, one per dimension


def hash_files_now(paths: tuple[str, ...]) -> str:
    """SHA-256 (16 hex) of the files' names and contents, in order; missing files are skipped.
    Read now: :func:`hash_files` keeps a process's first reading (the sources it loaded)."""
    h = hashlib.sha256()
    for name in paths:
        path = Path(name)
        if path.exists():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


hash_files = functools.cache(hash_files_now)


# What users write for a dtype, as torch and NumPy name it (torch.float32, fp32, half, ...).
_DTYPE_ALIASES = {
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "f32": "float32", "float": "float32", "single": "float32",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
    "i8": "int8", "char": "int8",
}  # fmt: skip


def closest(typed: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` that ``typed`` nearly is (a typo's intended word), or ``None``."""
    import difflib  # only for an error's words: not on the run-time import path

    close = difflib.get_close_matches(typed, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def nearest(typed: str, known: Sequence[str]) -> str:
    """``" (did you mean 'matmul'?)"`` for a near miss of one of ``known``, else ``""``."""
    close = closest(typed, known)
    return f" (did you mean {close!r}?)" if close else ""


def dtype_hint(dtype: object, supported: tuple[str, ...] | list[str]) -> str:
    """``" (did you mean 'float32'?)"`` when ``dtype`` is another name of a supported dtype
    (``fp32``, ``torch.float32``, ``Float32``), else ``""``."""
    if not isinstance(dtype, str):
        return ""
    name = dtype.strip().lower().removeprefix("torch.").removeprefix("np.").removeprefix("numpy.")
    name = _DTYPE_ALIASES.get(name, name)
    return f" (did you mean {name!r}?)" if name in supported and name != dtype else ""


@dataclass(frozen=True)
class KernelSpec:
    """What identifies one kernel in a cache key.

    Attributes:
        name: ``matmul`` for a built-in, ``"package.module:qualname"`` for a user's kernel.
        params: the problem's shape parameters, in order.
        inputs: each tensor argument's symbolic shape (``(("M", "K"), ("K", "N"))``).
        output: the output's symbolic shape.
        bucket: parameters a lookup rounds up to the next power of two (the batch-like rows).
            A server knows the built-in kernels' only (it never imports a user's kernel): a
            client's lookup of a user's kernel says its bucket.
        dtypes: backend → the dtypes the kernel runs in there (its keys are the backends).
        sources: backend (or ``"*"`` for every backend) → the files that define the kernel
            there; their hash invalidates cached entries when they change.
        description: one line for tables.
        choices: backend → the enumerated values of each config parameter there (the built-in
            kernels' Triton spaces): a served config must name exactly these parameters, each
            with one of its values (:func:`tunecache.configcheck.config_problem`).
        config_defaults: backend → values a config may leave out (a parameter added after
            records were tuned: ``{"SPLIT_K": 1}``).
    """

    name: str
    params: tuple[str, ...]
    inputs: tuple[Shape, ...]
    output: Shape
    dtypes: Mapping[str, tuple[str, ...]]
    bucket: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    description: str = ""
    choices: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    config_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [b for b in self.dtypes if b not in BACKENDS]
        if unknown:
            raise InvalidInput(f"kernel {self.name}: unknown backends {unknown}; known: {BACKENDS}")
        named = {d for shape in (*self.inputs, self.output) for d in shape}
        stray = sorted((named | set(self.bucket)) - set(self.params))
        if stray:
            raise InvalidInput(f"kernel {self.name}: {stray} are not among params {self.params}")

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self.dtypes)

    def check_backend(self, backend: str) -> None:
        """Raises :class:`InvalidInput` unless the kernel runs on ``backend``."""
        if backend not in self.dtypes:
            raise InvalidInput(
                f"{self.name} has backends {', '.join(self.backends)}, not {backend!r}"
                f"{nearest(backend, self.backends)}"
            )

    def check_dtype(self, dtype: str, backend: str) -> None:
        """Raises :class:`InvalidInput` unless the kernel runs in ``dtype`` on ``backend``."""
        self.check_backend(backend)
        supported = self.dtypes[backend]
        if dtype not in supported:
            raise InvalidInput(
                f"{self.name} on {backend} supports dtypes {', '.join(supported)}, not {dtype!r}"
                f"{dtype_hint(dtype, supported)}"
            )

    def source_hash(self, backend: str, *, now: bool = False) -> str:
        """SHA-256 (16 hex) of the sources that define this kernel for ``backend``, as this
        process first read them (``now``: as they are on disk now)."""
        paths = (*self.sources.get("*", ()), *self.sources.get(backend, ()))
        return hash_files_now(paths) if now else hash_files(paths)

    def problem(self, sizes: Mapping[str, Any]) -> dict[str, int]:
        """Checks ``sizes`` names exactly this kernel's parameters, each a positive integer.

        Raises:
            InvalidInput: a parameter is missing, unknown or out of range.
        """
        from tunecache.problem import check_sizes, describe

        if not isinstance(sizes, Mapping):  # a string's letters would read as its parameters
            example = ", ".join(f"{p!r}: 64" for p in self.params)
            raise InvalidInput(f"{self.name}: a shape maps its parameters to sizes, e.g. "
                               f"{{{example}}}; got {describe(sizes)}")  # fmt: skip
        missing = [p for p in self.params if p not in sizes]
        unknown = [p for p in sizes if p not in self.params]
        if missing or unknown:
            parts = [f"missing {', '.join(missing)}"] if missing else []
            parts += [f"unknown {', '.join(map(str, unknown))}"] if unknown else []
            raise InvalidInput(
                f"{self.name} takes shape parameters {', '.join(self.params)}: {'; '.join(parts)}"
            )
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInput(f"{self.name}: {name}={value!r} is not an integer")
        checked = check_sizes(sizes)
        return {p: int(checked[p]) for p in self.params}

    def problem_from_args(self, *args: Any) -> dict[str, int]:
        """The problem of a call, read from its tensor arguments' ``.shape``.

        Raises:
            InvalidInput: the wrong number of tensors, a wrong rank, or two dimensions that
                name the same parameter with different sizes.
        """
        if len(args) != len(self.inputs):
            raise InvalidInput(f"{self.name} takes {len(self.inputs)} tensors, got {len(args)}")
        sizes: dict[str, int] = {}
        for i, (arg, shape) in enumerate(zip(args, self.inputs, strict=True)):
            actual = tuple(getattr(arg, "shape", ()))
            if len(actual) != len(shape):
                raise InvalidInput(f"{self.name}: argument {i} has shape {actual}, not {shape}")
            for dim, size in zip(shape, actual, strict=True):
                if sizes.setdefault(dim, int(size)) != int(size):
                    raise InvalidInput(
                        f"{self.name}: {dim} is {sizes[dim]} in one argument, {size} in another"
                    )
        return dict(sorted(sizes.items()))

    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """The tensor arguments' concrete shapes at ``problem``."""
        return tuple(tuple(problem[d] for d in shape) for shape in self.inputs)

    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(problem[d] for d in self.output)


_REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    """Makes ``spec`` findable by its name; registering the same name twice keeps the last."""
    _REGISTRY[spec.name] = spec
    return spec


def as_spec(kernel: Any) -> KernelSpec:
    """``kernel`` as a :class:`KernelSpec`: a spec, anything with ``.spec``, or a name."""
    if isinstance(kernel, str):
        return get_kernel(kernel)
    spec = kernel if isinstance(kernel, KernelSpec) else getattr(kernel, "spec", None)
    if not isinstance(spec, KernelSpec):
        what = getattr(kernel, "__qualname__", None) or type(kernel).__name__
        raise InvalidInput(f"{what} is not a kernel: it is no KernelSpec and has no .spec")
    return spec


# A kernel of a user's package, as a daemon imports it: dotted identifiers, a colon, dotted
# identifiers (``mypkg.ops:Gemm``). A key's name admits more (``x:``, ``a:b:c``), which no import
# finds: a job for one was claimed and failed on every attempt.
_IDENTS = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
KERNEL_REF = re.compile(f"{_IDENTS}:{_IDENTS}")


def load_ref(ref: str) -> Any:
    """The object ``"package.module:qualname"`` names (imports the module).

    Raises:
        InvalidInput: the reference is malformed, or the module or the name does not exist.
    """
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name or not qualname:
        raise InvalidInput(f"{ref!r} is not a reference of the form 'package.module:qualname'")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        top = module_name.partition(".")[0]
        hint = (f" (is the folder holding {top!r} on sys.path? tunecache's commands look in "
                "the current directory, a script in its own folder; else install the package "
                "or set PYTHONPATH)"
                if isinstance(exc, ModuleNotFoundError) and exc.name == top else "")  # fmt: skip
        why = f"cannot import {module_name!r} for kernel {ref!r}: {exc}{hint}"
        raise InvalidInput(_as_file(module_name, qualname) or why) from None
    except Exception as exc:  # the module itself fails: a syntax error, a raise at import
        why = f"importing {module_name!r} for kernel {ref!r} failed: {one_line(exc)}"
        raise InvalidInput(_as_file(module_name, qualname) or why) from None
    for part in qualname.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise InvalidInput(f"module {module_name!r} has no {qualname!r}") from None
    return found


def _as_file(module_name: str, qualname: str) -> str | None:
    """What to write for a kernel named by a file's path (``mypkg/kernels.py:K``, a form
    ``tune --torch`` takes), or ``None`` when ``module_name`` reads as no path."""
    path = module_name.replace("\\", "/")
    if "/" not in path and not path.endswith(".py"):
        return None
    dotted = ".".join(p for p in path.removesuffix(".py").split("/") if p not in ("", "."))
    return (
        f"{module_name}:{qualname} names a file; a kernel is named by its module, "
        f"e.g. {dotted}:{qualname} with the folder holding it on sys.path (FILE.py:NAME is "
        "what tune --torch and --tvm take)"
    )


def builtin_names() -> list[str]:
    """The built-in kernels' names, sorted."""
    return sorted(k for k in _REGISTRY if ":" not in k)


def get_kernel(name: str) -> KernelSpec:
    """The kernel called ``name``: a registered (built-in) name or ``"module:qualname"``.

    Raises:
        InvalidInput: unknown name (the message lists the built-in ones), or a reference that
            does not load a kernel.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        builtin = builtin_names()
        raise InvalidInput(
            f"unknown kernel {name!r}{nearest(name, builtin)}; built-in: {', '.join(builtin)}; "
            "a kernel of your own is named 'package.module:qualname'"
        )
    found = load_ref(name)
    if not isinstance(found, KernelSpec) and not isinstance(
        getattr(found, "spec", None), KernelSpec
    ):
        raise InvalidInput(_not_a_kernel(name, found))
    spec = as_spec(found)
    if spec.name != name:
        raise InvalidInput(f"{name!r} loads the kernel named {spec.name!r}; use that name")
    return spec


_KINDS = {
    "function": "a function",
    "builtin_function_or_method": "a function",
    "module": "a module",
}


def triton_kind(found: Any) -> str | None:
    """What Triton kernel object ``found`` is (one of the drop-in's, or Triton's own), or
    ``None`` when it is none."""
    module = type(found).__module__
    if module.startswith("tunecache.triton"):
        return "a kernel of tunecache's Triton drop-in (tunecache.triton.autotune)"
    if module.partition(".")[0] == "triton":
        return f"a Triton kernel ({type(found).__name__})"
    return None


def _file_of(module: str) -> str:
    """The file ``--tvm`` and ``--torch`` would take for ``module``: its own (as the current
    directory names it), or ``FILE.py`` where it has none they can load (a package's)."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if not path or Path(path).suffix != ".py" or Path(path).name == "__init__.py":
        return "FILE.py"  # none, compiled, or a package's
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _not_a_kernel(name: str, found: Any) -> str:
    """Why ``name`` names no kernel, with the form of ``tune`` a function or module takes."""
    module, _, qualname = name.partition(":")
    file = f"{_file_of(module)}:{qualname}"
    if (triton := triton_kind(found)) is not None:  # it said: tune it with --tvm, --torch
        return (f"{name!r} is {triton}: it has no key of its own (the drop-in keys each launch "
                "by its arguments, dtypes included, and looks itself up as it launches); list "
                f"its records with `tunecache records ls --kernel {name} --all`")  # fmt: skip
    if isinstance(found, type) and any(c.__name__ == "Workload" for c in found.__mro__[1:]):
        return (
            f"{name!r} is a Workload subclass that declares no kernel: set its params, "
            "inputs, output and backend_dtypes (docs/integrations.md, 'Your own kernel')"
        )
    kind = type(found).__name__
    what = ("a class" if isinstance(found, type)
            else _KINDS.get(kind, f"an object of type {kind}"))  # fmt: skip
    if isinstance(found, type) and any(c.__name__ == "Module" and c.__module__.startswith(
            "torch.nn") for c in found.__mro__):  # fmt: skip
        return (f"{name!r} is a torch module (torch.nn.Module), not a kernel (a Workload "
                f"subclass or a KernelSpec): tune it with `--torch {file}`")  # fmt: skip
    if type(found).__module__.partition(".")[0] == "tvm":  # a PrimFunc, an IRModule
        return (f"{name!r} is a TVM {kind}, not a kernel (a Workload subclass or a KernelSpec): "
                f"tune it with `--tvm {file}`")  # fmt: skip
    return (
        f"{name!r} is {what}, not a kernel (a Workload subclass or a KernelSpec): tune a TVM "
        f"function with `--tvm {file}`, a torch module with `--torch {file}`"
    )


def builtin_problem(kernel: str, problem: Mapping[str, Any]) -> str | None:
    """Why ``problem`` is not the built-in ``kernel``'s (its shape parameters, a size each), or
    ``None``; ``None`` for a user's kernel too (a server never imports one)."""
    spec = _REGISTRY.get(kernel) if ":" not in kernel else None
    try:
        if spec is not None:
            spec.problem(problem)
    except InvalidInput as exc:
        return str(exc)
    return None


def registered(name: str) -> KernelSpec | None:
    """The registered kernel called ``name``, without importing anything."""
    return _REGISTRY.get(name)
