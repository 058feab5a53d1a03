"""Raw API calls as controller/kube.py makes them: :class:`ApiTransport` requests with
JSON bodies and raw JSON answers, and watch streams read line by line.

For the fake API server's own tests: every request goes through capwatch's own
transport: its headers (User-Agent, credentials) and connection pool.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from capwatch.kube.access import ClusterAccess
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer

SMP = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class Reachable(Protocol):
    """A server ``raw_request`` can reach: its URL (and TLS context, for https)."""

    @property
    def url(self) -> str: ...


def client_for(server: FakeKubeApiServer, *, user_agent: str) -> ApiTransport:
    """capwatch's transport to the fake, naming itself ``user_agent``."""
    return ApiTransport(ClusterAccess(server=server.url), user_agent=user_agent)


@dataclass(frozen=True, kw_only=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: dict[str, Any]

    @property
    def reason(self) -> str:
        """A Status answer's reason (checked to be a well-formed Status)."""
        assert self.body["kind"] == "Status", self.body
        assert self.body["status"] == "Failure"
        assert self.body["code"] == self.status
        return str(self.body["reason"])

    @property
    def rv(self) -> str:
        return str(self.body["metadata"]["resourceVersion"])


def call(
    client: ApiTransport,
    method: str,
    path: str,
    *,
    query: Mapping[str, str] | None = None,
    body: object = None,
    content_type: str = "application/json",
    timeout: float = 5.0,
) -> Answer:
    """One request, as controller/kube.py makes it; the answer whatever its status."""
    response = client.request(
        method,
        path,
        query=query,
        body=None if body is None else json.dumps(body).encode(),
        content_type=content_type,
        timeout=(timeout, timeout),
    )
    try:
        data = response.data
    finally:
        response.release_conn()
    return Answer(
        status=response.status,
        headers=dict(response.headers),
        body=json.loads(data) if data else {},
    )


class Watch:
    """A watch stream opened through the transport, read one event at a time."""

    def __init__(
        self,
        client: ApiTransport,
        path: str,
        query: Mapping[str, str],
        *,
        read_timeout: float = 10.0,
    ) -> None:
        self.raw = client.request(
            "GET", path, query={"watch": "true", **query}, timeout=(5.0, read_timeout)
        )
        assert self.raw.status == 200, self.raw.status
        self._lines = self._read_lines()

    def _read_lines(self) -> Iterator[str]:
        buffer = b""
        for chunk in self.raw.stream(amt=None, decode_content=False):
            buffer += bytes(chunk)
            *complete, buffer = buffer.split(b"\n")
            yield from (line.decode() for line in complete if line.strip())

    def next(self) -> dict[str, Any]:
        """The next event; StopIteration when the server ended the stream cleanly."""
        return dict(json.loads(next(self._lines)))

    def take(self, count: int) -> list[tuple[str, str]]:
        """(type, metadata.name or "") of the next ``count`` events."""
        out = []
        for _ in range(count):
            event = self.next()
            out.append((event["type"], event["object"]["metadata"].get("name", "")))
        return out

    def rest(self) -> list[dict[str, Any]]:
        """Every event until the server ends the stream."""
        return [json.loads(line) for line in self._lines]

    def close(self) -> None:
        # Closed before it goes back to the pool: a half-read stream is never reused.
        self.raw.close()
        self.raw.release_conn()


def raw_request(
    server: Reachable,
    method: str,
    path: str,
    *,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """A plain http.client request, for what the transport will not send (over
    TLS with the server's ``ssl`` context, as admin, when it has one)."""
    url = urlsplit(server.url)
    context = getattr(server, "ssl", None)
    connection: http.client.HTTPConnection
    if url.scheme == "https":
        connection = http.client.HTTPSConnection(
            url.hostname or "", url.port, timeout=10, context=context
        )
    else:
        connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        data = response.read()
        return Answer(
            status=response.status,
            headers=dict(response.getheaders()),
            body=json.loads(data) if data else {},
        )
    finally:
        connection.close()
