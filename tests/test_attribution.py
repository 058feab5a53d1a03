"""Process→pod attribution: cgroup parsing, the /proc reader, the attributor."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.agent.attribution import (
    Attributor,
    FsProcRoot,
    canonical_pod_uid,
    pod_uid_from_cgroup,
)

PROC = Path(__file__).parent / "data" / "proc"
CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# The committed fake /proc: pid -> (expected pod UID or None, what the shape is).
TREE: dict[int, tuple[str | None, str]] = {
    1001: ("c24956e4-8960-494e-9986-d852c14bb53a", "v2 systemd containerd burstable"),
    1002: ("539c4d6c-9de5-43a0-bc04-20784fc9a9ce", "v2 systemd containerd besteffort"),
    1003: ("57be60bc-ad30-479c-a7bb-0f9ec7bb4486", "v2 systemd containerd guaranteed"),
    1004: ("1da27aa6-8d4b-4690-af7c-098bebb89fe4", "v2 systemd cri-o burstable"),
    1005: ("69c3b78e-5771-44f0-97be-d88bd95624a7", "v2 systemd cri-o besteffort"),
    1006: ("fb8dfada-91b4-47fb-98c0-adaf8693ed5e", "v2 systemd cri-o guaranteed"),
    1007: ("303423a4-a4a5-4b55-9579-0d8413598602", "v2 systemd cri-o conmon in the pod slice"),
    1011: ("368914c3-bfc6-426f-9eef-1afc69b4506e", "v2 cgroupfs containerd burstable"),
    1012: ("e34c1a9a-502d-4289-8ab2-3a8902c2bf2e", "v2 cgroupfs containerd besteffort"),
    1013: ("7c77d4ce-2124-4444-a5cb-1870f848e10a", "v2 cgroupfs containerd guaranteed"),
    1014: ("cd605ce2-0849-4b7e-a839-c8eb0de22da4", "v2 cgroupfs cri-o burstable"),
    1015: ("77b1101e-b9ef-45a4-9549-1547963d4f7c", "v2 cgroupfs cri-o guaranteed"),
    1016: ("d82fbdea-9aab-4bbb-ab86-c0c5a0199129", "v2 cgroupfs cri-o conmon besteffort"),
    1021: ("dd61ab40-e2b8-48e9-a958-8220f279d1b7", "v1 systemd containerd burstable, Ubuntu 20.04"),
    1022: ("03513836-e7a7-4667-9baf-d2cd349e356f", "v1 systemd containerd besteffort, 22.04"),
    1023: ("62d3dd6d-2437-4bcb-8920-d687c7b94702", "v1 systemd containerd guaranteed"),
    1024: ("918b5dd5-b483-429a-b222-67a1c5cc3a19", "v1 systemd cri-o burstable"),
    1025: ("e96b5c5b-7aaf-44f4-96b8-4efc27458f0a", "v1 systemd cri-o besteffort, 22.04"),
    1026: ("3b554bdf-c234-4eb1-abfe-b185c310889f", "v1 systemd cri-o guaranteed, CentOS 7"),
    1031: ("62ebaef2-4833-4981-9495-69422edd8b31", "v1 cgroupfs containerd burstable, 0::/"),
    1032: ("a7eed466-ceb2-47a8-a9b0-0cdc2ca5e386", "v1 cgroupfs besteffort, 0:: names a service"),
    1033: ("b4670285-33f6-4149-b093-f8b11cf0f9cc", "v1 cgroupfs containerd guaranteed, CentOS 7"),
    1034: ("db126958-dfdd-4224-ab43-b3ff0073fd8e", "v1 cgroupfs cri-o burstable"),
    1035: ("1eb2d99d-146e-4a61-b3f2-5096f53c62f2", "v1 cgroupfs cri-o guaranteed, CentOS 7"),
    1041: ("ed4774b6-ed1c-4bf5-933d-5076db367937", "kind on v2: kubelet-kubepods burstable"),
    1042: ("21ed6fac-6b98-4492-8fed-67bd224ab310", "kind on v2: kubelet-kubepods guaranteed"),
    1043: ("9e5836a1-3a38-48e3-8352-c1ccdab37b47", "kind seen from the host: docker scope prefix"),
    1044: ("d963aa7d-bbfc-44a5-8bd9-03a28215580c", "node in docker on v1: /docker/<id> prefix"),
    1045: ("751b83fb-d1e9-4141-b9a2-a112af788e89", "CI runner: /actions_job/<id> prefix, v1"),
    1046: ("299d6436-1af0-4c25-9d4b-068ae68e5660", "node inside a pod: the inner pod wins"),
    1047: ("13b35c1d-d703-449f-96c9-26a956a97ba1", "reader in a private cgroupns, systemd"),
    1048: ("04a80963-ca2c-4f4d-b00e-980d53af03d3", "reader in a private cgroupns, cgroupfs"),
    1049: ("f18f9001-b64c-4290-a409-cc0ad8743519", "v2 container cgroup already removed"),
    1050: ("02c735e2-d543-4e43-b6cc-5d39c44a9e47", "v2 cgroup nested below the container"),
    2001: (None, "systemd service"),
    2002: (None, "user login session"),
    2003: (None, "docker container without Kubernetes, v2"),
    2004: (None, "docker container without Kubernetes, v1 cgroupfs"),
    2005: (None, "root cgroup 0::/"),
    2006: (None, "init 0::/init.scope"),
    2007: (None, "v1 systemd service (containerd.service)"),
    2008: (None, "podman container"),
    2009: (None, "desktop app scope whose name holds a UUID"),
    2010: (None, "the kubelet itself"),
    2011: (None, "static pod: its UID is a config hash, not a UUID"),
    3001: (None, "malformed: binary garbage, lines missing fields"),
    3002: (None, "malformed: truncated in the middle of the UID"),
    3003: (None, "empty file"),
    3004: (None, "pid directory without a cgroup file"),
    3005: (None, "malformed: v1 lines naming two different pods"),
}

UID = "c24956e4-8960-494e-9986-d852c14bb53a"
SD = UID.replace("-", "_")
CID = "0b11a92e32372c7a0fd590fdd606d4cfe0010f17de84149a5479007b950a5cd5"


class DictProcRoot:
    """A ProcRoot over a mutable dict, so a test can replace a process under a PID."""

    def __init__(self, files: dict[int, str]) -> None:
        self.files = files
        self.reads: list[int] = []

    def read_cgroup(self, pid: int) -> str | None:
        self.reads.append(pid)
        return self.files.get(pid)


@pytest.mark.parametrize(("pid", "expected", "shape"), [(p, e, s) for p, (e, s) in TREE.items()])
def test_committed_tree(pid: int, expected: str | None, shape: str) -> None:
    """Every committed real-world shape attributes to its pod, or to nothing."""
    attributor = Attributor(FsProcRoot(PROC))
    assert attributor.pod_uid(pid) == expected, shape


def test_table_covers_every_committed_pid() -> None:
    """The expectation table and tests/data/proc list exactly the same PIDs."""
    on_disk = {int(p.name) for p in PROC.iterdir() if p.name.isdigit()}
    assert on_disk == set(TREE)


def test_pod_uids_over_the_tree() -> None:
    """pod_uids answers for every PID asked, including one that does not exist."""
    attributor = Attributor(FsProcRoot(PROC))
    pids = [*TREE, 999_999]
    expected = {pid: uid for pid, (uid, _) in TREE.items()} | {999_999: None}
    assert attributor.pod_uids(pids) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Minimal well-formed shapes.
        (f"0::/kubepods/burstable/pod{UID}/{CID}\n", UID),
        (f"0::/kubepods/pod{UID}/{CID}", UID),
        (f"0::/kubepods.slice/kubepods-pod{SD}.slice/cri-containerd-{CID}.scope", UID),
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD}.slice", UID),
        (f"0::/kubepods/besteffort/pod{UID}", UID),
        # Upper-case hex is accepted and canonicalised.
        (f"0::/kubepods/pod{UID.upper()}/{CID}", UID),
        (f"0::/kubepods.slice/kubepods-pod{SD.upper()}.slice/x.scope", UID),
        # A cgroup namespace boundary may hide the outer part of the chain.
        (f"0::/../kubepods-pod{SD}.slice/cri-containerd-{CID}.scope", UID),
        (f"0::/../pod{UID}/{CID}", UID),
        # v1 lines that agree, or that do not name a pod at all.
        (f"2:cpu:/kubepods/pod{UID}/a\n1:name=systemd:/kubepods/pod{UID}/a\n0::/", UID),
        (f"2:rdma:/\n1:memory:/kubepods/pod{UID}/a\n0::/system.slice/containerd.service", UID),
        (f"0::/kubepods/pod{UID}/a\r\n", UID),
        # A prefix before the kubelet's hierarchy is fine.
        (f"0::/a/b/c/kubepods/burstable/pod{UID}/x", UID),
        (f"0::/x.slice/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{SD}.slice", UID),
        # Not pods.
        ("", None),
        ("\n\n", None),
        ("0::", None),
        ("0::/", None),
        ("0::/kubepods.slice", None),
        ("0::/kubepods.slice/kubepods-burstable.slice", None),
        ("0::/kubepods/burstable", None),
        # Lines that are not N:controllers:/path are ignored.
        (f"/kubepods/pod{UID}/{CID}", None),
        (f"0:/kubepods/pod{UID}/{CID}", None),
        (f"x::/kubepods/pod{UID}/{CID}", None),
        (f"\u0663::/kubepods/pod{UID}/{CID}", None),  # an Arabic-Indic digit
        (f"0::kubepods/pod{UID}/{CID}", None),
        # systemd: the ancestors must be the slices the name implies.
        (f"0::/kubepods-burstable-pod{SD}.slice/x.scope", None),
        (f"0::/system.slice/kubepods-burstable-pod{SD}.slice/x.scope", None),
        (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{SD}.slice", None),
        (f"0::/kubepods.slice/kubepods-burstable-pod{SD}.slice", None),
        (f"0::/kubepods.slice/kubelet-kubepods-pod{SD}.slice", None),
        (f"0::/kubepods.slice/kubepods-gold.slice/kubepods-gold-pod{SD}.slice", None),
        (f"0::/kubepods.slice/kubepods--pod{SD}.slice", None),
        (f"0::/kubepods.slice/kubepods-pod{UID}.slice", None),  # dashes: not systemd's
        (f"0::/kubepods.slice/kubepods-pod{SD}.scope", None),
        (f"0::/kubepods.slice/kubepods-pod{SD}x.slice", None),
        # cgroupfs: pod<uid> must sit in kubepods or one of its QoS levels.
        (f"0::/pod{UID}/{CID}", None),
        (f"0::/burstable/pod{UID}/{CID}", None),
        (f"0::/other/pod{UID}/{CID}", None),
        (f"0::/kubepods/gold/pod{UID}/{CID}", None),
        (f"0::/kubepods/pod{SD}/{CID}", None),  # underscores: not cgroupfs's
        (f"0::/kubepods/pod{UID}x/{CID}", None),
        (f"0::/kubepods/pod{UID[:-1]}/{CID}", None),
        (f"0::/kubepods/pod{UID[:-1]}\uff10/{CID}", None),  # a full-width zero
        # Static pods: the kubelet names them by a config hash, not a UUID.
        ("0::/kubepods/besteffort/pod5d1e3c4b2a7f9e8d6c0b1a2f3e4d5c6b/x", None),
    ],
)
def test_pod_uid_from_cgroup(text: str, expected: str | None) -> None:
    """The parser accepts exactly the kubelet's pod cgroups and canonicalises the UID."""
    assert pod_uid_from_cgroup(text) == expected


def test_lines_naming_different_pods_give_none() -> None:
    """A file whose lines disagree about the pod is not trusted, whatever the order."""
    other = "735c2798-b316-472f-a501-8c2e38cc0579"
    a = f"2:cpu:/kubepods/pod{UID}/x"
    b = f"1:memory:/kubepods/pod{other}/x"
    assert pod_uid_from_cgroup(f"{a}\n{b}\n") is None
    assert pod_uid_from_cgroup(f"{b}\n{a}\n") is None
    assert pod_uid_from_cgroup(f"{a}\n{a}\n") == UID


def test_deepest_pod_in_a_path_wins() -> None:
    """A node running inside another cluster's pod: the inner kubelet's pod is the answer."""
    outer = "735c2798-b316-472f-a501-8c2e38cc0579"
    text = f"0::/kubepods/pod{outer}/{CID}/kubepods/besteffort/pod{UID}/{CID}"
    assert pod_uid_from_cgroup(text) == UID


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (UID, UID),
        (UID.upper(), UID),
        (SD, None),
        (UID + "\n", None),
        (" " + UID, None),
        ("", None),
        ("5d1e3c4b2a7f9e8d6c0b1a2f3e4d5c6b", None),
    ],
)
def test_canonical_pod_uid(text: str, expected: str | None) -> None:
    """Only a dashed 8-4-4-4-12 hex UUID is a pod UID, returned lower-case."""
    assert canonical_pod_uid(text) == expected


@given(st.text())
def test_arbitrary_text_never_raises(text: str) -> None:
    """Any text at all yields None or a canonical UUID, never an exception."""
    result = pod_uid_from_cgroup(text)
    assert result is None or CANONICAL.fullmatch(result)


_FRAGMENTS = st.sampled_from(
    [
        "\n",
        "0::",
        "1:name=systemd:",
        ":",
        "/",
        "..",
        "kubepods",
        "kubepods.slice",
        "kubepods-burstable.slice",
        "kubepods-burstable-pod",
        "kubelet-",
        "-",
        "burstable",
        "besteffort",
        "pod",
        ".slice",
        "cri-containerd-",
        ".scope",
        UID,
        SD,
        UID.upper(),
        CID,
    ]
)


@given(st.lists(_FRAGMENTS | st.text(max_size=4), max_size=30).map("".join))
def test_near_miss_text_never_raises(text: str) -> None:
    """Text assembled from cgroup-path fragments never raises; UIDs come out canonical."""
    result = pod_uid_from_cgroup(text)
    assert result is None or CANONICAL.fullmatch(result)
    if result is not None:
        assert result == UID  # the only UUID the fragments contain


def test_fs_proc_root_reads_the_file(tmp_path: Path) -> None:
    """FsProcRoot returns <root>/<pid>/cgroup verbatim."""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/init.scope\n")
    assert FsProcRoot(tmp_path).read_cgroup(42) == "0::/init.scope\n"


def test_fs_proc_root_defaults_to_host_proc() -> None:
    """Without a root, FsProcRoot reads /proc (the host's, under hostPID)."""
    assert FsProcRoot().root == Path("/proc")


def test_gone_process_is_none_and_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A PID that has exited, or never was, reads as None without logging."""
    caplog.set_level(logging.DEBUG, logger="capwatch.agent.attribution")
    root = FsProcRoot(tmp_path)
    assert root.read_cgroup(12345) is None
    assert root.read_cgroup(0) is None
    assert root.read_cgroup(-1) is None
    assert caplog.records == []


def test_unreadable_cgroup_is_none_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Other OS errors read as None and leave a debug record naming the PID."""
    # A directory where the file should be: an OSError that is not "gone", and
    # one that root (which ignores permission bits) still gets.
    (tmp_path / "7" / "cgroup").mkdir(parents=True)
    (tmp_path / "8").write_text("not a directory")
    caplog.set_level(logging.DEBUG, logger="capwatch.agent.attribution")
    root = FsProcRoot(tmp_path)
    assert root.read_cgroup(7) is None
    assert root.read_cgroup(8) is None
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("pid=7" in m for m in messages)
    assert any("pid=8" in m for m in messages)


def test_undecodable_bytes_do_not_fail_the_read(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are replaced, and the rest of the file still parses."""
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "cgroup").write_bytes(b"\xff\xfe\n0::/kubepods/pod" + UID.encode() + b"/x\n")
    assert Attributor(FsProcRoot(tmp_path)).pod_uid(9) == UID


def test_attributor_does_not_cache() -> None:
    """A reused PID is attributed to its new process, not to the old one's pod."""
    files = {5: f"0::/kubepods/pod{UID}/{CID}\n"}
    procs = DictProcRoot(files)
    attributor = Attributor(procs)
    assert attributor.pod_uid(5) == UID
    files[5] = "0::/user.slice/user-1000.slice/session-1.scope\n"
    assert attributor.pod_uid(5) is None
    del files[5]
    assert attributor.pod_uid(5) is None
    assert procs.reads == [5, 5, 5]


def test_pod_uids_keys_are_the_pids_asked() -> None:
    """pod_uids maps each distinct PID asked for, gone ones to None."""
    procs = DictProcRoot({1: f"0::/kubepods/pod{UID}/x", 2: "0::/init.scope"})
    assert Attributor(procs).pod_uids([1, 2, 3, 1]) == {1: UID, 2: None, 3: None}
    assert Attributor(procs).pod_uids([]) == {}
