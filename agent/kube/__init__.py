"""The agent's Kubernetes views, on the shared :mod:`capwatch.kube` room: the pod view
(``podview``, its requests and event sink ``pod_requests``, a pod's JSON ``pod_wire``),
the node's claims and slices (``claims``), the sim driver's ResourceSlice
(``slice_publisher``), and what the agent reads when it leaves the node (``departure``,
``selection``). Imports the agent, the shared kube room and the kit.
"""
