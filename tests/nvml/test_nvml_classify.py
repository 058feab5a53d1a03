"""NVML return codes map to GpuErrorClass by number, and the numbers match nvml.h."""

from __future__ import annotations

import pytest

from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.nvml.backend import classify, uuid_text
from tests.fakenvml.control import FakeNvml
from tests.nvml.nvml_codes import CLASSIFIED, CLASSIFIED_IDS, UNCLASSIFIED

pytestmark = pytest.mark.nvml


@pytest.mark.parametrize(("name", "code", "error_class"), CLASSIFIED, ids=CLASSIFIED_IDS)
def test_classify_table(name: str, code: int, error_class: GpuErrorClass) -> None:
    """Each NVML code the agent distinguishes maps to its own class."""
    assert classify(code) is error_class


@pytest.mark.parametrize(("name", "code"), UNCLASSIFIED, ids=[n for n, _ in UNCLASSIFIED])
def test_classify_unlisted_codes_are_unknown(name: str, code: int) -> None:
    """Codes outside the table, including NVML_ERROR_UNKNOWN and unseen ones, are UNKNOWN."""
    assert classify(code) is GpuErrorClass.UNKNOWN


def test_every_nvml_class_has_a_code() -> None:
    """Every class except UNKNOWN (no NVML code) is produced by exactly one code."""
    produced = [error_class for _, _, error_class in CLASSIFIED]
    assert len(produced) == len(set(produced))
    assert set(produced) == set(GpuErrorClass) - {GpuErrorClass.UNKNOWN}


def test_codes_match_official_header(fake_nvml: FakeNvml) -> None:
    """The numbers in the test table are the values nvml.h gives those names."""
    for name, code, _ in CLASSIFIED:
        assert fake_nvml.return_code(name) == code, name
    for name, code in UNCLASSIFIED:
        if name.startswith("NVML_ERROR_"):
            assert fake_nvml.return_code(name) == code, name


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"GPU-fa4e0000-0000-4000-8000-000000000000", "GPU-fa4e0000-0000-4000-8000-000000000000"),
        ("GPU-fa4e0000-0000-4000-8000-000000000001", "GPU-fa4e0000-0000-4000-8000-000000000001"),
    ],
    ids=["bytes", "str"],
)
def test_uuid_text_accepts_bytes_and_str(raw: object, text: str) -> None:
    """Old bindings return bytes, new ones str; both become the same str."""
    assert uuid_text(raw) == text


def test_uuid_text_rejects_non_text() -> None:
    """A UUID that is neither text nor decodable bytes raises instead of comparing unequal."""
    with pytest.raises(TypeError):
        uuid_text(None)
    with pytest.raises(UnicodeDecodeError):
        uuid_text(b"GPU-\xff")
