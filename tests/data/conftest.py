"""Shared fixtures of the data tests: one tiny tokenizer per session and paths of the fixture datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlvr.data import builtin_corpus
from rlvr.models.tiny import build_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    return build_tokenizer(builtin_corpus("copy") + builtin_corpus("arith") + ["What is the answer? x y z"], 128)


@pytest.fixture()
def fixtures_dir() -> Path:
    return FIXTURES
