"""Formation's pipeline bookkeeping: a started batch's parts (one partition's records each,
split after every imported event), each user's last chain, and their views."""
from __future__ import annotations

import asyncio
import time
from typing import Callable, NamedTuple

from memstream.schemas import Decision, Event
from memstream.streams.log.records import Record
from memstream.streams.log.screening import imported
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.views import FactView


class Views:
    """One user's facts and graph as formation has decided them so far."""

    def __init__(self, facts: FactView, graph: GraphView):
        self.facts, self.graph = facts, graph
        self.settle = False  # read afresh once what they overlay is recorded and applied


class Tail(NamedTuple):
    """A user's last chain, and the part it is in."""
    chain: asyncio.Task
    part: "Part"


NO_TAIL = Tail(None, None)


class Part:
    """One partition's records of a started batch, in flight."""

    def __init__(self, records: list[Record], turns: list[tuple[Record, Event]], letters: list,
                 recorded: Callable[[], None], epoch: int):
        self.records, self.turns, self.letters, self.recorded, self.epoch = records, turns, letters, recorded, epoch
        self.finish: asyncio.Task
        self.made: list[list[Decision]] = [[] for _ in turns]
        self.refused: dict[int, str] = {}
        self.chains: list[asyncio.Task] = []
        self.users: list[str] = []
        self.embedded: asyncio.Future
        self.where: dict[int, int] = {}
        self.extracted: dict[int, asyncio.Task] = {}  # turn index -> its extraction, asked for when the batch starts
        self.ranks: dict[int, int] = {}  # turn index -> its place among the turns started
        self.started = time.perf_counter()


def by_user(turns: list[tuple[Record, Event]]) -> dict[str, list[int]]:
    """Each user's turns and requests (indices into ``turns``), in order."""
    users: dict[str, list[int]] = {}
    for i, (_, event) in enumerate(turns):
        users.setdefault(event.user_id, []).append(i)
    return users


def pieces(records: list[Record]) -> list[list[Record]]:
    """``records`` (one partition's, in order) cut after each run of imported events: a user's
    chain never runs across one, so the turns after it are formed on views read once the import
    is applied (and an import of thousands of events is one part, not thousands)."""
    out: list[list[Record]] = [[]]
    for r, after in zip(records, [*records[1:], None]):
        out[-1].append(r)
        if imported(r) and (after is None or not imported(after)):
            out.append([])
    return [p for p in out if p]
