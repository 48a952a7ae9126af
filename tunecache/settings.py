"""Every environment variable tunecache reads, in one place.

- ``TUNECACHE_URL``: the cache server the client and CLI talk to (``http://127.0.0.1:8765``)
- ``TUNECACHE_TIMEOUT``: seconds a run-time lookup may take before falling back (``0.5``):
  more than 0, at most 60 (a value in milliseconds, ``500``, is refused, not taken as minutes)
- ``TUNECACHE_TOKEN``: the API token sent to the server (``tunecache token create``); reads
  need none unless the server says so, uploads need one with the ``write`` scope; whitespace
  around it (a secret file's last newline) is dropped
- ``TUNECACHE_SNAPSHOT``: a snapshot file run-time lookups answer from before the server
  (``tunecache snapshot export``); unset: none
- ``TRITON_INTERPRET``: ``1`` (or ``true``, ``on``, ``yes``, ``y``) runs Triton kernels in Triton's
  CPU interpreter (numpy) instead of compiling them for a GPU; unset, empty or ``0`` (``false``,
  ``off``, ``no``, ``n``) compiles them. Triton reads it itself when a function is decorated with
  ``@triton.jit``; tunecache reads it to know where a Triton kernel runs (the CPU, under the
  interpreter), and so which device its key names. Interpreter timings are meaningless.
- ``TUNECACHE_OUTBOX``: the folder where a finished tune's record waits until the server has it
  (``tunecache push``); unset: ``outbox`` in the user cache directory
- ``TUNECACHE_WORK_DIR``: the folder where the tuner keeps its working files: MetaSchedule's
  tuning databases (a re-tune of a workload starts from the records there), the measurement
  workers' log, the Inductor search's notes; unset: ``work`` in the user cache directory
  (``~/.cache/tunecache`` on Linux, ``$XDG_CACHE_HOME/tunecache`` where that is set)
- ``TUNECACHE_LOCK_DIR``: the folder of the lock files through which timings on one device (a
  GPU, a CPU core) take turns, one process at a time; unset: ``locks`` in the user cache
  directory (one user's processes take turns; tuners running as several users on one machine
  share a folder they can all write)
- ``TUNECACHE_TIMING_CORES``: the CPU cores the tuner's measurement workers are pinned to
  (``2-3``, ``0,2,4-7``), with as many threads as cores; unset: every core this process may use
- ``TUNECACHE_TRITON_AUTOTUNE``: ``1`` routes every ``triton.autotune`` of the process through
  tunecache from interpreter start (the ``tunecache-triton.pth`` hook, ``_tunecache_triton_hook``);
  unset or ``0``: nothing happens. With it (and for ``tunecache.triton.install()``):
  ``TUNECACHE_TRITON_INCLUDE`` / ``TUNECACHE_TRITON_EXCLUDE``, comma-separated modules whose
  kernels are routed / left to Triton (a module covers its submodules; unset: every module, none);
  ``TUNECACHE_ON_MISS`` (``tune``, the default, or ``default``), ``TUNECACHE_POLICY``
  (``strict``, ``compatible``, ``any``) and ``TUNECACHE_VERIFY`` (``never`` or ``first``), as the
  arguments of ``tunecache.triton.autotune``

The server's own settings (``TUNECACHE_SERVER_*``) are in :mod:`cache_server.settings`.

A bad value raises a :class:`ValueError` naming the variable (:class:`InvalidInput`, one, from
:class:`Settings`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tunecache.errors import InvalidInput

DEFAULT_PORT = 8765


def outbox_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where records wait for their upload (``TUNECACHE_OUTBOX``, else the user cache dir's)."""
    return _cache_folder("TUNECACHE_OUTBOX", "outbox", env)


def work_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the tuner keeps its working files (``TUNECACHE_WORK_DIR``, else the user cache
    dir's ``work``)."""
    return _cache_folder("TUNECACHE_WORK_DIR", "work", env)


def lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where timings take turns on a device (``TUNECACHE_LOCK_DIR``, else the user cache dir's
    ``locks``; :mod:`tunecache.devicelock`)."""
    return _cache_folder("TUNECACHE_LOCK_DIR", "locks", env)


LOCK_WARNED = "TUNECACHE_LOCK_WARNED"  # "1": a parent process said its lock folder is unusable


def lock_warned(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process, or the one that started it, said its lock folder cannot be used
    (:mod:`tunecache.devicelock`): its worker processes say it no more."""
    return (os.environ if env is None else env).get(LOCK_WARNED) == "1"


def mark_lock_warned() -> None:
    """Records that the lock folder's warning was given, for the processes started from here."""
    os.environ[LOCK_WARNED] = "1"


def _cache_folder(variable: str, name: str, env: Mapping[str, str] | None) -> Path:
    import platformdirs

    chosen = (os.environ if env is None else env).get(variable, "").strip()
    return Path(chosen) if chosen else Path(platformdirs.user_cache_dir("tunecache")) / name


def default_db_url() -> str:
    """A SQLite file in the user cache directory (created on first use)."""
    import platformdirs

    root = Path(platformdirs.user_cache_dir("tunecache"))
    return f"sqlite:///{root / 'tunecache.db'}"


@dataclass(frozen=True)
class Settings:
    """Typed view of the ``TUNECACHE_*`` environment variables."""

    url: str = f"http://127.0.0.1:{DEFAULT_PORT}"
    timeout: float = 0.5
    token: str | None = None
    snapshot: Path | None = None

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, with_url: bool = True
    ) -> Settings:
        """Reads the settings from ``environ`` (``os.environ`` by default); with ``with_url``
        false, not ``TUNECACHE_URL`` (``url`` is the default): for a caller given a URL of its
        own (``--server``), which a bad ``TUNECACHE_URL`` must not stop. A caller that needs
        only some of them reads those alone (:func:`env_url`, :func:`env_timeout`,
        :func:`env_token`), so that a variable it does not use never stops it.

        Raises:
            InvalidInput: a variable is set to a value of the wrong type or range.
        """
        env = os.environ if environ is None else environ
        return cls(
            url=env_url(env) if with_url else cls.url,
            timeout=env_timeout(env),
            token=env_token(env),
            snapshot=snapshot_file(env),
        )


# The most seconds a run-time lookup may be given, however it is given (TUNECACHE_TIMEOUT,
# Client(timeout=), Timeout(lookup=)): 500 meant milliseconds, not a process held 8 minutes by
# each lookup of a silent server.
MAX_LOOKUP_TIMEOUT = 60.0


def env_url(environ: Mapping[str, str] | None = None) -> str:
    """``TUNECACHE_URL``, checked (:func:`checked_url`), or the default server's.

    Raises:
        InvalidInput: not an http(s) URL of a host (the message names the variable).
    """
    env = os.environ if environ is None else environ
    return checked_url(env.get("TUNECACHE_URL") or Settings.url, "TUNECACHE_URL=")


def env_timeout(environ: Mapping[str, str] | None = None) -> float:
    """``TUNECACHE_TIMEOUT``: seconds a run-time lookup may take (unset or empty: ``0.5``).

    Raises:
        InvalidInput: not a number, not above 0, not finite (``inf``: a lookup that never gives
            up, which :class:`tunecache.http.Timeout` refuses), or over
            :data:`MAX_LOOKUP_TIMEOUT` (a value in milliseconds: each lookup of a silent server
            would hold the caller that long).
    """
    raw = (os.environ if environ is None else environ).get("TUNECACHE_TIMEOUT")
    if raw is None or raw == "":
        return Settings.timeout
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"TUNECACHE_TIMEOUT={raw!r} is not a float") from None
    if not 0 < value <= MAX_LOOKUP_TIMEOUT:  # nan and inf fail it too
        limit = f"{MAX_LOOKUP_TIMEOUT:g}"
        raise InvalidInput(f"TUNECACHE_TIMEOUT={raw!r} must be more than 0 and at most {limit}: "
                           "it is in seconds (0.5: half a second)")  # fmt: skip
    return value


def env_token(environ: Mapping[str, str] | None = None) -> str | None:
    """``TUNECACHE_TOKEN``, checked (:func:`checked_token`: whitespace around it dropped), or
    ``None`` when unset or blank.

    Raises:
        InvalidInput: it holds a space, a control or a non-ASCII character (not shown).
    """
    raw = (os.environ if environ is None else environ).get("TUNECACHE_TOKEN", "")
    return checked_token(raw, "TUNECACHE_TOKEN=") or None


def checked_url(url: str, given: str) -> str:
    """``url``, a cache server's, without a trailing ``/`` (its scheme in lower case); ``given``
    says where it came from in an error (``"--server "``, ``"TUNECACHE_URL="``).

    Raises:
        InvalidInput: not an http(s) URL with a host, malformed, or with a user name or password
            in it (an ``@`` anywhere): httpx would send those as Basic auth *in place of* the
            token, and every message naming the server would show them. No error here shows
            what comes before the last ``@``.
    """
    import httpx

    shown = without_userinfo(url)
    label = f"{given}{shown!r}" + (" (user and password left out here)" if shown != url else "")
    if not url[:8].lower().startswith(("http://", "https://")):
        raise InvalidInput(f"{label} must start with http:// or https://")
    if "@" in url:
        raise InvalidInput(
            f"{label} holds a user name or password: tunecache sends its token"
            " (TUNECACHE_TOKEN) and no other credentials (a forward proxy's go in HTTPS_PROXY)"
        )
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidInput(f"{label} is not a valid URL: {exc}") from None
    if not parsed.host:
        raise InvalidInput(f"{label} names no host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:  # httpx takes 99999
        raise InvalidInput(f"{label} names port {parsed.port}: a port is 1 to 65535")
    scheme = url.index("://")
    return url[:scheme].lower() + url[scheme:].rstrip("/")


_TOKEN = re.compile(r"[\x21-\x7e]*")  # printable ASCII, no space: what an HTTP header carries


def checked_token(token: str | None, given: str) -> str | None:
    """``token`` without whitespace around it (``None`` stays ``None``); ``given`` names where
    it came from in an error. Stripping never changes a valid token (printable ASCII without
    spaces) and drops the newline a token read from a file (a mounted secret) ends with.

    Raises:
        InvalidInput: it holds a space, a control or a non-ASCII character (the message says
            where, never the token): sent anyway, the server's HTTP parser refused it, and the
            answer without a tunecache identity read as "not a tunecache server".
    """
    if token is None or _TOKEN.fullmatch(token := token.strip()):
        return token
    at = next(i for i, c in enumerate(token) if not _TOKEN.fullmatch(c))
    raise InvalidInput(  # NAME=… first, as every variable's error (settings_without_bad)
        f"{given}(not shown) holds {token[at]!a} at position {at}: an API token is printable "
        "ASCII without spaces (as `tunecache token create` prints it)"
    )


def without_userinfo(url: str) -> str:
    """``url`` as a message may show it: what stands between its scheme (or its start) and its
    last ``@`` left out, however malformed it is (``http:/u:p@h``, a ``/`` in the password).

    Example:
        >>> without_userinfo("https://ci:p4ss/w0rd@cache:8765/x")
        'https://cache:8765/x'
    """
    at = url.rfind("@")
    if at < 0:
        return url
    scheme = url.find("://")
    start = scheme + 3 if 0 <= scheme < at else 0
    return url[:start] + url[at + 1 :]


def settings_without_bad(environ: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """:meth:`Settings.from_env`, each malformed variable taken as unset (its default) instead of
    raising, and what was wrong with each: for code that must not fail on a bad variable (a
    user's kernel launch), so that one bad ``TUNECACHE_TIMEOUT`` does not also drop a good
    ``TUNECACHE_URL`` and ``TUNECACHE_TOKEN``."""
    env = dict(os.environ if environ is None else environ)
    problems: list[str] = []
    while True:
        try:
            return Settings.from_env(env), problems
        except ValueError as exc:  # every message starts with the variable: ``NAME=value …``
            name = str(exc).partition("=")[0]
            if name not in env:
                raise
            problems.append(str(exc))
            del env[name]


INTERPRET_VAR = "TRITON_INTERPRET"
_TRUE = frozenset({"1", "true", "on", "yes", "y"})
_FALSE = frozenset({"", "0", "false", "off", "no", "n"})


def snapshot_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """``TUNECACHE_SNAPSHOT``'s file, or ``None`` when unset: read alone, so that another
    variable set wrong never stops a client that needs only this one."""
    chosen = (os.environ if environ is None else environ).get("TUNECACHE_SNAPSHOT", "")
    return Path(chosen) if chosen else None


def interpret_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter (``os.environ`` by default).

    Raises:
        ValueError: the variable is set to something that is neither true nor false.
    """
    env = os.environ if environ is None else environ
    raw = env.get(INTERPRET_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{INTERPRET_VAR}={env.get(INTERPRET_VAR)!r} is not 1/true/on or 0/false/off")


# A process that compiles for a GPU without using one (the harness's compile farm) runs with no
# Triton interpreter and no CUDA device visible: its compiles are a real GPU's, its GPU untouched.
NO_DEVICE_ENV: Mapping[str, str | None] = {INTERPRET_VAR: None, "CUDA_VISIBLE_DEVICES": ""}


def apply_environment(changes: Mapping[str, str | None]) -> None:
    """Sets each variable of ``changes`` in ``os.environ`` (``None`` removes it): a new process's
    first step, before anything that reads them is imported."""
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


TIMING_CORES_VAR = "TUNECACHE_TIMING_CORES"


def timing_cores(environ: Mapping[str, str] | None = None) -> list[int] | None:
    """The CPU cores ``TUNECACHE_TIMING_CORES`` reserves for the tuner's measurement workers
    (``"2-3"``, ``"0,2,4-7"``); ``None`` when unset (they run on every core this process may).

    Raises:
        InvalidInput: the value is not a list of core numbers and ranges.
    """
    env = os.environ if environ is None else environ
    raw = env.get(TIMING_CORES_VAR, "").strip()
    if not raw:
        return None
    cores: set[int] = set()
    try:
        for part in raw.split(","):
            first, dash, last = part.strip().partition("-")
            low, high = int(first), int(last) if dash else int(first)
            if not 0 <= low <= high < 4096:
                raise ValueError
            cores.update(range(low, high + 1))
    except ValueError:
        raise InvalidInput(f"{TIMING_CORES_VAR}={raw!r} is not a list of cores such as "
                           "'2-3' or '0,2,4-7'") from None  # fmt: skip
    return sorted(cores)


# Thread-pool sizes a pinned measurement worker sets, unless the user set them.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS")


def thread_counts(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Each of :data:`THREAD_VARS` as the user set it, else ``threads``."""
    env = os.environ if environ is None else environ
    return {name: env.get(name) or str(threads) for name in THREAD_VARS}


def omp_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """The outermost level of ``OMP_NUM_THREADS`` (``"4,2"``: 4), or ``None`` if unset or not a
    positive count."""
    env = os.environ if environ is None else environ
    first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


AUTOTUNE_VAR = "TUNECACHE_TRITON_AUTOTUNE"
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_CHOICES: Mapping[str, tuple[str, ...]] = {
    "TUNECACHE_ON_MISS": ("tune", "default"),
    "TUNECACHE_POLICY": ("strict", "compatible", "any"),
    "TUNECACHE_VERIFY": ("never", "first"),
}


def autotune_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TUNECACHE_TRITON_AUTOTUNE`` asks to route every ``triton.autotune``.

    Raises:
        ValueError: the variable is set to something that is neither true nor false.
    """
    env = os.environ if environ is None else environ
    raw = env.get(AUTOTUNE_VAR, "").strip().lower()
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise ValueError(f"{AUTOTUNE_VAR}={env.get(AUTOTUNE_VAR)!r} is not 1/true/on or 0/false/off")


@dataclass(frozen=True)
class Routing:
    """Which ``triton.autotune`` kernels tunecache takes over, and how (``tunecache.triton``'s
    ``install``): modules included (empty: all) and excluded, and the drop-in's options."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    on_miss: str = "tune"
    policy: str = "strict"
    verify: str = "never"

    def __post_init__(self) -> None:
        for module in (*self.include, *self.exclude):
            if not _MODULE.fullmatch(module):
                raise InvalidInput(f"{module!r} is not a module name such as 'liger_kernel.ops'")
        for name, value in zip(_CHOICES, (self.on_miss, self.policy, self.verify), strict=True):
            if value not in _CHOICES[name]:
                raise InvalidInput(f"{name.removeprefix('TUNECACHE_').lower()}={value!r}: "
                                   f"expected one of {', '.join(_CHOICES[name])}")  # fmt: skip

    def routes(self, module: str) -> bool:
        """Whether kernels defined in ``module`` go through tunecache."""

        def covers(prefix: str) -> bool:
            return module == prefix or module.startswith(prefix + ".")

        if any(covers(prefix) for prefix in self.exclude):
            return False
        return not self.include or any(covers(prefix) for prefix in self.include)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Routing:
        """The routing the ``TUNECACHE_TRITON_*`` and drop-in variables ask for.

        Raises:
            InvalidInput: a variable names something that is not a module, or a value that is
                not one of its choices (the message names the variable).
        """
        env = os.environ if environ is None else environ

        def modules(name: str) -> tuple[str, ...]:
            found = tuple(part.strip() for part in env.get(name, "").split(",") if part.strip())
            for module in found:
                if not _MODULE.fullmatch(module):
                    raise InvalidInput(f"{name}: {module!r} is not a module name")
            return found

        def choice(name: str) -> str:
            value = env.get(name, "").strip().lower() or _CHOICES[name][0]
            if value not in _CHOICES[name]:
                raise InvalidInput(f"{name}={env.get(name)!r}: expected one of "
                                   f"{', '.join(_CHOICES[name])}")  # fmt: skip
            return value

        return cls(include=modules("TUNECACHE_TRITON_INCLUDE"),
                   exclude=modules("TUNECACHE_TRITON_EXCLUDE"),
                   on_miss=choice("TUNECACHE_ON_MISS"), policy=choice("TUNECACHE_POLICY"),
                   verify=choice("TUNECACHE_VERIFY"))  # fmt: skip
