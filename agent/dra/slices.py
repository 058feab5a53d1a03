"""This node's DRA devices as its ResourceSlices publish them, one pool generation at a time.

A DRA driver publishes each pool of devices (NVIDIA's GPU driver: one pool per node,
named for the node) as one or more ResourceSlices, all carrying the pool's
``generation`` and ``resourceSliceCount``. When the driver republishes (a restart, a
device change) it writes the pool's slices again under a higher generation and then
deletes the old ones; for a while both are listed, and the new generation may be
incomplete. The scheduler trusts only a pool's newest generation, and only once all of
its slices are there; so does capwatch:

- slices of an older generation than the pool's newest are ignored;
- a pool whose newest generation has fewer slices than its ``resourceSliceCount``
  resolves no device (it is being republished);
- a device resolves to the GPU UUID its attribute names (``--dra-uuid-attribute``).

:func:`node_devices` is pure: objects as the API server serves them (resource.k8s.io/v1)
in, a :class:`NodeDevices` out, whose :meth:`NodeDevices.resolve` says either which
GPU a device is or, in one phrase, why it cannot say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_UUID_ATTRIBUTE = "uuid"


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
class Pool:
    """One pool's newest generation: its devices' UUIDs (None: no UUID attribute)."""

    driver: str
    name: str
    generation: int
    slices: int
    expected: int
    devices: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.slices >= self.expected


@dataclass(frozen=True, kw_only=True)
class NodeDevices:
    """This node's pools, by (driver, pool name)."""

    pools: Mapping[tuple[str, str], Pool] = field(default_factory=dict)
    uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE

    def resolve(self, device: DeviceName) -> tuple[str | None, str]:
        """``(uuid, "")`` for a device this node's newest complete pool names, else
        ``(None, why)``."""
        pool = self.pools.get((device.driver, device.pool))
        if pool is None:
            return None, f"no ResourceSlice of this node lists pool {device.driver}/{device.pool}"
        if not pool.complete:
            return None, (
                f"pool {device.driver}/{device.pool} generation {pool.generation} has "
                f"{pool.slices} of its {pool.expected} slices (being republished)"
            )
        if device.device not in pool.devices:
            return None, (
                f"device {device.device} is not in pool {device.driver}/{device.pool} "
                f"generation {pool.generation}"
            )
        uuid = pool.devices[device.device]
        if uuid is None:
            return None, f"device {device} has no {self.uuid_attribute!r} attribute"
        return uuid, ""

    def names(self) -> dict[str, DeviceName]:
        """GPU UUID -> the device name its complete pool gives it (the DRA mirror's names)."""
        return {
            uuid: DeviceName(driver=pool.driver, pool=pool.name, device=device)
            for pool in self.pools.values()
            if pool.complete
            for device, uuid in pool.devices.items()
            if uuid is not None
        }


NO_DEVICES = NodeDevices()


def node_devices(
    slices: Iterable[Mapping[str, Any]], *, node: str, uuid_attribute: str
) -> NodeDevices:
    """The newest generation of each of this node's pools (see the module docstring)."""
    newest: dict[tuple[str, str], tuple[int, int, list[Mapping[str, Any]]]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        generation = _integer(pool.get("generation"))
        expected = max(1, _integer(pool.get("resourceSliceCount")))
        held = newest.get(key)
        if held is None or generation > held[0]:
            newest[key] = (generation, expected, [spec])
        elif generation == held[0]:
            held[2].append(spec)
    pools = {}
    for (driver, name), (generation, expected, specs) in newest.items():
        devices: dict[str, str | None] = {}
        for spec in specs:
            for device in spec.get("devices") or []:
                if device.get("name"):
                    attributes = device.get("attributes") or {}
                    devices[str(device["name"])] = _uuid(attributes, driver, uuid_attribute)
        pools[(driver, name)] = Pool(
            driver=driver,
            name=name,
            generation=generation,
            slices=len(specs),
            expected=expected,
            devices=devices,
        )
    return NodeDevices(pools=pools, uuid_attribute=uuid_attribute)


def _integer(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _uuid(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    # An unqualified attribute name is in the driver's own domain: both spellings.
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return None
