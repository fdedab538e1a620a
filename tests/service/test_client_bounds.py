"""Every wait of the client is bounded: a service that accepts and never answers, one that
never accepts, one that never notifies or completes a fence; and results that cannot be the
request's (absurd dimensions) are a clean error."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from helpers import add_model
from hostile import Hostile, answer, real_reply, silent

from nnhal.errors import NnhalError
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, OutputShape, Timing
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.service import client
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice, RemotePreparedModel
from nnhal.service.discovery import open_remote
from nnhal.service.transport import send_message

E = ErrorStatus
HANG_S = 5  # "returns within a few seconds" (the bounds below are a fraction of it)


def _request() -> RequestBuilder:
    a = np.ones((4, 4), np.float32)
    return RequestBuilder([a, a], [a.nbytes])


def test_a_service_that_never_answers_fails_each_kind_of_wait_within_its_bound(tmp_path):
    srv = Hostile(str(tmp_path / "s.sock"), silent)
    dev = RemoteDevice(srv.path, timeout_s=0.3, long_timeout_s=0.6)
    try:
        t0 = time.monotonic()
        assert dev.get_type() == (E.DEVICE_UNAVAILABLE, dev.get_type()[1])
        assert 0.25 < time.monotonic() - t0 < HANG_S
        t0 = time.monotonic()
        assert dev.get_capabilities() == (E.DEVICE_UNAVAILABLE, None)  # dead now: at once
        assert time.monotonic() - t0 < 0.2
    finally:
        dev.close()
    for call in ("sync", "deadline", "prepare", "async", "supported"):
        dev = RemoteDevice(srv.path, timeout_s=0.3, long_timeout_s=0.6)
        rb = _request()
        pm = RemotePreparedModel(dev.conn, 1)
        t0 = time.monotonic()
        if call == "sync":
            assert pm.execute_synchronously(rb.request)[0] == E.DEVICE_UNAVAILABLE
        elif call == "deadline":
            deadline = time.monotonic_ns() + 200_000_000
            assert pm.execute_synchronously(rb.request, deadline=deadline)[0] == \
                E.MISSED_DEADLINE_TRANSIENT
        elif call == "prepare":
            cb = PreparedModelCallback()
            assert dev.prepare_model(add_model((4, 4)), callback=cb) == E.DEVICE_UNAVAILABLE
            assert cb.wait(HANG_S)[0] == E.DEVICE_UNAVAILABLE
        elif call == "async":
            cb = ExecutionCallback()
            assert execute_1_3(pm, rb.request, 0, None, None, cb) == E.DEVICE_UNAVAILABLE
            assert cb.wait(HANG_S)[0] == E.DEVICE_UNAVAILABLE
        else:
            assert dev.get_supported_operations(add_model((4, 4)))[0] == E.DEVICE_UNAVAILABLE
        assert time.monotonic() - t0 < HANG_S, call
        dev.close()
        rb.close()
    srv.close()


def test_a_callback_never_notified_and_a_fence_never_completed_end(tmp_path):
    srv = Hostile(str(tmp_path / "s.sock"), lambda s, k, c: send_message(
        s, w.Kind.REPLY, c, real_reply(k)))  # replies, never notifies
    dev = RemoteDevice(srv.path, timeout_s=0.3, long_timeout_s=0.6)
    try:
        cb = PreparedModelCallback()
        t0 = time.monotonic()
        assert dev.prepare_model(add_model((4, 4)), callback=cb) == E.NONE
        assert cb.wait(HANG_S)[0] == E.DEVICE_UNAVAILABLE
        assert time.monotonic() - t0 < HANG_S
    finally:
        dev.close()
    dev = RemoteDevice(srv.path, timeout_s=0.3, long_timeout_s=0.6)
    rb = _request()
    try:
        status, fence, fcb = RemotePreparedModel(dev.conn, 1).execute_fenced(rb.request, [])
        assert status == E.NONE and fence is not None
        t0 = time.monotonic()
        assert fence.wait(HANG_S)  # completed (in error) by the bound, not by the test's
        assert time.monotonic() - t0 < HANG_S
        assert fcb.get_execution_info()[0] == E.DEVICE_UNAVAILABLE
    finally:
        dev.close()
        rb.close()
        srv.close()


def test_a_service_that_never_accepts(tmp_path, monkeypatch):
    monkeypatch.setenv("NNHAL_REMOTE_TIMEOUT_S", "0.3")
    srv = Hostile(str(tmp_path / "s.sock"), accept=False)  # listen(0), nobody accepts
    first = RemoteDevice(srv.path, timeout_s=0.3, long_timeout_s=0.6)  # in the backlog
    extra = []
    try:
        for _ in range(8):  # whatever room is left in the backlog
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            extra.append(s)
            try:
                s.connect(srv.path)
            except BlockingIOError:
                break
        t0 = time.monotonic()
        assert first.get_type()[0] == E.DEVICE_UNAVAILABLE  # connected, never served
        with pytest.raises(TimeoutError, match="backlog"):
            RemoteDevice(srv.path, timeout_s=0.3)
        assert time.monotonic() - t0 < HANG_S
        with pytest.raises(NnhalError, match="backlog"):
            open_remote(f"remote:{srv.path}")
    finally:
        first.close()
        for s in extra:
            s.close()
        srv.close()


@pytest.mark.parametrize("shapes", [
    [OutputShape([0xFFFF_FFFF] * 3, True)],                 # past any buffer
    [OutputShape([64, 64], True)],                          # past this request's buffer
    [OutputShape([4, 4], True), OutputShape([4, 4], True)],  # two shapes for one output
    [OutputShape([4, 4, 1], True)],                         # another rank than given
])
def test_results_that_cannot_be_the_requests_are_general_failure(tmp_path, shapes):
    def policy(sock, kind, call_id):
        if kind != w.Kind.EXECUTE_SYNCHRONOUSLY:
            return answer(sock, kind, call_id)
        send_message(sock, w.Kind.REPLY, call_id,
                     w.pack_shapes_result(E.NONE, shapes, Timing(1, 1)))
    srv = Hostile(str(tmp_path / "s.sock"), policy)
    dev = RemoteDevice(srv.path, timeout_s=2)
    rb = _request()
    rb.request.outputs[0].dimensions = [4, 4]
    try:
        assert RemotePreparedModel(dev.conn, 1).execute_synchronously(rb.request) == \
            (E.GENERAL_FAILURE, [], Timing(0xFFFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF))
        assert dev.get_type()[0] == E.NONE  # the connection goes on
    finally:
        dev.close()
        rb.close()
        srv.close()


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "soon"])
def test_bounds_from_the_environment_are_checked(tmp_path, monkeypatch, bad):
    srv = Hostile(str(tmp_path / "s.sock"))
    monkeypatch.setenv("NNHAL_REMOTE_TIMEOUT_S", bad)
    with pytest.raises(ValueError, match="NNHAL_REMOTE_TIMEOUT_S|positive"):
        RemoteDevice(srv.path)
    monkeypatch.setenv("NNHAL_REMOTE_TIMEOUT_S", "0.25")
    dev = RemoteDevice(srv.path)
    assert dev.conn.timeout_s == 0.25 and dev.get_type()[0] == E.NONE
    dev.close()
    srv.close()


def test_a_repeated_reply_is_checked_once_and_a_changed_one_again(tmp_path, monkeypatch):
    # The short way of a repeated execution decodes a reply whose bytes repeat (but its
    # timing) once, and checks it against the request once: each reply brings its own
    # timing, and a reply that changes is decoded and checked again.
    replies = iter([[OutputShape([4, 4], True)]] * 4 + [[OutputShape([64, 64], True)]] +
                   [[OutputShape([4, 4], True)]] * 2)
    sent: list[Timing] = []

    def policy(sock, kind, call_id):
        if kind != w.Kind.EXECUTE_SYNCHRONOUSLY:
            return answer(sock, kind, call_id)
        sent.append(Timing(len(sent) + 1, 2 * len(sent) + 1))
        send_message(sock, w.Kind.REPLY, call_id,
                     w.pack_shapes_result(E.NONE, next(replies), sent[-1]))
    calls = {"_fitting": 0, "_shapes_result": 0}

    def counting(name):
        real = getattr(client, name)

        def counted(*args):
            calls[name] += 1
            return real(*args)
        return counted
    for name in calls:
        monkeypatch.setattr(client, name, counting(name))
    srv = Hostile(str(tmp_path / "s.sock"), policy)
    dev = RemoteDevice(srv.path, timeout_s=2)
    rb = _request()
    pm = RemotePreparedModel(dev.conn, 1)
    try:
        got = [pm.execute_synchronously(rb.request) for _ in range(7)]
        assert dev.conn.sent_again == 5
        # Checked: the two long ways, the first short one, and the two changed replies;
        # decoded: the first reply and the two changed ones.
        assert calls == {"_fitting": 5, "_shapes_result": 3}
        fit = [OutputShape([4, 4], True)]
        assert got[:4] == [(E.NONE, fit, t) for t in sent[:4]]
        assert got[4][0] == E.GENERAL_FAILURE  # the same request, another reply: checked
        assert got[5:] == [(E.NONE, fit, t) for t in sent[5:]]
    finally:
        dev.close()
        rb.close()
        srv.close()
