"""``GET /readyz`` for the kubelet's probe: 200 or 503 with a short text body.

The HTTP side (404 for other paths, 405 for other methods, no access log,
deadlines, a connection limit that evicts squatters so a probe is always
answered) is :mod:`capwatch.server.http.serving`'s, shared with the metrics endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from capwatch.server.http.serving import (
    HEAD_TIMEOUT_S,
    MAX_CONNECTIONS,
    PathServer,
    Request,
    Response,
)

PATH = "/readyz"


@dataclass(frozen=True, kw_only=True)
class Answer:
    status: int  # 200 or 503
    body: str


def _route(answer: Callable[[], Answer]) -> Callable[[Request], Awaitable[Response]]:
    async def respond(request: Request) -> Response:
        given = answer()
        return Response(status=given.status, body=given.body.encode())

    return respond


class ReadyzServer(PathServer):
    """Serves ``answer()`` on ``/readyz`` (and ``extra_routes``, for the controller's
    ``/healthz``). ``start`` raises OSError if the port is taken."""

    def __init__(
        self,
        answer: Callable[[], Answer],
        *,
        host: str = "0.0.0.0",  # noqa: S104 - the kubelet probes the pod IP
        port: int = 8081,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        extra_routes: Mapping[str, Callable[[], Answer]] | None = None,
    ) -> None:
        routes = {PATH: answer, **(extra_routes or {})}
        super().__init__(
            {path: _route(given) for path, given in routes.items()},
            host=host,
            port=port,
            max_connections=max_connections,
            head_timeout_s=head_timeout_s,
        )
