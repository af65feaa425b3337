"""Progress of long commands: plain lines when not on a terminal (a log, CI), a tqdm bar on one."""
import io

from memstream.progress import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_it_writes_plain_lines_and_always_the_last():
    out = io.StringIO()
    with progress("replay", every_s=3600, stream=out) as report:
        for done in (10, 20, 30):
            report(done, 30)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("replay: 10/30 records (") and lines[-1].startswith("replay: 30/30 records (")
    assert len(lines) == 2 and "\r" not in out.getvalue()  # throttled, and no bar control codes


def test_on_a_terminal_it_draws_a_bar_with_the_total():
    out = Terminal()
    with progress("reform", unit="events", stream=out) as report:
        report(5, 10)
        report(10, 10)
    assert "reform" in out.getvalue() and "100%" in out.getvalue()
