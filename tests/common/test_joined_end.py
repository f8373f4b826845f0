"""The fast path sends a stream's parts whole, its last part and its end as one message, and nothing later."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from common.fastpath import _JoinedEnd


class _Recorder:
    def __init__(self) -> None:
        self.messages: list[tuple[float, dict[str, Any]]] = []

    async def __call__(self, message: Mapping[str, Any]) -> None:
        self.messages.append((asyncio.get_running_loop().time(), dict(message)))


def _body(data: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def test_a_last_part_and_the_end_sent_together_are_one_message() -> None:
    sent = _Recorder()
    send = _JoinedEnd(sent)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send(_body(b"first\n", True))
    await send(_body(b"last\n", True))
    await send({"type": "http.response.body"})
    assert [m for _, m in sent.messages] == [
        {"type": "http.response.start", "status": 200, "headers": []},
        _body(b"first\n", True),
        {"type": "http.response.body", "body": b"last\n"},
    ]


async def test_a_part_followed_by_a_pause_goes_out_at_once() -> None:
    sent = _Recorder()
    send = _JoinedEnd(sent)
    await send(_body(b"a\n", True))
    started = asyncio.get_running_loop().time()
    await asyncio.sleep(0.3)  # the command is silent for a while
    assert [m for _, m in sent.messages] == [_body(b"a\n", True)]
    assert sent.messages[0][0] - started < 0.1
    await send(_body(b"b\n", True))
    await send({"type": "http.response.body"})
    assert [m for _, m in sent.messages] == [_body(b"a\n", True), {"type": "http.response.body", "body": b"b\n"}]


async def test_a_failed_send_is_reported_to_the_next_one() -> None:
    class ClientGoneError(Exception):
        pass

    async def broken(message: Mapping[str, Any]) -> None:
        raise ClientGoneError

    send = _JoinedEnd(broken)
    await send(_body(b"a\n", True))
    await asyncio.sleep(0.01)
    with pytest.raises(ClientGoneError):
        await send({"type": "http.response.body"})


async def test_a_streamed_part_goes_out_whole_and_a_cancelled_send_closes_the_stream() -> None:
    from django.http import StreamingHttpResponse

    from common.fastpath import _send_streaming_response

    big = b"x" * (1 << 20)  # an exec's coalesced output: one NDJSON line of a megabyte
    closed: list[bool] = []

    async def content() -> Any:
        try:
            yield big
            yield b""  # nothing to send for an empty part
            yield b"end\n"
        finally:
            closed.append(True)

    sent = _Recorder()
    response = StreamingHttpResponse(content(), content_type="application/x-ndjson")
    await _send_streaming_response(response, sent)
    start, *bodies = [m for _, m in sent.messages]
    assert start["status"] == 200 and (b"Content-Type", b"application/x-ndjson") in start["headers"]
    assert bodies == [_body(big, True), _body(b"end\n", True), _body(b"", False)]
    assert closed == [True]

    # A client that goes away cancels the sending (common.fastpath's disconnect listener), here
    # while the server waits to write the first part.
    async def stalled(message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()

    closed.clear()
    sending = asyncio.ensure_future(_send_streaming_response(StreamingHttpResponse(content()), stalled))
    await asyncio.sleep(0.05)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    # As with Django's own sending, the view's generator is finalized once the response is let go
    # (at once, its last reference gone), its close then run by the event loop.
    del sending
    for _ in range(5):
        await asyncio.sleep(0)
    assert closed == [True], "the view's stream (and the command behind it) stops with the client"
