"""ServerMeter against a real CPU server: the engine's busy share and batch occupancy after real generation."""

from __future__ import annotations

import asyncio
from typing import Any

from rollflow.api.inference import GenerateRequest, SamplingParams
from rollflow.inference.client import EngineClient
from rollflow.inference.server_meter import ServerMeter


def test_server_meter_reads_a_real_cpu_server(cpu_server: Any) -> None:
    address = cpu_server.addresses[0]
    meter = ServerMeter(cpu_server.addresses)

    async def generate() -> None:
        client = EngineClient(cpu_server.addresses)
        try:
            sp = SamplingParams(max_new_tokens=16, ignore_eos=True)
            await asyncio.gather(*(client.agenerate(GenerateRequest([1, 2, 3, 4], sp)) for _ in range(16)))
        finally:
            await client.aclose()

    asyncio.run(generate())
    got = meter.sample()[address]
    assert 0.0 < got["busy_frac"] <= 1.0
    assert got["avg_batch"] >= 1.0 and 0.0 < got["occupancy"] <= 1.0
    assert meter.since_start()[address]["busy_frac"] > 0.0
    assert ServerMeter(["127.0.0.1:1"], timeout_s=0.5).sample() == {}  # nobody there: no reading, no error
