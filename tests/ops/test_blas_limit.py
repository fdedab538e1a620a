"""The shared BLAS thread limit: nested and concurrent executions restore the count only when
the last one leaves, and the first use (before any symbol search) does not deadlock."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nnhal.ops import blas

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not blas.available(), reason="no OpenBLAS thread control in this numpy")
def test_the_last_execution_to_leave_restores_the_count():
    before = blas.set_threads(2)
    try:
        blas.limit_enter(1)
        blas.limit_enter(1)
        assert blas.get_threads() == 1
        blas.limit_exit()
        assert blas.get_threads() == 1  # another execution is still running
        blas.limit_exit()
        assert blas.get_threads() == 2
    finally:
        blas.set_threads(before or 1)


@pytest.mark.skipif(not blas.available(), reason="no OpenBLAS thread control in this numpy")
def test_a_limit_set_on_another_thread_holds_for_every_thread():
    # A served driver executes on the service's call threads, never the main thread: the
    # count must be the process's, not the setting thread's.
    before = blas.set_threads(2)
    entered, release = threading.Event(), threading.Event()

    def execution() -> None:
        blas.limit_enter(1)
        entered.set()
        release.wait(10)
        blas.limit_exit()

    t = threading.Thread(target=execution)
    t.start()
    try:
        assert entered.wait(10)
        assert blas.get_threads() == 1
    finally:
        release.set()
        t.join(10)
    try:
        assert blas.get_threads() == 2
    finally:
        blas.set_threads(before or 1)


def test_first_use_is_the_limit_itself():
    code = ("from nnhal.ops import blas; blas.limit_enter(1); blas.limit_exit(); "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
