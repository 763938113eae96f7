"""The core's log lines reach the Prefect run that is running, and only while it runs (real Prefect server).

``tasks.runtime.core_logs_to_this_run`` forwards the ``rollflow`` / ``storage`` / ``infra`` loggers to the
flow run's logs, lines from background threads included; when the flow ends the handler is removed and the
levels restored, so in one process (a notebook) a later line is not filed under a finished run, and a subflow
hands its parent's forwarding back.
"""

from __future__ import annotations

import logging
import threading
import uuid

from prefect import flow
from prefect.runtime import flow_run

from tasks.runtime import CORE_LOGGERS, _RunLogHandler, core_logs_to_this_run

LOG = logging.getLogger("rollflow.test_core_logs")


@flow(name="core-logs-child")
def _child(tag: str) -> str:
    with core_logs_to_this_run():
        LOG.info("child %s", tag)
        return str(flow_run.id)


@flow(name="core-logs-parent")
def _parent(tag: str) -> dict[str, str]:
    with core_logs_to_this_run():
        LOG.info("parent before %s", tag)
        child = _child(tag)
        LOG.info("parent after %s", tag)
        t = threading.Thread(target=LOG.info, args=("parent thread %s", tag))  # outside the flow's context
        t.start()
        t.join()
        return {"parent": str(flow_run.id), "child": child}


def _messages(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[uuid.UUID(flow_run_id)])))
    return [log.message for log in logs]


def _forwarders() -> dict[str, list[logging.Handler]]:
    return {
        name: [h for h in logging.getLogger(name).handlers if isinstance(h, _RunLogHandler)]
        for name in CORE_LOGGERS
    }


def test_core_lines_go_to_the_running_flow_run_and_nowhere_after_it(use_prefect_server: str) -> None:
    from prefect.logging.handlers import APILogHandler

    tag = uuid.uuid4().hex[:8]
    levels = {name: logging.getLogger(name).level for name in CORE_LOGGERS}
    ids = _parent(tag)
    LOG.warning("after the flow %s", tag)  # no flow run now: must not be filed under the finished one
    APILogHandler().flush()  # send what is queued and wait

    assert _forwarders() == {name: [] for name in CORE_LOGGERS}
    assert {name: logging.getLogger(name).level for name in CORE_LOGGERS} == levels
    parent, child = _messages(ids["parent"]), _messages(ids["child"])
    for line in (f"parent before {tag}", f"parent after {tag}", f"parent thread {tag}"):
        assert line in parent, parent  # the subflow handed the parent's forwarding back
    assert f"child {tag}" in child and f"child {tag}" not in parent, (child, parent)
    assert not any(f"after the flow {tag}" in m for m in parent + child)
