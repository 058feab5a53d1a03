"""Caps asked for on DRA ResourceClaims: which GPU each claim holds, and what cap it asks.

A cap on a claim is an opaque device configuration for capwatch's own driver name,
applying to some or all of the claim's requests::

    config:
    - requests: [gpu]          # none: every request of the claim
      opaque:
        driver: capwatch.io
        parameters: {apiVersion: capwatch.io/v1alpha1, kind: PowerCap, watts: 450}

The agent reads only the claims the pods bound to its node name, as the kubelet does
(:func:`referenced_claims`): a claim's allocation (``status.allocation.devices``)
names each device it got by driver, pool and device name, and carries the claim's
configuration, its class's first (``source: FromClass``), then its own
(``FromClaim``); the node's ResourceSlices (:mod:`capwatch.agent.dra.slices`) say which GPU each
device is. :func:`claims_snapshot` joins them, pure: each GPU UUID with the caps
its claims ask for, and every claim that cannot be taken as a named problem.

Fail closed. A claim that cannot be read, or whose device no slice of the node
resolves now, never silently uncaps a GPU:

- a device resolved once stays *pinned* to that GPU for as long as its claim is
  referenced (the workload's container was prepared on it): a device that no
  longer resolves keeps its cap on the pinned GPU, and a republish that names
  another GPU for it is reported and never moves the cap;
- a claim that cannot be read, or a device that never resolved, makes the pods
  that use it *held*: the cycle writes and releases nothing on a GPU they own or
  run on (the reconciler's rule), and each is a named failure of the cycle.

Parameters that are not a valid PowerCap (another apiVersion or kind, ``watts`` not
an integer or out of range) are an invalid request, as an invalid annotation is: the
GPU gets the safe default and the claim is named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from capwatch.agent.dra.slices import NO_DEVICES, DeviceName, NodeDevices
from capwatch.agent.gpus import MAX_REQUEST_WATTS
from capwatch.agent.pods import PodRef, PodSnapshot

DRIVER = "capwatch.io"
API_VERSION = "capwatch.io/v1alpha1"
KIND = "PowerCap"
# DRA applies a class's configuration before the claim's own (both in the allocation).
SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}


@dataclass(frozen=True, kw_only=True, order=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


# A claim as a pod names it: its namespace (the pod's) and its name.
ClaimKey = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class ClaimCap:
    """What one claim asks of one of its devices: ``watts``, or ``problem`` saying why
    its parameters are not a valid PowerCap. ``pods`` are this node's pods using it."""

    claim: ClaimRef
    request: str
    watts: int | None
    problem: str | None
    pods: tuple[PodRef, ...] = ()


class ClaimProblemKind(str, Enum):
    # The claim could not be read: not found, not allocated, the request failed.
    UNAVAILABLE = "claim_unavailable"
    # A capped device no slice of this node resolves to a GPU now.
    UNMAPPED = "claim_device_unmapped"
    # A republish names another GPU for a device pinned to the one it was prepared on.
    MOVED = "claim_device_moved"


@dataclass(frozen=True, kw_only=True)
class ClaimProblem:
    """A claim (or one of its devices) capwatch cannot take as it is, and why."""

    kind: ClaimProblemKind
    claim: ClaimRef
    detail: str
    device: DeviceName | None = None
    pods: tuple[PodRef, ...] = ()
    kept_on: str | None = None  # the GPU its cap stays on (a pinned device)

    def message(self) -> str:
        where = f"claim {self.claim}" + (f": device {self.device}" if self.device else "")
        kept = f"; its cap stays on {self.kept_on}" if self.kept_on else ""
        return f"{where}: {self.detail}{kept}"


@dataclass(frozen=True, kw_only=True, order=True)
class Pin:
    """One allocated device of one claim, by the claim's uid."""

    claim_uid: str
    request: str
    device: DeviceName


@dataclass(frozen=True, kw_only=True)
class ClaimsSnapshot:
    caps: Mapping[str, tuple[ClaimCap, ...]] = field(default_factory=dict)  # by GPU UUID
    problems: tuple[ClaimProblem, ...] = ()
    names: Mapping[str, DeviceName] = field(default_factory=dict)  # GPU UUID -> its name
    # Pods whose GPUs keep their caps: a claim of theirs cannot be read or resolved.
    held: Mapping[str, ClaimProblem] = field(default_factory=dict)  # pod uid -> why
    pins: Mapping[Pin, str] = field(default_factory=dict)  # device -> GPU UUID

    def for_gpu(self, uuid: str) -> tuple[ClaimCap, ...]:
        """The caps this node's pods' claims ask of ``uuid``."""
        return self.caps.get(uuid, ())

    def hold(self, pod_uids: Iterable[str]) -> ClaimProblem | None:
        """Why a GPU with these pods (owners or processes) must keep its cap, or None."""
        for uid in pod_uids:
            problem = self.held.get(uid)
            if problem is not None:
                return problem
        return None


NO_CLAIMS = ClaimsSnapshot()


class ClaimView(Protocol):
    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        """The claims ``pods`` use, joined with the node's slices. Raises PodViewError
        when the slices cannot be trusted (not synced)."""
        ...

    def close(self) -> None:
        """Stop any background work. Idempotent."""
        ...


class NoClaims:
    """No claims are read (claims off, or no API server to read them from)."""

    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        return NO_CLAIMS

    def close(self) -> None:
        return


def referenced_claims(pods: PodSnapshot) -> dict[ClaimKey, tuple[PodRef, ...]]:
    """Each claim this node's running pods use, with those pods. A finished pod's
    claims are not read: its processes are gone, and its generated claims with it."""
    using: dict[ClaimKey, list[PodRef]] = {}
    for info in pods.pods.values():
        if info.finished:
            continue
        for name in info.claims:
            using.setdefault((info.ref.namespace, name), []).append(info.ref)
    return {key: tuple(sorted(refs)) for key, refs in using.items()}


@dataclass(frozen=True, kw_only=True)
class ReadClaim:
    """What the view could read of one referenced claim: the object, or why not."""

    key: ClaimKey
    obj: Mapping[str, Any] | None
    problem: str = ""


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
    if not 0 < watts <= MAX_REQUEST_WATTS:
        return None, f"watts {watts} is out of range (1 to {MAX_REQUEST_WATTS})"
    extra = set(parameters) - {"apiVersion", "kind", "watts"}
    if extra:
        return None, f"unknown field {sorted(extra)[0]!r}"
    return watts, None


def allocated(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    metadata = claim.get("metadata") or {}
    return ClaimRef(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
    )


class _Join:
    """The state one :func:`claims_snapshot` builds."""

    def __init__(self, devices: NodeDevices, pins: Mapping[Pin, str]) -> None:
        self.devices = devices
        self.old_pins = pins
        self.pins: dict[Pin, str] = {}
        self.caps: dict[str, list[ClaimCap]] = {}
        self.problems: list[ClaimProblem] = []
        self.held: dict[str, ClaimProblem] = {}

    def fail(self, problem: ClaimProblem, *, hold: bool) -> None:
        self.problems.append(problem)
        if hold:
            for pod in problem.pods:
                self.held.setdefault(pod.uid, problem)

    def claim(self, read: ReadClaim, pods: tuple[PodRef, ...]) -> None:
        if read.obj is None:
            ref = ClaimRef(namespace=read.key[0], name=read.key[1])
            detail = read.problem or "not read"
            problem = ClaimProblem(
                kind=ClaimProblemKind.UNAVAILABLE, claim=ref, detail=detail, pods=pods
            )
            self.fail(problem, hold=True)
            return
        ref = claim_ref(read.obj)
        devices = ((read.obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
        configs = _ordered(devices.get("config") or [])
        for result in devices.get("results") or []:
            request = str(result.get("request") or "")
            applies, parameters = _cap_config(configs, request)
            if applies:
                device = DeviceName(
                    driver=str(result.get("driver") or ""),
                    pool=str(result.get("pool") or ""),
                    device=str(result.get("device") or ""),
                )
                watts, invalid = parse_power_cap(parameters)
                cap = ClaimCap(claim=ref, request=request, watts=watts, problem=invalid, pods=pods)
                self.device(ref, Pin(claim_uid=ref.uid, request=request, device=device), cap)

    def device(self, ref: ClaimRef, pin: Pin, cap: ClaimCap) -> None:
        uuid, why = self.devices.resolve(pin.device)
        pinned = self.old_pins.get(pin) if ref.uid else None
        if uuid is not None and pinned in (None, uuid):
            self.pins[pin] = uuid
            self.caps.setdefault(uuid, []).append(cap)
            return
        if pinned is None:  # never resolved: nothing to keep it on but the GPUs' own caps
            problem = ClaimProblem(
                kind=ClaimProblemKind.UNMAPPED,
                claim=ref,
                device=pin.device,
                detail=why,
                pods=cap.pods,
            )
            self.fail(problem, hold=True)
            return
        self.pins[pin] = pinned
        self.caps.setdefault(pinned, []).append(cap)
        if uuid is None:
            kind, detail = ClaimProblemKind.UNMAPPED, why
        else:
            kind = ClaimProblemKind.MOVED
            detail = f"this node's slices now name {uuid} for it; it was prepared on {pinned}"
        problem = ClaimProblem(
            kind=kind, claim=ref, device=pin.device, detail=detail, pods=cap.pods, kept_on=pinned
        )
        self.fail(problem, hold=False)


def claims_snapshot(
    claims: Iterable[ReadClaim],
    referencing: Mapping[ClaimKey, tuple[PodRef, ...]],
    devices: NodeDevices = NO_DEVICES,
    *,
    pins: Mapping[Pin, str] | None = None,
) -> ClaimsSnapshot:
    """Each GPU with the caps the read claims ask of it, and every claim's problem (see
    the module docstring); ``pins`` is the previous snapshot's, pure."""
    join = _Join(devices, pins or {})
    for read in claims:
        join.claim(read, referencing.get(read.key, ()))
    return ClaimsSnapshot(
        caps={
            uuid: tuple(sorted(found, key=lambda c: c.claim)) for uuid, found in join.caps.items()
        },
        problems=tuple(
            sorted(join.problems, key=lambda p: (p.claim, str(p.device or ""), p.kind.value))
        ),
        names=devices.names(),
        held=join.held,
        pins=join.pins,
    )


def _ordered(configs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The allocation's configs in the order DRA applies them: the class's, then the
    claim's, each in its own order (a stable sort)."""
    return sorted(configs, key=lambda config: SOURCE_ORDER.get(str(config.get("source")), 1))


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
