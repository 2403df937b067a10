"""Shared fixtures: where ../shared lives (data and matrices are read there, never copied)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared not found at {SHARED}: tests read data and matrices from there")
    return SHARED


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache directory for the embedded models, exported once per test session."""
    return tmp_path_factory.mktemp("crossknn-models")
