"""The custom ComputeClass that orders capacity kinds, checked against GKE's documented schema."""

from __future__ import annotations

import pytest

from manifests.compute_class import compute_class, pool_name
from tests.k8s_schema import validate_custom


def test_standard_class_orders_the_stacks_own_pools_and_goes_no_further():
    obj = compute_class(kinds=["reservation", "flex-start", "spot"], autopilot=False)
    validate_custom(obj)
    assert obj["spec"] == {
        "priorities": [{"nodepools": ["gpu-reservation"]}, {"nodepools": ["gpu-flex-start"]},
                       {"nodepools": ["gpu-spot"]}],
        "nodePoolAutoCreation": {"enabled": False},
        "whenUnsatisfiable": "DoNotScaleUp",
    }
    assert pool_name("on-demand") == "gpu-on-demand"


def test_autopilot_class_describes_each_kinds_nodes():
    obj = compute_class(kinds=["reservation", "flex-start", "spot", "on-demand"], autopilot=True,
                        machine_type="a4-highgpu-8g", accelerator="nvidia-b200", gpus_per_node=8,
                        reservation="projects/owner-1/reservations/b200-res", project="my-project")
    validate_custom(obj)
    node = {"machineType": "a4-highgpu-8g", "gpu": {"type": "nvidia-b200", "count": 8}}
    assert obj["spec"]["priorities"] == [
        {**node, "reservations": {"affinity": "Specific", "specific": [{"name": "b200-res", "project": "owner-1"}]}},
        {**node, "flexStart": {"enabled": True}},
        {**node, "spot": True},
        {**node, "spot": False},
    ]
    assert obj["spec"]["nodePoolAutoCreation"] == {"enabled": True}


def test_the_documented_schema_rejects_what_gke_would():
    obj = compute_class(kinds=["spot"], autopilot=False)
    obj["spec"]["whenUnsatisfiable"] = "ScaleUpSomewhere"
    with pytest.raises(AssertionError, match="whenUnsatisfiable"):
        validate_custom(obj)
    obj = compute_class(kinds=["spot"], autopilot=False)
    obj["spec"]["priorities"][0]["flexstart"] = {"enabled": True}  # misspelt
    with pytest.raises(AssertionError, match="flexstart"):
        validate_custom(obj)
