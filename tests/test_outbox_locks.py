"""Whether a taken outbox file's sender lives is the kernel's word, not a PID's: the sender holds
an advisory lock on the file while it sends it, which the kernel drops when the process dies.
A PID judged it, and a PID reused (a container's PID 1, any PID after a reboot) left an upload
killed mid-send never sent again, ``tunecache push`` saying nothing waits. Real processes here:
each sender is a child killed with SIGKILL while it holds its file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tunecache_cli
from tests.factories import make_key, make_record
from tunecache import outbox, outbox_files
from tunecache.schemas import RecordCreate

URL = "http://cache.example:8765"
ROOT = Path(__file__).resolve().parents[1]

SENDER = r"""
import os, sys, time
from pathlib import Path
from tests.factories import make_key, make_record
from tunecache import outbox
from tunecache.schemas import RecordCreate
folder, url, m, shown = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
taken = outbox.put(url, make_record(make_key(m)), folder)  # taken: its upload is next
if shown:  # the PID its name shows is another's (alive: PID 1), as after a reuse
    os.rename(taken, taken.with_name(taken.name.replace(f"-{os.getpid()}-", f"-{shown}-", 1)))
print("taken", flush=True)
time.sleep(600)
"""

TAKER = r"""
import sys, time
from pathlib import Path
from tunecache import outbox
from tunecache.schemas import RecordCreate
sys.stdin.readline()  # all start together
print(len(outbox.take(sys.argv[2], Path(sys.argv[1]))), flush=True)
time.sleep(600)  # holds what it took till killed
"""


def child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip


def sender(folder: Path, m: int = 8, shown: str = "") -> subprocess.Popen[str]:
    """A process that put an upload and holds it taken, as a tune mid-upload."""
    proc = child(SENDER, str(folder), URL, str(m), shown)
    assert proc.stdout is not None and proc.stdout.readline() == "taken\n"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: as the OOM killer, docker kill
    proc.wait(timeout=60)


def test_an_upload_whose_sender_was_killed_waits_again_whatever_pid_its_name_shows(
    own_outbox: Path,
) -> None:
    proc = sender(own_outbox, shown="1")  # PID 1 lives: the PID said "still sending"
    try:
        assert outbox.waiting(URL, own_outbox) == 0  # sending: not pushable meanwhile
        assert outbox.take(URL, own_outbox) == []
    finally:
        kill(proc)
    assert outbox.waiting(URL, own_outbox) == 1
    assert outbox.sending(URL, own_outbox) == 0
    (first,) = outbox.take(URL, own_outbox)
    assert isinstance(first.upload, RecordCreate)  # the sender's record, whole
    assert not first.name.startswith(".") and first.path.name.endswith(first.name)
    assert outbox.take(URL, own_outbox) == []  # taken: a second pusher finds nothing
    outbox.done(first.path)
    assert not any(own_outbox.iterdir())


def test_a_file_taken_by_a_version_before_the_lock_waits_when_nobody_holds_it(
    tmp_path: Path,
) -> None:
    kept = outbox.release(outbox.put(URL, make_record(make_key(8)), tmp_path))
    kept.rename(kept.with_name(f"{outbox_files.TAKEN}1-{kept.name}"))  # left by a killed older push
    assert outbox.waiting(URL, tmp_path) == 1
    (item,) = outbox.take(URL, tmp_path)
    assert item.name == kept.name
    outbox.release(item.path)
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]


def test_an_upload_a_live_process_sends_is_said_as_such_and_left_to_it(
    own_outbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = sender(own_outbox)
    try:
        assert outbox.waiting(URL, own_outbox) == 0
        assert outbox.sending(URL, own_outbox) == 1
        assert outbox.servers(own_outbox) == {}
        assert outbox.take(URL, own_outbox) == []
        assert tunecache_cli.main(["push", "--server", URL]) == 0  # nothing waits for it
        err = capsys.readouterr().err
        assert f"nothing waits for {URL}" in err
        assert f"1 upload is being sent to {URL} by another process" in err
        assert len(list(own_outbox.iterdir())) == 1  # untouched
    finally:
        kill(proc)
    assert (outbox.waiting(URL, own_outbox), outbox.sending(URL, own_outbox)) == (1, 0)


def test_of_processes_taking_at_once_exactly_one_takes_each_file(tmp_path: Path) -> None:
    """Two files: one waiting, one its killed sender's (taken, its lock gone)."""
    outbox.release(outbox.put(URL, make_record(make_key(8)), tmp_path))
    kill(sender(tmp_path, m=16, shown="1"))
    takers = [child(TAKER, str(tmp_path), URL) for _ in range(6)]
    try:
        for proc in takers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        counts = [int(proc.stdout.readline()) for proc in takers if proc.stdout is not None]
        assert sorted(counts) in ([0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 2])
        assert outbox.waiting(URL, tmp_path) == 0 and outbox.sending(URL, tmp_path) == 2
    finally:
        for proc in takers:
            kill(proc)
    assert outbox.waiting(URL, tmp_path) == 2  # their takers died: both wait again


MANY = r"""
import resource, sys
from pathlib import Path
from tests.factories import make_key, make_record
from tunecache import outbox
folder, url = Path(sys.argv[1]), sys.argv[2]
for m in range(8, 8 + 300):
    outbox.release(outbox.put(url, make_record(make_key(m), trials=0), folder))
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

class Server:  # the upload's boundary: takes each
    def __init__(self): self.sent = 0
    def upload(self, record): self.sent += 1

server = Server()
print(outbox.push(server, url, folder)[:2], server.sent, outbox.waiting(url, folder), flush=True)
"""


def test_a_push_of_more_files_than_descriptors_sends_them_all(tmp_path: Path) -> None:
    """300 uploads wait and the process may open 128 files: a push holds a batch of them taken
    at a time (each is open while it is held), and sends every one; holding all at once, the
    files past the process's descriptors were skipped."""
    folder = tmp_path / "outbox"
    pushed = subprocess.run([sys.executable, "-c", MANY, str(folder), URL], cwd=ROOT, text=True,
                            capture_output=True, timeout=300)  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    assert pushed.stdout.split("\n")[0] == "(300, 0) 300 0", pushed.stdout
    assert not list(folder.glob("*.json"))


def test_a_child_forked_while_an_upload_is_written_holds_none_of_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child forked while a parent thread wrote an upload into the outbox kept the file open,
    its lock with it: once the parent died, the upload was "being sent" for as long as the
    child ran (a data loader's worker: hours), and no push sent it. The file is held from the
    moment it is made, so the child closes its copy (and no fork falls between the two)."""
    import multiprocessing
    import os
    import threading

    writing, go_on = threading.Event(), threading.Event()
    fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        writing.set()
        go_on.wait(30)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    writer = threading.Thread(target=outbox.put, args=(URL, make_record(make_key(8)), tmp_path))
    writer.start()
    assert writing.wait(30)
    read_end, write_end = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        opened = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")]  # fmt: skip
        write_end.send([path for path in opened if str(tmp_path) in path])
        os._exit(0)
    go_on.set()
    writer.join(30)
    held_by_child = read_end.recv()
    os.waitpid(child, 0)
    assert held_by_child == []
    assert outbox.sending(URL, tmp_path) == 1  # the parent's, taken: its upload is next


def test_children_forked_while_uploads_are_written_neither_hang_nor_write_them_twice(
    tmp_path: Path,
) -> None:
    """Holding the file being written made each forked child close it: a buffered file's close
    flushed what the parent's thread had buffered (the upload twice in its file, unreadable)
    or waited on its buffer's lock, which that thread held at the fork (the child hung in the
    fork for good: a reviewer's within 4 to 12 forks). The file is unbuffered."""
    import os
    import threading
    import time

    done = threading.Event()

    def write() -> None:
        while not done.is_set():
            outbox.release(outbox.put(URL, make_record(make_key(8)), tmp_path))

    writer = threading.Thread(target=write)
    writer.start()
    stuck = []
    try:
        for _ in range(300):
            child = os.fork()
            if child == 0:  # pragma: no cover - the child only exits
                os._exit(0)
            deadline = time.monotonic() + 10
            while os.waitpid(child, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                    stuck.append(child)
                    break
                time.sleep(0.001)
            if stuck:
                break
    finally:
        done.set()
        writer.join(60)
    assert stuck == []
    written = list(tmp_path.glob("*.json"))  # read here, not taken: a taken file stays open
    assert written and all("record" in json.loads(p.read_bytes()) for p in written)
