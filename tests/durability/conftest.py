"""Fixtures shared by the durability tests."""
from __future__ import annotations

import pytest

from support import testjar
from support.durability import disarm


@pytest.fixture
def fault_root(spark):
    """The objtest:// fault root with no fault armed and an empty fault log, before and after
    the test (a test arms its own rules; a leftover rule would hit the next test)."""
    root = disarm(spark)
    testjar.clear_fault_log(root)
    yield root
    disarm(spark)
