"""The scenario's DRA objects: ResourceClaims allocated on the node, and its ResourceSlices.

A scenario's ``claims`` section lists ResourceClaims as the API server would serve
them once allocated on this node: each reserved for some of the scenario's pods,
allocated some of its GPUs (by index, or by the device's name in the slices), with
the parameters of a ``capwatch.io`` opaque config as written on the claim (invalid
ones included: that is what an invalid claim looks like), during a range of
cycles. ``slices`` lists the node's ResourceSlices; without it they are derived
from the GPUs as the NVIDIA DRA driver publishes them (one pool named for the
node, devices ``gpu-N`` carrying the GPU's UUID as the ``uuid`` attribute).
``docs/scenario.md`` documents the format; :mod:`capwatch.agent.sim.claims` builds the
resource.k8s.io/v1 objects from these values and serves them to the agent.

This module holds the values and their validation; the main parser
(``agent.sim.scenario``) calls :func:`parse_slices` and :func:`parse_claims` with
itself as the :class:`Reader`, so errors carry the same path and
``file:line:column``.
"""

from __future__ import annotations

import math
import re
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

from capwatch.agent.dra.slices import DEFAULT_UUID_ATTRIBUTE
from capwatch.agent.pods import PodRef
from capwatch.agent.sim.cycles import ALWAYS, CycleRange

GPU_DRIVER = "gpu.nvidia.com"  # the NVIDIA DRA driver's name, as its slices give it
DEFAULT_REQUEST = "gpu"
# A request name is a DNS label; a subrequest's result is named "<request>/<subrequest>".
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_REQUEST = re.compile(rf"{_LABEL}(/{_LABEL})?")
_UIDS = uuidlib.UUID("5c1a1e00-0000-4000-8000-000000000000")  # namespace of claims' uids


@dataclass(frozen=True, kw_only=True)
class SliceDeviceSpec:
    """One device of a slice: its name in the pool, and the UUID attribute (None: the
    slice gives it none, so a claim's cap on it cannot be applied)."""

    name: str
    uuid: str | None = None


@dataclass(frozen=True, kw_only=True)
class SliceSpec:
    """One ResourceSlice. ``node`` None: this node (the agent's); ``pool`` None: named
    for its node, as the NVIDIA driver names its pools."""

    devices: tuple[SliceDeviceSpec, ...]
    driver: str = GPU_DRIVER
    pool: str | None = None
    node: str | None = None
    uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE


@dataclass(frozen=True, kw_only=True)
class ClaimDeviceSpec:
    """An allocated device, as the allocation result names it. ``pool`` None: the
    node's name."""

    driver: str
    pool: str | None
    device: str


@dataclass(frozen=True, kw_only=True)
class CapParameters:
    """The ``parameters`` of the claim's capwatch.io opaque config, exactly as written:
    a JSON object, as the API server requires, whose content is the agent's to judge."""

    value: object


@dataclass(frozen=True, kw_only=True)
class ClaimSpec:
    """A ResourceClaim allocated (and reserved for ``reserved_for``) during ``cycles``.

    ``cap`` None: the claim has no capwatch.io config (its devices' caps are not the
    claim's to set). Every device is a result of the one request ``request``.
    """

    namespace: str
    name: str
    uid: str
    reserved_for: tuple[PodRef, ...]
    devices: tuple[ClaimDeviceSpec, ...]
    request: str = DEFAULT_REQUEST
    cap: CapParameters | None = None
    cycles: CycleRange = ALWAYS

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def derived_slices(gpu_uuids: Sequence[str]) -> tuple[SliceSpec, ...]:
    """The node's slice as the NVIDIA DRA driver publishes it: devices ``gpu-N``."""
    devices = tuple(SliceDeviceSpec(name=f"gpu-{i}", uuid=u) for i, u in enumerate(gpu_uuids))
    return (SliceSpec(devices=devices),)


class Reader(Protocol):
    """What the parsers here need of the scenario parser."""

    def fail(self, option: str, reason: str) -> NoReturn: ...

    def mapping(
        self, value: object, path: str, required: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, object]: ...

    def sequence(self, value: object, path: str) -> list[object]: ...

    def integer(self, value: object, path: str, *, minimum: int = 1, what: str = "") -> int: ...

    def string(self, value: object, path: str) -> str: ...

    def cycles(self, value: object, path: str) -> CycleRange: ...


# --- slices ----------------------------------------------------------------------------


def parse_slices(
    reader: Reader, value: object, *, node_name: str, gpu_uuids: Sequence[str]
) -> tuple[SliceSpec, ...]:
    """The ``slices`` list, validated. Raises ScenarioError (through ``reader``)."""
    out: list[SliceSpec] = []
    seen: dict[str, str] = {}  # device name -> where, across every slice
    uuids: dict[str, str] = {}  # uuid -> where, across this node's slices
    for i, item in enumerate(reader.sequence(value, "slices")):
        path = f"slices[{i}]"
        raw = reader.mapping(item, path, ("devices",), ("driver", "pool", "node", "uuid_attribute"))
        opt = {
            key: reader.string(raw[key], f"{path}.{key}")
            for key in ("driver", "pool", "node", "uuid_attribute")
            if key in raw
        }
        ours = opt.get("node", node_name) == node_name
        devices: list[SliceDeviceSpec] = []
        for j, entry in enumerate(reader.sequence(raw["devices"], f"{path}.devices")):
            where = f"{path}.devices[{j}]"
            fields = reader.mapping(entry, where, ("name",), ("uuid",))
            name = reader.string(fields["name"], f"{where}.name")
            if name in seen:
                reader.fail(
                    f"{where}.name",
                    f"duplicate device name {name!r} (also {seen[name]}); claims name a "
                    "device by its name alone",
                )
            seen[name] = where
            found = reader.string(fields["uuid"], f"{where}.uuid") if "uuid" in fields else None
            if found is not None and ours:
                if found not in gpu_uuids:
                    reader.fail(
                        f"{where}.uuid",
                        f"{found!r} is the uuid of none of the scenario's GPUs (a slice of "
                        "another node, with node:, may name any)",
                    )
                if found in uuids:
                    reader.fail(f"{where}.uuid", f"duplicate uuid {found!r} (also {uuids[found]})")
                uuids[found] = where
            devices.append(SliceDeviceSpec(name=name, uuid=found))
        out.append(
            SliceSpec(
                devices=tuple(devices),
                driver=opt.get("driver", GPU_DRIVER),
                pool=opt.get("pool"),
                node=opt.get("node"),
                uuid_attribute=opt.get("uuid_attribute", DEFAULT_UUID_ATTRIBUTE),
            )
        )
    return tuple(out)


# --- claims ----------------------------------------------------------------------------


def parse_claims(
    reader: Reader,
    value: object,
    *,
    node_name: str,
    gpu_uuids: Sequence[str],
    pods: Sequence[PodRef],
    slices: tuple[SliceSpec, ...] | None,
) -> tuple[ClaimSpec, ...]:
    """The ``claims`` list, validated against the scenario's pods and GPUs and its slices
    (None: the derived ones). Raises ScenarioError (through ``reader``)."""
    out: list[ClaimSpec] = []
    known = derived_slices(gpu_uuids) if slices is None else slices
    for i, item in enumerate(reader.sequence(value, "claims")):
        claim = _claim(
            reader, item, i, node_name=node_name, gpu_uuids=gpu_uuids, pods=pods, slices=known
        )
        for j, other in enumerate(out):
            same = (other.namespace, other.name) == (claim.namespace, claim.name)
            if same and other.cycles.overlaps(claim.cycles):
                reader.fail(
                    f"claims[{i}].name", f"claim {claim} is also claims[{j}] in the same cycles"
                )
        out.append(claim)
    return tuple(out)


def _claim(
    reader: Reader,
    item: object,
    index: int,
    *,
    node_name: str,
    gpu_uuids: Sequence[str],
    pods: Sequence[PodRef],
    slices: tuple[SliceSpec, ...],
) -> ClaimSpec:
    path = f"claims[{index}]"
    raw = reader.mapping(
        item,
        path,
        ("namespace", "name", "reserved_for", "devices"),
        ("request", "parameters", "cycles"),
    )
    namespace = reader.string(raw["namespace"], f"{path}.namespace")
    name = reader.string(raw["name"], f"{path}.name")
    request = DEFAULT_REQUEST
    if "request" in raw:
        request = reader.string(raw["request"], f"{path}.request")
        if not _REQUEST.fullmatch(request):
            reader.fail(
                f"{path}.request",
                f"{request!r} is not a request name (a DNS label such as 'gpu', or "
                "'<request>/<subrequest>')",
            )
    reserved: list[PodRef] = []
    for j, ref in enumerate(reader.sequence(raw["reserved_for"], f"{path}.reserved_for")):
        pod = _pod(reader, ref, f"{path}.reserved_for[{j}]", namespace, pods)
        if pod in reserved:
            reader.fail(f"{path}.reserved_for[{j}]", f"pod {pod} is listed twice")
        reserved.append(pod)
    listed = reader.sequence(raw["devices"], f"{path}.devices")
    if not listed:
        reader.fail(f"{path}.devices", "an allocated claim has at least one device")
    devices: list[ClaimDeviceSpec] = []
    for j, ref in enumerate(listed):
        device = _device(
            reader,
            ref,
            f"{path}.devices[{j}]",
            node_name=node_name,
            gpu_uuids=gpu_uuids,
            slices=slices,
        )
        if device in devices:
            reader.fail(f"{path}.devices[{j}]", f"device {device.device!r} is listed twice")
        devices.append(device)
    cap = None
    if "parameters" in raw:
        if not isinstance(raw["parameters"], dict):
            # The API server refuses anything else (null included) as opaque parameters.
            reader.fail(
                f"{path}.parameters",
                f"expected a mapping (a claim's opaque parameters are a JSON object), got "
                f"{_kind(raw['parameters'])}",
            )
        cap = CapParameters(value=_json(reader, raw["parameters"], f"{path}.parameters"))
    return ClaimSpec(
        namespace=namespace,
        name=name,
        uid=str(uuidlib.uuid5(_UIDS, f"{namespace}/{name}/{index}")),
        reserved_for=tuple(reserved),
        devices=tuple(devices),
        request=request,
        cap=cap,
        cycles=reader.cycles(raw["cycles"], f"{path}.cycles") if "cycles" in raw else ALWAYS,
    )


def _pod(
    reader: Reader, value: object, path: str, namespace: str, pods: Sequence[PodRef]
) -> PodRef:
    """A pod of the scenario, by uid or by name in the claim's namespace."""
    ref = reader.string(value, path)
    by_uid = next((p for p in pods if p.uid == ref), None)
    if by_uid is not None:
        if by_uid.namespace != namespace:
            reader.fail(
                path,
                f"pod {by_uid} is not in the claim's namespace {namespace!r}; a claim is "
                "reserved only for pods of its namespace",
            )
        return by_uid
    named = [(i, p) for i, p in enumerate(pods) if p.name == ref and p.namespace == namespace]
    if not named:
        reader.fail(
            path, f"no pod with uid {ref!r}, nor named so in namespace {namespace!r}, in pods"
        )
    if len(named) > 1:
        which = ", ".join(f"pods[{i}]" for i, _ in named)
        reader.fail(path, f"{namespace}/{ref} names several pods ({which}); give its uid")
    return named[0][1]


def _device(
    reader: Reader,
    value: object,
    path: str,
    *,
    node_name: str,
    gpu_uuids: Sequence[str],
    slices: tuple[SliceSpec, ...],
) -> ClaimDeviceSpec:
    """A GPU by index (the device of this node's slices with its UUID), or a device of
    the slices by name."""
    if isinstance(value, int) and not isinstance(value, bool):
        gpu = reader.integer(value, path, minimum=0, what="a GPU index or a device name")
        if gpu >= len(gpu_uuids):
            reader.fail(
                path, f"no GPU at index {gpu}; the scenario declares {len(gpu_uuids)} GPU(s)"
            )
        ours = [s for s in slices if s.node in (None, node_name)]
        match = next(
            ((s, d.name) for s in ours for d in s.devices if d.uuid == gpu_uuids[gpu]), None
        )
        if match is None:
            reader.fail(
                path,
                f"no device of this node's slices has GPU {gpu}'s uuid {gpu_uuids[gpu]!r}; "
                "name the device instead",
            )
        return ClaimDeviceSpec(driver=match[0].driver, pool=_pool(match[0]), device=match[1])
    if not isinstance(value, str):
        reader.fail(path, f"expected a GPU index or a device name, got {_kind(value)}")
    name = reader.string(value, path)
    found = next((s for s in slices if any(d.name == name for d in s.devices)), None)
    if found is None:
        names = [device.name for s in slices for device in s.devices]
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        reader.fail(path, f"no device {name!r} in the scenario's slices ({shown or 'none'})")
    return ClaimDeviceSpec(driver=found.driver, pool=_pool(found), device=name)


def _pool(found: SliceSpec) -> str | None:
    """The slice's pool name; None: this node's name."""
    return found.pool if found.pool is not None else found.node


def _json(reader: Reader, value: object, path: str) -> object:
    """``value`` if it is what JSON can say (the API server keeps parameters as JSON)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            reader.fail(path, f"{value} is not a JSON number")
        return value
    if isinstance(value, list):
        return [_json(reader, item, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, dict):
        reader.fail(
            path, f"{type(value).__name__} {value!r} is not a JSON value; quote it to make a string"
        )
    for key in value:
        if not isinstance(key, str):
            reader.fail(path, f"keys of JSON objects are strings, got {_kind(key)}")
    return {key: _json(reader, item, f"{path}.{key}") for key, item in value.items()}


def _kind(value: object) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else f"boolean {str(value).lower()}"
    if isinstance(value, str | int | float):
        return f"{'string' if isinstance(value, str) else 'number'} {value!r}"
    kinds = {list: "a list", dict: "a mapping"}
    return next((v for k, v in kinds.items() if isinstance(value, k)), type(value).__name__)
