"""Local files are written through a private temporary file: a link planted at a fixed temporary
name (``DIR/.<file>.partial``) used to make ``sync --format vllm-moe`` overwrite its target."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tunecache.vllm_moe import MoeFile, MoeShape, file_text, write_file

GOOD = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 2}  # fmt: skip


def test_a_link_planted_beside_a_vllm_moe_file_is_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    shape, contents = MoeShape(8, 64, "X"), MoeFile({1: GOOD})
    name = shape.file_name()
    (out / f".{name}.partial").symlink_to(victim)  # the old fixed temporary name
    written = write_file(out, shape, contents)
    assert victim.read_text() == "keep me\n"
    assert written == out / name and not written.is_symlink()
    assert written.read_text() == file_text(contents)
    assert sorted(p.name for p in out.iterdir()) == sorted([name, f".{name}.partial"])
    umask = os.umask(0o022)
    os.umask(umask)
    assert written.stat().st_mode & 0o777 == 0o666 & ~umask  # vLLM may read it as another user
    written.chmod(0o600)  # the owner's choice is kept
    write_file(out, shape, contents)
    assert written.stat().st_mode & 0o777 == 0o600


def test_concurrent_writes_of_one_vllm_moe_file_each_leave_it_whole(tmp_path: Path) -> None:
    shape = MoeShape(8, 64, "X")
    files = [MoeFile({m: GOOD for m in range(1, n + 2)}) for n in range(8)]
    errors: list[BaseException] = []

    def write(contents: MoeFile) -> None:
        try:
            for _ in range(20):
                write_file(tmp_path, shape, contents)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(c,)) for c in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert (tmp_path / shape.file_name()).read_text() in {file_text(c) for c in files}
    assert [p.name for p in tmp_path.iterdir()] == [shape.file_name()]
