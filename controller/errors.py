"""The controller's errors, below :class:`capwatch.kit.errors.CapwatchError`."""

from __future__ import annotations

from capwatch.kit.errors import CapwatchError


class ApiError(CapwatchError):
    """A Kubernetes API call failed. ``status`` is the HTTP status (None: no answer at all:
    a refused connection, a timeout); ``retry_after`` the server's Retry-After, if any."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Conflict(ApiError):
    """409: the object changed since it was read (optimistic concurrency lost)."""


class FieldConflict(Conflict):
    """409 on a server-side apply: fields it sets are owned by other field managers
    (``managers``, as the API server names them), and the apply was not forced."""

    def __init__(self, message: str, *, managers: tuple[str, ...], status: int = 409) -> None:
        super().__init__(message, status=status)
        self.managers = managers


class NotFound(ApiError):
    """404: the object does not exist."""


# What the chart's fencing policy says when it refuses a write (its messages start so).
FENCING_MARK = "capwatch fencing"


class FencedOut(ApiError):
    """403 from the API server's fencing policy: this replica does not hold its shard's
    Lease (charts/capwatch/templates/controller-fencing.yaml). A lost lease, not an
    error to retry."""


class DeadlinePassed(ApiError):
    """The request was not sent: its deadline (a write's, the fence's) had passed by the
    time its thread could send it (the process was paused, or the API client's threads
    were all busy). Nothing reached the API server; for a write it is as if the fence had
    been closed when it was read."""
