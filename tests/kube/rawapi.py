"""Raw API calls as controller/kube.py makes them: ``ApiClient.param_serialize`` and
``call_api`` with JSON bodies and raw JSON answers, and watch streams read line by line.

For the fake API server's own tests: every request goes through the real client's
configuration, headers (User-Agent), serialization and connection pool.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import kubernetes.client

from tests.fakes.kube_apiserver import FakeKubeApiServer

SMP = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class Reachable(Protocol):
    """A server ``raw_request`` can reach: its URL (and TLS context, for https)."""

    @property
    def url(self) -> str: ...


def client_for(server: FakeKubeApiServer, *, user_agent: str) -> kubernetes.client.ApiClient:
    """A real ApiClient for the fake, retries off, naming itself ``user_agent``."""
    configuration = kubernetes.client.Configuration(host=server.url)
    configuration.retries = False
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = user_agent
    return client


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
    client: kubernetes.client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str] | None = None,
    body: object = None,
    content_type: str = "application/json",
    timeout: float = 5.0,
) -> Answer:
    """One request, as controller/kube.py makes it; the answer whatever its status."""
    _, url, headers, serialized, _ = client.param_serialize(
        method,
        path,
        query_params=list((query or {}).items()),
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = client.call_api(
        method, url, header_params=headers, body=serialized, _request_timeout=(timeout, timeout)
    )
    data = response.read()
    return Answer(
        status=response.status,
        headers=dict(response.getheaders()),
        body=json.loads(data) if data else {},
    )


class Watch:
    """A watch stream opened through ``call_api``, read one event at a time."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        path: str,
        query: Mapping[str, str],
        *,
        read_timeout: float = 10.0,
    ) -> None:
        _, url, headers, _, _ = client.param_serialize(
            "GET",
            path,
            query_params=[("watch", "true"), *query.items()],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = client.call_api(
            "GET", url, header_params=headers, _request_timeout=(5.0, read_timeout)
        )
        self.raw = response.response
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
    """A plain http.client request, for what the kubernetes client will not send (over
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
