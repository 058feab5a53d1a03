"""The fake libnvidia-ml.so.1: C source, build script and Python control."""
