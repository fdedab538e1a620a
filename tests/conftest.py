import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from nnhal.drivers.reference import ReferenceDevice  # noqa: E402


@pytest.fixture
def device():
    dev = ReferenceDevice()
    yield dev
    dev.close()


def pytest_terminal_summary(terminalreporter):
    """Print the conformance report per mode (collected by test_conformance) before pytest's
    own closing line."""
    try:
        import test_conformance
    except ImportError:
        return
    for summary in test_conformance.SUMMARIES:
        terminalreporter.section("conformance")
        terminalreporter.write_line(summary)
