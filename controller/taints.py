"""DeviceTaintRules for faulted GPUs: which rule each faulted device should have (pure).

A GPU with an active device fault (the agent's categories: ``xid``, ``gpu_lost``,
``ecc_uncorrected``, ``row_remap_failure``) on a node whose DRA driver's
ResourceSlice names it (the agent streams the driver, pool and device) gets one
``resource.k8s.io/v1`` DeviceTaintRule selecting exactly that device:

- the taint's key is :data:`TAINT_KEY` (``capwatch.io/gpu-fault``) and its value
  the fault's category; with several faults at once, the category whose effect
  is strongest (then the first of :data:`CATEGORIES`) names the taint;
- its effect is the operator's choice per category (``None`` by default:
  visible, changes no placement; ``NoSchedule``: the scheduler allocates the
  device to no new claim; ``NoExecute``: the device-taint eviction controller
  evicts the pods using it);
- a DeviceTaint has no message: the rule's ``capwatch.io/message`` annotation
  says which GPU, on which node, with which faults;
- labels ``app.kubernetes.io/managed-by: capwatch`` and the release's
  ``app.kubernetes.io/instance`` (plus the node's name): two releases never
  touch each other's rules, and the chart's cleanup finds its own.

A faulted GPU no slice names (``dra_driver_name`` empty on the stream) gets no
rule: that is reported, with the reason, as an :class:`Untainted` entry.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from capwatch.controller.conditions import GpuSummary
from capwatch.kit.errors import ConfigError

API_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"
TAINT_KEY = "capwatch.io/gpu-fault"
MANAGED_BY = "capwatch"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
INSTANCE_LABEL = "app.kubernetes.io/instance"
NODE_LABEL = "capwatch.io/node"
MESSAGE_ANNOTATION = "capwatch.io/message"
UUID_ANNOTATION = "capwatch.io/gpu-uuid"
# The agent's fault categories (agent/health/faults.py FaultKind), in the order a tie
# between two faults' effects is broken.
CATEGORIES = ("gpu_lost", "xid", "ecc_uncorrected", "row_remap_failure")
MESSAGE_LIMIT = 1024
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class Effect(str, Enum):
    NONE = "None"
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"

    @property
    def strength(self) -> int:
        return (Effect.NONE, Effect.NO_SCHEDULE, Effect.NO_EXECUTE).index(self)


@dataclass(frozen=True, kw_only=True)
class TaintPolicy:
    """What the operator chose: on or off, the effect per category, the hold-down."""

    release: str
    enabled: bool = True
    effects: Mapping[str, Effect] = field(default_factory=dict)
    hold_down_s: float = 300.0

    def effect(self, category: str) -> Effect:
        return self.effects.get(category, Effect.NONE)

    def selector(self) -> str:
        """The label selector of this release's rules."""
        return f"{MANAGED_BY_LABEL}={MANAGED_BY},{INSTANCE_LABEL}={self.release}"


def parse_effect(flag: str, text: str) -> tuple[str, Effect]:
    """``CATEGORY=EFFECT`` (``gpu_lost=NoExecute``), or ConfigError naming what is wrong."""
    category, sep, value = text.partition("=")
    category, value = category.strip(), value.strip()
    if not sep or category not in CATEGORIES:
        raise ConfigError(
            flag, f"{text!r}: want CATEGORY=EFFECT, CATEGORY one of {', '.join(CATEGORIES)}"
        )
    try:
        return category, Effect(value)
    except ValueError:
        choices = ", ".join(e.value for e in Effect)
        raise ConfigError(flag, f"{text!r}: the effect must be one of {choices}") from None


@dataclass(frozen=True, kw_only=True)
class DeviceTaint:
    """One rule as it should be: the device, the taint, and what a person reads."""

    node: str
    index: int
    uuid: str
    driver: str
    pool: str
    device: str
    category: str
    effect: Effect
    faults: tuple[str, ...]  # the faults' summaries (XID 79, GPU lost, ...)

    def name(self, release: str) -> str:
        return rule_name(release, self.driver, self.pool, self.device)

    @property
    def spec_key(self) -> tuple[str, str, str]:
        """What a rule already in place must match not to be written again."""
        return (TAINT_KEY, self.category, self.effect.value)

    def message(self) -> str:
        text = (
            f"GPU {self.index} ({self.uuid or 'unknown UUID'}) on node {self.node}, device "
            f"{self.driver}/{self.pool}/{self.device}: {', '.join(self.faults)} "
            f"(capwatch, effect {self.effect.value})"
        )
        return text[:MESSAGE_LIMIT]


@dataclass(frozen=True, kw_only=True)
class Untainted:
    """A faulted GPU that gets no rule, and why."""

    node: str
    index: int
    uuid: str
    faults: tuple[str, ...]
    why: str

    def message(self) -> str:
        return (
            f"GPU {self.index} ({self.uuid or 'unknown UUID'}): {', '.join(self.faults)}; "
            f"no DeviceTaintRule: {self.why}"
        )[:MESSAGE_LIMIT]


def rule_name(release: str, driver: str, pool: str, device: str) -> str:
    """A stable name per device and release: readable where it can be, always unique."""
    digest = hashlib.sha256(f"{driver}/{pool}/{device}".encode()).hexdigest()
    readable = f"{release}-{pool}-{device}".lower()
    if len(readable) <= 200 and _NAME.fullmatch(readable):
        return f"{readable}-{digest[:8]}"
    return f"{release}-{digest[:24]}"


def device_taints(
    node: str, gpus: Iterable[GpuSummary], policy: TaintPolicy
) -> tuple[dict[str, DeviceTaint], list[Untainted]]:
    """The rules a node's faulted GPUs should have (by rule name), and the faulted GPUs
    that cannot have one."""
    wanted: dict[str, DeviceTaint] = {}
    untainted: list[Untainted] = []
    for gpu in gpus:
        kinds = [kind for kind in gpu.fault_kinds if kind in CATEGORIES]
        if not kinds:
            continue
        if gpu.dra_device is None:
            untainted.append(
                Untainted(
                    node=node,
                    index=gpu.index,
                    uuid=gpu.uuid,
                    faults=gpu.faults,
                    why="no ResourceSlice of this node names the GPU",
                )
            )
            continue
        category = max(
            kinds,
            key=lambda kind: (policy.effect(kind).strength, -CATEGORIES.index(kind)),
        )
        driver, pool, device = gpu.dra_device
        taint = DeviceTaint(
            node=node,
            index=gpu.index,
            uuid=gpu.uuid,
            driver=driver,
            pool=pool,
            device=device,
            category=category,
            effect=policy.effect(category),
            faults=gpu.faults,
        )
        wanted[taint.name(policy.release)] = taint
    return wanted, untainted


def rule_object(taint: DeviceTaint, policy: TaintPolicy) -> dict[str, Any]:
    """The DeviceTaintRule to create (or to replace one with, its resourceVersion added)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": taint.name(policy.release),
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                INSTANCE_LABEL: policy.release,
                NODE_LABEL: taint.node,
            },
            "annotations": {MESSAGE_ANNOTATION: taint.message(), UUID_ANNOTATION: taint.uuid},
        },
        "spec": {
            "deviceSelector": {"driver": taint.driver, "pool": taint.pool, "device": taint.device},
            "taint": {"key": TAINT_KEY, "value": taint.category, "effect": taint.effect.value},
        },
    }


@dataclass(frozen=True, kw_only=True)
class PlacedRule:
    """A rule of this release as the API server holds it."""

    name: str
    node: str
    spec_key: tuple[str, str, str]
    resource_version: str


def placed_rule(obj: Mapping[str, Any]) -> PlacedRule | None:
    """A listed rule's identity and taint, or None when it is not a rule we could write."""
    metadata = obj.get("metadata") or {}
    taint = (obj.get("spec") or {}).get("taint") or {}
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    return PlacedRule(
        name=name,
        node=str((metadata.get("labels") or {}).get(NODE_LABEL) or ""),
        spec_key=(
            str(taint.get("key") or ""),
            str(taint.get("value") or ""),
            str(taint.get("effect") or ""),
        ),
        resource_version=str(metadata.get("resourceVersion") or ""),
    )
