"""Every version of an object as the API server commits it: a watch as admin, on a thread.

Polling can miss a version that lives for less than one poll (a Lease released and
taken over within a retry period); a watch cannot. The watch asks the server to end
it every few seconds and resumes from the last resourceVersion, so :meth:`stop`
returns within that, and no version in between is lost.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
import urllib.request
from datetime import datetime
from typing import Any

from tests.realkube.controlplane import ControlPlane

WATCH_S = 3  # the server ends each watch after this


def micro_time(text: str) -> float:
    """A MicroTime/Time (RFC 3339, ``Z``) as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class ObjectWatch:
    """The versions of the objects at ``collection`` named ``name``, in commit order."""

    def __init__(self, plane: ControlPlane, collection: str, name: str) -> None:
        self._url = plane.url + collection
        self._name = name
        self._context = ssl.create_default_context(cafile=str(plane.ca_path))
        self._context.load_cert_chain(str(plane.pki.admin.cert), str(plane.pki.admin.key))
        self._lock = threading.Lock()
        self._versions: list[tuple[str, dict[str, Any]]] = []  # (event type, object)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def __enter__(self) -> ObjectWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=WATCH_S + 10)

    @property
    def versions(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            if self._error is not None:
                raise AssertionError(f"the watch of {self._name} failed: {self._error!r}")
            return list(self._versions)

    def specs(self) -> list[dict[str, Any]]:
        """The spec of every version (ADDED, MODIFIED), in order."""
        return [obj.get("spec", {}) for kind, obj in self.versions if kind != "DELETED"]

    def _run(self) -> None:
        version = "0"  # "0": start with the current state (an ADDED event), then follow
        try:
            while not self._stop.is_set():
                query = urllib.parse.urlencode(
                    {
                        "watch": "true",
                        "fieldSelector": f"metadata.name={self._name}",
                        "resourceVersion": version,
                        "timeoutSeconds": str(WATCH_S),
                    }
                )
                request = urllib.request.Request(f"{self._url}?{query}")  # noqa: S310 - our loopback server
                with urllib.request.urlopen(  # noqa: S310
                    request, context=self._context, timeout=WATCH_S + 30
                ) as response:
                    for line in response:
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise AssertionError(f"watch ERROR: {obj}")
                        version = obj["metadata"]["resourceVersion"]
                        with self._lock:
                            # A re-watch from "0" (nothing seen yet) replays the current one.
                            if version not in {
                                o["metadata"]["resourceVersion"] for _, o in self._versions
                            }:
                                self._versions.append((event["type"], obj))
        except BaseException as err:  # noqa: BLE001 - reported by versions
            with self._lock:
                self._error = err
