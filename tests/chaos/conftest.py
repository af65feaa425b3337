from tests.integration.conftest import conn, dsn, settings, stack, workers  # noqa: F401  (shared fixtures)
