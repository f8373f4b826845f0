"""The audit of the tool HTTP API's fast path, written by one background thread in batches.

A plain JSON call is recorded after its response was sent, through common.batching: requests hand
their finished record over and return, and many calls share one commit. A record is in the database
at most about LINGER_SECONDS (plus the write) after its response. Records are complete when handed
over (status, sizes, duration); a process that exits writes what is pending first.
"""

from __future__ import annotations

from typing import Any

from common.batching import BatchWriter
from toolapi import services

LINGER_SECONDS = 0.05


class CallRecorder(BatchWriter[dict[str, Any]]):
    """Stores the keyword arguments of services.record_calls, many per statement."""

    def __init__(self) -> None:
        super().__init__(services.record_calls, name="toolapi-call-recorder", linger_seconds=LINGER_SECONDS)


recorder = CallRecorder().flush_at_exit()
