"""Output chunks already waiting are joined into one NDJSON line (sandboxes.api.streaming._coalesced)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from sandboxd.protocol import ErrorCode
from sandboxes.api.streaming import COALESCE_BYTES, _coalesced
from sandboxes.daemon_client import DaemonError, ExecEvent, ExecExit, ExecOutput, ExecStarted


async def _collect(events: AsyncGenerator[ExecEvent, None]) -> list[ExecEvent]:
    return [event async for event in _coalesced(events)]


async def _all_at_once(events: list[ExecEvent]) -> AsyncGenerator[ExecEvent, None]:
    for event in events:
        yield event


def test_waiting_chunks_of_one_stream_are_joined_in_order() -> None:
    events: list[ExecEvent] = [
        ExecStarted(1),
        ExecOutput("stdout", b"a"),
        ExecOutput("stdout", b"b"),
        ExecOutput("stderr", b"c"),
        ExecOutput("stderr", b"d"),
        ExecOutput("stdout", b"e"),
        ExecExit(0),
    ]

    got = asyncio.run(_collect(_all_at_once(events)))
    # The reader gets ahead (the source never waits): what was waiting behind a chunk joins it,
    # never across streams and never reordered.
    assert got == [
        ExecStarted(1),
        ExecOutput("stdout", b"ab"),
        ExecOutput("stderr", b"cd"),
        ExecOutput("stdout", b"e"),
        ExecExit(0),
    ]


def test_joined_lines_are_bounded() -> None:
    chunk = b"x" * (64 * 1024)
    events: list[ExecEvent] = [ExecOutput("stdout", chunk) for _ in range(40)]

    got = asyncio.run(_collect(_all_at_once([*events, ExecExit(0)])))
    outputs = [event for event in got if isinstance(event, ExecOutput)]
    assert b"".join(e.data for e in outputs) == chunk * 40
    assert all(len(e.data) <= COALESCE_BYTES for e in outputs)
    assert len(outputs) < 40
    assert got[-1] == ExecExit(0)


def test_errors_come_through_after_the_output_before_them() -> None:
    async def failing() -> AsyncGenerator[ExecEvent, None]:
        yield ExecOutput("stdout", b"partial")
        raise DaemonError(ErrorCode.WORKDIR_MISSING, "no such directory")

    async def main() -> tuple[list[ExecEvent], DaemonError | None]:
        seen: list[ExecEvent] = []
        try:
            async for event in _coalesced(failing()):
                seen.append(event)
        except DaemonError as exc:
            return seen, exc
        return seen, None

    seen, error = asyncio.run(main())
    assert seen == [ExecOutput("stdout", b"partial")]
    assert error is not None and error.code == ErrorCode.WORKDIR_MISSING


def test_stopping_early_closes_the_daemon_call() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncGenerator[ExecEvent, None]:
        try:
            while True:
                yield ExecOutput("stdout", b"y\n")
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def main() -> bool:
        coalesced = _coalesced(endless())
        await anext(coalesced)
        await coalesced.aclose()
        return closed.is_set()

    assert asyncio.run(main())


@pytest.mark.parametrize("count", [0, 1])
def test_short_streams_pass_through(count: int) -> None:
    events: list[ExecEvent] = [ExecOutput("stdout", b"z") for _ in range(count)]
    events.append(ExecExit(3))
    assert asyncio.run(_collect(_all_at_once(events)))[-1] == ExecExit(3)
