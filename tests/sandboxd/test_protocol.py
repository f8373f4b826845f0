from __future__ import annotations

import pytest

from sandboxd.protocol import (
    HEADER,
    MAX_FRAME,
    Kind,
    ProtocolError,
    TextDecoder,
    decode_json,
    encode_json,
    parse_header,
)


def test_json_frame_round_trip() -> None:
    frame = encode_json({"type": "exit", "exitCode": 3, "text": "é"})
    kind, length = parse_header(frame[: HEADER.size])
    assert kind == Kind.JSON
    assert length == len(frame) - HEADER.size
    assert decode_json(frame[HEADER.size :]) == {"type": "exit", "exitCode": 3, "text": "é"}


@pytest.mark.parametrize(
    "header",
    [HEADER.pack(9, 1), HEADER.pack(Kind.DATA, MAX_FRAME + 1)],
    ids=["unknown kind", "oversized"],
)
def test_bad_headers_are_refused(header: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_header(header)


@pytest.mark.parametrize("payload", [b"[1, 2]", b"{not json", b"\xff\xfe"])
def test_json_frames_must_be_objects(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_json(payload)


def test_text_decoder_joins_characters_split_between_chunks() -> None:
    decoder = TextDecoder()
    euro = "€".encode()
    parts = [decoder.decode(b"a" + euro[:1]), decoder.decode(euro[1:2]), decoder.decode(euro[2:] + b"b")]
    assert parts == ["a", "", "€b"]
    assert decoder.flush() == ""


def test_text_decoder_replaces_invalid_bytes() -> None:
    decoder = TextDecoder()
    assert decoder.decode(b"ok \xff\xfe end") == "ok \ufffd\ufffd end"
    assert decoder.decode(b"\xe2\x82") == ""
    assert decoder.flush() == "\ufffd"
