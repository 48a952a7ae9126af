"""A runnable around ``torch.compile`` that honours every call's inputs, frozen weights included.

With ``torch._inductor.config.freezing`` Inductor folds a module's parameters into the compiled
graph as constants (and, on CPU, prepacks the GEMM weight for the C++ template). The workload's
weights (every input after the first, unless the workload names others in
``inductor_frozen_inputs``) therefore become parameters of a small module built around
``workload.torch_fn``. A compiled graph is only valid for the weights it was built from, so
:class:`InductorRunnable` keeps one compiled entry per distinct set of weight tensors (by identity
and version counter, plus every input's shape, stride and dtype) and compiles a new entry when a
call brings new ones: the first call with new weights pays a compile; later calls reuse it.

Every entry compiles (``fullgraph=True``) a function with a fresh code object. Dynamo keeps
compiled code per code object, with a recompile limit (8) after which it silently runs eagerly;
fresh code objects give every entry its own cache, so no entry is ever a recompile of another and
none falls back to eager. For the same reason nothing here calls ``torch._dynamo.reset()``: entries
share no dynamo state (a reset would only make earlier runnables recompile without their settings).
At most :data:`MAX_ENTRIES` weight sets are kept per runnable (least recently used dropped).

A compile that fails where ``torch_fn`` itself raises (run eagerly on the same inputs) raises what
``torch_fn`` raised, as the uncompiled function would: Dynamo's own exception holds the user's
only as text in its debug context.
"""

from __future__ import annotations

import itertools
import logging
import types
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.inductor.options import MODE_MAX_AUTOTUNE, compile_scope

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MAX_ENTRIES = 8  # compiled weight sets kept per runnable (validation seeds, rotated inputs)
_serial = itertools.count()


def default_frozen_inputs(workload: Any, n_inputs: int) -> tuple[int, ...]:
    """Positions of the inputs frozen as parameters: the workload's choice, else all but the first.

    Args:
        workload: may define ``inductor_frozen_inputs`` (a tuple of input positions).
        n_inputs: how many inputs the workload's kernel takes.
    """
    declared = getattr(workload, "inductor_frozen_inputs", None)
    if declared is not None:
        return tuple(sorted(int(i) for i in declared))
    return tuple(range(1, n_inputs))


def _fresh_function(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A copy of ``fn`` (same closure) with its own code object, so dynamo caches it separately."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _make_module(
    fn: Callable[..., torch.Tensor], weights: Mapping[int, torch.Tensor], n_inputs: int
) -> torch.nn.Module:
    """An ``nn.Module`` calling ``fn`` with ``weights`` (position → tensor) as frozen parameters."""
    import torch

    class _Frozen(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._fn = fn
            self._order: list[tuple[bool, int]] = []  # (is_weight, weight position or input slot)
            slot = 0
            for position in range(n_inputs):
                if position in weights:
                    # Shares the caller's storage (no copy): the compiled graph holds its own
                    # folded constants, and an in-place update is a new key (version counter).
                    param = torch.nn.Parameter(weights[position].detach(), False)
                    self.register_parameter(f"w{position}", param)
                    self._order.append((True, position))
                else:
                    self._order.append((False, slot))
                    slot += 1

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            args = [getattr(self, f"w{i}") if weight else inputs[i] for weight, i in self._order]
            return self._fn(*args)

    return _Frozen().eval()


@dataclass
class _Entry:
    call: Callable[..., torch.Tensor]
    weights: tuple[torch.Tensor, ...]  # held so their ids stay unique while the entry lives


class InductorRunnable:
    """``runnable(*cpu_inputs) -> fresh output``, compiled by ``torch.compile`` per weight set.

    Args:
        fn: the workload's ``torch_fn``.
        config: ``{"mode": "default"}`` or a max-autotune config; it picks the compile mode and
            the Inductor settings each compile runs under (:func:`compile_scope`).
        frozen: positions of the inputs frozen as module parameters (max-autotune only).
        label: names the compiled functions in dynamo's logs.
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        config: Mapping[str, Any],
        frozen: Sequence[int] = (),
        *,
        label: str = "kernel",
    ) -> None:
        self.fn = fn
        self.config: dict[str, Any] = dict(config)
        self.frozen = tuple(frozen) if config.get("mode") == MODE_MAX_AUTOTUNE else ()
        self.label = label
        self.compiles = 0
        self.torch_fn_error: Exception | None = None  # what torch_fn raised run eagerly
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()

    def _key(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        key: list[Any] = [(t.shape, t.stride(), t.dtype, t.device) for t in inputs]
        key.extend((id(inputs[i]), inputs[i]._version, inputs[i].data_ptr()) for i in self.frozen)
        return tuple(key)

    def _compile(self, inputs: Sequence[torch.Tensor]) -> _Entry:
        import torch

        name = f"tunecache_{self.label}_{next(_serial)}"
        if self.frozen:
            module = _make_module(self.fn, {i: inputs[i] for i in self.frozen}, len(inputs))

            def call(*args: torch.Tensor) -> torch.Tensor:
                return module(*args)

        else:
            fn = self.fn

            def call(*args: torch.Tensor) -> torch.Tensor:
                return fn(*args)

        mode = MODE_MAX_AUTOTUNE if self.config.get("mode") == MODE_MAX_AUTOTUNE else None
        # fullgraph: one graph per entry, so no inner frame (torch_fn's own code object, shared by
        # every entry) is ever compiled on its own and counted against dynamo's recompile limit.
        compiled = torch.compile(
            _fresh_function(call, name), mode=mode, dynamic=False, fullgraph=True
        )
        self.compiles += 1
        logger.debug("compiling %s (%s, frozen inputs %s)", name, mode or "default", self.frozen)
        return _Entry(call=compiled, weights=tuple(inputs[i] for i in self.frozen))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        import torch

        key = self._key(inputs)
        entry = self._entries.get(key)
        args = tuple(t for i, t in enumerate(inputs) if i not in self.frozen)
        if entry is None:
            entry = self._compile(inputs)
            failed: Exception | None = None
            try:
                with torch.no_grad(), compile_scope(self.config):
                    out = entry.call(*args)  # traces and compiles under the config's settings
            except Exception as exc:
                failed = exc
            if failed is not None:  # run eagerly out of the handler, and never past the device
                if not _device_failure(failed):
                    self.torch_fn_error = _eager_error(self.fn, inputs)
                if self.torch_fn_error is None:
                    raise failed  # Dynamo or Inductor failed on code that runs eagerly
                raise self.torch_fn_error from None  # Dynamo's: logged by _eager_error
            self._entries[key] = entry
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
            with torch.no_grad():
                out = entry.call(*args)
        return _fresh(out, inputs)


def _eager_error(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Exception | None:
    """What ``fn`` raises run eagerly on ``inputs``, or ``None``.

    Dynamo traces a ``raise`` in user code without running it: what it raises is its own
    ``Unsupported: Observed exception`` (or ``TorchRuntimeError``), the user's exception only a
    repr in its debug text (torch 2.13: ``__cause__`` is an ``Observed<Name>Error`` holding that
    repr, not the exception). Running ``fn`` eagerly gives the real one.
    """
    import torch

    try:
        with torch.no_grad():
            fn(*inputs)
    except Exception as exc:  # the user's code may raise anything
        logger.debug("the compile failed; torch_fn run eagerly raises too", exc_info=True)
        return None if _device_failure(exc) else exc
    return None


def _device_failure(exc: Exception) -> bool:
    """Whether ``exc`` is the device's (out of memory, a CUDA error), never ``torch_fn``'s to
    answer for: a compile that ran out of memory is not run again eagerly."""
    import torch

    out_of_memory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(exc, out_of_memory) or str(exc).startswith("CUDA error")


def _fresh(out: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``out``, cloned only if it shares storage with an input (a graph that returns a view)."""
    ptr = out.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == ptr for t in inputs):
        return out.clone()
    return out
