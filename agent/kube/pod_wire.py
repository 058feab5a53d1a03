"""A pod's JSON as the agent sees it: decoded straight into
:class:`~capwatch.agent.pods.PodInfo` (the typed client models cost more than the few
fields the agent needs), its ResourceClaims named as the kubelet reads them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from capwatch.agent.pods import PodInfo, PodRef
from capwatch.kube.wire import as_mapping

logger = logging.getLogger(__name__)


def pod_info(obj: Mapping[str, Any]) -> PodInfo | None:
    """A pod's JSON as the agent sees it; None (and a warning) if it lacks identity."""
    metadata = as_mapping(obj.get("metadata"))
    uid, name, namespace = (str(metadata.get(k) or "") for k in ("uid", "name", "namespace"))
    if not (uid and name and namespace):
        logger.warning("skipping pod without identity metadata=%r", dict(metadata))
        return None
    annotations = {str(k): str(v) for k, v in as_mapping(metadata.get("annotations")).items()}
    status = as_mapping(obj.get("status"))
    return PodInfo(
        ref=PodRef(namespace=namespace, name=name, uid=uid),
        annotations=annotations,
        claims=pod_claims(as_mapping(obj.get("spec")), status),
        finished=status.get("phase") in {"Succeeded", "Failed"},
    )


def pod_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the ResourceClaims a pod uses: ``spec.resourceClaims`` that name one
    (``resourceClaimName``), and those made from a template for it, which its
    ``status.resourceClaimStatuses`` name once made (an entry without a name: none was
    needed). As the kubelet reads them."""
    names = {
        str(entry["resourceClaimName"])
        for source in (spec.get("resourceClaims"), status.get("resourceClaimStatuses"))
        for entry in (source if isinstance(source, list) else [])
        if isinstance(entry, Mapping) and entry.get("resourceClaimName")
    }
    return tuple(sorted(names))
