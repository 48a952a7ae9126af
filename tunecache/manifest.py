"""Pre-tune manifests: which keys a deployment needs tuned, as a TOML file.

::

    arch = "sm_90"             # the target arch of the keys whose backend runs on such a device
                               # (sm_*: Triton's; cpu-*: TVM's, Inductor's); others: this machine's
    policy = "compatible"      # which tuned versions count as tuned (coverage)

    [[tune]]
    kernel = "matmul"          # a built-in, or "package.module:Class"
    backends = ["triton"]
    dtypes = ["bfloat16"]
    shapes = [{M = 16, N = 6144, K = 4096}]
    trials = 64                # the budget; strategy = "optuna" picks the search (optional)

    [[tune]]
    preset = "llama3-8b"       # the model's GEMMs and norms (tunecache.presets)
    tokens = [16, 2048]
    tp = 1
    backends = ["triton"]
    dtypes = ["bfloat16"]

    [[tune]]
    preset = "mixtral-8x7b-moe"  # vLLM's own fused-MoE kernel at the model's experts
    tp = [1, 2, 4, 8]          # a degree or several; tokens default to the engine's M list
    backends = ["triton"]
    dtypes = ["bfloat16"]

Every entry expands to keys (kernels × shapes × dtypes × backends); a key for an arch other than
this machine's (``arch`` applies to the backends that run on that kind of device) names the arch
only (the daemon that tunes it completes it with its device). A bad
entry is an error naming its line, before anything is queued.
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunecache.device import DeviceFingerprint, check_arch, local_device
from tunecache.errors import InvalidInput, validation_problems
from tunecache.jobs import MAX_JOB_TRIALS, STRATEGY_PATTERN
from tunecache.kernels import closest, nearest
from tunecache.key import DEVICE_KINDS, Key, arch_kind, device_kind, kernel_module, key_for
from tunecache.policies import VERSION_POLICIES, VersionPolicy
from tunecache.presets import preset_problems
from tunecache.schemas import KeyModel

_ENTRY_FIELDS = {
    "kernel", "preset", "shapes", "tokens", "tp", "backends", "dtypes", "trials", "strategy",
}  # fmt: skip


@dataclass(frozen=True)
class Manifest:
    """The keys a manifest asks for, and the version policy that counts a key as tuned."""

    keys: list[Key]
    policy: VersionPolicy
    budgets: dict[str, tuple[str | None, int]]  # key digest → the entry's (strategy, trials)

    @property
    def packages(self) -> tuple[str, ...]:
        """The packages of the users' kernels it names (what a daemon tuning them imports)."""
        return tuple(sorted({m for k in self.keys if (m := kernel_module(k.kernel)) is not None}))


_ENTRY = re.compile(r"""\s*\[\[\s*(tune|"tune"|'tune')\s*\]\]\s*(#.*)?""")


def _lines(text: str) -> list[int]:
    """The line number of each ``[[tune]]`` entry, in order (``[[ tune ]] # a comment`` too: one
    not counted put every later entry's error on the line of the one before)."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if _ENTRY.fullmatch(line)]


def _device(arch: str | None, backend: str) -> Any:
    """This machine's device for ``backend``, or a placeholder naming only ``arch`` where the
    backend runs on that kind of device (a GPU's arch is for Triton's keys, a CPU's for TVM's
    and Inductor's: a key whose backend cannot run on its arch would wait for ever)."""
    if arch is None or arch_kind(arch) != DEVICE_KINDS[backend]:
        return local_device(device_kind(backend))
    here = None
    with contextlib.suppress(InvalidInput):  # no GPU here: the key names the arch only
        here = local_device(arch_kind(arch)).fingerprint
    if here is not None and here.arch == arch:
        return here
    return DeviceFingerprint(kind=arch_kind(arch), arch=arch, name="any", units=1)


_TOP_FIELDS = {"arch", "policy", "tune"}


def _entry_keys(entry: Mapping[str, Any], arch: str | None) -> list[Key]:
    unknown = sorted(set(entry) - _ENTRY_FIELDS)
    if unknown:
        hint = nearest(unknown[0], sorted(_ENTRY_FIELDS)) if len(unknown) == 1 else ""
        raise InvalidInput(f"unknown fields {unknown}{hint}; known: {sorted(_ENTRY_FIELDS)}")
    if ("kernel" in entry) == ("preset" in entry):
        raise InvalidInput("give either kernel (with shapes) or preset (with tokens)")
    backends, dtypes = entry.get("backends"), entry.get("dtypes", ["float32"])
    if not isinstance(backends, list) or not backends or not isinstance(dtypes, list):
        raise InvalidInput("backends must be a non-empty list (and dtypes a list)")
    trials = entry.get("trials", 32)
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_JOB_TRIALS:
        raise InvalidInput(f"trials={trials!r} must be an integer from 1 to {MAX_JOB_TRIALS:,}")
    strategy = entry.get("strategy")
    if strategy is not None and (not isinstance(strategy, str)
                                 or re.fullmatch(STRATEGY_PATTERN, strategy) is None):  # fmt: skip
        raise InvalidInput(f"strategy={strategy!r} is not a strategy name")
    if "preset" in entry:
        problems = _preset(entry["preset"], entry.get("tokens"), entry.get("tp", 1))
    else:
        shapes = entry.get("shapes")
        if not isinstance(shapes, list) or not shapes:
            raise InvalidInput("shapes must be a non-empty list of tables, e.g. [{M = 16}]")
        problems = {entry["kernel"]: shapes}
    keys = []
    for kernel, shapes in problems.items():
        for i, problem in enumerate(shapes):
            if not isinstance(problem, dict):  # a string's letters were read as its parameters
                raise InvalidInput(f"shapes[{i}] = {problem!r} is not a table of sizes; write "
                                   "shapes = [{M = 16, N = 4096}]")  # fmt: skip
            for backend in backends:
                for dtype in dtypes:
                    key = key_for(kernel, backend, problem, dtype, device=_device(arch, backend))
                    try:  # what the server takes, checked before anything is queued
                        KeyModel.from_key(key)
                    except ValidationError as exc:
                        raise InvalidInput(f"{key.short()}: {validation_problems(exc)}") from None
                    keys.append(key)
    return keys


def _preset(name: object, tokens: object, tp: object) -> dict[str, list[dict[str, int]]]:
    """A preset's problems at each tensor-parallel degree of ``tp`` (one, or a list)."""
    if not isinstance(name, str):
        raise InvalidInput(f"preset={name!r} is not a preset's name")
    if tokens is not None and not isinstance(tokens, list):
        raise InvalidInput(f"tokens={tokens!r} must be a list of token counts, e.g. [16, 2048]")
    problems: dict[str, list[dict[str, int]]] = {}
    for degree in tp if isinstance(tp, list) and tp else [tp]:
        if isinstance(degree, bool) or not isinstance(degree, int):
            raise InvalidInput(f"tp={degree!r} is not a tensor-parallel degree (1, 2, 4, 8 …)")
        for kernel, shapes in preset_problems(name, tokens=tokens, tp=degree).items():
            known = problems.setdefault(kernel, [])
            known += [shape for shape in shapes if shape not in known]
    return problems


def parse_manifest(text: str, source: str = "manifest") -> Manifest:
    """The keys of a manifest's text.

    Raises:
        InvalidInput: not TOML, an unknown arch or policy, or an entry that names an unknown
            kernel, preset, backend or dtype, a bad shape, a missing field or a budget out of
            range — naming the line.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{source}: not TOML: {exc}") from None
    if unknown := sorted(set(data) - _TOP_FIELDS):  # a typo (polcy) left the default quietly
        close = closest(unknown[0], _TOP_FIELDS)
        hint = f" (did you mean {close}?)" if close else ""
        raise InvalidInput(f"{source}: unknown top-level fields {unknown}{hint}; known: "
                           f"{sorted(_TOP_FIELDS)}, the entries each a [[tune]] table")  # fmt: skip
    policy = data.get("policy", "compatible")
    if policy not in VERSION_POLICIES:
        raise InvalidInput(f"{source}: policy {policy!r} is not one of {VERSION_POLICIES}")
    arch = data.get("arch")
    if arch is not None:
        try:
            check_arch(arch)
        except InvalidInput as exc:
            raise InvalidInput(f"{source}: {exc}") from None
    entries = data.get("tune")
    if not isinstance(entries, list) or not entries:
        raise InvalidInput(f"{source}: no [[tune]] entries")
    lines = _lines(text)
    keys: list[Key] = []
    budgets: dict[str, tuple[str | None, int]] = {}
    for i, entry in enumerate(entries):
        where = (f"{source}, the [[tune]] entry at line {lines[i]}" if i < len(lines)
                 else f"{source}, entry {i + 1}")  # fmt: skip
        try:
            found = _entry_keys(entry, arch)
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: {exc}") from None
        for key in found:
            if key.digest() not in budgets:
                keys.append(key)
            budgets[key.digest()] = (entry.get("strategy"), int(entry.get("trials", 32)))
    return Manifest(keys=keys, policy=policy, budgets=budgets)


def load_manifest(path: Path) -> Manifest:
    """Reads and parses a manifest file.

    Raises:
        InvalidInput: unreadable, or see :func:`parse_manifest`.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read manifest {path}: {exc}") from None
    return parse_manifest(text, str(path))
