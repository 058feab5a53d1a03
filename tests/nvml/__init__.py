"""Tests of agent.nvml.backend through the real pynvml against the fake libnvidia-ml.so.1."""
