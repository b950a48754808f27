"""JVM-layer tests: keyedstate's classes driven through py4j, without a streaming query."""
from __future__ import annotations

import pytest

from support.jvm import LayerStore


@pytest.fixture(scope="session", autouse=True)
def state_server_up(spark, tmp_path_factory):
    """Start this JVM's state servers once, so that each test measures only its own work."""
    layer = LayerStore(spark, tmp_path_factory.mktemp("warm-up"))
    layer.close()
