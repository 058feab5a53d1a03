"""Caps asked for on DRA ResourceClaims: which GPU each claim holds, and what cap it asks.

A cap on a claim is an opaque device configuration for capwatch's own driver name,
applying to some or all of the claim's requests::

    config:
    - requests: [gpu]          # none: every request of the claim
      opaque:
        driver: capwatch.io
        parameters: {apiVersion: capwatch.io/v1alpha1, kind: PowerCap, watts: 450}

The claim's allocation (``status.allocation.devices``) names each device it got by
driver, pool and device name, and carries the claim's configuration again; the GPU
driver's ResourceSlices on this node name each device's UUID as an attribute (the
NVIDIA DRA driver's ``uuid``). :func:`claims_snapshot` joins the two, pure, from the
objects as the API server serves them (resource.k8s.io/v1): each GPU UUID with the
caps its claims ask for, the claims whose device names no GPU (a named failure), and
the driver's name for each GPU (which the DRA health mirror then uses).

Parameters that are not a valid PowerCap (another apiVersion or kind, ``watts`` not
an integer or out of range) are an invalid request, as an invalid annotation is: the
GPU gets the safe default and the claim is named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.pods import PodRef

DRIVER = "capwatch.io"
API_VERSION = "capwatch.io/v1alpha1"
KIND = "PowerCap"
DEFAULT_UUID_ATTRIBUTE = "uuid"
# As for an annotation: more than any GPU draws is a typo (or milliwatts).
MAX_WATTS = 100_000


@dataclass(frozen=True, kw_only=True, order=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, kw_only=True, order=True)
class DeviceName:
    """A device as DRA names it: the driver, its pool (the node, for GPU drivers) and
    the device's name in that pool (``gpu-0``)."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, kw_only=True)
class ClaimCap:
    """What one claim asks of one of its devices: ``watts``, or ``problem`` saying why
    its parameters are not a valid PowerCap. ``pods`` are those it is reserved for."""

    claim: ClaimRef
    request: str
    watts: int | None
    problem: str | None
    pods: tuple[PodRef, ...] = ()


@dataclass(frozen=True, kw_only=True)
class UnmappedDevice:
    """A capped claim's device in a pool of this node that no ResourceSlice gives a UUID."""

    claim: ClaimRef
    device: DeviceName


@dataclass(frozen=True, kw_only=True)
class ClaimsSnapshot:
    caps: Mapping[str, tuple[ClaimCap, ...]] = field(default_factory=dict)  # by GPU UUID
    unmapped: tuple[UnmappedDevice, ...] = ()
    names: Mapping[str, DeviceName] = field(default_factory=dict)  # GPU UUID -> its name

    def for_gpu(self, uuid: str, pods_on_node: Mapping[str, Any]) -> tuple[ClaimCap, ...]:
        """The caps on ``uuid`` from claims reserved for a pod bound to this node (a pod
        of the node's pod view, by UID)."""
        return tuple(
            cap for cap in self.caps.get(uuid, ()) if any(p.uid in pods_on_node for p in cap.pods)
        )


NO_CLAIMS = ClaimsSnapshot()


class ClaimView(Protocol):
    def snapshot(self) -> ClaimsSnapshot:
        """The claims allocated on this node now. Raises PodViewError when not synced."""
        ...

    def close(self) -> None:
        """Stop any background work. Idempotent."""
        ...


class NoClaims:
    """No claims are read (claims off, or no API server to read them from)."""

    def snapshot(self) -> ClaimsSnapshot:
        return NO_CLAIMS

    def close(self) -> None:
        return


def parse_power_cap(parameters: object) -> tuple[int | None, str | None]:
    """``(watts, None)`` for a valid PowerCap, ``(None, why)`` otherwise."""
    if not isinstance(parameters, Mapping):
        return None, "parameters are not an object"
    version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if version != API_VERSION:
        return None, f"apiVersion {version!r} is not {API_VERSION}"
    if kind != KIND:
        return None, f"kind {kind!r} is not {KIND}"
    watts = parameters.get("watts")
    # JSON has one number type: 450.0 is the integer 450, as JSON Schema says too.
    if isinstance(watts, float) and watts.is_integer():
        watts = int(watts)
    if isinstance(watts, bool) or not isinstance(watts, int):
        return None, f"watts {watts!r} is not an integer"
    if not 0 < watts <= MAX_WATTS:
        return None, f"watts {watts} is out of range (1 to {MAX_WATTS})"
    extra = set(parameters) - {"apiVersion", "kind", "watts"}
    if extra:
        return None, f"unknown field {sorted(extra)[0]!r}"
    return watts, None


def slice_devices(
    slices: Iterable[Mapping[str, Any]], *, node: str, uuid_attribute: str
) -> tuple[dict[tuple[str, str], dict[str, str]], set[tuple[str, str]]]:
    """From this node's ResourceSlices: ``(driver, pool) -> {device: uuid}`` for the
    devices whose slice gives the UUID attribute, and every ``(driver, pool)`` of the
    node (a device in one of them with no UUID is unmapped, not someone else's)."""
    uuids: dict[tuple[str, str], dict[str, str]] = {}
    pools: set[tuple[str, str]] = set()
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        pools.add((driver, pool))
        for device in spec.get("devices") or []:
            found = _uuid(device.get("attributes") or {}, driver, uuid_attribute)
            if found is not None and device.get("name"):
                uuids.setdefault((driver, pool), {})[str(device["name"])] = found
    return uuids, pools


def _uuid(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    # An unqualified attribute name is in the driver's own domain: both spellings.
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return None


def claims_snapshot(
    claims: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    *,
    node: str,
    uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE,
) -> ClaimsSnapshot:
    """Each of this node's GPUs with the caps its allocated claims ask for (see the module
    docstring); pure."""
    uuids, pools = slice_devices(slices, node=node, uuid_attribute=uuid_attribute)
    names = {
        uuid: DeviceName(driver=driver, pool=pool, device=device)
        for (driver, pool), devices in uuids.items()
        for device, uuid in devices.items()
    }
    caps: dict[str, list[ClaimCap]] = {}
    unmapped: list[UnmappedDevice] = []
    for claim in claims:
        metadata = claim.get("metadata") or {}
        ref = ClaimRef(
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
        )
        status = claim.get("status") or {}
        devices = (status.get("allocation") or {}).get("devices") or {}
        pods = _reserved_pods(status.get("reservedFor") or [], ref.namespace)
        for result in devices.get("results") or []:
            key = (str(result.get("driver") or ""), str(result.get("pool") or ""))
            if key not in pools:
                continue  # another node's device
            request = str(result.get("request") or "")
            applies, config = _cap_config(devices.get("config") or [], request)
            if not applies:
                continue  # this device's cap is not capwatch's to set
            watts, problem = parse_power_cap(config)
            uuid = uuids.get(key, {}).get(str(result.get("device") or ""))
            if uuid is None:
                name = DeviceName(driver=key[0], pool=key[1], device=str(result.get("device")))
                unmapped.append(UnmappedDevice(claim=ref, device=name))
                continue
            caps.setdefault(uuid, []).append(
                ClaimCap(claim=ref, request=request, watts=watts, problem=problem, pods=pods)
            )
    return ClaimsSnapshot(
        caps={uuid: tuple(sorted(found, key=lambda c: c.claim)) for uuid, found in caps.items()},
        unmapped=tuple(sorted(unmapped, key=lambda u: (u.claim, u.device))),
        names=names,
    )


def _cap_config(configs: Iterable[Mapping[str, Any]], request: str) -> tuple[bool, object]:
    """Whether a capwatch.io config applies to ``request``, and the parameters of the last
    one that does (later entries override earlier ones, as DRA applies them; missing
    parameters are None, which is not a PowerCap)."""
    applies, found = False, None
    for config in configs:
        opaque = config.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
        requests = config.get("requests") or []
        # A request of a claim with subrequests is named "<request>/<subrequest>".
        if not requests or request in requests or request.split("/", 1)[0] in requests:
            applies, found = True, opaque.get("parameters")
    return applies, found


def _reserved_pods(reserved: Iterable[Mapping[str, Any]], namespace: str) -> tuple[PodRef, ...]:
    return tuple(
        sorted(
            PodRef(namespace=namespace, name=str(r.get("name") or ""), uid=str(r.get("uid") or ""))
            for r in reserved
            if r.get("resource") == "pods" and not r.get("apiGroup")
        )
    )
