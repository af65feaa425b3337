import time

from memstream.stack.launcher import Stack


def test_every_local_service_answers_and_a_second_up_reuses_them(stack: Stack):
    assert all(s.answers for s in stack.status()), stack.status()
    t = time.monotonic()
    stack.up()
    assert time.monotonic() - t < 5
