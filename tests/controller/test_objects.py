"""The Kubernetes JSON the controller writes (controller/objects.py): a Lease PUT keeps
what the election does not own."""

from __future__ import annotations

import dataclasses

import pytest

from capwatch.controller.objects import lease_body, lease_record, resource_version

READ = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {
        "name": "capwatch-controller-0",
        "namespace": "capwatch",
        "resourceVersion": "41",
        "uid": "1f0c9f5e-0000-4000-8000-000000000000",
        "labels": {"team": "gpu"},
        "annotations": {"note": "kept"},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "c", "uid": "u-1"}
        ],
        "finalizers": ["example.com/keep"],
    },
    "spec": {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-12-01T10:00:00.000000Z",
        "renewTime": "2026-12-01T10:00:10.000000Z",
        "leaseTransitions": 3,
        "preferredHolder": "b",
        "strategy": "OldestEmulationVersion",
    },
}


def test_a_renewal_keeps_metadata_and_spec_fields_it_does_not_set():
    """Renewing from the Lease as read: labels, annotations, owner references,
    finalizers and spec fields the election does not set (preferredHolder, strategy)
    are sent back unchanged; its own fields and the resourceVersion are the new ones."""
    record = lease_record(READ)
    renewed = dataclasses.replace(record, renew_time="2026-12-01T10:00:12.000000Z")
    body = lease_body("capwatch-controller-0", "capwatch", renewed)
    for key in ("labels", "annotations", "ownerReferences", "finalizers", "uid"):
        assert body["metadata"][key] == READ["metadata"][key]
    assert body["metadata"]["resourceVersion"] == "41"
    assert body["spec"]["preferredHolder"] == "b"
    assert body["spec"]["strategy"] == "OldestEmulationVersion"
    assert body["spec"]["renewTime"] == "2026-12-01T10:00:12.000000Z"
    assert body["spec"]["leaseTransitions"] == 3
    assert READ["spec"]["renewTime"] == "2026-12-01T10:00:10.000000Z"  # the read is not changed


def test_a_lease_to_create_carries_only_the_election():
    """With nothing read (the Lease does not exist yet) the body is the election's fields,
    the name and namespace, and no resourceVersion."""
    record = dataclasses.replace(lease_record(READ), raw=None, resource_version="")
    body = lease_body("capwatch-controller-1", "capwatch", record)
    assert body["metadata"] == {"name": "capwatch-controller-1", "namespace": "capwatch"}
    assert set(body["spec"]) == {
        "holderIdentity",
        "leaseDurationSeconds",
        "acquireTime",
        "renewTime",
        "leaseTransitions",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("4242", 4242),
        ("123456789012345678901234567890", 123456789012345678901234567890),
        ("0", None),
        ("0042", None),
        ("", None),
        ("12a", None),
        ("-5", None),
        ("\u00b2", None),
        (None, None),
        (17, None),
    ],
)
def test_a_resource_version_compares_only_as_kep_5504_allows(
    text: object, expected: int | None
) -> None:
    """KEP-5504: a positive decimal integer with no leading zero compares as an integer,
    of any length; anything else (0, a leading zero, a sign, letters, not a string) is not
    comparable (None), so the writer takes such a Node as it comes."""
    assert resource_version({"metadata": {"resourceVersion": text}}) == expected
