"""Tests of agent.nvml through the real pynvml against the fake libnvidia-ml.so.1."""
