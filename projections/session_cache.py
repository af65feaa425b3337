"""Tier 0: the recent turns of each conversation, a derived cache in Redis.

One sorted set per conversation, scored by ``occurred_at``; members are the turn as canonical
JSON, so re-adding a redelivered turn is a no-op (one written before members were canonical in
UTC is added once more). Keys carry the schema and the projection epoch, so a rebuild or a
second deployment never reads another's cache. Losing Redis loses nothing: the read client
falls back to Postgres, and a conversation's key that is missing when its next turn arrives (a
flush, a restart, a switch's new epoch) is seeded from the store first (``push_turns``), so it
holds the conversation's last turns, not only the ones since. A key expires some days after its
conversation's last turn (``tier0_ttl_s``): a quiet conversation costs Redis nothing. (A Redis
restored from an older snapshot, or a replica promoted without the last writes, keeps keys short
of those turns.)
"""
from __future__ import annotations

import json
from datetime import timezone
from typing import Awaitable, Callable, Iterable, Mapping, Sequence

from memstream.projections import cache_keys
from memstream.projections.episodes.core import EpisodeRow


def tier0_key(schema: str, epoch: int, user_id: str, conversation_id: str) -> str:
    return cache_keys.key(schema, epoch, "t0", user_id, conversation_id)


def turn_member(row: EpisodeRow) -> str:
    return member(row.episode_id, row.occurred_at, row.user_message, row.assistant_message)


def member(episode_id, occurred_at, user_message: str, assistant_message: str) -> str:
    """A turn as Tier 0 holds it: canonical JSON, so the same turn is always the same member
    (its time in UTC: as the host sent it, or as Postgres gives it back)."""
    return json.dumps({"episode_id": str(episode_id), "occurred_at": occurred_at.astimezone(timezone.utc).isoformat(),
                       "user_message": user_message, "assistant_message": assistant_message},
                      sort_keys=True, separators=(",", ":"))


History = Callable[[Sequence[tuple[str, str]], int], Awaitable[Mapping[tuple[str, str], Sequence[Mapping]]]]

# Adds the turns (ARGV: keep, seconds to live, then score, member pairs) only to a key that
# exists, trims it and sets it to expire; 1 if it did. One key per call: a Redis cluster takes it.
_ADD_IF_KEPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 3, #ARGV, 2 do redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[1]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
# A conversation's key lives this long past its last turn by default: the read path finds a key
# gone as it finds one flushed (it reads Postgres), and the next turn seeds it again.
TTL_S = 3 * 86400


async def push_turns(redis, schema: str, epoch: int, rows: Iterable[EpisodeRow], keep: int,
                     history: History, stale: Iterable[tuple[str, str]] = (), ttl_s: int = TTL_S) -> None:
    """Adds ``rows`` to their conversations' keys, each trimmed to its last ``keep`` turns and
    set to expire ``ttl_s`` seconds after this push.
    ``history`` gives the last ``keep`` stored turns of each ``(user_id, conversation_id)`` asked
    (``rows`` already stored among them): it seeds the keys that do not exist yet, which would
    otherwise hold only the turns from here on, and rebuilds those of ``stale``, conversations
    whose keys may lack turns (an earlier push that failed). A key is written whole by one
    command, so a reader sees it without those turns, or gone, never half seeded."""
    stale = set(stale)
    turns: dict[tuple[str, str], dict[str, float]] = {c: {} for c in stale}
    for row in rows:
        turns.setdefault((row.user_id, row.conversation_id), {})[turn_member(row)] = row.occurred_at.timestamp()
    key = {c: tier0_key(schema, epoch, *c) for c in turns}
    kept = [c for c in turns if c not in stale]
    # EVAL, not a registered script: a pipeline's SCRIPT EXISTS check that fails keeps its
    # connection from the pool (redis-py 8.1), and Redis caches the script by its digest anyway.
    async with redis.pipeline(transaction=False) as pipe:
        for c in kept:
            pipe.eval(_ADD_IF_KEPT, 1, key[c], keep, ttl_s, *(x for m, score in turns[c].items() for x in (score, m)))
        added = await pipe.execute() if kept else []
    seed = [c for c, there in zip(kept, added) if not there] + list(stale)
    if not seed:
        return
    stored = await history(seed, keep)
    async with redis.pipeline(transaction=False) as pipe:
        for c in seed:
            members = {member(t["episode_id"], t["occurred_at"], t["user_message"], t["assistant_message"]):
                       t["occurred_at"].timestamp() for t in stored.get(c, ())}
            if c in stale:
                pipe.delete(key[c])
            if members := {**members, **turns[c]}:
                pipe.zadd(key[c], members)
                pipe.zremrangebyrank(key[c], 0, -(keep + 1))
                pipe.expire(key[c], ttl_s)
        await pipe.execute()


async def recent_turns(redis, schema: str, epoch: int, user_id: str, conversation_id: str, n: int) -> Sequence[dict]:
    """The last ``n`` turns of the conversation, oldest first; turns of one instant in the order
    Postgres gives them (by episode id: Redis would order them by their JSON, i.e. by text)."""
    members = await redis.zrange(tier0_key(schema, epoch, user_id, conversation_id), -n, -1, withscores=True)
    turns = [(score, json.loads(m)) for m, score in members]
    return [t for _, t in sorted(turns, key=lambda st: (st[0], st[1]["episode_id"]))]



async def forget(redis, schema: str, epoch: int, episodes: Sequence, users: Sequence[str]) -> None:
    """Tier 0 without these turns (rows with episode_id, user_id, conversation_id, occurred_at and
    the messages) and without any conversation of these users."""
    # Found by its time and id, not by its text: a member written before the text was canonical
    # (or by another version) would never match, and the forgotten turn be read on.
    keys = [tier0_key(schema, epoch, e["user_id"], e["conversation_id"]) for e in episodes]
    pipe = redis.pipeline(transaction=False)
    for key, e in zip(keys, episodes):
        pipe.zrangebyscore(key, e["occurred_at"].timestamp(), e["occurred_at"].timestamp())
    found = await pipe.execute() if episodes else []
    pipe = redis.pipeline(transaction=False)
    for key, e, members in zip(keys, episodes, found):
        for m in members:
            if json.loads(m)["episode_id"] == str(e["episode_id"]):
                pipe.zrem(key, m)
    await pipe.execute()
    await cache_keys.forget(redis, schema, "t0", users)  # of every epoch: a switch's leftovers too
