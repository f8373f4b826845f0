"""Wire format shared by the sandbox daemon and the control-plane client.

Every message is a frame: a 5-byte header (1 byte kind, 4 bytes big-endian payload length) followed by
the payload. Control messages are JSON objects (kind ``JSON``); bulk bytes travel raw in ``DATA`` and
``DATA2`` frames so output and file contents are never re-encoded. One connection carries one request:
the client's first frame is a JSON request that also carries the secret, and the connection closing is
the cancellation signal (the daemon kills whatever the request started).

Request (client -> daemon, first frame)::

    {"v": 1, "op": "<op>", "secret": "<per-sandbox secret>", ...op fields}

Operations and their replies (daemon -> client):

``ping``
    ``{"type": "pong", "version", "pid", "uptimeSeconds", "hostname"}``
``exec`` ``{command, timeout, workdir, env?}``
    ``{"type": "started", "pid"}``, then DATA (stdout) / DATA2 (stderr) frames as produced, then
    ``{"type": "exit", "exitCode", "timedOut", "signal"}``. A command that ran past ``timeout`` has its
    whole process group killed and ends with exit code ``TIMEOUT_EXIT_CODE``.
``read`` ``{path, passFd?}``
    ``{"type": "ok", "size"}``, DATA frames, then ``{"type": "done", "size": <bytes sent>}``. With
    ``passFd`` over a unix socket, the answer is ``{"type": "ok", "size", "fd": true}`` carrying the
    open file itself (SCM_RIGHTS), and nothing follows: the client reads ``size`` bytes from it.
``write`` ``{path, mode?, passFd?}``
    ``{"type": "ready"}``; the client sends DATA frames and then ``{"type": "end"}``; the daemon answers
    ``{"type": "done", "path", "size"}`` after an atomic rename. With ``passFd`` over a unix socket,
    ``{"type": "ready", "fd": true}`` carries the temporary file itself (SCM_RIGHTS): the client
    writes it and sends ``{"type": "end", "size"}`` with the bytes it wrote, which must be the file's.
``process`` ``{argv? | command?, pty, cols, rows, workdir?, env?}``
    ``{"type": "started", "pid"}``; client DATA frames are stdin, ``{"type": "resize", cols, rows}``,
    ``{"type": "signal", "signal": "INT"}`` and ``{"type": "eof"}`` control it; the daemon sends DATA
    (stdout, or the terminal) and DATA2 (stderr without a PTY) and finally ``{"type": "exit", ...}``.
``exchange`` ``{url, identityToken, baseUrl, config?, background?}``
    The daemon presents the identity token to the service's token exchange at ``url`` from inside the
    sandbox and installs the token it gets as with ``credentials``; ``{"type": "ok", "expiresIn"}``.
    With ``background`` it first answers ``{"type": "accepted"}`` and from then on holds every exec
    and process until the token is installed (by this exchange or, after it failed, by
    ``credentials``), for at most ``CREDENTIALS_WAIT_SECONDS``.
``credentials`` ``{env, config?}``
    ``{"type": "ok"}``. ``env`` replaces the variables added to every later exec and process;
    ``config`` (an object) is written to ``~/.svc.config`` with mode 600; held commands go ahead.

Any failure is ``{"type": "error", "code", "message"}`` and ends the request.

This module is imported by the daemon (Debian's stdlib-only python3 inside the sandbox) and by the
control plane, so it must stay free of third-party imports.
"""

from __future__ import annotations

import codecs
import enum
import json
import struct

# typing costs start-up time inside every sandbox and only the type checker needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final

PROTOCOL_VERSION: Final = 1

HEADER = struct.Struct(">BI")
HEADER_SIZE: Final = HEADER.size

# Large enough for a 1 MiB command even if every byte needed a JSON escape, small enough that a
# broken peer cannot make either side allocate without bound.
MAX_FRAME: Final = 16 * 1024 * 1024

# Reads from pipes and files use chunks this large so per-chunk Python work stays negligible next to
# the copy itself.
CHUNK_SIZE: Final = 1024 * 1024

# Same convention as coreutils timeout(1), so shell users recognise it.
TIMEOUT_EXIT_CODE: Final = 124


class Kind(enum.IntEnum):
    JSON = 1
    DATA = 2  # stdout, file content, process stdin/stdout, terminal output
    DATA2 = 3  # stderr


class ErrorCode(enum.StrEnum):
    UNAUTHORIZED = "unauthorized"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    IS_DIRECTORY = "is_directory"
    NOT_A_DIRECTORY = "not_a_directory"
    INVALID_PATH = "invalid_path"
    PERMISSION_DENIED = "permission_denied"
    WORKDIR_MISSING = "workdir_missing"
    SPAWN_FAILED = "spawn_failed"
    IO_ERROR = "io_error"
    EXCHANGE_FAILED = "exchange_failed"
    INTERNAL = "internal"


_KINDS = frozenset(int(k) for k in Kind)


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame sequence."""


def frame(kind: int, payload: bytes | bytearray | memoryview) -> bytes:
    """Header for ``payload``; callers write the header and the payload separately to avoid a copy."""
    return HEADER.pack(kind, len(payload))


def encode_json(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    return HEADER.pack(Kind.JSON, len(body)) + body


def parse_header(header: bytes | memoryview) -> tuple[int, int]:
    """Kind and payload length of a frame header, validated."""
    kind, length = HEADER.unpack(header)
    if kind not in _KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_FRAME} byte limit")
    return kind, length


def decode_json(payload: bytes) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"invalid JSON frame: {exc}") from exc
    if not isinstance(value, dict):
        raise ProtocolError("JSON frame is not an object")
    return value


class TextDecoder:
    """Turns a byte stream into text without splitting multi-byte UTF-8 characters between chunks.

    Bytes that are not valid UTF-8 become U+FFFD instead of failing, because command output is
    arbitrary and a stream must never die on it.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, data: bytes) -> str:
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
