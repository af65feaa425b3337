"""The reader's write-back of a profile on a cache miss never outlives a forget: taken back when
the profile is gone by then, and when the check fails (a statement timeout, a deadline)."""
import asyncio
import json

import pytest

from memstream.projections.profile import query as profile_q

pytestmark = pytest.mark.asyncio


class Redis:
    def __init__(self):
        self.kept: dict[str, tuple[str, int | None]] = {}

    async def get(self, key):
        return self.kept.get(key, (None,))[0]

    async def set(self, key, value, nx=False, ex=None):
        if nx and key in self.kept:
            return None
        self.kept[key] = (value, ex)
        return True

    async def delete(self, *keys):
        for k in keys:
            self.kept.pop(k, None)


class Pool:
    """Gives the profile, then answers the check for it with ``checked``."""

    def __init__(self, checked):
        self._answers = [json.dumps({"home": "Porto"}), checked]

    async def fetchval(self, sql, *args):
        answer = self._answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.mark.parametrize("checked, raised", [(False, None), (asyncio.TimeoutError(), asyncio.TimeoutError),
                                             (asyncio.CancelledError(), asyncio.CancelledError)])
async def test_a_profile_forgotten_meanwhile_or_unchecked_is_not_left_in_the_cache(checked, raised):
    redis = Redis()
    if raised is None:
        assert await profile_q.read(redis, Pool(checked), "s", 1, "ana") == {"home": "Porto"}
    else:
        with pytest.raises(raised):
            await profile_q.read(redis, Pool(checked), "s", 1, "ana")
    assert redis.kept == {}


async def test_a_profile_written_back_expires_on_its_own():
    redis = Redis()
    await profile_q.read(redis, Pool(True), "s", 1, "ana")
    [(value, ttl)] = redis.kept.values()
    assert json.loads(value) == {"home": "Porto"} and ttl == profile_q.WRITE_BACK_TTL_S
