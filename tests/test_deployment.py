"""Docker and KubeRay files, checked offline (no Docker engine or Kubernetes runs here): versions
agree with the installed Ray, what the Dockerfile copies exists, the manifests have the fields
KubeRay needs, and the RayJob's entrypoint parses as a deltarl command whose grid expands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import ray
import yaml

REPO = Path(__file__).resolve().parents[1]


def test_dockerfile_builds_on_the_matching_ray_image_and_copies_what_exists():
    text = (REPO / "docker" / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+)-py(\d+)-\$\{VARIANT\}$", text, re.M)
    assert base and base.group(1) == ray.__version__ and base.group(2) == "311"
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M)
    for src in re.findall(r"^COPY --chown=\S+ (.+) \S+$", text, re.M):
        for part in src.split():
            assert (REPO / part).exists(), part
    assert "torch==2.13.0" in text and "whl/cpu" in text  # CPU images take the CPU wheel
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"runs", ".venv", ".git"} <= set(ignored)


def test_raycluster_manifest():
    docs = list(yaml.safe_load_all((REPO / "k8s" / "raycluster.yaml").read_text()))
    rc = next(d for d in docs if d["kind"] == "RayCluster")
    assert rc["apiVersion"] == "ray.io/v1" and rc["spec"]["rayVersion"] == ray.__version__
    assert rc["spec"]["authOptions"] == {"mode": "token"}
    head = rc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert {6379, 8265, 10001} <= ports
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1" and gpu["image"].endswith(":gpu")
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for spec in [head["template"]["spec"]] + [g["template"]["spec"] for g in groups.values()]:
        assert spec["volumes"][0]["persistentVolumeClaim"]["claimName"] in claims
        assert spec["containers"][0]["volumeMounts"][0]["mountPath"] == "/data"


@pytest.mark.slow
def test_rayjob_entrypoint_is_a_deltarl_grid_that_expands(tmp_path):
    from orchestrator.campaign.grid import expand, load_grid
    from orchestrator.cli import build_parser

    job = yaml.safe_load((REPO / "k8s" / "rayjob-grid.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "deltarl"}
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[0] == "deltarl"
    args = build_parser().parse_args(argv[1:])
    assert args.func.__name__ == "cmd_grid" and args.out.startswith("/data/")
    grid_path = REPO / Path(args.grid).relative_to("/home/ray/deltarl")  # the image's copy of the repo
    g = load_grid(grid_path)
    assert len(expand(g)) == 12
