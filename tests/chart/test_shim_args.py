"""The rendered readyz container's command line, as the real ``capwatch shim`` reads it."""

from __future__ import annotations

import pytest

from capwatch.cli import _parser  # the real `capwatch` parser: what the image will accept
from capwatch.server.settings import server_settings
from capwatch.shim import shim_settings
from tests.chart.support import VARIANTS, Manifests, ports


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_shim_args_parse_into_the_probed_port_and_the_agents_socket(
    rendered: dict[str, Manifests], variant: str
) -> None:
    """The readyz container's args and env parse through `capwatch shim`: it serves the
    probed port on every address and follows a unix socket the agent listens on."""
    manifests = rendered[variant]
    shim, agent = manifests.container("readyz"), manifests.container("agent")
    assert shim["command"] == ["capwatch"]
    namespace = _parser().parse_args(shim["args"])
    assert namespace.command == "shim"
    env = {e["name"]: e.get("value", "") for e in shim.get("env", [])}
    settings = shim_settings(namespace, env)
    connection = settings.connection
    assert settings.readyz_port == shim["readinessProbe"]["httpGet"]["port"] == 8081
    assert settings.readyz_port == ports(shim)["readyz"]
    assert settings.readyz_address == "0.0.0.0"  # the kubelet probes the pod IP
    assert not connection.tls
    assert connection.target.startswith("unix:///")
    # The TLS files exist only in the pod; the listeners are what is checked here.
    agent_args = [a for a in agent["args"] if not a.startswith("--grpc-tls-")]
    agent_namespace = _parser().parse_args(agent_args)
    agent_env = {e["name"]: e.get("value", "") for e in agent["env"]}
    listeners = server_settings(agent_namespace, agent_env).listeners
    assert connection.target in [listener.address for listener in listeners]
