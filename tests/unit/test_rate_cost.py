"""A request that counts as many (a PodBatch: one per pod) spends as many of its tenant's
tokens, at most a whole burst (so that it can pass at all)."""

from __future__ import annotations

import asyncio

from app.ratelimit import Bucket


def test_a_costly_request_spends_as_many_tokens() -> None:
    async def scenario() -> None:
        bucket = Bucket("t", 10, None)  # 10 per second, bursts of 20
        assert await bucket.take("a", now=0.0, cost=20) == 0
        assert await bucket.take("a", now=0.0) > 0  # the batch spent the burst
        assert await bucket.take("a", now=0.1) == 0  # a tenth of a second refilled one
        for _ in range(19):
            assert await bucket.take("b", now=0.0) == 0
        assert await bucket.take("b", now=0.0, cost=2) > 0  # one token left, two asked
        assert await bucket.take("b", now=0.0) == 0
        # more than a burst costs a burst: it passes on a full bucket, and empties it
        assert await bucket.take("c", now=0.0, cost=500) == 0
        assert await bucket.take("c", now=0.0) > 0

    asyncio.run(scenario())
