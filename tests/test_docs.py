"""The README and docs/: every command and API the README names is documented in docs/, every
link between them resolves, every command's help runs, and the README's client example runs as
written (against a server that is not there: the default config, within its timeout)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
CLI = DOCS["cli.md"]


def commands(text: str) -> set[str]:
    """``tunecache WORD`` as written in a console line or inline code."""
    return set(re.findall(r"(?:^\$ |`|bin/)tunecache ([a-z]+)", text, flags=re.M))


def test_the_readme_is_short_and_points_to_every_page() -> None:
    assert len(README.splitlines()) <= 200
    for name in DOCS:
        assert f"docs/{name}" in README, name


def test_every_command_the_readme_names_is_documented_in_docs_cli() -> None:
    named = commands(README)
    assert {"serve", "tune", "get", "daemon", "pretune", "coverage", "demo"} <= named
    documented = set(re.findall(r"^tunecache ([a-z]+)", CLI, flags=re.M))
    assert named <= documented, named - documented


@pytest.mark.parametrize("api", ["tunecache.key_for", "tunecache.Client", "client.lookup",
                                 "tunecache.triton.autotune", "tunecache.inductor.enable",
                                 "tunecache.tvm.Database", "tunecache.triton.install"])  # fmt: skip
def test_every_api_the_readme_names_has_an_example_in_docs(api: str) -> None:
    assert api in README
    examples = "".join(re.findall(r"```python\n(.*?)```", "".join(DOCS.values()), flags=re.S))
    short = api.rsplit(".", 1)[-1]
    assert api in examples or f".{short}(" in examples or f"{short}(" in examples, api


def test_every_relative_link_resolves() -> None:
    pages = {ROOT / "README.md": README, **{ROOT / "docs" / n: t for n, t in DOCS.items()}}
    for page, text in pages.items():
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_every_documented_command_answers_help() -> None:
    documented = sorted(set(re.findall(r"^tunecache ([a-z]+)", CLI, flags=re.M)))
    assert len(documented) >= 15
    for command in documented:
        done = subprocess.run([sys.executable, "-m", "tunecache_cli", command, "--help"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "usage: tunecache" in done.stdout, (command, done.stderr)


def test_the_readmes_client_example_runs_and_falls_back_in_time() -> None:
    block = re.search(r"```python\n(.*?)```", README, flags=re.S)
    assert block is not None and "client.lookup(key)" in block.group(1)
    namespace: dict[str, object] = {}
    started = time.monotonic()
    exec(compile(block.group(1), "README.md", "exec"), namespace)  # our own README, as written
    assert time.monotonic() - started < 5.0
    result = namespace["result"]
    assert result.source == "default"  # type: ignore[attr-defined]
    assert result.config == {"schedule": "default"}  # type: ignore[attr-defined]
