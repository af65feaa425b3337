from tests.integration.conftest import conn, dsn, runs, settings, stack, workers  # noqa: F401  (shared fixtures)
