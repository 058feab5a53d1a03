"""Fixtures shared across test packages: the fake NVML library (see tests/fakenvml/)."""

pytest_plugins = ["tests.fakenvml.fixtures"]
