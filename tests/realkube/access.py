"""Requests to the real API server: as admin (the client certificate) or with a token.

:class:`ApiAccess` is the half of :class:`~tests.realkube.controlplane.ControlPlane`
that talks to a running server: plain HTTPS requests, namespaces and
ServiceAccounts, TokenRequest tokens (optionally bound to a pod), and
kubeconfigs or ``kubernetes.client`` configurations for them.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.realkube import kubeconfig
from tests.realkube.pki import KeyPair, Pki

if TYPE_CHECKING:
    from kubernetes.client import Configuration


class ApiError(Exception):
    """The API server answered a request with an HTTP error."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class BoundPod:
    """The pod a bound ServiceAccount token is tied to (TokenRequest boundObjectRef)."""

    name: str
    uid: str


class ApiAccess:
    """Requests to the API server at :attr:`url`, trusting :attr:`ca_path`."""

    pki: Pki
    _contexts: dict[str, ssl.SSLContext]

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def ca_path(self) -> Path:
        raise NotImplementedError

    # -- talking to the API server ----------------------------------------------------

    def _context(self, client: KeyPair | None) -> ssl.SSLContext:
        """A TLS context trusting our CA, presenting client's certificate if given."""
        key = "" if client is None else str(client.cert)
        if key not in self._contexts:
            context = ssl.create_default_context(cafile=str(self.ca_path))
            if client is not None:
                context.load_cert_chain(str(client.cert), str(client.key))
            self._contexts[key] = context
        return self._contexts[key]

    def request_text(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        base: str | None = None,
        content_type: str = "application/json",
    ) -> str:
        """One request, as admin unless a bearer token is given; the body as text.

        base: another https://127.0.0.1:PORT signed by our CA (a component's
        secure port) in place of the API server.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request((base or self.url) + path, data=data, method=method)  # noqa: S310 - https to our own loopback server
        request.add_header("Accept", "application/json, */*")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        context = self._context(None if token is not None else self.pki.admin)
        try:
            with urllib.request.urlopen(request, context=context, timeout=timeout) as response:  # noqa: S310
                return str(response.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            with err:
                detail = err.read().decode("utf-8", errors="replace")
            raise ApiError(err.code, method, path, detail) from None

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        """One request, as admin unless a bearer token is given; the JSON answer."""
        text = self.request_text(method, path, body, token=token)
        return json.loads(text) if text else None

    def version(self) -> dict[str, str]:
        """GET /version: gitVersion, major, minor, ..."""
        answer: dict[str, str] = self.request("GET", "/version")
        return answer

    def create_namespace(self, name: str) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        created: dict[str, Any] = self.request("POST", "/api/v1/namespaces", body)
        return created

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (it stays Terminating unless kube-controller-manager runs)."""
        with contextlib.suppress(ApiError):
            self.request("DELETE", f"/api/v1/namespaces/{name}")

    def create_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        created: dict[str, Any] = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body
        )
        return created

    def token(
        self,
        namespace: str,
        service_account: str,
        *,
        audiences: Sequence[str] = (),
        expiration_seconds: int = 3600,
        pod: BoundPod | None = None,
    ) -> str:
        """A token for the ServiceAccount from the TokenRequest API.

        pod: bind the token to that pod (name and uid must match a live pod that
        runs as this ServiceAccount); it stops working when the pod is deleted.
        No audiences means the API server's own. The API server refuses an
        expiration under 600 seconds.
        """
        spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        if pod is not None:
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "uid": pod.uid,
            }
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        answer = self.request("POST", path, body)
        return str(answer["status"]["token"])

    def token_kubeconfig(self, token: str, path: Path, *, namespace: str | None = None) -> Path:
        """Write a kubeconfig that authenticates with token; return its path."""
        text = kubeconfig.render(self.url, self.ca_path, "token", {"token": token}, namespace)
        return kubeconfig.write_private(path, text)

    def token_configuration(self, token: str) -> Configuration:
        """A kubernetes.client.Configuration that authenticates with token."""
        from kubernetes.client import Configuration

        config = Configuration()
        config.host = self.url
        config.ssl_ca_cert = str(self.ca_path)
        config.api_key = {"authorization": f"Bearer {token}"}
        return config

    def admin_configuration(self) -> Configuration:
        """A kubernetes.client.Configuration for the admin client certificate."""
        from kubernetes.client import Configuration

        config = Configuration()
        config.host = self.url
        config.ssl_ca_cert = str(self.ca_path)
        config.cert_file = str(self.pki.admin.cert)
        config.key_file = str(self.pki.admin.key)
        return config
