"""The Kubernetes pod view against the fake API server, through the real client."""
