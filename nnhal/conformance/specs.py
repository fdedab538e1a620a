"""Where the conformance cases are, and whether a folder holds any; standard library only, so
that the command line can check its arguments before it loads numpy and the driver."""

from __future__ import annotations

import os
from pathlib import Path

#: Where the conformance data lives when neither --specs nor NNHAL_CONFORMANCE names it.
DEFAULT_SPECS = "../shared/conformance"
SPECS_ENV = "NNHAL_CONFORMANCE"


def default_specs_dir() -> Path:
    return Path(os.environ.get(SPECS_ENV) or DEFAULT_SPECS)


def case_files(specs: Path) -> list[Path]:
    """The case files under ``specs`` (a folder of folders, one folder, or one file), sorted."""
    specs = Path(specs)
    return [specs] if specs.is_file() else sorted(specs.rglob("*.json.gz"))


def specs_problem(specs: Path) -> str | None:
    """Why ``specs`` holds no case file to run, or None."""
    specs = Path(specs)
    if not specs.exists():
        return (f"no conformance data at {specs} (name the folder with --specs DIR or "
                f"${SPECS_ENV})")
    if not case_files(specs):
        return f"no case files (*.json.gz) in {specs}"
    return None


def no_cases_message(specs: Path, pattern: str | None) -> str:
    """The complaint when ``iter_cases(specs, pattern)`` yields nothing."""
    if pattern:
        return f"no case matches --filter {pattern!r} in {specs}"
    return f"no cases in {specs} (every case file is an empty list)"
