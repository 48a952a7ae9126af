"""Argument parsing shared by the commands: shapes, servers, key options."""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.errors import InvalidInput, ServerError
from tunecache.http import IDENTITY_HEADER
from tunecache.key import BACKENDS, DTYPES, Key, key_for
from tunecache.problem import MAX_DIM, describe
from tunecache.settings import Settings, checked_url
from tunecache.tokens import Scope, grants

if TYPE_CHECKING:
    from tunecache.client import Client

PREFLIGHT_SECONDS = 2.0  # the server's answer to "may this token do that?"

_INTEGER = re.compile(r"-?[0-9]+")  # int() also takes "١٢" (Arabic-Indic), "1_000", "+8"
MAX_SEED = 2**32 - 1  # numpy's and Optuna's seeds: 0 to 2**32 - 1


def parse_shape(text: str) -> dict[str, int]:
    """``"M=64,N=64,K=64"`` → ``{"M": 64, "N": 64, "K": 64}``.

    Raises:
        InvalidInput: naming the malformed part.
    """
    shape: dict[str, int] = {}
    shown = describe(text, 60)
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InvalidInput(f"malformed shape {shown}: expected NAME=INT[,NAME=INT...]")
        if name in shape:
            raise InvalidInput(f"malformed shape {shown}: {name} given twice")
        if not _INTEGER.fullmatch(value):
            apart = " (sizes go apart with commas: M=64,N=64)" if "=" in value else ""
            raise InvalidInput(
                f"malformed shape {shown}: {name}={describe(value)} is not an integer{apart}"
            )
        if len(value.lstrip("-")) > len(str(MAX_DIM)):  # and int() refuses 4300+ digits
            raise InvalidInput(f"shape: {name}={describe(value)} is outside 1..{MAX_DIM}")
        size = int(value)
        if size < 1:
            raise InvalidInput(f"malformed shape {shown}: {name}={size} must be positive")
        shape[name] = size
    return shape


def add_server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server", metavar="URL", help="cache server (default: $TUNECACHE_URL or the local one)"
    )


def server_url(args: argparse.Namespace) -> str:
    """The server URL (``--server``, else ``$TUNECACHE_URL``), checked.

    Raises:
        InvalidInput: not an http(s) URL with a host, or malformed.
    """
    if not args.server:
        return Settings.from_env().url
    return checked_url(args.server, "--server ")


def upload_url(args: argparse.Namespace) -> str | None:
    """The server a tuning command uploads to (``None`` with ``--no-upload``).

    Raises:
        InvalidInput: uploading, but ``$TUNECACHE_TOKEN`` is unset: said before any work is done.
    """
    if args.no_upload:
        return None
    url = server_url(args)
    preflight(url, "write", "uploading the result", or_else=", or --no-upload")
    return url


def preflight(url: str, needed: Scope, doing: str, *, or_else: str = "") -> None:
    """Checks, before any work, that the server answers and the token may do ``needed``.

    Raises:
        InvalidInput: no token in ``$TUNECACHE_TOKEN``.
        ServerError: the server is unreachable (exit 3), refuses the token or its scope is too
            small (401 / 403: exit 4). One line each, within :data:`PREFLIGHT_SECONDS`.
    """
    from tunecache.client import Client

    create = token_hint(needed)
    if not Settings.from_env(with_url=False).token:
        raise InvalidInput(
            f"{doing} needs a token with the {needed!r} scope in $TUNECACHE_TOKEN ({create})"
            + or_else
        )
    with Client(url, timeout=PREFLIGHT_SECONDS) as client:
        try:
            me = client.whoami(timeout=PREFLIGHT_SECONDS)
        except ServerError as exc:
            if exc.foreign:  # a web server, but not ours: the work would be lost at the upload
                raise InvalidInput(f"{doing}: {url} is not a tunecache server (its answer to "
                                   f"/v1/whoami has no {IDENTITY_HEADER} header): is the URL "
                                   "right?") from None  # fmt: skip
            if exc.status_code == 404:  # a tunecache server older than /v1/whoami, or a path
                _check_path(client, url, doing)  # in the URL that no tunecache route has
                return
            if exc.status_code == 401:
                raise ServerError(
                    f"{url} refuses the token in $TUNECACHE_TOKEN (unknown or revoked); {create}",
                    status_code=401,
                ) from None
            other = or_else.removeprefix(", or ")
            hint = f" (checked before any work: start it, or {other})" if other else ""
            raise ServerError(f"{doing}: the server is not answering: {exc}{hint}") from None
    if me.scope is None or not grants(me.scope, needed):
        name = "no token" if me.token is None else f"token {me.token.name!r}"
        raise ServerError(
            f"{doing} needs the {needed!r} scope; {name} has {me.scope or 'none'} ({create})",
            status_code=403,
        )


def token_hint(scope: Scope) -> str:
    """How to make a token of ``scope``, in both forms: ``token create`` without ``--db`` goes
    through the server and needs an admin token, so the hint alone (what this said) failed with
    401 on the local default, where ``--db`` (the server's own database) is what works."""
    return (
        f"make one: `tunecache token create --db --name NAME --scope {scope}` on the "
        "server's machine (`--db URL` where the server was started with `--db URL`: bare, "
        "--db is the default database, another server's), or the same without --db anywhere, "
        "with an admin token in $TUNECACHE_TOKEN"
    )


def _check_path(client: Client, url: str, doing: str) -> None:
    """Raises :class:`InvalidInput` unless ``url`` answers ``/health`` (every tunecache server
    has): a tunecache server behind ``url``'s host with a path that is none of its routes
    (``http://host:8765/tc``) answers 404 to everything, which lookups take for misses."""
    try:
        client.health()
    except ServerError as exc:
        if exc.status_code == 404:
            raise InvalidInput(f"{doing}: {url} answers 404 to /health, which every "
                               "tunecache server answers: is the path in the URL right?"
                               ) from None  # fmt: skip


def add_key(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """KERNEL, ``--backend``, ``--dtype``, ``--shape``; ``optional``: the command checks them."""
    parser.add_argument(
        "workload",
        nargs="?" if optional else None,
        metavar="KERNEL",
        help="a built-in kernel (see `tunecache workloads`) or your own, as package.module:Class",
    )
    # Backends and dtypes are checked by the workload, so the error names what it supports.
    parser.add_argument("--backend", required=not optional, action=Once,
                        help=f"one of {', '.join(BACKENDS)}")  # fmt: skip
    parser.add_argument(
        "--dtype", default="float32", action=Once,
        help=f"one of {', '.join(DTYPES)} (default float32)",
    )  # fmt: skip
    parser.add_argument(
        "--shape", required=not optional, action=Once,
        help="shape parameters, e.g. M=64,N=64,K=64",
    )  # fmt: skip


class Once(argparse.Action):
    """An option of one key given twice is refused (``--shape`` twice: the last one was tuned,
    without a word)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:  # fmt: skip
        given: set[str] = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in given:
            parser.error(f"{option_string} given twice: give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def key_from_args(args: argparse.Namespace) -> Key:
    """The key the command line names, on this machine's device for the backend.

    Raises:
        InvalidInput: a bad kernel, backend, dtype or shape, or a CUDA key without a GPU.
    """
    try:
        return key_for(args.workload, args.backend, parse_shape(args.shape), args.dtype)
    except InvalidInput:
        refuse_triton_object(args.workload)  # a clearer line, when that is why
        _need_gpu(args)
        raise


def _need_gpu(args: argparse.Namespace) -> None:
    """Raises :class:`InvalidInput` saying what to run here when the one thing wrong with the
    key is that its backend's keys name a GPU and this machine has none (the library's own line
    advises its Python API), or the key's own mistake where it has one; returns when the GPU is
    not what is wrong."""
    from tunecache.device import Device, DeviceFingerprint, DeviceLimits, local_device
    from tunecache.key import device_kind

    backend = args.backend
    if backend not in BACKENDS or device_kind(backend) != "cuda":  # unknown: the key says so
        return
    try:
        local_device("cuda")
        return
    except InvalidInput:
        pass
    stand_in = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="gpu", units=1),
                      DeviceLimits.H100)  # fmt: skip
    # The key without the GPU: any other mistake in it is said first, as it is (raises).
    key_for(args.workload, backend, parse_shape(args.shape), args.dtype, device=stand_in)
    raise InvalidInput(
        f"--backend {backend}: no CUDA device is visible here, and its keys name the GPU they "
        "run on: run this on a GPU machine (or `tunecache daemon --device cuda` there), or use "
        "--backend tvm or inductor on this CPU"
    )


def refuse_triton_object(ref: str | None) -> None:
    """Says clearly why a Triton kernel object is no KERNEL for the CLI (``as_spec`` names it by
    its ``repr``, ``<…CachedAutotuner object at 0x…>``); returns when ``ref`` names none.

    Raises:
        InvalidInput: ``ref`` (``module:name``) is a kernel of the Triton drop-in
            (``tunecache.triton.autotune``) or of Triton itself, naming it as written.
    """
    from tunecache.kernels import load_ref, triton_kind

    if ref is None or ":" not in ref:
        return
    try:
        found = load_ref(ref)  # imported already by the failed key: no second import
    except InvalidInput:
        return
    if (what := triton_kind(found)) is None:
        return
    raise InvalidInput(
        f"{ref} is {what}: the CLI does not look Triton kernels up by their Python object (the "
        "drop-in keys each launch by its arguments, dtypes included, and looks it up and tunes "
        f"it as it launches); list its records with `tunecache records ls --kernel {ref} --all`"
    )


def check_count(flag: str, value: int | None, low: int = 1, high: int | None = None) -> None:
    """A whole-number option (``--trials``, ``--workers``) within ``low..high``, or unset.

    Raises:
        InvalidInput: naming ``flag``, the value and the range.
    """
    if value is None or (value >= low and (high is None or value <= high)):
        return
    wanted = f"at least {low}" if high is None else f"{low} to {high}"
    raise InvalidInput(f"{flag} must be {wanted}, not {value}")


def check_trials(flag: str, value: int | None) -> None:
    """A trial count (``--trials``, ``--max-trials``): from 1 to what a job may ask
    (:data:`~tunecache.jobs.MAX_JOB_TRIALS`; 2**63 trials failed in TVM's C++ after the search
    had started), or unset.

    Raises:
        InvalidInput: naming ``flag``, the value and the range.
    """
    from tunecache.jobs import MAX_JOB_TRIALS

    check_count(flag, value, 1, MAX_JOB_TRIALS)


def check_workers(value: int | None) -> None:
    """``--workers``: from 1 to the CPU cores this process may use, or unset (each worker
    builds on a core, and holds a few hundred MB: 284 MB for a TVM worker set up for a small
    matmul; more workers than cores only share them, and a typed extra zero could take the
    machine's memory).

    Raises:
        InvalidInput: naming the value and the cores.
    """
    from tunecache.device import host_cores

    check_count("--workers", value)
    if value is not None and value > (cores := host_cores()):
        raise InvalidInput(f"--workers {value}: at most {cores}, the CPU cores this process may "
                           "use (each worker builds on one)")  # fmt: skip


def check_seconds(flag: str, value: float | None, most: float | None = None,
                  least: float | None = None) -> None:  # fmt: skip
    """A duration option (``--seconds``, ``--poll``): a finite number above 0 (at most
    ``most``, at least ``least``, where given), or unset.

    Raises:
        InvalidInput: naming ``flag`` and the value.
    """
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InvalidInput(f"{flag} must be a positive number of seconds, not {value:g}")
    if value is not None and most is not None and value > most:
        raise InvalidInput(f"{flag} {value:g}: at most {most:g} seconds")
    if value is not None and least is not None and value < least:
        raise InvalidInput(f"{flag} {value:g}: at least {least:g} seconds")


def output_file(flag: str, path: Path) -> Path:
    """``path`` as a file a command may write, checked before any work: its folder exists (it is
    never created: a mistyped folder is said, not made) and is writable, and it is no folder.

    Raises:
        InvalidInput: naming ``flag``, the path and what is wrong with it.
    """
    folder = path.parent
    if path.is_dir():
        raise InvalidInput(f"{flag} {path} is a folder: name a file in it")
    if not folder.exists():
        raise InvalidInput(f"{flag} {path}: folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise InvalidInput(f"{flag} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidInput(f"{flag} {path}: folder {folder} is not writable")
    return path


def parse_backends(text: str) -> tuple[str, ...]:
    """``--backends``: known backend names, each once (``best --backends tvm,tvm`` printed its
    row twice; an unknown name was asked of the server, and answered with nothing).

    Raises:
        InvalidInput: an unknown name, or none.
    """
    from tunecache.kernels import nearest

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in BACKENDS]
    if not names or unknown:
        near = nearest(unknown[0], BACKENDS) if unknown else ""
        raise InvalidInput(f"--backends {text!r}: expected some of {', '.join(BACKENDS)}"
                           + (f"; unknown {unknown[0]!r}{near}" if unknown else ""))  # fmt: skip
    return names
