"""The reads behind :mod:`capwatch.agent.departure`: the agent's own pod, its DaemonSet, its node.

Three GETs at shutdown, each bounded by the requests' own timeout: the pod (for
the DaemonSet that controls it), the DaemonSet, the node. A 404 of the DaemonSet
or of the node is an answer (deleted); 401 or 403 means the release's access is
already being removed (uninstall); anything else that stops a read (a timeout,
a 5xx, a body that is not an object) is "cannot tell", and the caps stay.
"""

from __future__ import annotations

from typing import Any, Protocol

from capwatch.agent.departure import Departure, staying_unknown
from capwatch.agent.kube.selection import controller_daemonset, judge
from capwatch.kit.errors import CapwatchError
from capwatch.kube.client import ObjectReadError
from capwatch.kube.wire import ApiStatusError

_REVOKED = (401, 403)


class ObjectGetter(Protocol):
    def get(self, path: str) -> dict[str, Any]:
        """The object at ``path``; raises ApiStatusError, or ObjectReadError short of
        an HTTP answer."""
        ...


class _Deleted(Exception):
    """The object is not found (HTTP 404)."""


class KubeDepartureCheck:
    """Asks the API server whether this agent's DaemonSet still runs on its node."""

    def __init__(
        self, objects: ObjectGetter, *, namespace: str, pod_name: str, node_name: str
    ) -> None:
        self._objects = objects
        self._namespace = namespace
        self._pod = pod_name
        self._node = node_name

    def check(self) -> Departure:
        try:
            return self._check()
        except ApiStatusError as err:
            if err.status in _REVOKED:
                return Departure(
                    leaving=True,
                    reason=f"the agent's access is refused ({err}): the release is being removed",
                )
            return staying_unknown(str(err))
        except CapwatchError as err:
            return staying_unknown(str(err))

    def _check(self) -> Departure:
        ns = self._namespace
        try:
            pod = self._get(f"/api/v1/namespaces/{ns}/pods/{self._pod}")
        except _Deleted:
            return staying_unknown(f"pod {ns}/{self._pod} not found")
        owner = controller_daemonset(pod)
        if owner is None:
            return Departure(leaving=True, reason=f"pod {ns}/{self._pod} is not run by a DaemonSet")
        try:
            daemonset: dict[str, Any] | None = self._get(
                f"/apis/apps/v1/namespaces/{ns}/daemonsets/{owner}"
            )
        except _Deleted:
            daemonset = None
        node: dict[str, Any] | None = None
        if daemonset is not None:
            try:
                node = self._get(f"/api/v1/nodes/{self._node}")
            except _Deleted:
                node = None
        return judge(daemonset=daemonset, name=f"{ns}/{owner}", node=node, node_name=self._node)

    def _get(self, path: str) -> dict[str, Any]:
        try:
            found = self._objects.get(path)
        except ApiStatusError as err:
            if err.status == 404:
                raise _Deleted from err
            raise
        if not isinstance(found, dict):
            raise ObjectReadError(f"GET {path}: not an object")
        return found
