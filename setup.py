"""Build hook: compile nnhal's libneuralnetworks.so into the package (nnhal/capi/lib/).

Everything else about the project is in pyproject.toml. The library finds the Python
environment it was installed into at run time (from its own path), so nothing about the
install location is needed here; pip may build in an isolated environment. Without a C
compiler the install still succeeds: `nnhal ndk --libdir` then builds the library on demand.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py


def _capi_build():
    path = Path(__file__).resolve().parent / "nnhal" / "capi" / "build.py"
    spec = importlib.util.spec_from_file_location("_nnhal_capi_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return  # an editable install builds the library on demand, from the source tree
        build = _capi_build()
        target = Path(self.build_lib) / "nnhal" / "capi" / "lib" / build.NAME
        reason = build.compile_library(target)
        if reason:
            print(f"warning: nnhal: libneuralnetworks.so not built: {reason}", file=sys.stderr)
        elif not build.libpython():
            print("warning: nnhal: this Python has no shared libpython; libneuralnetworks.so "
                  "will work only when loaded inside a Python process", file=sys.stderr)


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
