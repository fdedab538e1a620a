"""The runtime directory as a hostile place: FIFOs, links, devices and junk where entries go
never block a reader nor get followed, and a service writes only through its own files."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

import pytest

from nnhal.cli import main
from nnhal.service import registration
from nnhal.service.discovery import remote_reason


def _planted(d: Path) -> None:
    d.mkdir(mode=0o700)
    os.mkfifo(d / "fifo.service")
    (d / "elsewhere").write_text("socket=/x\npid=1\n")
    os.symlink(d / "elsewhere", d / "link.service")
    (d / "junk.service").write_bytes(b"\xff\x00 not an entry")
    (d / "dir.service").mkdir()
    (d / "big.service").write_bytes(b"x" * 10_000)


def test_services_never_block_on_or_follow_what_is_planted(tmp_path, capsys):
    d = tmp_path / "rt"
    _planted(d)
    t0 = time.monotonic()
    entries, others = registration.scan(d)
    assert entries == []
    why = dict(others)
    assert why["fifo.service"] == "a FIFO"
    assert why["link.service"] == "a symbolic link"
    assert why["dir.service"] == "a directory"
    assert "no socket" in why["junk.service"] and "larger" in why["big.service"]
    assert registration.find("fifo", d) is None and registration.find("link", d) is None
    assert main(["services", "--runtime-dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "fifo.service  not a service: a FIFO" in out
    assert "link.service  not a service: a symbolic link" in out
    assert time.monotonic() - t0 < 5  # a FIFO opened for reading would block for ever


def test_registration_replaces_a_planted_link_and_leaves_its_target(tmp_path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_text("keep me")
    os.chmod(target, 0o644)
    os.symlink(target, d / "ref.service")
    os.symlink(target, d / f".ref.service.{os.getpid()}")  # a temporary's name, guessed
    entry = registration.register(d, "ref", "/tmp/ref.sock", "reference")
    assert target.read_text() == "keep me" and (target.stat().st_mode & 0o777) == 0o644
    assert not (d / "ref.service").is_symlink()
    assert registration.read(d / "ref.service") == entry
    assert sorted(p.name for p in d.iterdir()) == [f".ref.service.{os.getpid()}",
                                                   "ref.service"]  # no temporary left


@pytest.mark.parametrize("how", ["link", "others-writable", "file"])
def test_registration_refuses_a_directory_it_cannot_trust(tmp_path, how):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    d = tmp_path / "rt"
    if how == "link":
        os.symlink(real, d)
    elif how == "file":
        d.write_text("")
    else:
        d.mkdir()
        os.chmod(d, 0o777)
    with pytest.raises(OSError):
        registration.register(d, "ref", "/tmp/ref.sock", "reference")
    assert list(real.iterdir()) == []


def test_a_full_backlog_reads_busy_not_dead(tmp_path):
    path = str(tmp_path / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(0)
    clients = []
    try:
        for _ in range(16):  # fill the backlog: a Unix socket then says EAGAIN at once
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            clients.append(c)
            try:
                c.connect(path)
            except BlockingIOError:
                break
        else:
            pytest.skip("the backlog never filled")
        entry = registration.Entry("s", path, 1, "reference", tmp_path / "s.service")
        t0 = time.monotonic()
        assert entry.state() == registration.BUSY and entry.alive()
        assert remote_reason(f"remote:{path}") is None
        assert time.monotonic() - t0 < 2
    finally:
        for c in clients:
            c.close()
        srv.close()
    assert registration.socket_state(path) == registration.DEAD  # nothing listens now
    os.unlink(path)
    assert registration.socket_state(path) == registration.DEAD
    os.mkfifo(path)
    assert registration.socket_state(path) == registration.DEAD  # not a socket: no connect
    assert errno.EAGAIN in registration._BUSY
