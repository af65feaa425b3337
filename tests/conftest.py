from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items):
    for item in items:
        path = str(item.fspath)
        # A contract suite runs some implementations on the local stack and others in memory:
        # only the tests that use the stack belong to the integration tier.
        if "/integration/" in path or ("/contracts/" in path and {"stack", "dsn"} & set(item.fixturenames)):
            item.add_marker(pytest.mark.integration)
