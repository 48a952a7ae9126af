"""The workload interface: one kernel's problem, inputs, golden reference, costs and per-backend
code; its identity is a :class:`~tunecache.kernels.KernelSpec`.

A workload owns the math; backends own the machinery. A built-in workload is a package
(``workloads/matmul/``) whose ``__init__.py`` defines the torch function (the eager baseline and
what Inductor compiles) and the float64 reference, whose ``tvm.py`` holds the TVM compute and
whose ``triton.py`` the Triton kernel; its spec is declared in :mod:`tunecache.builtin`.

A user's kernel is a subclass anywhere, declared the same way in a few class attributes; it is
named ``"package.module:QualName"`` and registers itself when the class is defined::

    class Scale(Workload):
        params = ("M", "N")
        inputs = (("M", "N"),)
        output = ("M", "N")
        backend_dtypes = {"inductor": ("float32",)}

        def torch_fn(self, x): return x * 2
        def reference(self, x): return x.double() * 2
        def flops(self, problem): return problem["M"] * problem["N"]

It overrides :meth:`Workload.tvm_compute` for TVM and the ``triton_*`` hooks for Triton.
"""

from __future__ import annotations

import abc
import importlib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tunecache.defaults import TOLERANCES, default_config
from tunecache.errors import InvalidInput
from tunecache.kernels import KernelSpec, Shape, register

if TYPE_CHECKING:
    import torch
    from tvm import te

    from tunecache.device import DeviceLimits
    from tunecache.space import Config, SearchSpace

# What a workload defines for a backend it lists, when no module beside it does.
BACKEND_HOOKS = {"tvm": "tvm_compute()",
                 "triton": "triton_space(), triton_default() and triton_launch()"}  # fmt: skip
# Inputs are drawn from U(low, high) with a random sign: never zero, never a constant.
INPUT_LOW, INPUT_HIGH = 0.1, 1.0


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` → ``torch.float32``."""
    import torch

    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise InvalidInput(f"unknown dtype {name!r}")
    return value


def random_nonzero(
    shape: tuple[int, ...], dtype: str, generator: torch.Generator, *, scale: float = 1.0
) -> torch.Tensor:
    """Uniform magnitudes in [0.1, 1.0) × ``scale`` with random signs: no zeros, no constants."""
    import torch

    magnitude = torch.rand(shape, generator=generator, dtype=torch.float64)
    magnitude = INPUT_LOW + (INPUT_HIGH - INPUT_LOW) * magnitude
    sign = torch.randint(0, 2, shape, generator=generator, dtype=torch.int8) * 2 - 1
    return (magnitude * sign * scale).to(torch_dtype(dtype))


class Workload(abc.ABC):
    """One kernel. Built-ins set ``spec``; a user's subclass sets ``params``, ``inputs``,
    ``output`` and ``backend_dtypes`` (``name``, ``bucket`` and ``description`` optional), or
    inherits them from the kernel it subclasses, and gets its own spec from them: a subclass is
    a kernel of its own, never its parent under another name. Either way ``spec`` and these
    attributes agree."""

    spec: ClassVar[KernelSpec]
    name: ClassVar[str]
    description: ClassVar[str] = ""
    params: ClassVar[tuple[str, ...]]  # the problem's shape parameters, in order
    inputs: ClassVar[tuple[Shape, ...]]
    output: ClassVar[Shape]
    bucket: ClassVar[tuple[str, ...]] = ()
    backend_dtypes: ClassVar[Mapping[str, tuple[str, ...]]]  # backend -> dtypes it runs in
    demo_problem: ClassVar[Mapping[str, int]]
    tvm_knobs: ClassVar[str | None] = None  # the TVM knob schedule family, if there is one
    # The first input is drawn as U(0.1, 1) · scale with random signs, plus offset (the others
    # without): inputs that make a careless kernel fail (softmax without the max, one-pass
    # variance).
    input_scale: ClassVar[float] = 1.0
    input_offset: ClassVar[float] = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A user's kernel: a class with params of its own, or inheriting a user's kernel's (a
        # subclass that overrides only its computation is its own kernel, under its own name:
        # tuned as the parent, it got the parent's compute and key). Its source hash covers its
        # parents' files. A subclass of a built-in (named without a ':') stays that built-in: its
        # backends' hooks live beside the built-in, not beside a user's module.
        parent: KernelSpec | None = getattr(cls, "spec", None)
        users = parent is not None and ":" in parent.name
        if "spec" not in cls.__dict__ and ("params" in cls.__dict__ or users):
            source = str(Path(importlib.import_module(cls.__module__).__file__ or ""))
            inherited = dict(parent.sources) if parent is not None else {}
            shared = tuple(dict.fromkeys((source, *inherited.get("*", ()))))
            cls.spec = register(KernelSpec(
                name=cls.__dict__.get("name", f"{cls.__module__}:{cls.__qualname__}"),
                params=cls.params, inputs=cls.inputs, output=cls.output, bucket=cls.bucket,
                dtypes=dict(cls.backend_dtypes), sources={**inherited, "*": shared},
                description=cls.description,
                choices=parent.choices if parent is not None else {},
                config_defaults=parent.config_defaults if parent is not None else {},
            ))  # fmt: skip
        if "spec" in cls.__dict__:
            spec = cls.spec
            cls.name, cls.params, cls.description = spec.name, spec.params, spec.description
            cls.inputs, cls.output, cls.bucket = spec.inputs, spec.output, spec.bucket
            cls.backend_dtypes = spec.dtypes

    @property
    def backends(self) -> tuple[str, ...]:
        return self.spec.backends

    def dtypes(self, backend: str) -> tuple[str, ...]:
        """The dtypes ``backend`` runs this workload in."""
        self.check_backend(backend)
        return self.spec.dtypes[backend]

    # -- problems ---------------------------------------------------------------------------
    def problem(self, sizes: Mapping[str, Any]) -> dict[str, int]:
        """Checks ``sizes`` names exactly this workload's parameters, each a positive integer.

        Raises:
            InvalidInput: a parameter is missing, unknown or out of range.
        """
        return self.spec.problem(sizes)

    def edge_problem(self, problem: Mapping[str, int]) -> dict[str, int] | None:
        """A nearby problem with awkward sizes (odd, not a multiple of any tile), or ``None``."""
        edge = {k: (v - 1 if v > 2 else v) | 1 for k, v in problem.items()}
        return edge if edge != dict(problem) else None

    def check_dtype(self, dtype: str, backend: str) -> None:
        self.spec.check_dtype(dtype, backend)

    def check_backend(self, backend: str) -> None:
        self.spec.check_backend(backend)

    # -- math ------------------------------------------------------------------------------
    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """Shapes of the kernel's inputs, in the order it takes them."""
        return self.spec.input_shapes(problem)

    def make_inputs(
        self, problem: Mapping[str, int], dtype: str, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Seeded random non-zero inputs on the CPU, in the order the kernel takes them."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        inputs = []
        for i, shape in enumerate(self.input_shapes(problem)):
            scale, offset = (self.input_scale, self.input_offset) if i == 0 else (1.0, 0.0)
            values = random_nonzero(shape, "float64", generator, scale=scale) + offset
            inputs.append(values.to(torch_dtype(dtype)))
        return tuple(inputs)

    @abc.abstractmethod
    def torch_fn(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The eager torch implementation: the baseline, and the graph Inductor compiles."""

    @abc.abstractmethod
    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The golden reference, computed in float64."""

    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        """Shape of the kernel's single output."""
        return self.spec.output_shape(problem)

    @abc.abstractmethod
    def flops(self, problem: Mapping[str, int]) -> int:
        """Floating-point operations of one call (for the roofline)."""

    def bytes_moved(self, problem: Mapping[str, int], dtype: str) -> int:
        """The fewest bytes one call must move: every input read once, the output written once."""
        import torch

        size = torch.empty((), dtype=torch_dtype(dtype)).element_size()
        shapes = (*self.input_shapes(problem), self.output_shape(problem))
        return sum(math.prod(shape) for shape in shapes) * size

    def memory_needed(self, problem: Mapping[str, int], dtype: str) -> int:
        """Bytes a tune holds at least for one set of inputs: each input and the output in
        ``dtype``, and in float64 as the inputs are drawn and the reference computes."""
        import torch

        size = torch.empty((), dtype=torch_dtype(dtype)).element_size()
        shapes = (*self.input_shapes(problem), self.output_shape(problem))
        return sum(math.prod(shape) for shape in shapes) * (size + 8)

    def tolerance(self, dtype: str) -> float:
        return TOLERANCES[dtype]

    def default_config(
        self, backend: str, problem: Mapping[str, int] | None = None, dtype: str | None = None
    ) -> dict[str, Any]:
        """The config used without tuning (and timed as the ``default_config`` baseline).

        The backend-wide default when there is one; else (Triton) :meth:`triton_default` at
        ``problem`` (default: ``demo_problem``) and ``dtype`` (default: the backend's first).
        """
        self.check_backend(backend)
        config = default_config(backend)
        if config is not None:
            return config
        if backend != "triton":
            raise NotImplementedError(f"{self.name} defines no default config for {backend}")
        chosen = self.triton_default(
            self.problem(problem or self.demo_problem), dtype or self.dtypes(backend)[0]
        )
        return chosen.to_json()

    # -- backend hooks: a built-in's live in workloads/<name>/<backend>.py ------------------
    def backend_module(self, backend: str) -> Any:
        """This workload's module for ``backend`` (``workloads.matmul.tvm``), imported lazily."""
        self.check_backend(backend)
        name = f"{type(self).__module__}.{backend}"
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # what the module itself imports is missing: not ours to say
                raise
            hooks = BACKEND_HOOKS.get(backend, "its hooks")
            raise InvalidInput(
                f"{self.name} lists {backend!r} in backend_dtypes but defines no {hooks}, and "
                f"there is no module {name}: define {hooks} or leave {backend!r} out"
            ) from None

    def tvm_compute(self, problem: Mapping[str, int], dtype: str) -> list[te.Tensor]:
        """The TVM tensor-expression compute: the placeholders, then the output."""
        compute: list[te.Tensor] = self.backend_module("tvm").compute(problem, dtype)
        return compute

    def triton_space(
        self, problem: Mapping[str, int], dtype: str, limits: DeviceLimits
    ) -> SearchSpace:
        """The Triton config space at ``problem``, pruned for ``limits``."""
        space: SearchSpace = self.backend_module("triton").space(problem, dtype, limits)
        return space

    def triton_default(
        self, problem: Mapping[str, int], dtype: str, limits: DeviceLimits | None = None
    ) -> Config:
        """The untuned Triton config (the tutorial's) at ``problem``."""
        config: Config = self.backend_module("triton").default_config(problem, dtype, limits)
        return config

    def triton_launch(self, config: Config, *inputs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Launches the Triton kernel with ``config`` (``out=`` writes into a given buffer)."""
        out: torch.Tensor = self.backend_module("triton").launch(config, *inputs, **kwargs)
        return out

    def triton_launcher(self) -> Callable[..., torch.Tensor]:
        """What :meth:`triton_launch` calls, for a caller that launches often to look up once
        (a decode kernel runs in 20 µs: the lookup is not free): the module's ``launch``, or a
        subclass's own ``triton_launch``."""
        if type(self).triton_launch is not Workload.triton_launch:
            return self.triton_launch
        launch: Callable[..., torch.Tensor] = self.backend_module("triton").launch
        return launch

    def source_hash(self, backend: str) -> str:
        """SHA-256 (16 hex) of the sources that define this kernel for ``backend``."""
        return self.spec.source_hash(backend)
