"""Real MCP servers for the tests, built with the `mcp` SDK and served over streamable HTTP on loopback.

``alpha`` is an MCPServer whose schemas come from type hints (enum, bounds, defaults, nested models
in $defs, arrays of objects, Optional as anyOf, a discriminated union as oneOf), plus a tool that
raises, a slow tool reporting progress and noticing cancellation, and one returning an image with
structured content. ``beta`` is a low-level Server with hand-written schemas, cursor pagination of its
tool list, an ``add`` tool (same name as alpha's) and a ``Customer`` definition that differs from
alpha's. ``gamma`` is a low-level Server whose tool list grows while clients are connected and which
announces the change, in either protocol era.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import anyio
import mcp_types as types
import uvicorn
from mcp.server import MCPServer, Server
from mcp.server.mcpserver import Context
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ServerEvent, ToolsListChanged
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

# The SDK logs every request at INFO through rich; tests only need warnings.
for _name in ("mcp", "uvicorn", "httpx", "httpx2"):
    logging.getLogger(_name).setLevel(logging.WARNING)

PNG_1PX = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
        "0000000d4944415478da63f8cfc0f01f0005000201a5a8d5f90000000049454e44ae426082"
    )
).decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Upstream:
    name: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread
    # What the tests observe about traffic: request headers, slow-tool lifecycle events.
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self, *, force: bool = False) -> None:
        self.server.should_exit = True
        # A graceful stop waits for open connections, and a client's standing change stream (the
        # handshake era's GET stream, a listen stream) stays open as long as its session does.
        self.server.force_exit = force
        self.thread.join(timeout=10)

    def wait_for_event(self, event: str, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if event in self.events:
                return True
            time.sleep(0.05)
        return False


class _RecordHeaders:
    def __init__(self, app: Any, sink: list[dict[str, str]]) -> None:
        self.app, self.sink = app, sink

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.sink.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


def serve(name: str, app: Any, holder: Upstream | None = None, port: int | None = None) -> Upstream:
    port = port or free_port()
    seen: list[dict[str, str]] = holder.seen_headers if holder else []
    config = uvicorn.Config(_RecordHeaders(app, seen), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"upstream-{name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"upstream {name} did not start")
        time.sleep(0.01)
    if holder is not None:
        holder.server, holder.thread, holder.port = server, thread, port
        return holder
    return Upstream(name=name, port=port, server=server, thread=thread, seen_headers=seen)


# -- alpha ------------------------------------------------------------------------------------------


class Address(BaseModel):
    street: str
    city: str
    country: Literal["DE", "FR", "US"] = "DE"


class Customer(BaseModel):
    name: str = Field(description="Full name")
    address: Address


class Item(BaseModel):
    sku: str
    quantity: int = Field(ge=1, le=100)


class Circle(BaseModel):
    kind: Literal["circle"]
    radius: float = Field(gt=0)


class Square(BaseModel):
    kind: Literal["square"]
    side: float = Field(gt=0)


class Node(BaseModel):
    value: int
    children: list[Node] = []


def build_alpha(events: list[str]) -> MCPServer:
    server = MCPServer("alpha", log_level="WARNING")

    @server.tool(title="Pick a color")
    def pick_color(
        color: Annotated[Literal["red", "green", "blue"], Field(description="Which color")],
        intensity: Annotated[int, Field(ge=1, le=10, description="How strong")] = 5,
    ) -> str:
        """Pick a color and an intensity."""
        return f"{color}:{intensity}"

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def create_order(
        customer: Customer, items: list[Item], note: str | None = None, express: bool = False
    ) -> dict[str, Any]:
        """Create an order for a customer."""
        return {"customer": customer.name, "city": customer.address.city, "lines": len(items), "express": express}

    @server.tool()
    def draw(shape: Annotated[Circle | Square, Field(discriminator="kind")]) -> str:
        """Draw one shape."""
        return shape.kind

    @server.tool()
    def total(tree: Node) -> int:
        """Sum a tree of numbers."""

        def walk(node: Node) -> int:
            return node.value + sum(walk(child) for child in node.children)

        return walk(tree)

    @server.tool()
    def fail(reason: str = "broken") -> str:
        """Always raises."""
        raise ValueError(f"tool failed: {reason}")

    @server.tool()
    async def slow(seconds: float, ctx: Context) -> str:
        """Sleep, reporting progress every 0.1 s."""
        events.append("slow:started")
        steps = int(seconds * 10)
        try:
            for step in range(steps):
                await anyio.sleep(0.1)
                await ctx.report_progress(step + 1, steps)
        except BaseException as exc:
            if isinstance(exc, (asyncio.CancelledError, anyio.get_cancelled_exc_class())):
                events.append("slow:cancelled")
            raise
        events.append("slow:finished")
        return f"slept {seconds}"

    @server.tool(structured_output=False)
    def picture() -> types.CallToolResult:
        """An image and structured content."""
        return types.CallToolResult(
            content=[
                types.TextContent(text="a red dot"),
                types.ImageContent(data=PNG_1PX, mime_type="image/png"),
            ],
            structured_content={"width": 1, "height": 1},
        )

    return server


def start_alpha() -> Upstream:
    events: list[str] = []
    mcp = build_alpha(events)
    upstream = serve("alpha", mcp.streamable_http_app())
    upstream.events = events
    return upstream


# -- beta -------------------------------------------------------------------------------------------

BETA_TOOLS = [
    types.Tool(
        name="add",
        description="Add two numbers (beta).",
        input_schema={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    ),
    types.Tool(
        name="register",
        description="Register a customer (beta's own Customer model).",
        input_schema={
            "type": "object",
            "$defs": {
                "Customer": {
                    "type": "object",
                    "properties": {"email": {"type": "string", "format": "email"}, "vip": {"type": "boolean"}},
                    "required": ["email"],
                }
            },
            "properties": {"customer": {"$ref": "#/$defs/Customer"}},
            "required": ["customer"],
        },
    ),
    types.Tool(
        name="tags.list",
        description="A dotted upstream name.",
        input_schema={"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}},
    ),
]


@dataclass
class BetaState:
    tools: list[types.Tool] = field(default_factory=lambda: list(BETA_TOOLS))
    page_size: int = 1


def build_beta(state: BetaState) -> Server[Any]:
    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + state.page_size
        next_cursor = str(end) if end < len(state.tools) else None
        return types.ListToolsResult(tools=state.tools[start:end], next_cursor=next_cursor)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "add":
            total = args["a"] + args["b"]
            return types.CallToolResult(content=[types.TextContent(text=f"beta:{total}")])
        if params.name == "register":
            return types.CallToolResult(content=[types.TextContent(text=args["customer"]["email"])])
        if params.name == "tags.list":
            return types.CallToolResult(content=[types.TextContent(text=",".join(args.get("tags", [])))])
        return types.CallToolResult(content=[types.TextContent(text="unknown")], is_error=True)

    return Server("beta", on_list_tools=list_tools, on_call_tool=call_tool)


def start_beta(state: BetaState | None = None) -> tuple[Upstream, BetaState]:
    state = state or BetaState()
    return serve("beta", build_beta(state).streamable_http_app()), state


def restart(upstream: Upstream, factory: Callable[[], Any]) -> Upstream:
    """Serve a fresh app on the same port (an upstream that went down and came back)."""
    return serve(upstream.name, factory(), holder=upstream, port=upstream.port)


# -- gamma: a tool list that changes while clients are connected -------------------------------------

GAMMA_ECHO = types.Tool(
    name="echo",
    description="Echo a text.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
GAMMA_SHOUT = types.Tool(
    name="shout",
    description="Echo a text in capitals (added while running).",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


class _CountingBus(InMemorySubscriptionBus):
    """The in-process bus, counting open `subscriptions/listen` streams so tests can wait for one."""

    def __init__(self) -> None:
        super().__init__()
        self.listening = 0

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        unsubscribe = super().subscribe(listener)
        self.listening += 1
        done = False

        def counted() -> None:
            nonlocal done
            if not done:
                done = True
                self.listening -= 1
            unsubscribe()

        return counted


@dataclass
class GammaState:
    """A server whose tool list grows at run time, announcing it the way its protocol era does.

    ``handshake_only`` refuses ``server/discover``, as servers of the initialize-handshake era do, so
    clients fall back to that era; changes are then announced as ``notifications/tools/list_changed``
    on each session's standalone stream. Otherwise clients speak 2026-07-28 and changes go to their
    ``subscriptions/listen`` streams.
    """

    handshake_only: bool
    tools: list[types.Tool] = field(default_factory=lambda: [GAMMA_ECHO])
    bus: _CountingBus = field(default_factory=_CountingBus)
    loop: asyncio.AbstractEventLoop | None = None
    # Handshake-era sessions that have listed tools: the ones a change is announced to.
    sessions: list[Any] = field(default_factory=list)
    # Standalone (GET) streams open right now: a notification sent while none is open is lost.
    standalone_streams: int = 0
    # The protocol version of every tools/list served, so tests can check which era they exercised.
    listed_with: list[str] = field(default_factory=list)

    @property
    def listening(self) -> int:
        return self.standalone_streams if self.handshake_only else self.bus.listening

    def add_tool_and_announce(self, tool: types.Tool) -> None:
        """Called from the test's thread: change the list, then notify on the server's own loop."""
        assert self.loop is not None, "nobody has connected yet"
        self.tools.append(tool)

        async def announce() -> None:
            if self.handshake_only:
                for session in self.sessions:
                    await session.send_tool_list_changed()
            else:
                await self.bus.publish(ToolsListChanged())

        asyncio.run_coroutine_threadsafe(announce(), self.loop).result(timeout=5)


class _CountStandaloneStreams:
    """Counts GET requests answered with a stream (the handshake era's server-to-client channel)."""

    def __init__(self, app: Any, state: GammaState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        opened = False

        async def watch(message: Any) -> None:
            nonlocal opened
            if message["type"] == "http.response.start" and message["status"] == 200:
                opened = True
                self.state.standalone_streams += 1
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if opened:
                self.state.standalone_streams -= 1


def build_gamma(state: GammaState) -> Server[Any]:
    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        state.loop = asyncio.get_running_loop()
        state.listed_with.append(ctx.protocol_version)
        if state.handshake_only and ctx.session not in state.sessions:
            state.sessions.append(ctx.session)
        return types.ListToolsResult(tools=list(state.tools))

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        known = {tool.name for tool in state.tools}
        if params.name not in known:
            return types.CallToolResult(content=[types.TextContent(text=f"unknown tool {params.name}")], is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=text.upper() if params.name == "shout" else text)])

    server: Server[Any] = Server(
        "gamma", on_list_tools=list_tools, on_call_tool=call_tool, on_subscriptions_listen=ListenHandler(state.bus)
    )
    if state.handshake_only:

        async def no_discover(ctx: Any, params: types.RequestParams) -> types.DiscoverResult:
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found")

        server.add_request_handler("server/discover", types.RequestParams, no_discover)
    return server


def _gamma_app(state: GammaState) -> Any:
    return _CountStandaloneStreams(build_gamma(state).streamable_http_app(), state)


def start_gamma(*, handshake_only: bool) -> tuple[Upstream, GammaState]:
    state = GammaState(handshake_only=handshake_only)
    return serve("gamma", _gamma_app(state)), state


def restart_gamma(upstream: Upstream, state: GammaState) -> Upstream:
    """Serve gamma again on its port, with whatever tools ``state`` holds now (sessions start anew)."""
    state.sessions.clear()
    return restart(upstream, lambda: _gamma_app(state))
