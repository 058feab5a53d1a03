"""What the controller writes to Kubernetes, and when.

``writer``: the ``GPUPowerCapEnforced`` condition, only on change plus a
heartbeat, fenced by the lease, through a ``workqueue`` in client-go's shape;
``recorder``: one Event on the Node per transition. Imports the controller's
conditions and errors, and the kit.
"""

# Every write's request is bounded by this, and by the lease's renew deadline when
# that comes first (the fence: docs/controller.md).
REQUEST_TIMEOUT_S = 10.0
