"""``OldestFirst``: formation's LLM slots go to the oldest turn waiting, and a cancelled waiter
neither holds nor loses a slot."""
import asyncio

from memstream.streams.worker.formation.slots import OldestFirst


async def _hold(slots: OldestFirst, rank: int, order: list, release: asyncio.Event) -> None:
    async with slots.slot(rank):
        order.append(rank)
        await release.wait()


def test_waiters_go_in_lowest_rank_first_and_a_cancelled_one_passes_its_turn_on():
    async def run():
        slots, order, go = OldestFirst(1), [], asyncio.Event()
        first = asyncio.ensure_future(_hold(slots, 50, order, go))
        await asyncio.sleep(0)
        waiting = {rank: asyncio.ensure_future(_hold(slots, rank, order, go)) for rank in (30, 10, 20, 5)}
        await asyncio.sleep(0)
        waiting[5].cancel()  # never served, and its place is not lost
        go.set()
        await asyncio.gather(first, *(t for r, t in waiting.items() if r != 5))
        assert order == [50, 10, 20, 30]
        async with slots.slot(0):  # every slot given back
            pass
        assert slots._free == 1

    asyncio.run(run())


def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on():
    async def run():
        slots, order, go = OldestFirst(1), [], asyncio.Event()
        held = slots.slot(1)
        await held.__aenter__()
        handed = asyncio.ensure_future(_hold(slots, 2, order, asyncio.Event()))
        after = asyncio.ensure_future(_hold(slots, 3, order, go))
        await asyncio.sleep(0)
        await held.__aexit__(None, None, None)  # rank 2 is handed the slot ...
        handed.cancel()  # ... and cancelled before it could run
        go.set()
        await asyncio.gather(handed, return_exceptions=True)
        await after
        assert order == [3] and slots._free == 1

    asyncio.run(run())
