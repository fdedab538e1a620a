"""The library of the C API tests, as `nnhal ndk --libdir` finds it."""

import shutil
from pathlib import Path

import pytest

from nnhal.capi.build import compiler, library_dir


@pytest.fixture(scope="session")
def libdir() -> Path:
    if shutil.which(compiler()[0]) is None:
        pytest.skip(f"no C compiler ({compiler()[0]})")
    d, why = library_dir()
    assert d is not None, why
    return d
