"""The claims join (agent/dra/claims.py) on objects exactly as a real API server served them.

tests/data/dra-served-v1.37.json was recorded on the real control plane of
tests/realkube (its "recorded" field says how): what kube-scheduler writes into a claim's
``status.allocation`` (the class's config first, ``source: FromClass``; then the claim's,
``FromClaim``, its ``requests`` dropped when it applies to every request of the claim;
``reservedFor`` entries with no ``apiGroup``) and what the resourceclaim controller
leaves once the claim is released (``status: {}``). The real tier proves the same end to
end (tests/realkube/test_claims_real.py); this pins the shapes in the fast tier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capwatch.agent.dra.claims import ClaimRef
from capwatch.agent.dra.slices import DeviceName
from tests.claims_objects import join

SERVED = Path(__file__).parent / "data" / "dra-served-v1.37.json"
NODE = "n1"


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(SERVED.read_text(encoding="utf-8"))
    return found


def _caps(served: dict[str, Any], *claims: str) -> dict[str, list[tuple[str, str, int | None]]]:
    snapshot = join([served["claims"][name] for name in claims], [served["slice"]], node=NODE)
    assert snapshot.problems == ()
    return {
        uuid: [(str(c.claim), c.request, c.watts) for c in caps]
        for uuid, caps in snapshot.caps.items()
    }


def test_the_claims_own_config_overrides_the_class_config_the_scheduler_copied_first(
    served: dict[str, Any],
) -> None:
    """Claim 'one' as served: its allocation carries the class's 500 W (FromClass) and then
    the claim's 350 W (FromClaim, no ``requests``: the scheduler dropped them, the entry
    applies to the claim's only request); the later entry wins, on the GPU whose UUID the
    slice gives the allocated device."""
    config = served["claims"]["one"]["status"]["allocation"]["devices"]["config"]
    assert [(c["source"], "requests" in c) for c in config] == [
        ("FromClass", False),
        ("FromClaim", False),
    ]
    assert _caps(served, "one") == {"GPU-0": [("ns/one", "gpu", 350)]}


def test_each_request_of_a_claim_gets_the_config_that_names_it(served: dict[str, Any]) -> None:
    """Claim 'pair' as served: two requests, a config naming each (kept as ``requests:
    [fast]`` and ``[slow]``) after the class's: each allocated GPU its own cap."""
    assert _caps(served, "pair") == {
        "GPU-1": [("ns/pair", "fast", 400)],
        "GPU-2": [("ns/pair", "slow", 250)],
    }


def test_the_cap_names_the_claim_as_served_and_the_pods_that_use_it(
    served: dict[str, Any],
) -> None:
    """The cap carries the claim's identity as served (namespace, name, uid) and the
    pods that use it (here the pod its ``reservedFor`` names, as served: resource pods,
    name, uid; no apiGroup)."""
    snapshot = join([served["claims"]["one"]], [served["slice"]], node=NODE)
    ((cap,),) = snapshot.caps.values()
    assert [(p.namespace, p.name, p.uid) for p in cap.pods] == [("ns", "p", served["pod_uid"])]
    assert cap.claim == ClaimRef(
        namespace="ns", name="one", uid=served["claims"]["one"]["metadata"]["uid"]
    )
    assert snapshot.for_gpu("GPU-0") == (cap,)


def test_a_released_claim_caps_nothing_and_the_slice_still_names_every_gpu(
    served: dict[str, Any],
) -> None:
    """Claim 'one' once the resourceclaim controller released it (``status: {}``, its
    finalizer gone) asks nothing of any GPU; the slice alone still names each GPU by its
    driver, pool and device (what the DRA health mirror streams)."""
    released = served["deallocated"]
    assert released["status"] == {}
    assert "finalizers" not in released["metadata"]
    snapshot = join([released], [served["slice"]], node=NODE)
    assert snapshot.caps == {}
    assert snapshot.names == {
        f"GPU-{i}": DeviceName(driver="gpu.nvidia.com", pool=NODE, device=f"gpu-{i}")
        for i in range(3)
    }
