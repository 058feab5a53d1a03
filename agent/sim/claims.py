"""The simulated node's DRA claims: the scenario's claims and slices as the API server
serves them, joined by the agent's own code.

:func:`slice_objects` and :func:`claim_objects` build resource.k8s.io/v1 ResourceSlice
and ResourceClaim dicts (the shape the real informer lists and watches) from a
scenario (:mod:`capwatch.agent.sim.scenario_claims`); :class:`SimClaimView` implements
:class:`~capwatch.agent.dra.claims.ClaimView` over a :class:`~capwatch.agent.sim.world.SimWorld` by
passing the current cycle's objects to :func:`capwatch.agent.dra.claims.claims_snapshot`, so the
simulator exercises the very join the real agent uses.
"""

from __future__ import annotations

import copy
from typing import Any

from capwatch.agent.dra.claims import (
    DRIVER,
    ClaimKey,
    ClaimsSnapshot,
    Pin,
    ReadClaim,
    claims_snapshot,
    referenced_claims,
)
from capwatch.agent.dra.slices import DEFAULT_UUID_ATTRIBUTE, node_devices
from capwatch.agent.pods import PodSnapshot
from capwatch.agent.sim.scenario import Scenario
from capwatch.agent.sim.scenario_claims import ClaimSpec, SliceSpec, derived_slices
from capwatch.agent.sim.world import SimWorld
from capwatch.kit.errors import PodViewError

API_VERSION = "resource.k8s.io/v1"


def slices_of(scenario: Scenario) -> tuple[SliceSpec, ...]:
    """The scenario's slices, or those derived from its GPUs when it gives none."""
    if scenario.slices is not None:
        return scenario.slices
    return derived_slices([g.uuid for g in scenario.gpus])


def slice_objects(scenario: Scenario, *, node: str) -> list[dict[str, Any]]:
    """The node's ResourceSlices, one per scenario slice, as the API server serves them."""
    out = []
    for i, spec in enumerate(slices_of(scenario)):
        owner = spec.node or node
        pool = spec.pool or owner
        devices = []
        for j, device in enumerate(spec.devices):
            attributes: dict[str, Any] = {"index": {"int": j}}
            if device.uuid is not None:
                attributes[spec.uuid_attribute] = {"string": device.uuid}
            devices.append({"name": device.name, "attributes": attributes})
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": f"{owner}-{spec.driver}-{i}", "uid": f"sim-slice-{i}"},
                "spec": {
                    "driver": spec.driver,
                    "nodeName": owner,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        )
    return out


def claim_object(spec: ClaimSpec, *, node: str) -> dict[str, Any]:
    """One allocated ResourceClaim: its request, the capwatch.io config (if it has one)
    in its spec and again in its allocation, a result per device, and the pods it is
    reserved for."""
    top = spec.request.split("/", 1)[0]
    config = []
    if spec.cap is not None:
        opaque = {"driver": DRIVER, "parameters": copy.deepcopy(spec.cap.value)}
        config.append({"requests": [top], "opaque": opaque})
    drivers = sorted({d.driver for d in spec.devices})
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"namespace": spec.namespace, "name": spec.name, "uid": spec.uid},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": top,
                        "exactly": {
                            "deviceClassName": drivers[0],
                            "allocationMode": "ExactCount",
                            "count": len(spec.devices),
                        },
                    }
                ],
                "config": copy.deepcopy(config),
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": spec.request,
                            "driver": d.driver,
                            "pool": d.pool or node,
                            "device": d.device,
                        }
                        for d in spec.devices
                    ],
                    "config": [{"source": "FromClaim", **c} for c in config],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": pod.name, "uid": pod.uid} for pod in spec.reserved_for
            ],
        },
    }


def claim_objects(scenario: Scenario, *, cycle: int, node: str) -> list[dict[str, Any]]:
    """The claims allocated in ``cycle`` (those whose ``cycles`` contain it)."""
    return [claim_object(c, node=node) for c in scenario.claims if c.cycles.contains(cycle)]


class SimClaimView:
    """A :class:`~capwatch.agent.dra.claims.ClaimView` over a :class:`SimWorld`: the claims the
    cycle's pods use (each pod uses the claims reserved for it), read from the
    scenario and joined with the node's slices by :func:`capwatch.agent.dra.claims.claims_snapshot`.

    ``node`` is the agent's node name (the scenario's unless the agent is told
    another): derived slices are its pool. ``uuid_attribute`` is the agent's
    ``--dra-uuid-attribute``; a slice whose attribute is another leaves its devices
    unmapped, as on a real node.
    """

    def __init__(
        self, world: SimWorld, *, node: str, uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE
    ) -> None:
        self._world = world
        self._node = node
        self._devices = node_devices(
            slice_objects(world.scenario, node=node), node=node, uuid_attribute=uuid_attribute
        )
        self._pins: dict[Pin, str] = {}
        self._closed = False

    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        if self._closed:
            raise PodViewError("simulated claim view is closed")
        served: dict[ClaimKey, dict[str, Any]] = {
            (obj["metadata"]["namespace"], obj["metadata"]["name"]): obj
            for obj in claim_objects(self._world.scenario, cycle=self._world.cycle, node=self._node)
        }
        using = referenced_claims(pods)
        reads = [
            ReadClaim(key=key, obj=served.get(key), problem="" if key in served else "not found")
            for key in sorted(using)
        ]
        snapshot = claims_snapshot(reads, using, self._devices, pins=self._pins)
        self._pins = dict(snapshot.pins)
        return snapshot

    def close(self) -> None:
        self._closed = True
