"""File read and write through the daemon inside a real sandbox."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from sandboxes.daemon_client import DaemonClient, DaemonError, DescriptorFileReader, FileReader


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


@pytest.mark.parametrize("pass_fd", [True, False], ids=["handed-over", "relayed"])
async def test_open_file_reports_size_before_content(client: DaemonClient, pass_fd: bool) -> None:
    await client.write_file("/tmp/sized", b"x" * 1000)
    reader = await client.open_file("/tmp/sized", pass_fd=pass_fd)
    assert isinstance(reader, DescriptorFileReader if pass_fd else FileReader)
    assert reader.size == 1000
    assert len(b"".join([chunk async for chunk in reader])) == 1000


@pytest.mark.parametrize("pass_fd", [True, False], ids=["handed-over", "relayed"])
async def test_a_file_is_read_as_it_was_sized_when_opened(client: DaemonClient, pass_fd: bool) -> None:
    # Both ways of reading give exactly the bytes of a multi-chunk file, and no more than it held
    # when it was opened, even while something appends to it.
    data = os.urandom(3 * 1024 * 1024 + 17)
    await client.write_file("/tmp/growing", data)
    reader = await client.open_file("/tmp/growing", pass_fd=pass_fd)
    await client.run("head -c 100000 /dev/zero >> /tmp/growing")
    assert b"".join([chunk async for chunk in reader]) == data


async def test_a_handed_over_file_closed_early_is_released(client: DaemonClient) -> None:
    await client.write_file("/tmp/early", os.urandom(4 * 1024 * 1024))
    before = len(os.listdir("/proc/self/fd"))
    reader = await client.open_file("/tmp/early")
    assert isinstance(reader, DescriptorFileReader)
    async for _ in reader:
        break
    await reader.aclose()
    assert len(os.listdir("/proc/self/fd")) == before


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


@pytest.mark.parametrize("pass_fd", [True, False], ids=["handed-over", "relayed"])
async def test_writes_both_ways_commit_exactly_what_was_sent(client: DaemonClient, pass_fd: bool) -> None:
    pieces = [os.urandom(size) for size in (1, 65536, 3 * 1024 * 1024 + 5, 200_000, 7)]

    async def produce() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    result = await client.write_file("/home/ubuntu/both/ways.bin", produce(), pass_fd=pass_fd, mode=0o640)
    data = b"".join(pieces)
    assert (result.path, result.size) == ("/home/ubuntu/both/ways.bin", len(data))
    assert await read_all(client, "/home/ubuntu/both/ways.bin") == data
    assert (await client.run("stat -c '%a %U' ~/both/ways.bin")).text == "640 ubuntu\n"


@pytest.mark.parametrize("pass_fd", [True, False], ids=["handed-over", "relayed"])
async def test_a_write_that_fails_half_way_leaves_nothing(client: DaemonClient, pass_fd: bool) -> None:
    async def produce() -> AsyncIterator[bytes]:
        yield os.urandom(2 * 1024 * 1024)
        raise RuntimeError("the upload broke off")

    with pytest.raises(RuntimeError):
        await client.write_file("/home/ubuntu/halfway/file.bin", produce(), pass_fd=pass_fd)
    # The daemon notices the connection closing and removes its temporary file.
    for _ in range(50):
        listing = (await client.run("ls -A ~/halfway")).text
        if not listing:
            break
        await asyncio.sleep(0.05)
    assert listing == ""
