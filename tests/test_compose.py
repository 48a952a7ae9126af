"""docker-compose.yml stays in step with the code: real settings, real commands, a GPU daemon.

(No Docker engine runs in CI; this checks what can drift without one.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from cache_server.settings import ServerSettings
from tunecache_cli import build_parser

ROOT = Path(__file__).parents[1]
COMPOSE = ROOT / "docker-compose.yml"


def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return loaded


def default(value: str) -> str:
    """``${NAME:-default}`` → ``default``, as compose would fill it with ``NAME`` unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


def test_server_settings_are_real_and_valid() -> None:
    env = services()["server"]["environment"]
    names = {f"TUNECACHE_SERVER_{field.upper()}" for field in ServerSettings.model_fields}
    assert set(k for k in env if k.startswith("TUNECACHE_SERVER_")) <= names
    values = {
        k.removeprefix("TUNECACHE_SERVER_").lower(): default(v)
        for k, v in env.items()
        if k.startswith("TUNECACHE_SERVER_") and "${" not in default(v)
    }
    settings = ServerSettings(**values)
    assert settings.db.startswith("postgresql+psycopg://")
    assert settings.workers > 1 and settings.host == "0.0.0.0"
    assert "TUNECACHE_SERVER_BOOTSTRAP_TOKEN" in env


def test_server_command_migrates_then_serves_with_commands_that_parse() -> None:
    server = services()["server"]
    script = server["command"][-1]
    steps = [shlex.split(step.strip().removeprefix("exec ")) for step in script.split("&&")]
    assert [step[:2] for step in steps] == [["tunecache", "db"], ["tunecache", "serve"]]
    for step in steps:
        build_parser().parse_args(step[1:])  # exits 2 on an unknown command or flag
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_daemon_reserves_a_gpu_and_talks_to_the_server() -> None:
    daemon = services()["daemon"]
    (device,) = daemon["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == 1
    assert daemon["environment"]["TUNECACHE_URL"] == "http://server:8765"
    assert "TUNECACHE_TOKEN" in daemon["environment"]
    assert daemon["profiles"] == ["gpu"]
    args = build_parser().parse_args(daemon["command"][1:])  # a real command, its flags parse
    assert (args.command, args.device) == ("daemon", "cuda")


def test_the_images_hold_every_package_the_project_installs() -> None:
    """The console script lives in ``tunecache_cli``: an image without it runs no command."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (ROOT / "Dockerfile").read_text(), re.M))
    assert packages <= copied, packages - copied
    assert "tunecache_cli" in packages
