"""Conformance mode ``caching``: prepared with cache files, restored from them, then tampered.

For each case: prepare with fresh cache files (holding stale bytes, at a nonzero offset, so the
driver must truncate and ignore the descriptors' offsets), restore from the files while the
writer is alive and again after it is dropped, and check the restored models' results as the
general mode does. Then the files are altered: a wrong token, a flipped byte of a model cache
file, a model cache file grown by a few bytes, and a wrong number of handles must each fail
cleanly (callback exactly once, an error status, no model); a flipped byte of a data cache file
may fail cleanly or succeed, but then the results must still be right.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from nnhal.conformance.cases import Case
from nnhal.conformance.runner import (
    CALLBACK_TIMEOUT_S,
    CaseFailure,
    Options,
    Unsupported,
    _execute_sync,
    general_paths,
    prepare,
    run_paths,
)
from nnhal.hal.interfaces import IDevice, IPreparedModel, PreparedModelCallback
from nnhal.hal.types import ErrorStatus, MeasureTiming

STALE = b"stale cache bytes"


def _restore(device: IDevice, mc: list[Any], dc: list[Any], token: bytes, label: str
             ) -> tuple[ErrorStatus, IPreparedModel | None]:
    """prepareModelFromCache; checks the callback protocol, returns (status, model)."""
    cb = PreparedModelCallback()
    launch = device.prepare_model_from_cache(None, mc, dc, token, cb)
    status, prepared = cb.wait(CALLBACK_TIMEOUT_S)
    if cb.calls != 1:
        raise CaseFailure(f"{label}: callback called {cb.calls} times")
    if launch != ErrorStatus.NONE and launch != status:
        raise CaseFailure(f"{label}: launch status {launch.name} but callback {status.name}")
    if (status == ErrorStatus.NONE) != (prepared is not None):
        raise CaseFailure(f"{label}: status {status.name} with prepared model {prepared!r}")
    return status, prepared


def _restore_ok(device: IDevice, mc: list[Any], dc: list[Any], token: bytes, label: str
                ) -> IPreparedModel:
    status, prepared = _restore(device, mc, dc, token, label)
    if status != ErrorStatus.NONE or prepared is None:
        raise CaseFailure(f"{label}: prepareModelFromCache failed with {status.name}")
    return prepared


def _expect_rejected(device: IDevice, mc: list[Any], dc: list[Any], token: bytes, label: str,
                     allowed: tuple[ErrorStatus, ...] = (ErrorStatus.GENERAL_FAILURE,)) -> None:
    status, _ = _restore(device, mc, dc, token, label)
    if status not in allowed:
        raise CaseFailure(f"{label}: prepareModelFromCache gave {status.name}, expected "
                          f"{' or '.join(s.name for s in allowed)}")


def _flip(f: Any, token: bytes) -> tuple[int, bytes] | None:
    """Flip one bit of a file at a position derived from the token; (position, old byte)."""
    fd = f.fileno()
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    pos = int.from_bytes(token[:4], "little") % size
    old = os.pread(fd, 1, pos)
    os.pwrite(fd, bytes([old[0] ^ (1 << (token[4] % 8))]), pos)
    return pos, old


def _unflip(f: Any, flipped: tuple[int, bytes] | None) -> None:
    if flipped is not None:
        os.pwrite(f.fileno(), flipped[1], flipped[0])


def run(device: IDevice, case: Case, opts: Options) -> str:
    status, n_model, n_data = device.get_number_of_cache_files_needed()
    if status != ErrorStatus.NONE:
        raise CaseFailure(f"getNumberOfCacheFilesNeeded: {status.name}")
    if n_model == 0 and n_data == 0:
        raise Unsupported("the device does not support compilation caching")
    m = case.data["model"]
    token = hashlib.sha256(f"{case.file}/{case.name}".encode()).digest()
    files = [tempfile.TemporaryFile() for _ in range(n_model + n_data + 1)]
    try:
        spare = files[-1]
        mc, dc = files[:n_model], files[n_model:-1]
        for f in files:
            f.write(STALE)
            f.flush()
        writer = prepare(device, case, m, mc, dc, token)
        for f in mc + dc:
            f.seek(3)
        live = _restore_ok(device, mc, dc, token, "restore (writer alive)")
        run_paths(case, live, m, [("restored sync", _execute_sync, MeasureTiming.NO)], opts)
        del writer, live
        restored = _restore_ok(device, mc, dc, token, "restore (writer dropped)")
        run_paths(case, restored, m, [(f"restored {label}", fn, measure)
                                      for label, fn, measure in general_paths(opts)], opts)
        del restored

        wrong = bytes([token[0] ^ 0x01]) + token[1:]
        _expect_rejected(device, mc, dc, wrong, "wrong token")
        for i, f in enumerate(mc):
            flipped = _flip(f, token)
            try:
                _expect_rejected(device, mc, dc, token, f"model cache {i} with a flipped bit")
            finally:
                _unflip(f, flipped)
            size = os.fstat(f.fileno()).st_size
            os.pwrite(f.fileno(), b"\x00extra", size)
            try:
                _expect_rejected(device, mc, dc, token, f"model cache {i} grown")
            finally:
                os.ftruncate(f.fileno(), size)
        invalid = (ErrorStatus.INVALID_ARGUMENT, ErrorStatus.GENERAL_FAILURE)
        _expect_rejected(device, [*mc, spare], dc, token, "one model cache handle too many",
                         invalid)
        _expect_rejected(device, mc, [*dc, spare], token, "one data cache handle too many",
                         invalid)
        for i, f in enumerate(dc):
            flipped = _flip(f, token)
            try:
                status, pm = _restore(device, mc, dc, token, f"data cache {i} with a flipped bit")
                if pm is not None:  # accepted: the results must still be right
                    run_paths(case, pm, m, [(f"data cache {i} flipped: sync", _execute_sync,
                                             MeasureTiming.NO)], opts)
            finally:
                _unflip(f, flipped)
        # The untouched files still restore.
        _restore_ok(device, mc, dc, token, "restore after the tampering was undone")
    finally:
        for f in files:
            f.close()
    return "saved, restored twice, tampering rejected"
