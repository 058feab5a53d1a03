"""What the controller writes to Kubernetes, and when.

``writer``: the ``GPUPowerCapEnforced`` condition, only on change plus a
heartbeat, fenced by the lease, through a ``workqueue`` in client-go's shape;
``recorder``: one Event on the Node per transition. Imports the controller's
conditions and errors, the kube room's write deadline, and the kit.
"""
