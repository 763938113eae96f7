"""prefect.yaml as Prefect reads it: the nightly retrain is deployed with its schedule paused (opt-in, issue 21).

The schedule entries go through Prefect's own reader of deployment schedules (what `prefect deploy` calls),
so a key Prefect does not know (or a schedule left active) fails here, not on the first night.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_nightly_schedule_is_deployed_paused() -> None:
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    from prefect.client.schemas.schedules import CronSchedule

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    scheduled = {d["name"]: d["schedules"] for d in spec["deployments"] if d.get("schedules")}
    assert set(scheduled) == {"nightly"}, scheduled  # nothing else runs on its own
    (entry,) = scheduled["nightly"]
    schedule = _schedule_config_to_deployment_schedule(entry)
    assert schedule["active"] is False, schedule
    assert isinstance(schedule["schedule"], CronSchedule) and schedule["schedule"].cron == "0 2 * * *"
