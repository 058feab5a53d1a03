"""A real Kubernetes control plane (etcd, kube-apiserver, and optionally
kube-controller-manager, kube-scheduler and KWOK) on loopback, for tests and benches.

The binaries are built from source by scripts/build_kube.py; see controlplane.py.
"""
