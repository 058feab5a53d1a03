"""The NVML return codes capwatch classifies, with their values from nvml.h.

The numbers are written out here, independently of ``pynvml``, and checked
against the official header (through the fake library) by a test.
"""

from __future__ import annotations

from capwatch.agent.gpus import GpuErrorClass

# (nvmlReturn_t name, value in nvml.h, class)
CLASSIFIED: tuple[tuple[str, int, GpuErrorClass], ...] = (
    ("NVML_ERROR_UNINITIALIZED", 1, GpuErrorClass.UNINITIALIZED),
    ("NVML_ERROR_INVALID_ARGUMENT", 2, GpuErrorClass.INVALID_ARGUMENT),
    ("NVML_ERROR_NOT_SUPPORTED", 3, GpuErrorClass.NOT_SUPPORTED),
    ("NVML_ERROR_NO_PERMISSION", 4, GpuErrorClass.NO_PERMISSION),
    ("NVML_ERROR_NOT_FOUND", 6, GpuErrorClass.NOT_FOUND),
    ("NVML_ERROR_INSUFFICIENT_POWER", 8, GpuErrorClass.INSUFFICIENT_POWER),
    ("NVML_ERROR_DRIVER_NOT_LOADED", 9, GpuErrorClass.DRIVER_NOT_LOADED),
    ("NVML_ERROR_TIMEOUT", 10, GpuErrorClass.TIMEOUT),
    ("NVML_ERROR_LIBRARY_NOT_FOUND", 12, GpuErrorClass.LIBRARY_NOT_FOUND),
    ("NVML_ERROR_FUNCTION_NOT_FOUND", 13, GpuErrorClass.FUNCTION_NOT_FOUND),
    ("NVML_ERROR_GPU_IS_LOST", 15, GpuErrorClass.GPU_IS_LOST),
    ("NVML_ERROR_RESET_REQUIRED", 16, GpuErrorClass.RESET_REQUIRED),
    ("NVML_ERROR_IN_USE", 19, GpuErrorClass.IN_USE),
)

# Codes that exist (or not) but that capwatch does not distinguish: UNKNOWN.
UNCLASSIFIED: tuple[tuple[str, int], ...] = (
    ("NVML_ERROR_ALREADY_INITIALIZED", 5),
    ("NVML_ERROR_INSUFFICIENT_SIZE", 7),
    ("NVML_ERROR_IRQ_ISSUE", 11),
    ("NVML_ERROR_CORRUPTED_INFOROM", 14),
    ("NVML_ERROR_OPERATING_SYSTEM", 17),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18),
    ("NVML_ERROR_MEMORY", 20),
    ("NVML_ERROR_NOT_READY", 27),
    ("NVML_ERROR_UNKNOWN", 999),
    ("not in nvml.h", 4242),
)

CLASSIFIED_IDS = [name.removeprefix("NVML_ERROR_") for name, _, _ in CLASSIFIED]
