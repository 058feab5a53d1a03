"""The Kubernetes API as every capwatch process speaks it, without the client library.

``access`` is where the API server is and who this process is to it (in-cluster or a
kubeconfig), ``transport`` the HTTP to it (urllib3, raw JSON), ``wire`` its wire format
(transient errors, error statuses, Retry-After, JSON and watch streams), ``client`` the
requests every client makes (the transport loaded, collections listed and watched,
objects read), ``informer`` the list+watch machinery and when it may be trusted. The
agent's views and the controller are built on it. Imports the kit only.
"""
