"""The fake proc tree: rendering real cgroup formats, and the round trip through attribution."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.agent.attribution import Attributor, FsProcRoot, pod_uid_from_cgroup
from capwatch.agent.sim.proctree import CgroupLayout, ProcSpec, QosClass, cgroup_text, materialise
from capwatch.kit.errors import ConfigError

PROC = Path(__file__).parent / "data" / "proc"
UID = "c24956e4-8960-494e-9986-d852c14bb53a"
CID = "0b11a92e32372c7a0fd590fdd606d4cfe0010f17de84149a5479007b950a5cd5"
LINE = re.compile(r"(\d+):([^:]*):(/.*)")
COMBINATIONS = list(itertools.product(CgroupLayout, QosClass))


@pytest.mark.parametrize(("layout", "qos"), COMBINATIONS)
def test_round_trip_every_layout_and_qos(layout: CgroupLayout, qos: QosClass) -> None:
    """Rendering a pod process and parsing it back yields the same pod UID."""
    spec = ProcSpec(pid=4242, pod_uid=UID, qos=qos, layout=layout)
    assert pod_uid_from_cgroup(cgroup_text(spec)) == UID


@pytest.mark.parametrize(("layout", "qos"), COMBINATIONS)
def test_non_kubernetes_process_maps_to_nothing(layout: CgroupLayout, qos: QosClass) -> None:
    """A spec without a pod renders a cgroup that attribution maps to None."""
    spec = ProcSpec(pid=4242, pod_uid=None, qos=qos, layout=layout)
    assert pod_uid_from_cgroup(cgroup_text(spec)) is None


@given(
    uid=st.uuids().map(str),
    layout=st.sampled_from(CgroupLayout),
    qos=st.sampled_from(QosClass),
    pid=st.integers(min_value=1, max_value=4_194_304),
    cid=st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex),
)
def test_round_trip_random_uuids(
    uid: str, layout: CgroupLayout, qos: QosClass, pid: int, cid: str | None
) -> None:
    """Any UUID, PID and container id survives render-then-parse in every layout."""
    spec = ProcSpec(pid=pid, pod_uid=uid, qos=qos, layout=layout, container_id=cid)
    assert pod_uid_from_cgroup(cgroup_text(spec)) == uid


def test_materialised_tree_through_the_real_reader(tmp_path: Path) -> None:
    """materialise writes a tree that FsProcRoot + Attributor attribute correctly."""
    specs = [
        ProcSpec(pid=100 + n, pod_uid=f"{n:08x}-0000-4000-8000-{n:012x}", qos=qos, layout=layout)
        for n, (layout, qos) in enumerate(COMBINATIONS)
    ]
    specs.append(ProcSpec(pid=99, pod_uid=None))
    materialise(tmp_path, specs)
    got = Attributor(FsProcRoot(tmp_path)).pod_uids(s.pid for s in specs)
    assert got == {s.pid: s.pod_uid for s in specs}
    assert sorted(p.name for p in (tmp_path / "100").iterdir()) == ["cgroup"]


def test_materialise_overwrites(tmp_path: Path) -> None:
    """Writing a PID again replaces its cgroup, as when the simulator reuses a PID."""
    other = "735c2798-b316-472f-a501-8c2e38cc0579"
    materialise(tmp_path, [ProcSpec(pid=7, pod_uid=UID)])
    materialise(tmp_path, [ProcSpec(pid=7, pod_uid=other, layout=CgroupLayout.V1_CGROUPFS_CRIO)])
    assert Attributor(FsProcRoot(tmp_path)).pod_uid(7) == other
    materialise(tmp_path, [ProcSpec(pid=7, pod_uid=None)])
    assert Attributor(FsProcRoot(tmp_path)).pod_uid(7) is None


@pytest.mark.parametrize("layout", list(CgroupLayout))
def test_line_format(layout: CgroupLayout) -> None:
    """v1 renders several hierarchies plus the unified line; v2 renders one 0:: line."""
    text = cgroup_text(ProcSpec(pid=1, pod_uid=UID, layout=layout))
    assert text.endswith("\n")
    lines = text.splitlines()
    matches = [LINE.fullmatch(line) for line in lines]
    assert all(matches), text
    ids = [int(m.group(1)) for m in matches if m]
    if layout.is_v1:
        assert len(lines) > 10
        assert ids == sorted(set(ids), reverse=True)
        assert ids[-1] == 0
        assert "1:name=systemd:" in text
    else:
        assert ids == [0]
        assert lines[0].startswith("0::/")


@pytest.mark.parametrize(
    ("layout", "qos", "fragment"),
    [
        (CgroupLayout.V2_SYSTEMD_CONTAINERD, QosClass.BURSTABLE, f"/cri-containerd-{CID}.scope"),
        (CgroupLayout.V2_SYSTEMD_CRIO, QosClass.BURSTABLE, f"/crio-{CID}.scope"),
        (CgroupLayout.V2_CGROUPFS_CONTAINERD, QosClass.BURSTABLE, f"/pod{UID}/{CID}"),
        (CgroupLayout.V2_CGROUPFS_CRIO, QosClass.BURSTABLE, f"/pod{UID}/crio-{CID}"),
        (
            CgroupLayout.V2_SYSTEMD_CONTAINERD,
            QosClass.GUARANTEED,
            f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/",
        ),
        (CgroupLayout.V1_CGROUPFS_CONTAINERD, QosClass.BESTEFFORT, "/kubepods/besteffort/pod"),
        (CgroupLayout.V2_KIND_SYSTEMD_CONTAINERD, QosClass.BESTEFFORT, "0::/kubelet.slice/"),
        (CgroupLayout.V1_KIND_CGROUPFS_CONTAINERD, QosClass.GUARANTEED, "/kubelet/kubepods/pod"),
    ],
)
def test_layout_details(layout: CgroupLayout, qos: QosClass, fragment: str) -> None:
    """Each layout names the container the way its runtime and driver really do."""
    spec = ProcSpec(pid=1, pod_uid=UID, qos=qos, layout=layout, container_id=CID)
    assert fragment in cgroup_text(spec)


@pytest.mark.parametrize(
    ("pid", "layout", "qos"),
    [
        (1001, CgroupLayout.V2_SYSTEMD_CONTAINERD, QosClass.BURSTABLE),
        (1021, CgroupLayout.V1_SYSTEMD_CONTAINERD, QosClass.BURSTABLE),
        (1031, CgroupLayout.V1_CGROUPFS_CONTAINERD, QosClass.BURSTABLE),
    ],
)
def test_rendering_matches_committed_real_shapes(
    pid: int, layout: CgroupLayout, qos: QosClass
) -> None:
    """For the same pod and container, the renderer writes byte-for-byte the committed file."""
    committed = (PROC / str(pid) / "cgroup").read_text()
    first = committed.splitlines()[0]
    uid = pod_uid_from_cgroup(committed)
    cid = first.rsplit("/", 1)[1].removeprefix("cri-containerd-").removesuffix(".scope")
    spec = ProcSpec(pid=pid, pod_uid=uid, qos=qos, layout=layout, container_id=cid)
    assert cgroup_text(spec) == committed


def test_derived_container_id_is_stable_and_per_pid() -> None:
    """Without a container id, one is derived from the PID: 64 hex, same PID same id."""

    def text(pid: int) -> str:
        return cgroup_text(ProcSpec(pid=pid, pod_uid=UID, layout=CgroupLayout.V2_CGROUPFS_CRIO))

    cid = text(10).strip().rsplit("/crio-", 1)[1]
    assert re.fullmatch("[0-9a-f]{64}", cid)
    assert text(10) == text(10)
    assert text(10) != text(11)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"pid": 0, "pod_uid": UID}, "pid"),
        ({"pid": -3, "pod_uid": None}, "pid"),
        ({"pid": 1, "pod_uid": UID.upper()}, "pod_uid"),
        ({"pid": 1, "pod_uid": UID.replace("-", "_")}, "pod_uid"),
        ({"pid": 1, "pod_uid": "not-a-uid"}, "pod_uid"),
        ({"pid": 1, "pod_uid": UID, "container_id": "abc"}, "container_id"),
        ({"pid": 1, "pod_uid": UID, "container_id": CID.upper()}, "container_id"),
    ],
)
def test_spec_rejects_values_no_node_produces(kwargs: dict[str, object], option: str) -> None:
    """ProcSpec refuses PIDs, UIDs and container ids that could not round-trip."""
    with pytest.raises(ConfigError) as info:
        ProcSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.option == option


def test_enum_values() -> None:
    """Layouts and QoS classes have the stable string values scenarios use."""
    assert {q.value for q in QosClass} == {"guaranteed", "burstable", "besteffort"}
    assert CgroupLayout("v2-systemd-containerd") is CgroupLayout.V2_SYSTEMD_CONTAINERD
    for layout in CgroupLayout:
        assert re.fullmatch(r"v[12](-kind)?-(systemd|cgroupfs)-(containerd|crio)", layout.value)
        assert layout.value == layout.name.lower().replace("_", "-")
