"""Shared fixtures for the whole test suite."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder next to the repo (../shared/data); CI must have it, elsewhere tests skip."""
    path = REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        message = f"shared data folder {path} is missing"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
