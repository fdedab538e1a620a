"""The shared BLAS thread limit: nested and concurrent executions restore the count only when
the last one leaves, and the first use (before any symbol search) does not deadlock."""

from __future__ import annotations

import subprocess
import sys
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


def test_first_use_is_the_limit_itself():
    code = ("from nnhal.ops import blas; blas.limit_enter(1); blas.limit_exit(); "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
