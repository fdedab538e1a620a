import pytest
from ndk_helpers import ref_device

from nnhal.runtime import Device


@pytest.fixture
def device() -> Device:
    return ref_device()
