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
