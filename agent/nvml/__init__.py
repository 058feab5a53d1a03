"""The real GPU backend: NVML through the official bindings.

``backend`` (the only module in capwatch that imports ``pynvml``), its device
``event_watch`` thread (XID and ECC events), and ``probe`` (``capwatch probe``:
what each read answers, writing nothing). Imports the agent and the kit.
"""
