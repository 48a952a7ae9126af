"""Installs ``tunecache-triton.pth`` beside the packages, for wheels and editable installs alike.

The file is one line that does nothing unless ``TUNECACHE_TRITON_AUTOTUNE`` is set; then it arms
``_tunecache_triton_hook``, which routes every ``triton.autotune`` of the process through
tunecache once the program imports Triton (docs/integrations.md). The rest is in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).with_name("tunecache-triton.pth")


class BuildWithPth(build_py):
    """A wheel gets the file at its root (site-packages once installed)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / PTH.name)]


class _WithPth:
    """An editable install's strategy that also writes the file into the editable wheel."""

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy

    def __enter__(self) -> _WithPth:
        self._strategy.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._strategy.__exit__(*exc)

    def __call__(self, wheel: Any, files: list[str], mapping: Any) -> None:
        self._strategy(wheel, files, mapping)
        wheel.writestr(PTH.name, PTH.read_bytes())


class EditableWithPth(editable_wheel):
    # setuptools' own hook (64 and newer; private): tests/test_triton_install.py runs in an
    # editable install, so a setuptools that changes it fails there, not silently.
    def _select_strategy(self, *args: Any, **kwargs: Any) -> Any:
        return _WithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildWithPth, "editable_wheel": EditableWithPth})
