"""The outbox reads its files within bounds: a FIFO named ``*.json`` blocked ``tunecache push``
(and the quiet push at the start of every tune) for ever, and a ``*.json`` link to ``/dev/zero``
was read until memory ran out ("internal error"). They are opened without following links or
blocking, read only if regular and within :data:`tunecache.outbox_files.MAX_FILE_BYTES`, and set
aside in ``rejected/``, each named with why. A ``rejected`` that is a file is said in one line
naming it, the upload waiting still: it was "internal error: FileExistsError"."""

from __future__ import annotations

import logging
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import make_key, make_record
from tests.test_outbox import Upstream
from tunecache import outbox, outbox_files
from tunecache.errors import ServerError

URL = "http://cache.example:8765"
MEMORY = 2 * 2**30  # a push needs far less; a read of /dev/zero without bound meets it


def push(folder: Path) -> subprocess.CompletedProcess[str]:
    """``tunecache push`` on ``folder``, in a process of bounded memory and time (what went
    wrong before: a read for ever, or without bound)."""

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    env = {**os.environ, "TUNECACHE_OUTBOX": str(folder)}
    return subprocess.run([sys.executable, "-m", "tunecache_cli", "push", "--server", URL],
                          env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=bounded)  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_set_aside_never_waited_on(own_outbox: Path) -> None:
    fifo = own_outbox / "1700000000000-fifo.json"
    os.mkfifo(fifo)
    pushed = push(own_outbox)
    assert pushed.returncode == 1, pushed.stderr
    assert f"1 unreadable file set aside in {own_outbox / 'rejected'}: 1700000000000-fifo.json: " \
        "not a regular file (a FIFO)" in pushed.stderr  # fmt: skip
    assert stat.S_ISFIFO(os.lstat(own_outbox / "rejected" / fifo.name).st_mode)
    assert not os.path.lexists(fifo)


def test_a_link_to_dev_zero_is_set_aside_unread(own_outbox: Path) -> None:
    link = own_outbox / "1700000000000-zero.json"
    link.symlink_to("/dev/zero")
    pushed = push(own_outbox)
    assert pushed.returncode == 1, pushed.stderr
    assert "internal error" not in pushed.stderr
    assert "1700000000000-zero.json: not a regular file (a link, not followed)" in pushed.stderr
    assert os.readlink(own_outbox / "rejected" / link.name) == "/dev/zero"


def test_a_file_past_the_bound_is_set_aside_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = outbox.release(outbox.put(URL, make_record(make_key(8)), tmp_path))
    monkeypatch.setattr(outbox_files, "MAX_FILE_BYTES", small.stat().st_size - 1)
    assert outbox.waiting(URL, tmp_path) == 0  # never read as an upload
    bound = small.stat().st_size - 1
    assert outbox.set_aside_unreadable(tmp_path) == [f"{small.name}: over {bound:,} bytes"]
    assert (tmp_path / "rejected" / small.name).exists()


def test_push_with_rejected_a_file_says_so_in_one_line_and_loses_nothing(
    own_outbox: Path,
) -> None:
    garbage = own_outbox / "1700000000000-garbage.json"
    garbage.write_text("not json")
    (own_outbox / "rejected").write_text("i am a file")
    pushed = push(own_outbox)
    assert pushed.returncode == 1, pushed.stderr  # an unreadable file is left: not all well
    assert "internal error" not in pushed.stderr
    said = [line for line in pushed.stderr.splitlines() if "rejected" in line]
    assert len(said) == 1, pushed.stderr
    assert f"{garbage.name} cannot be set aside in {own_outbox / 'rejected'} (a file, not a " \
        f"folder): it waits in {own_outbox}" in said[0]  # fmt: skip
    assert garbage.read_text() == "not json"
    assert (own_outbox / "rejected").read_text() == "i am a file"


def test_an_upload_refused_when_rejected_is_a_file_waits_again(
    own_outbox: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (own_outbox / "rejected").write_text("i am a file")
    later = outbox.Later(URL, make_record(make_key(8)), "the record")
    refusal = ServerError("POST /v1/records → 422: invalid", status_code=422)
    with caplog.at_level(logging.WARNING), pytest.raises(ServerError, match="422"):
        later.send(Upstream(refusal))
    assert [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()] == [
        f"{later_name(own_outbox)} cannot be set aside in {own_outbox / 'rejected'} (a file, "
        f"not a folder): it waits in {own_outbox}, to be sent again"
    ]
    assert outbox.waiting(URL, own_outbox) == 1  # nothing lost
    upstream = Upstream(ServerError("422 invalid", status_code=422))
    assert outbox.push(upstream, URL, own_outbox)[:2] == (0, 0)  # not refused: it waits
    assert outbox.waiting(URL, own_outbox) == 1


def later_name(folder: Path) -> str:
    (waiting,) = folder.glob("[0-9]*.json")
    return waiting.name


def test_json_nested_past_the_parser_is_set_aside_not_an_internal_error(own_outbox: Path) -> None:
    """``[[[…`` 200,000 deep is JSON no parser takes (RecursionError): push was an internal
    error naming no file, and every tune, which pushes first, died before it began."""
    deep = own_outbox / "1700000000000-deep.json"
    deep.write_text("[" * 200_000)
    pushed = push(own_outbox)
    assert pushed.returncode == 1, pushed.stderr
    assert "internal error" not in pushed.stderr and "Traceback" not in pushed.stderr
    assert "1700000000000-deep.json" in pushed.stderr, pushed.stderr
    assert (own_outbox / "rejected" / deep.name).exists()


def test_an_error_of_another_kind_mid_push_leaves_the_rest_waiting(own_outbox: Path) -> None:
    """A send that fails with something other than the server's answer (a bug, an interrupt)
    ends the push; the files it had taken and not sent wait again, none left held as "being
    sent" by a process that goes on for hours."""
    for m in (8, 16, 24):
        outbox.release(outbox.put(URL, make_record(make_key(m)), own_outbox))

    class Broken:
        def upload(self, record: object) -> None:
            raise RuntimeError("a bug in the sender")

    with pytest.raises(RuntimeError):
        outbox.push(Broken(), URL, own_outbox)
    assert outbox.waiting(URL, own_outbox) == 3
    assert outbox.sending(URL, own_outbox) == 0


def test_a_stray_file_named_as_taken_breaks_no_push(own_outbox: Path) -> None:
    """``.sending-x.json`` (no PID in its name, put there by hand) made every push, and the push
    after each tune's upload, an "internal error: IndexError" after the tune's record was
    stored. It is read as any other file; the uploads beside it go."""
    (own_outbox / ".sending-x.json").write_text("{}")
    outbox.release(outbox.put(URL, make_record(make_key(8)), own_outbox))
    assert outbox.waiting(URL, own_outbox) == 1
    assert outbox.push(Upstream(None), URL, own_outbox)[:2] == (1, 0)
    pushed = push(own_outbox)
    assert "internal error" not in pushed.stderr and "Traceback" not in pushed.stderr


def test_an_upload_the_disk_cannot_hold_leaves_no_half_written_file(own_outbox: Path) -> None:
    """On a full disk (here a file-size limit) each upload left its ``.writing-*.tmp`` behind,
    cut short: closing the file flushed it again, which failed again, before it was removed.
    Ones a killed writer left over an hour ago go at the next upload."""
    abandoned, fresh = own_outbox / ".writing-old.tmp", own_outbox / ".writing-new.tmp"
    abandoned.write_text("{")
    fresh.write_text("{")
    os.utime(abandoned, (0, 0))
    script = ("import signal, resource, sys\n"
              "from pathlib import Path\n"
              "from tests.factories import make_key, make_record\n"
              "from tunecache import outbox\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
              "try:\n"
              f"    outbox.put({URL!r}, make_record(make_key(8), trials=50), Path(sys.argv[1]))\n"
              "except OSError as exc:\n"
              "    print(exc.errno)\n")  # fmt: skip
    ran = subprocess.run([sys.executable, "-c", script, str(own_outbox)], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert ran.stdout.strip() == "27", ran.stderr  # EFBIG: the record did not fit
    assert sorted(p.name for p in own_outbox.iterdir()) == [fresh.name]


def test_a_rejected_folder_that_is_a_link_takes_nothing(own_outbox: Path, tmp_path: Path) -> None:
    """``rejected`` planted as a link (while an older version left the outbox open) moved the
    uploads set aside out of the private folder, to wherever it pointed."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (own_outbox / "rejected").symlink_to(elsewhere)
    garbage = own_outbox / "1700000000000-garbage.json"
    garbage.write_text("not json")
    pushed = push(own_outbox)
    assert "(a link, not a folder): it waits in" in pushed.stderr, pushed.stderr
    assert list(elsewhere.iterdir()) == [] and garbage.read_text() == "not json"


def test_a_half_written_file_whose_writer_lives_is_not_swept(own_outbox: Path) -> None:
    """The sweep went by the file's age alone: a writer an hour behind (its clock, or its file
    server's) or stopped mid-write lost its file to another process's upload, and its own
    upload was not kept. A live writer holds its file's lock."""
    import fcntl

    live = own_outbox / ".writing-live.tmp"
    live.write_text("{")
    os.utime(live, (0, 0))
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as its writer holds it
        outbox.release(outbox.put(URL, make_record(make_key(8)), own_outbox))
        assert live.exists()
    outbox.release(outbox.put(URL, make_record(make_key(16)), own_outbox))  # its writer died
    assert not live.exists() and outbox.waiting(URL, own_outbox) == 2


def test_a_rejected_folder_an_older_version_left_open_is_closed_and_used(
    own_outbox: Path,
) -> None:
    """``rejected/`` made under an umask of 002 (0775) by an older version was refused as
    another's to write in: every refused upload stayed, sent again at every push."""
    (own_outbox / "rejected").mkdir(mode=0o775)
    os.chmod(own_outbox / "rejected", 0o775)
    garbage = own_outbox / "1700000000000-garbage.json"
    garbage.write_text("not json")
    pushed = push(own_outbox)
    assert "set aside in" in pushed.stderr and "cannot be set aside" not in pushed.stderr
    assert (own_outbox / "rejected" / garbage.name).exists()
    assert stat.S_IMODE(os.stat(own_outbox / "rejected").st_mode) == 0o700
