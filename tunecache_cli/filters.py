"""The record filters of ``records ls``, ``report`` and ``snapshot export`` (``--kernel``,
``--backend``, ``--dtype``, ``--device-arch``): declared alike, checked here in the CLI's words
before the server is asked (each said it differently: a pydantic message, the server's 422 and
its regex), and, when nothing matched, the built-in or arch a typo nearly named."""

from __future__ import annotations

import argparse
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.key import BACKENDS, DTYPES


def add_filters(parser: Any, *, dtype: bool = False, arch: bool = True) -> None:
    """Declares ``--kernel`` and ``--backend`` (with ``dtype``, ``--dtype``; with ``arch``,
    ``--device-arch``) on ``parser``."""
    parser.add_argument("--kernel", help="only this kernel (a built-in, or package.module:Class)")
    parser.add_argument("--backend", help=f"only this backend ({', '.join(BACKENDS)})")
    if dtype:
        parser.add_argument("--dtype", help=f"only this dtype ({', '.join(DTYPES)})")
    if arch:
        parser.add_argument("--device-arch", metavar="ARCH",
                            help="only this device arch, e.g. sm_90 or cpu-avx2")  # fmt: skip


def check_filters(args: argparse.Namespace) -> None:
    """The filters ``args`` holds, said here rather than as the server's 422 (its pattern for a
    name).

    Raises:
        InvalidInput: an unknown backend or dtype (with the nearest known one), or a kernel or
            arch no name can be.
    """
    from tunecache.kernels import dtype_hint, nearest
    from tunecache.problem import NAME

    for flag, value, known in (("--backend", args.backend, BACKENDS),
                               ("--dtype", getattr(args, "dtype", None), DTYPES)):  # fmt: skip
        if value is not None and value not in known:
            hint = dtype_hint(value, DTYPES) if flag == "--dtype" else ""
            raise InvalidInput(f"{flag} {value!r}: expected one of {', '.join(known)}"
                               f"{hint or nearest(value, known)}")  # fmt: skip
    for flag, value in (("--kernel", args.kernel),
                        ("--device-arch", getattr(args, "device_arch", None))):  # fmt: skip
        if value is not None and not NAME.fullmatch(value):
            raise InvalidInput(f"{flag} {value!r}: a name starts with a letter or _ and holds "
                               "letters, digits and _ . : - (at most 128)")  # fmt: skip


def near_misses(args: argparse.Namespace) -> str:
    """``" (--kernel: did you mean 'matmul'?)"`` for a kernel or arch filter that nearly is a
    built-in kernel's name or a device's arch (a typo matches nothing), else ``""``."""
    from tunecache.device import CPU_ARCHS, CUDA_ARCHS
    from tunecache.kernels import builtin_names, closest
    from tunecache_cli.exports import gpu_arch

    hints, archs = [], CUDA_ARCHS + CPU_ARCHS
    arch = getattr(args, "device_arch", None)
    for flag, value, known in (("--kernel", args.kernel, builtin_names()),
                               ("--device-arch", arch, archs)):  # fmt: skip
        if value is None or value in known or ":" in value or gpu_arch(value):
            continue  # a kernel of one's own, or a GPU arch (any, newer ones too): not a typo
        if close := closest(value, known):
            hints.append(f"{flag}: did you mean {close!r}?")
    return f" ({'; '.join(hints)})" if hints else ""
