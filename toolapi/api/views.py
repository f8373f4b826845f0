from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.auth import get_principal
from common.errors import not_found
from common.pagination import NewestFirstCursorPagination
from common.permissions import IsOrganizationAdmin
from toolapi import selectors, services
from toolapi.api.serializers import (
    McpServerDetailSerializer,
    McpServerSerializer,
    McpServerWriteSerializer,
    ToolCallSerializer,
)
from toolapi.models import McpServer


def _server_or_404(request: Request, server_id: str) -> McpServer:
    server = selectors.registry_server(principal=get_principal(request), server_id=server_id)
    if server is None:
        raise not_found("MCP server")
    return server


class McpServerListView(APIView):
    """Members list the servers they can use; owners and admins list and register all of them."""

    permission_classes = [IsOrganizationAdmin]

    @extend_schema(responses=McpServerSerializer(many=True))
    def get(self, request: Request) -> Response:
        servers = selectors.registry_servers(principal=get_principal(request))
        return Response({"results": McpServerSerializer(servers, many=True).data})

    @extend_schema(request=McpServerWriteSerializer, responses={201: McpServerDetailSerializer})
    def post(self, request: Request) -> Response:
        principal = get_principal(request)
        serializer = McpServerWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        server = services.create_server(
            organization=principal.organization, created_by=principal.user, **serializer.create_kwargs()
        )
        if server.enabled:
            # Discovery right away, so the response (and the next openapi.json) already has the tools
            # or says why the upstream failed.
            services.refresh_server_tools(server=server)
        return Response(McpServerDetailSerializer(server).data, status=201)


class McpServerDetailView(APIView):
    permission_classes = [IsOrganizationAdmin]

    @extend_schema(responses=McpServerDetailSerializer)
    def get(self, request: Request, server_id: str) -> Response:
        return Response(McpServerDetailSerializer(_server_or_404(request, server_id)).data)

    @extend_schema(request=McpServerWriteSerializer, responses=McpServerDetailSerializer)
    def put(self, request: Request, server_id: str) -> Response:
        return self._update(request, server_id, partial=False)

    @extend_schema(request=McpServerWriteSerializer, responses=McpServerDetailSerializer)
    def patch(self, request: Request, server_id: str) -> Response:
        return self._update(request, server_id, partial=True)

    def _update(self, request: Request, server_id: str, *, partial: bool) -> Response:
        server = _server_or_404(request, server_id)
        serializer = McpServerWriteSerializer(data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        server, rediscover = services.update_server(server=server, **serializer.update_kwargs())
        if rediscover and server.enabled:
            services.refresh_server_tools(server=server)
        return Response(McpServerDetailSerializer(server).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, server_id: str) -> Response:
        services.delete_server(server=_server_or_404(request, server_id))
        return Response(status=204)


class McpServerRefreshView(APIView):
    """Rediscover a server's tools now (they are also refreshed on a schedule)."""

    @extend_schema(request=None, responses=McpServerDetailSerializer)
    def post(self, request: Request, server_id: str) -> Response:
        server = _server_or_404(request, server_id)
        services.refresh_server_tools(server=server)
        return Response(McpServerDetailSerializer(server).data)


class ToolCallListView(APIView):
    """The audit of tool calls: everyone's for owners and admins, one's own for members."""

    @extend_schema(responses=ToolCallSerializer(many=True))
    def get(self, request: Request) -> Response:
        paginator = NewestFirstCursorPagination()
        calls = selectors.recent_calls(principal=get_principal(request))
        page = paginator.paginate_queryset(calls, request, view=self)
        return paginator.get_paginated_response(ToolCallSerializer(page, many=True).data)
