"""The workload interface: one kernel family's problem, inputs, golden reference and costs.

A workload owns the math; backends own the machinery. Each workload is a package
(``workloads/matmul/``) whose ``__init__.py`` defines the torch function (the eager baseline and
what Inductor compiles) and the float64 reference, and whose ``tvm.py`` holds the TVM compute.
"""

from __future__ import annotations

import abc
import hashlib
import importlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tunecache.defaults import default_config
from tunecache.errors import InvalidInput
from tunecache.key import check_problem

if TYPE_CHECKING:
    import torch

# ‖out − ref‖ / ‖ref‖ a correct kernel stays under, per dtype (DESIGN.md, "Correct first").
TOLERANCES: dict[str, float] = {
    "float64": 1e-9,
    "float32": 1e-4,
    "bfloat16": 2e-2,
    "float16": 5e-3,
}
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
    """One kernel family. Subclasses set the class variables and implement the math."""

    name: ClassVar[str]
    description: ClassVar[str]
    params: ClassVar[tuple[str, ...]]  # the problem's shape parameters, in order
    backends: ClassVar[tuple[str, ...]] = ("tvm", "inductor")
    # dtypes each backend runs this workload in (CPU backends: float32; Triton adds half types).
    backend_dtypes: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "tvm": ("float32",),
        "inductor": ("float32",),
        "triton": ("float32", "float16", "bfloat16"),
    }

    def dtypes(self, backend: str) -> tuple[str, ...]:
        """The dtypes ``backend`` runs this workload in."""
        self.check_backend(backend)
        return self.backend_dtypes.get(backend, ())

    demo_problem: ClassVar[Mapping[str, int]]
    # Per backend, files (relative to ``workloads/``) beyond this package's own that define the
    # kernel: they go into the source hash, so a change there invalidates cached entries.
    shared_sources: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    # -- problems ---------------------------------------------------------------------------
    def problem(self, sizes: Mapping[str, Any]) -> dict[str, int]:
        """Checks ``sizes`` names exactly this workload's parameters, each a positive integer.

        Raises:
            InvalidInput: a parameter is missing, unknown or out of range.
        """
        missing = [p for p in self.params if p not in sizes]
        unknown = [p for p in sizes if p not in self.params]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown {', '.join(unknown)}")
            raise InvalidInput(
                f"{self.name} takes shape parameters {', '.join(self.params)}: {'; '.join(parts)}"
            )
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInput(f"{self.name}: {name}={value!r} is not an integer")
        checked = check_problem(sizes)
        return {p: int(checked[p]) for p in self.params}

    def edge_problem(self, problem: Mapping[str, int]) -> dict[str, int] | None:
        """A nearby problem with awkward sizes (odd, not a multiple of any tile), or ``None``."""
        edge = {k: (v - 1 if v > 2 else v) | 1 for k, v in problem.items()}
        return edge if edge != dict(problem) else None

    def check_dtype(self, dtype: str, backend: str) -> None:
        supported = self.dtypes(backend)
        if dtype not in supported:
            raise InvalidInput(
                f"{self.name} on {backend} supports dtypes {', '.join(supported)}, not {dtype!r}"
            )

    def check_backend(self, backend: str) -> None:
        if backend not in self.backends:
            raise InvalidInput(
                f"{self.name} has backends {', '.join(self.backends)}, not {backend!r}"
            )

    # -- math ------------------------------------------------------------------------------
    @abc.abstractmethod
    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """Shapes of the kernel's inputs, in the order it takes them."""

    def make_inputs(
        self, problem: Mapping[str, int], dtype: str, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Seeded random non-zero inputs on the CPU, in the order the kernel takes them."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        return tuple(random_nonzero(s, dtype, generator) for s in self.input_shapes(problem))

    @abc.abstractmethod
    def torch_fn(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The eager torch implementation: the baseline, and the graph Inductor compiles."""

    @abc.abstractmethod
    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The golden reference, computed in float64."""

    @abc.abstractmethod
    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        """Shape of the kernel's single output."""

    @abc.abstractmethod
    def flops(self, problem: Mapping[str, int]) -> int:
        """Floating-point operations of one call (for the roofline)."""

    def bytes_moved(self, problem: Mapping[str, int], dtype: str) -> int:
        """The fewest bytes one call must move: every input read once, the output written once."""
        import torch

        size = torch.empty((), dtype=torch_dtype(dtype)).element_size()
        shapes = (*self.input_shapes(problem), self.output_shape(problem))
        return sum(math.prod(shape) for shape in shapes) * size

    def tolerance(self, dtype: str) -> float:
        return TOLERANCES[dtype]

    def default_config(
        self, backend: str, problem: Mapping[str, int] | None = None, dtype: str | None = None
    ) -> dict[str, Any]:
        """The config used without tuning (and timed as the ``default_config`` baseline).

        The backend-wide default when there is one; else the backend module's
        ``default_config(problem, dtype)`` (Triton's depend on both; ``problem`` defaults to
        ``demo_problem``, ``dtype`` to the backend's first dtype).
        """
        self.check_backend(backend)
        config = default_config(backend)
        if config is not None:
            return config
        hook = getattr(self.backend_module(backend), "default_config", None)
        if hook is None:
            raise NotImplementedError(f"{self.name} defines no default config for {backend}")
        chosen = hook(self.problem(problem or self.demo_problem), dtype or self.dtypes(backend)[0])
        return dict(chosen.to_json())

    # -- backend hooks ---------------------------------------------------------------------
    def backend_module(self, backend: str) -> Any:
        """This workload's module for ``backend`` (``workloads.matmul.tvm``), imported lazily."""
        self.check_backend(backend)
        return importlib.import_module(f"{type(self).__module__}.{backend}")

    def source_hash(self, backend: str) -> str:
        """SHA-256 (16 hex) of the sources that define this kernel for ``backend``."""
        package = Path(importlib.import_module(type(self).__module__).__file__ or "").parent
        files = [package / "__init__.py", package / f"{backend}.py"]
        files += [package.parent / name for name in self.shared_sources.get(backend, ())]
        h = hashlib.sha256()
        for path in files:
            if path.exists():
                h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()[:16]
