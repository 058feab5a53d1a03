"""The simulation scenario file: its dataclasses, parser and validator.

A scenario describes a simulated node for the ``sim`` backend and pod view:
its GPUs, the pods on it, which processes run on which GPU, the DRA
ResourceClaims allocated on it and its ResourceSlices (``claims``, ``slices``,
parsed by :mod:`capwatch.agent.sim.scenario_claims`), faults to inject into backend
calls, and faults of the devices themselves (``device_faults``, parsed by
:mod:`capwatch.agent.sim.scenario_devices`), each optionally limited to a range of
reconcile cycles. The format is
YAML (JSON is valid YAML) and is documented in ``docs/scenario.md``.

Validation is strict: unknown keys, wrong types, out-of-range numbers,
duplicates and dangling references all raise :class:`~capwatch.kit.errors.ScenarioError`
whose ``option`` is the path to the bad key (``gpus[1].min_watts``), so a typo
never silently turns into a different simulation.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn, TypeVar

import yaml

from capwatch.agent.attribution import canonical_pod_uid
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.pods import PodInfo, PodRef
from capwatch.agent.sim import yamlsource
from capwatch.agent.sim.cycles import ALWAYS, CycleRange
from capwatch.agent.sim.proctree import CgroupLayout, QosClass
from capwatch.agent.sim.scenario_claims import ClaimSpec, SliceSpec, parse_claims, parse_slices
from capwatch.agent.sim.scenario_devices import DeviceFaultSpec, parse_device_faults
from capwatch.agent.sim.yamlsource import Position, join
from capwatch.kit.errors import ScenarioError

_E = TypeVar("_E", bound=Enum)
_T = TypeVar("_T")
_Read = Callable[[object, str], _T]  # reads the value at a path, or fails

_DEFAULT_RESOURCE = "default.yaml"
_LAYOUT = CgroupLayout.V2_SYSTEMD_CONTAINERD  # the most common node today


class FaultOp(str, Enum):
    """The backend or pod-view operation a fault applies to."""

    DEVICE_COUNT = "device_count"
    UUID = "uuid"  # every UUID read, including the identity check before a write
    PROCESSES = "processes"
    CONSTRAINTS = "constraints"
    SET_LIMIT = "set_limit"
    RESTORE = "restore"
    POD_VIEW = "pod_view"

    @property
    def per_gpu(self) -> bool:
        return self not in (FaultOp.DEVICE_COUNT, FaultOp.POD_VIEW)


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    uuid: str
    min_watts: int
    max_watts: int
    default_watts: int


@dataclass(frozen=True, kw_only=True)
class PodSpec:
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    cycles: CycleRange = ALWAYS

    @property
    def ref(self) -> PodRef:
        return PodRef(namespace=self.namespace, name=self.name, uid=self.uid)

    def info(self) -> PodInfo:
        return PodInfo(ref=self.ref, annotations=MappingProxyType(dict(self.annotations)))


@dataclass(frozen=True, kw_only=True)
class ProcessSpec:
    """A compute process on one GPU. ``pod`` None: not a Kubernetes process.

    ``cycles`` is the effective range: a file entry without ``cycles`` inherits
    its pod's range (a process lives as long as its pod), or :data:`ALWAYS`.
    """

    gpu: int
    pid: int
    pod: str | None
    qos: QosClass = QosClass.BURSTABLE
    cgroup_layout: CgroupLayout = _LAYOUT
    cycles: CycleRange = ALWAYS


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """One injected fault: ``op`` (on ``gpu``) errors, hangs, or reports another UUID.

    Exactly one of ``error``, ``hang_seconds`` and ``change_to`` (``uuid`` op
    only) is set. ``identity_check_only`` (``uuid`` op only) limits the fault to
    the identity re-read inside a write, which is how a device re-enumerated
    between a step's UUID read and its write looks. Raises ValueError when
    constructed inconsistently (the parser reports such files as ScenarioError).
    """

    op: FaultOp
    gpu: int | None = None
    error: GpuErrorClass | None = None
    hang_seconds: float | None = None
    change_to: str | None = None
    identity_check_only: bool = False
    cycles: CycleRange = ALWAYS

    def __post_init__(self) -> None:
        actions = (self.error, self.hang_seconds, self.change_to)
        if (
            sum(a is not None for a in actions) != 1
            or self.op.per_gpu != (self.gpu is not None)
            or (self.gpu or 0) < 0
            or (self.op is not FaultOp.UUID and (self.change_to or self.identity_check_only))
            or not 0 < (self.hang_seconds or 1) < math.inf
        ):
            raise ValueError(f"inconsistent fault {self!r}")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    node_name: str
    safe_default_watts: int
    gpus: tuple[GpuSpec, ...]
    pods: tuple[PodSpec, ...] = ()
    processes: tuple[ProcessSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    device_faults: tuple[DeviceFaultSpec, ...] = ()  # see agent.sim.scenario_devices
    claims: tuple[ClaimSpec, ...] = ()  # see agent.sim.scenario_claims
    slices: tuple[SliceSpec, ...] | None = None  # None: derived from the GPUs
    interval_seconds: float | None = None  # a hint for the demo's --interval
    description: str = ""
    source: str = ""  # where it was loaded from, for messages


# --- loading ---------------------------------------------------------------------------


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file. Raises ScenarioError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError("scenario", f"cannot read {path}: {exc}") from exc
    return _parse_text(text, source=str(path))


def default_scenario() -> Scenario:
    """The built-in demo scenario shipped as ``agent/sim/scenarios/default.yaml``."""
    resource = resources.files("capwatch.agent.sim").joinpath("scenarios", _DEFAULT_RESOURCE)
    return _parse_text(resource.read_text(encoding="utf-8"), source=f"builtin:{_DEFAULT_RESOURCE}")


def parse_scenario(data: object, *, source: str) -> Scenario:
    """Validate an already-decoded document (a dict, as from YAML or JSON)."""
    return _Parser(source).scenario(data)


def _parse_text(text: str, *, source: str) -> Scenario:
    try:
        data, positions = yamlsource.load(text)
    except yaml.YAMLError as exc:
        where = yamlsource.describe(exc, source)
        raise ScenarioError("scenario", f"not valid YAML at {where}") from exc
    return _Parser(source, positions).scenario(data)


# --- validation ------------------------------------------------------------------------


def _describe(value: object) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else f"boolean {str(value).lower()}"
    if isinstance(value, str | int | float):
        return f"{'string' if isinstance(value, str) else 'number'} {value!r}"
    kinds = {list: "a list", dict: "a mapping"}
    return next((v for k, v in kinds.items() if isinstance(value, k)), type(value).__name__)


class _Parser:
    """Walks a decoded document, raising ScenarioError at the first bad key."""

    def __init__(self, source: str, positions: Mapping[str, Position] | None = None) -> None:
        self.source = source
        self.positions = positions or {}

    def fail(self, option: str, reason: str) -> NoReturn:
        at = yamlsource.position_of(option, self.positions) if self.positions else None
        where = f"{self.source}:{at}" if at is not None else self.source
        raise ScenarioError(option or "scenario", f"{reason} (in {where})")

    def mapping(
        self, value: object, path: str, required: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, object]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_describe(value)}")
        allowed = required + optional
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                guess = f"; did you mean {hint[0]!r}?" if hint else ""
                self.fail(
                    join(path, str(key)),
                    f"unknown key {key!r}{guess} (allowed: {', '.join(allowed)})",
                )
        for key in required:
            if key not in value:
                self.fail(join(path, key), "required key is missing")
        return value

    def opt(self, raw: dict[str, object], key: str, path: str, read: _Read[_T], default: _T) -> _T:
        """``read`` the optional ``key`` of ``raw``, or ``default`` when it is absent."""
        return read(raw[key], join(path, key)) if key in raw else default

    def sequence(self, value: object, path: str) -> list[object]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_describe(value)}")
        return value

    def integer(self, value: object, path: str, *, minimum: int = 1, what: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected {what or 'an integer'}, got {_describe(value)}")
        if value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        return value

    def watts(self, value: object, path: str) -> int:
        return self.integer(value, path, what="an integer number of watts")

    def seconds(self, value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected a number of seconds, got {_describe(value)}")
        if not 0 < value < math.inf:
            self.fail(path, f"must be a positive, finite number of seconds, got {value}")
        return float(value)

    def of(self, kind: type[_T], what: str) -> _Read[_T]:
        def read(value: object, path: str) -> _T:
            if not isinstance(value, kind):
                self.fail(path, f"expected {what}, got {_describe(value)}")
            return value

        return read

    def string(self, value: object, path: str) -> str:
        if not self.of(str, "a string")(value, path).strip():
            self.fail(path, "must not be empty")
        return str(value)

    def choice(self, enum: type[_E]) -> _Read[_E]:
        def read(value: object, path: str) -> _E:
            allowed = [str(member.value) for member in enum]
            if not isinstance(value, str) or value not in allowed:
                self.fail(path, f"unknown value {value!r}; expected one of: {', '.join(allowed)}")
            return enum(value)

        return read

    def cycles(self, value: object, path: str) -> CycleRange:
        if isinstance(value, int) and not isinstance(value, bool):
            n = self.integer(value, path, what="a cycle number")
            return CycleRange(first=n, last=n)
        if not isinstance(value, dict):
            self.fail(
                path, f"expected a cycle number or {{from: N, to: M}}, got {_describe(value)}"
            )
        raw = self.mapping(value, path, ("from",), ("to",))
        first = self.integer(raw["from"], f"{path}.from", what="a cycle number")
        if raw.get("to") is None:
            return CycleRange(first=first)
        last = self.integer(raw["to"], f"{path}.to", what="a cycle number")
        if last < first:
            self.fail(f"{path}.to", f"ends before it starts (from {first}, to {last})")
        return CycleRange(first=first, last=last)

    def gpu_index(self, value: object, path: str, gpus: tuple[GpuSpec, ...]) -> int:
        index = self.integer(value, path, minimum=0, what="a GPU index")
        if index >= len(gpus):
            self.fail(path, f"no GPU at index {index}; the scenario declares {len(gpus)} GPU(s)")
        return index

    # --- the document -----------------------------------------------------------------

    def scenario(self, data: object) -> Scenario:
        if data is None:
            self.fail("scenario", "the document is empty")
        optional = (
            "pods",
            "processes",
            "claims",
            "slices",
            "faults",
            "device_faults",
            "interval_seconds",
            "description",
        )
        raw = self.mapping(data, "", ("node_name", "safe_default_watts", "gpus"), optional)
        node_name = self.string(raw["node_name"], "node_name")
        gpus = self.gpus(raw["gpus"])
        pods = self.pods(raw.get("pods", []))
        uuids = [g.uuid for g in gpus]
        slices = None
        if "slices" in raw:
            slices = parse_slices(self, raw["slices"], node_name=node_name, gpu_uuids=uuids)
        return Scenario(
            node_name=node_name,
            safe_default_watts=self.watts(raw["safe_default_watts"], "safe_default_watts"),
            gpus=gpus,
            pods=pods,
            processes=self.processes(raw.get("processes", []), gpus, pods),
            claims=parse_claims(
                self,
                raw.get("claims", []),
                node_name=node_name,
                gpu_uuids=uuids,
                pods=[p.ref for p in pods],
                slices=slices,
            ),
            slices=slices,
            faults=tuple(
                self.fault(item, f"faults[{i}]", gpus)
                for i, item in enumerate(self.sequence(raw.get("faults", []), "faults"))
            ),
            device_faults=parse_device_faults(
                self, raw.get("device_faults", []), gpu_count=len(gpus)
            ),
            interval_seconds=self.opt(raw, "interval_seconds", "", self.seconds, None),
            description=self.opt(raw, "description", "", self.of(str, "a string"), ""),
            source=self.source,
        )

    def gpus(self, value: object) -> tuple[GpuSpec, ...]:
        out: list[GpuSpec] = []
        for i, item in enumerate(self.sequence(value, "gpus")):
            path = f"gpus[{i}]"
            keys = ("uuid", "min_watts", "max_watts", "default_watts")
            raw = self.mapping(item, path, keys, ())
            uuid = self.string(raw["uuid"], f"{path}.uuid")
            low, high, default = (self.watts(raw[k], f"{path}.{k}") for k in keys[1:])
            if low > high:
                self.fail(f"{path}.min_watts", f"min_watts ({low}) is above max_watts ({high})")
            if not low <= default <= high:
                self.fail(
                    f"{path}.default_watts", f"default_watts ({default}) is outside [{low}, {high}]"
                )
            for j, other in enumerate(out):
                if other.uuid == uuid:
                    self.fail(f"{path}.uuid", f"duplicate uuid {uuid!r} (also gpus[{j}])")
            out.append(GpuSpec(uuid=uuid, min_watts=low, max_watts=high, default_watts=default))
        return tuple(out)

    def pods(self, value: object) -> tuple[PodSpec, ...]:
        out: list[PodSpec] = []
        for i, item in enumerate(self.sequence(value, "pods")):
            path = f"pods[{i}]"
            raw = self.mapping(item, path, ("namespace", "name", "uid"), ("annotations", "cycles"))
            uid = self.string(raw["uid"], f"{path}.uid")
            # Attribution finds a pod only by the UUID in its cgroup path.
            if canonical_pod_uid(uid) != uid:
                self.fail(
                    f"{path}.uid",
                    f"{uid!r} is not a lower-case UUID (like 0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9);"
                    " attribution finds pods by the UUID in their cgroup path",
                )
            pod = PodSpec(
                namespace=self.string(raw["namespace"], f"{path}.namespace"),
                name=self.string(raw["name"], f"{path}.name"),
                uid=uid,
                annotations=self.opt(raw, "annotations", path, self.annotations, {}),
                cycles=self.opt(raw, "cycles", path, self.cycles, ALWAYS),
            )
            for j, other in enumerate(out):
                if other.uid == uid:
                    self.fail(f"{path}.uid", f"duplicate pod uid {uid!r} (also pods[{j}])")
                same_name = (other.namespace, other.name) == (pod.namespace, pod.name)
                if same_name and other.cycles.overlaps(pod.cycles):
                    self.fail(f"{path}.name", f"pod {pod.ref} is also pods[{j}] in the same cycles")
            out.append(pod)
        return tuple(out)

    def annotations(self, value: object, path: str) -> Mapping[str, str]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping of strings, got {_describe(value)}")
        for key, item in value.items():
            if not isinstance(key, str):
                self.fail(path, f"annotation keys must be strings, got {_describe(key)}")
            if not isinstance(item, str):
                # YAML reads 250 as a number; Kubernetes annotations are always strings.
                shown = str(item).lower() if isinstance(item, bool) else str(item)
                quote = "" if item is None else f'; quote it: {key}: "{shown}"'
                self.fail(
                    f'{path}["{key}"]',
                    f"annotation values must be strings, got {_describe(item)}{quote}",
                )
        return MappingProxyType(dict(value))

    def processes(
        self, value: object, gpus: tuple[GpuSpec, ...], pods: tuple[PodSpec, ...]
    ) -> tuple[ProcessSpec, ...]:
        out: list[ProcessSpec] = []
        for i, item in enumerate(self.sequence(value, "processes")):
            path = f"processes[{i}]"
            raw = self.mapping(
                item, path, ("gpu", "pid"), ("pod", "qos", "cgroup_layout", "cycles")
            )
            gpu = self.gpu_index(raw["gpu"], f"{path}.gpu", gpus)
            pid = self.integer(raw["pid"], f"{path}.pid", what="a PID")
            pod: PodSpec | None = None
            if raw.get("pod") is not None:
                uid = self.string(raw["pod"], f"{path}.pod")
                pod = next((p for p in pods if p.uid == uid), None)
                if pod is None:
                    self.fail(f"{path}.pod", f"no pod with uid {uid!r} is declared in pods")
            proc = ProcessSpec(
                gpu=gpu,
                pid=pid,
                pod=None if pod is None else pod.uid,
                qos=self.opt(raw, "qos", path, self.choice(QosClass), QosClass.BURSTABLE),
                cgroup_layout=self.opt(
                    raw, "cgroup_layout", path, self.choice(CgroupLayout), _LAYOUT
                ),
                # A process lives as long as its pod unless told otherwise.
                cycles=self.opt(raw, "cycles", path, self.cycles, pod.cycles if pod else ALWAYS),
            )
            cgroup = (proc.pod, proc.qos, proc.cgroup_layout)
            for j, other in enumerate(out):
                if other.pid == pid and other.gpu == gpu:
                    self.fail(f"{path}.pid", f"duplicate pid {pid} on gpu {gpu} (processes[{j}])")
                # One PID has one cgroup file, so every GPU it uses must agree on it.
                if other.pid == pid and (other.pod, other.qos, other.cgroup_layout) != cgroup:
                    self.fail(
                        f"{path}.pid",
                        f"pid {pid} is also processes[{j}] with another pod, qos or "
                        "cgroup_layout; a process using several GPUs has one cgroup",
                    )
            out.append(proc)
        return tuple(out)

    def fault(self, item: object, path: str, gpus: tuple[GpuSpec, ...]) -> FaultSpec:
        optional = ("gpu", "error", "hang", "change_to", "identity_check_only", "cycles")
        raw = self.mapping(item, path, ("op",), optional)
        op = self.choice(FaultOp)(raw["op"], f"{path}.op")
        gpu: int | None = None
        if op.per_gpu:
            if "gpu" not in raw:
                self.fail(f"{path}.gpu", f"required for op {op.value!r}")
            gpu = self.gpu_index(raw["gpu"], f"{path}.gpu", gpus)
        elif "gpu" in raw:
            self.fail(f"{path}.gpu", f"op {op.value!r} is not per GPU; remove gpu")
        for key in ("change_to", "identity_check_only"):
            if key in raw and op is not FaultOp.UUID:
                self.fail(f"{path}.{key}", f"only the 'uuid' op takes {key}")
        choices = ("error", "hang", "change_to") if op is FaultOp.UUID else ("error", "hang")
        given = [k for k in choices if k in raw]
        if len(given) != 1:
            found = f"both {' and '.join(given)}" if given else "none"
            self.fail(path, f"give exactly one of {' or '.join(choices)}; found {found}")
        change_to = self.opt(raw, "change_to", path, self.string, None)
        if gpu is not None and change_to == gpus[gpu].uuid:
            self.fail(f"{path}.change_to", "is the GPU's own uuid, so nothing would change")
        return FaultSpec(
            op=op,
            gpu=gpu,
            error=self.opt(raw, "error", path, self.choice(GpuErrorClass), None),
            hang_seconds=self.opt(raw, "hang", path, self.seconds, None),
            change_to=change_to,
            identity_check_only=self.opt(
                raw, "identity_check_only", path, self.of(bool, "true or false"), False
            ),
            cycles=self.opt(raw, "cycles", path, self.cycles, ALWAYS),
        )
