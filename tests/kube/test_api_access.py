"""kube.access: what a kubeconfig or the in-cluster environment says about the API
server and this process's credentials, and the one-line refusals of what capwatch
does not do."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from capwatch.kit.errors import ConfigError
from capwatch.kube.access import ClusterAccess, from_environment, from_kubeconfig, in_cluster

CA = b"-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"
CERT = b"-----BEGIN CERTIFICATE-----\nclient\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN EC PRIVATE KEY-----\nkey\n-----END EC PRIVATE KEY-----\n"


def kubeconfig(
    path: Path,
    *,
    cluster: dict[str, object] | None = None,
    user: dict[str, object] | None = None,
    current: str | None = "main",
    name: str = "main",
) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster or {"server": "https://10.1.2.3:6443"}}],
        "users": [{"name": name, "user": user or {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    if current is not None:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_current_contexts_server_and_inline_credentials(tmp_path: Path) -> None:
    """The CA, client certificate and key given as -data are decoded; the server's trailing
    slash dropped (paths are appended to it); the source names the file."""
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://api.example:6443/", "certificate-authority-data": b64(CA)},
        user={"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)},
    )
    assert from_kubeconfig(str(path), {}) == ClusterAccess(
        server="https://api.example:6443",
        ca_pem=CA,
        client_cert_pem=CERT,
        client_key_pem=KEY,
        source=str(path),
    )


def test_file_paths_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    """certificate-authority, client-certificate, client-key and tokenFile name files
    relative to the kubeconfig's own directory, as kubectl reads them."""
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "ca.crt").write_bytes(CA)
    (folder / "c.crt").write_bytes(CERT)
    (folder / "c.key").write_bytes(KEY)
    path = kubeconfig(
        folder / "config",
        cluster={"server": "https://h:1", "certificate-authority": "ca.crt"},
        user={"client-certificate": "c.crt", "client-key": "c.key", "tokenFile": "tok"},
    )
    access = from_kubeconfig(str(path), {})
    assert (access.ca_pem, access.client_cert_pem, access.client_key_pem) == (CA, CERT, KEY)
    assert access.token_file == str(folder.resolve() / "tok")


def test_token_basic_auth_server_name_and_insecure(tmp_path: Path) -> None:
    """A static token, username/password, tls-server-name and insecure-skip-tls-verify
    are carried as given."""
    path = kubeconfig(
        tmp_path / "config",
        cluster={
            "server": "https://h:1",
            "tls-server-name": "kubernetes.default",
            "insecure-skip-tls-verify": True,
        },
        user={"token": "abc", "username": "u", "password": "p"},
    )
    access = from_kubeconfig(str(path), {})
    assert (access.token, access.basic_auth) == ("abc", "u:p")
    assert (access.tls_server_name, access.insecure) == ("kubernetes.default", True)


def test_kubeconfig_list_merges_first_definition_winning(tmp_path: Path) -> None:
    """$KUBECONFIG's files merge as kubectl merges them: a missing one is skipped, the
    first to set current-context or to name a cluster wins."""
    first = kubeconfig(tmp_path / "a", cluster={"server": "https://first:1"}, current="main")
    second = kubeconfig(tmp_path / "b", cluster={"server": "https://second:1"}, current="other")
    listed = f"{tmp_path / 'missing'}:{first}:{second}"
    assert from_kubeconfig(None, {"KUBECONFIG": listed}).server == "https://first:1"


@pytest.mark.parametrize(
    ("cluster", "user", "current", "message"),
    [
        (None, None, None, "sets no current-context"),
        (None, None, "elsewhere", "no context named 'elsewhere'"),
        ({"server": "ftp://h"}, None, "main", r"has no http\(s\) server"),
        ({"server": "https://h", "proxy-url": "http://p"}, None, "main", "proxy-url"),
        (None, {"exec": {"command": "aws"}}, "main", "exec plugin, which capwatch does not run"),
        (None, {"auth-provider": {"name": "gcp"}}, "main", "auth-provider plugin"),
        (None, {"client-key-data": "not base64!"}, "main", "cannot load"),
    ],
)
def test_what_capwatch_cannot_use_is_one_config_error(
    tmp_path: Path,
    cluster: dict[str, object] | None,
    user: dict[str, object] | None,
    current: str | None,
    message: str,
) -> None:
    """Each is a ConfigError naming --kubeconfig and saying what is wrong, never a request
    sent somewhere, or as someone, the file did not say."""
    path = kubeconfig(tmp_path / "config", cluster=cluster, user=user, current=current)
    with pytest.raises(ConfigError, match=message) as raised:
        from_kubeconfig(str(path), {})
    assert raised.value.option == "--kubeconfig"


def test_a_missing_or_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    """An explicit path that does not exist, and a file that is not a kubeconfig, are
    ConfigErrors with their cause chained."""
    with pytest.raises(ConfigError) as missing:
        from_kubeconfig(str(tmp_path / "absent"), {})
    assert isinstance(missing.value.__cause__, FileNotFoundError)
    (tmp_path / "list").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="not a kubeconfig"):
        from_kubeconfig(str(tmp_path / "list"), {})
    (tmp_path / "broken").write_text("clusters: [\n")
    with pytest.raises(ConfigError, match="cannot load"):
        from_kubeconfig(str(tmp_path / "broken"), {})


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    """In a pod: the service's host and port (an IPv6 address in brackets), the account's
    CA, and its token file to be re-read (the kubelet rotates it)."""
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "token").write_text("t0")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster(env, account=tmp_path) == ClusterAccess(
        server="https://[fd00::1]:443",
        ca_pem=CA,
        token_file=str(tmp_path / "token"),
        source="in-cluster",
    )


def test_in_cluster_without_its_credentials_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KUBERNETES_SERVICE_HOST set the in-cluster account is used (a kubeconfig
    ignored); without its files, or without the port, that is a ConfigError naming
    in-cluster."""
    with pytest.raises(ConfigError, match="service account") as raised:
        in_cluster(
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
            account=tmp_path,
        )
    assert raised.value.option == "in-cluster"
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_PORT"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, account=tmp_path)
    if not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
        with pytest.raises(ConfigError) as loaded:
            from_environment(str(kubeconfig(tmp_path / "config")))
        assert loaded.value.option == "in-cluster"
