"""The agent's Kubernetes pod view: list+watch of this node's pods.

``access`` is where the API server is and who this process is to it (in-cluster
or a kubeconfig), ``transport`` the HTTP to it (urllib3, raw JSON: no client
library), ``client`` the requests the agent makes, ``informer`` the list+watch
machinery and when it may be trusted, ``wire`` the API server's wire format,
``podview`` the synced view the cycle reads. The controller uses access,
transport, client and informer too. Imports the agent and the kit.
"""
