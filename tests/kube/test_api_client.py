"""api_client_from_environment: kubeconfig and in-cluster configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kube.client import KubernetesPodRequests, api_client_from_environment
from agent.kube.informer import WatchPolicy
from agent.kube.podview import PodInformer
from kit.clock import SystemClock
from kit.errors import ConfigError
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.support import NODE, is_synced, names, wait_until

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
    """Outside a cluster the kubeconfig file is used; the client it builds has
    urllib3 retries off (the view owns retries), TCP keepalive on, and serves a
    working pod view."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(url=kube_apiserver.url))
    kube_apiserver.add_pod("ns", "a", node=NODE)

    client = api_client_from_environment(str(path))
    try:
        assert client.configuration.host == kube_apiserver.url
        assert client.configuration.retries is False
        assert client.configuration.keep_alive is True
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


def test_missing_kubeconfig_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubeconfig that does not exist raises ConfigError naming --kubeconfig."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError) as raised:
        api_client_from_environment(str(tmp_path / "absent"))
    assert raised.value.option == "--kubeconfig"
    assert raised.value.__cause__ is not None


def test_in_cluster_without_service_account_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With KUBERNETES_SERVICE_HOST set the in-cluster loader is used (and the
    kubeconfig ignored); without a service-account token that is a ConfigError."""
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running inside a real pod")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConfigError) as raised:
        api_client_from_environment("/nonexistent/kubeconfig")
    assert raised.value.option == "in-cluster"
