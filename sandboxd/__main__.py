"""Entry point: ``python3 -m sandboxd --listen-fd 3 --secret-fd 4 [--ready-fd 5] [--env NAME=VALUE]...``.

The listening socket normally arrives already bound (``--listen-fd``), so its path never has to exist
inside the sandbox; ``--listen unix:PATH`` and ``--listen tcp:HOST:PORT`` serve images where the daemon
binds for itself (a Kubernetes pod). The secret arrives on a descriptor, in a file or in
``SANDBOXD_SECRET`` (removed from the environment at once) rather than in argv, which every process of
the sandbox user can read.

Options are parsed by hand: argparse alone would add ~10 ms to every sandbox's start.
"""

from __future__ import annotations

import os
import socket
import sys

from sandboxd.daemon import DEFAULT_PATH, DaemonConfig, serve

USAGE = (
    "usage: python3 -m sandboxd (--listen-fd N | --listen unix:PATH | --listen tcp:HOST:PORT)\n"
    "       (--secret-fd N | --secret-file PATH | SANDBOXD_SECRET=...) [--ready-fd N]\n"
    "       [--home DIR] [--user NAME] [--path PATH] [--env NAME=VALUE]..."
)
VALUED = {
    "--listen-fd",
    "--listen",
    "--secret-fd",
    "--secret-file",
    "--ready-fd",
    "--home",
    "--user",
    "--path",
    "--env",
}


def _fail(message: str) -> SystemExit:
    return SystemExit(f"sandboxd: {message}\n{USAGE}")


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    env_items: list[str] = []
    items = iter(argv)
    for item in items:
        name, sep, value = item.partition("=")
        if name not in VALUED:
            raise _fail(f"unknown option {item!r}")
        if not sep:
            try:
                value = next(items)
            except StopIteration:
                raise _fail(f"{name} needs a value") from None
        if name == "--env":
            env_items.append(value)
        else:
            options[name] = value
    return options, env_items


def _int(options: dict[str, str], name: str) -> int | None:
    if name not in options:
        return None
    try:
        return int(options[name])
    except ValueError:
        raise _fail(f"{name} expects a number") from None


def _read_secret(options: dict[str, str]) -> bytes:
    secret_fd = _int(options, "--secret-fd")
    if secret_fd is not None:
        with os.fdopen(secret_fd, "rb") as f:
            secret = f.read()
    elif "--secret-file" in options:
        with open(options["--secret-file"], "rb") as f:
            secret = f.read()
    else:
        secret = os.environb.pop(b"SANDBOXD_SECRET", b"")
    secret = secret.strip()
    if len(secret) < 16:
        raise _fail("a secret of at least 16 bytes is required")
    return secret


def _socket(options: dict[str, str]) -> socket.socket:
    listen_fd = _int(options, "--listen-fd")
    if listen_fd is not None:
        sock = socket.socket(fileno=listen_fd)
        sock.set_inheritable(False)
        return sock
    spec = options.get("--listen", "")
    if spec.startswith("unix:"):
        path = spec[len("unix:") :]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
    elif spec.startswith("tcp:"):
        host, _, port = spec[len("tcp:") :].rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or "0.0.0.0", int(port)))  # noqa: S104 - a pod serves on its own IP
    else:
        raise _fail("--listen-fd or --listen is required")
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def main(argv: list[str] | None = None) -> None:
    options, env_items = parse_args(sys.argv[1:] if argv is None else argv)
    base_env = {}
    for item in env_items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _fail(f"--env expects NAME=VALUE, got {item!r}")
        base_env[name] = value
    config = DaemonConfig(
        _read_secret(options),
        home=options.get("--home", os.environ.get("HOME", "/home/ubuntu")),
        user=options.get("--user", "ubuntu"),
        path=options.get("--path", DEFAULT_PATH),
        base_env=base_env,
    )
    sock = _socket(options)
    ready_fd = _int(options, "--ready-fd")
    os.umask(0o022)
    try:
        os.chdir(config.home)
    except OSError:
        os.chdir("/")
    serve(config, sock, ready_fd=ready_fd)


if __name__ == "__main__":
    main()
