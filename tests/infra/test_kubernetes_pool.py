"""The Kubernetes GPU work-pool template, rendered as Prefect renders it, is a valid Kubernetes Job.

No cluster here: the template is filled with Prefect's own templating (``apply_values``) and the two
steps the Kubernetes worker adds (its environment prepended to the container's, the command split
into ``args``), then checked against the Kubernetes API's JSON schema (``kubernetes-validate``, strict:
an unknown field is an error). The Job runs one pod per trainer node: an Indexed Job of ``nnodes``
pods under a headless Service, pod 0 running the flow and the others ``flows.train_node``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "work_pools" / "kubernetes-gpu.json"
K8S_VERSION = "1.30.0"


def render(job_variables: dict[str, Any]) -> dict[str, Any]:
    """The Job manifest a Prefect Kubernetes worker would submit for these job variables."""
    from prefect.utilities.templating import apply_values

    doc = json.loads(TEMPLATE.read_text())
    defaults = {k: v["default"] for k, v in doc["variables"]["properties"].items() if "default" in v}
    values = {**defaults, "name": "train-gsm8k", "command": "prefect flow-run execute", **job_variables}
    config = apply_values(doc["job_configuration"], values)
    manifest = config["job_manifest"]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    worker_env = {"PREFECT__FLOW_RUN_ID": "0b5c0e9e-5d2c-4d5e-9a53-1c7a2b9c1f00", **config["env"]}
    container["env"] = [{"name": k, "value": v} for k, v in worker_env.items()] + container["env"]
    container["args"] = shlex.split(container["args"])
    return manifest


def _validate(manifest: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_two_nodes_render_to_a_valid_indexed_job() -> None:
    manifest = render({"nnodes": 2, "gpu_count": 8, "env": {"ROLLFLOW_ROLE": "train"}, "image": "reg/r:gpu"})
    _validate(manifest)
    spec = manifest["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 2 and spec["parallelism"] == 2
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "rollflow-train"
    assert spec["template"]["metadata"]["labels"] == {"app.kubernetes.io/name": "rollflow-train"}
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8 and c["image"] == "reg/r:gpu"
    env = {e["name"]: e for e in c["env"]}
    # JOB_NAME comes before the endpoint that expands it ($(VAR) only sees earlier variables)
    names = [e["name"] for e in c["env"]]
    assert names.index("JOB_NAME") < names.index("ROLLFLOW_RDZV_ENDPOINT")
    assert env["ROLLFLOW_RDZV_ENDPOINT"]["value"] == "$(JOB_NAME)-0.rollflow-train:29400"
    assert env["ROLLFLOW_ROLE"]["value"] == "train"
    # pod 0 runs the flow's command; the others the node agent
    script = c["command"][2]
    assert c["command"][:2] == ["/bin/sh", "-c"] and 'exec "$0" "$@"' in script
    assert "python -m flows.train_node" in script and c["args"] == ["prefect", "flow-run", "execute"]


def test_one_node_is_one_pod_and_a_wrong_field_is_caught() -> None:
    import kubernetes_validate

    manifest = render({"gpu_count": 4})
    _validate(manifest)
    assert manifest["spec"]["completions"] == 1
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = [8]
    with pytest.raises(kubernetes_validate.ValidationError):  # the schema check is not vacuous
        _validate(manifest)


def test_the_train_deployment_passes_nnodes_to_the_pool() -> None:
    import yaml

    deployments = yaml.safe_load((ROOT / "prefect-gpu.yaml").read_text())["deployments"]
    (train,) = [d for d in deployments if d["entrypoint"] == "flows/train.py:train"]
    assert train["work_pool"]["name"] == "rollflow-gpu-k8s"
    assert train["work_pool"]["job_variables"]["nnodes"] == "{{ gpu.train_nnodes }}"
    variables = json.loads(TEMPLATE.read_text())["variables"]["properties"]
    assert set(train["work_pool"]["job_variables"]) <= set(variables)


def test_the_headless_service_matches_the_pool() -> None:
    import yaml

    service = yaml.safe_load((ROOT / "infra" / "work_pools" / "kubernetes-train-service.yaml").read_text())
    _validate(service)
    manifest = render({"nnodes": 2})
    pod = manifest["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["metadata"]["name"] == pod["spec"]["subdomain"]  # the pods' DNS names live under it
    assert service["metadata"]["namespace"] == manifest["metadata"]["namespace"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == pod["spec"]["containers"][0]["ports"][0]["containerPort"]
