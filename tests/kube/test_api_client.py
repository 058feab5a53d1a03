"""kube.transport and api_transport: the kubeconfig's client drives a pod view;
over TLS the server is verified against the kubeconfig's CA (or the name it gives),
the client certificate is presented, the token is sent and a rotated token file
re-read; and the answer is the caller's whatever its status."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3.exceptions

from capwatch.agent.kube.pod_requests import KubernetesPodRequests
from capwatch.agent.kube.podview import PodInformer
from capwatch.kit.clock import FakeClock, SystemClock
from capwatch.kit.errors import ConfigError
from capwatch.kube.access import TOKEN_REREAD_S, ClusterAccess
from capwatch.kube.client import api_transport
from capwatch.kube.informer import WatchPolicy
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.support import NODE, is_synced, names, wait_until
from tests.realkube.pki import Pki

BEARER = "a-bearer-token"  # what the server must see after "Bearer "
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{server: "{url}"}}
users:
- name: nobody
  user: {{}}
contexts:
- name: fake
  context: {{cluster: fake, user: nobody}}
current-context: fake
"""


def test_kubeconfig_client_drives_a_pod_view(
    kube_apiserver: FakeKubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a cluster the kubeconfig file is used; the transport it builds names
    itself by the User-Agent given and serves a working pod view."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(url=kube_apiserver.url))
    kube_apiserver.add_pod("ns", "a", node=NODE)

    client = api_transport(str(path), user_agent="capwatch-agent/node-a")
    try:
        assert client.server == kube_apiserver.url
        view = PodInformer(
            node_name=NODE,
            requests=KubernetesPodRequests(client, node_name=NODE, namespace=None),
            clock=SystemClock(),
            policy=WatchPolicy(stale_after=1.0),
        )
        view.start()
        try:
            wait_until(lambda: is_synced(view), what="sync through kubeconfig client")
            assert names(view) == {"ns/a"}
        finally:
            view.close()
    finally:
        client.close()
    agents = {r.user_agent for r in kube_apiserver.requests("list")}
    assert agents == {"capwatch-agent/node-a"}


def test_a_missing_kubeconfig_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubeconfig that does not exist raises ConfigError naming --kubeconfig."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError) as raised:
        api_transport(str(tmp_path / "absent"), user_agent="t")
    assert raised.value.option == "--kubeconfig"
    assert raised.value.__cause__ is not None


class _Seen:
    """What the TLS server saw of each request: the client certificate's CN, the
    Authorization header."""

    def __init__(self) -> None:
        self.requests: list[tuple[str | None, str | None]] = []


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[tuple[str, _Seen]]:
    """An https server on 127.0.0.1:<ephemeral> with the control plane's serving
    certificate, asking for (not requiring) a client certificate; it answers 200 with
    a JSON object, or 403 to a request with no credentials at all."""
    seen = _Seen()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
            cn = None
            for rdn in (peer or {}).get("subject", ()):
                for key, value in rdn:
                    cn = value if key == "commonName" else cn
            authorization = self.headers.get("Authorization")
            seen.requests.append((cn, authorization))
            status = 200 if cn or authorization else 403
            body = json.dumps({"kind": "Status", "code": status}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.serving.cert), str(pki.serving.key))
    context.load_verify_locations(cafile=str(pki.ca.cert))
    context.verify_mode = ssl.CERT_OPTIONAL
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _get(access: ClusterAccess, clock: FakeClock | None = None) -> int:
    transport = ApiTransport(access, user_agent="t", clock=clock)
    try:
        response = transport.request("GET", "/api", timeout=5.0)
        response.drain_conn()
        return response.status
    finally:
        transport.close()


def test_tls_with_the_kubeconfigs_ca_and_client_certificate(
    pki: Pki, tls_server: tuple[str, _Seen]
) -> None:
    """The server is verified against the given CA (its certificate names 127.0.0.1) and
    the client certificate is presented: the server sees its CN."""
    url, seen = tls_server
    access = ClusterAccess(
        server=url,
        ca_pem=pki.ca.cert.read_bytes(),
        client_cert_pem=pki.admin.cert.read_bytes(),
        client_key_pem=pki.admin.key.read_bytes(),
    )
    assert _get(access) == 200
    assert seen.requests == [("admin", None)]


def test_the_server_must_prove_itself(pki: Pki, tls_server: tuple[str, _Seen]) -> None:
    """Not trusted: the system's store does not know the test CA, and a tls-server-name
    the certificate does not carry is refused; a name it carries is accepted, and
    insecure-skip-tls-verify skips the check as the kubeconfig asked."""
    url, seen = tls_server
    with pytest.raises(urllib3.exceptions.SSLError):
        _get(ClusterAccess(server=url, token=BEARER))
    ca = pki.ca.cert.read_bytes()
    with pytest.raises(urllib3.exceptions.SSLError):
        _get(ClusterAccess(server=url, ca_pem=ca, token=BEARER, tls_server_name="elsewhere"))
    named = ClusterAccess(server=url, ca_pem=ca, token=BEARER, tls_server_name="kubernetes")
    assert _get(named) == 200
    assert _get(ClusterAccess(server=url, token=BEARER, insecure=True)) == 200
    assert [a for _, a in seen.requests] == [f"Bearer {BEARER}"] * 2


def test_a_token_file_is_re_read_as_it_rotates(
    pki: Pki, tls_server: tuple[str, _Seen], tmp_path: Path
) -> None:
    """The bound service-account token the kubelet rotates is read again once
    TOKEN_REREAD_S has passed, not before; a token file that vanishes keeps the last
    token (the server's 401 would say it expired)."""
    url, seen = tls_server
    token = tmp_path / "token"
    token.write_text("first\n")
    clock = FakeClock()
    transport = ApiTransport(
        ClusterAccess(server=url, ca_pem=pki.ca.cert.read_bytes(), token_file=str(token)),
        user_agent="t",
        clock=clock,
    )

    def get(after: float) -> None:
        clock.advance(after)
        transport.request("GET", "/api", timeout=5.0).drain_conn()

    try:
        get(0.0)
        token.write_text("second\n")
        get(1.0)
        get(TOKEN_REREAD_S)
        token.unlink()
        get(TOKEN_REREAD_S)
    finally:
        transport.close()
    assert [a for _, a in seen.requests] == [
        "Bearer first",
        "Bearer first",
        "Bearer second",
        "Bearer second",
    ]


def test_an_error_answer_is_returned_not_raised(pki: Pki, tls_server: tuple[str, _Seen]) -> None:
    """No credentials: the server's 403 comes back as the response (the caller reads
    the status); urllib3 retries nothing (one request seen)."""
    url, seen = tls_server
    assert _get(ClusterAccess(server=url, ca_pem=pki.ca.cert.read_bytes())) == 403
    assert seen.requests == [(None, None)]


def test_a_client_key_without_its_certificate_is_a_config_error(pki: Pki) -> None:
    """Half a client certificate, or PEM that is not one, is a ConfigError at start."""
    with pytest.raises(ConfigError, match="needs both"):
        ApiTransport(
            ClusterAccess(server="https://h:1", client_key_pem=pki.admin.key.read_bytes()),
            user_agent="t",
        )
    with pytest.raises(ConfigError, match="TLS material"):
        ApiTransport(ClusterAccess(server="https://h:1", ca_pem=b"not pem"), user_agent="t")
