"""File read and write through the daemon inside a real sandbox."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from sandboxes.daemon_client import DaemonClient, DaemonError


async def read_all(client: DaemonClient, path: str) -> bytes:
    return b"".join([chunk async for chunk in client.read_file(path)])


async def test_binary_round_trip_of_every_byte_value(client: DaemonClient) -> None:
    data = bytes(range(256)) * 3
    result = await client.write_file("/home/ubuntu/bytes.bin", data)
    assert (result.path, result.size) == ("/home/ubuntu/bytes.bin", len(data))
    assert await read_all(client, "/home/ubuntu/bytes.bin") == data
    assert (await client.run("sha256sum < ~/bytes.bin")).text.split()[0] == hashlib.sha256(data).hexdigest()


async def test_nested_parents_are_created(client: DaemonClient) -> None:
    await client.write_file("/home/ubuntu/a/b/c/d.txt", b"deep")
    assert (await client.run("cat ~/a/b/c/d.txt; echo; stat -c %U ~/a/b")).text == "deep\nubuntu\n"


async def test_write_is_atomic_and_leaves_no_temp_files(client: DaemonClient) -> None:
    await client.write_file("/tmp/atomic/f.txt", b"one")
    await client.write_file("/tmp/atomic/f.txt", b"two")
    assert (await client.run("ls -A /tmp/atomic")).text == "f.txt\n"
    assert await read_all(client, "/tmp/atomic/f.txt") == b"two"


async def test_write_keeps_the_mode_of_an_existing_file(client: DaemonClient) -> None:
    await client.write_file("/tmp/script.sh", b"#!/bin/sh\necho hi\n", mode=0o755)
    await client.write_file("/tmp/script.sh", b"#!/bin/sh\necho again\n")
    assert (await client.run("stat -c %a /tmp/script.sh; /tmp/script.sh")).text == "755\nagain\n"


async def test_empty_file(client: DaemonClient) -> None:
    assert (await client.write_file("/tmp/empty", b"")).size == 0
    assert await read_all(client, "/tmp/empty") == b""


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/home/ubuntu/does-not-exist", "not_found"),
        ("/home/ubuntu", "is_directory"),
        ("relative/path.txt", "invalid_path"),
        ("/etc/passwd/x", "not_a_directory"),
    ],
)
async def test_read_errors(client: DaemonClient, path: str, code: str) -> None:
    with pytest.raises(DaemonError) as error:
        await client.open_file(path)
    assert error.value.code == code


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/home/ubuntu", "is_directory"),
        ("relative.txt", "invalid_path"),
        ("/usr/bin/not-allowed", "permission_denied"),
        ("/etc/passwd/x", "not_a_directory"),
    ],
)
async def test_write_errors(client: DaemonClient, path: str, code: str) -> None:
    with pytest.raises(DaemonError) as error:
        await client.write_file(path, b"x")
    assert error.value.code == code


async def test_open_file_reports_size_before_content(client: DaemonClient) -> None:
    await client.write_file("/tmp/sized", b"x" * 1000)
    reader = await client.open_file("/tmp/sized")
    assert reader.size == 1000
    assert len(b"".join([chunk async for chunk in reader])) == 1000


@pytest.mark.slow
async def test_large_file_round_trip_in_bounded_memory(client: DaemonClient) -> None:
    size = 200 * 1024 * 1024
    chunk = os.urandom(1024 * 1024)
    expected = hashlib.sha256()

    async def produce() -> AsyncIterator[bytes]:
        for _ in range(size // len(chunk)):
            expected.update(chunk)
            yield chunk

    tracemalloc.start()
    try:
        result = await client.write_file("/home/ubuntu/big.bin", produce())
        assert result.size == size
        digest = hashlib.sha256()
        received = 0
        async for piece in client.read_file("/home/ubuntu/big.bin"):
            digest.update(piece)
            received += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert received == size
    assert digest.hexdigest() == expected.hexdigest()
    assert peak < 32 * 1024 * 1024, f"peak Python allocations {peak} bytes"
    await client.run("rm ~/big.bin")


async def test_frames_of_any_size_in_any_order(client: DaemonClient) -> None:
    # Frames larger than the daemon's receive buffer make it grow that buffer between frames of
    # other sizes; the file must come out whole either way.
    pieces = [b"x", os.urandom(3 * 1024 * 1024), os.urandom(64 * 1024), os.urandom(5 * 1024 * 1024 + 7)]

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    result = await client.write_file("/tmp/mixed.bin", body())
    data = b"".join(pieces)
    assert result.size == len(data)
    assert hashlib.sha256(await read_all(client, "/tmp/mixed.bin")).hexdigest() == hashlib.sha256(data).hexdigest()
