"""The CLI refuses a count that makes no sense before it starts anything (no stack needed)."""
import pytest
from click.testing import CliRunner

from memstream.cli import main


@pytest.mark.parametrize("args, option", [
    (["bench", "read", "--reads", "0"], "--reads"),  # the percentiles of no reads: a numpy error
    (["bench", "read", "--readers", "-1"], "--readers"),
    (["bench", "read", "--rows", "0"], "--rows"),
    (["bench", "ingest", "--rate", "0"], "--rate"),
    (["bench", "formation", "--users", "0"], "--users"),
    (["eval", "locomo", __file__, "--k", "0"], "--k"),  # read's own ValueError, as a traceback
    (["demo", "--users", "0"], "--users"),
])
def test_a_nonsensical_count_is_a_usage_error_naming_the_option(args, option):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert option in result.output and "Invalid value" in result.output


def test_an_unknown_projection_is_refused_before_any_rebuild_runs():
    result = CliRunner().invoke(main, ["replay", "episodes", "bogus", "--bulk", "--into", "s1"])
    assert result.exit_code == 2 and "bogus" in result.output and "Invalid value" in result.output, result.output


def test_a_store_that_does_not_answer_is_a_message_not_a_traceback():
    result = CliRunner(env={"MEMSTREAM_POSTGRES_DSN": "postgresql://nobody@127.0.0.1:1/none"}).invoke(
        main, ["memories", "list", "someone"])
    assert result.exit_code == 1 and "a store did not answer" in result.output, result.output
    assert not isinstance(result.exception, OSError)  # ClickException's SystemExit, not the error itself
