"""Sandbox lifecycle endpoints (DRF). The streaming operations live in ``streaming.py``."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.services import client_address
from common.auth import get_principal
from common.pagination import NewestFirstCursorPagination
from sandboxes import selectors, services
from sandboxes.api.serializers import SandboxSerializer
from sandboxes.models import DestroyReason, SandboxStatus

STATUS_FILTERS = ["active", "all", *SandboxStatus.values]


class SandboxListView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("status", OpenApiTypes.STR, enum=STATUS_FILTERS, description="Default: active.")],
        responses=SandboxSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        status = request.query_params.get("status", "active")
        if status not in STATUS_FILTERS:
            raise serializers.ValidationError({"status": [f"Must be one of {', '.join(STATUS_FILTERS)}."]})
        queryset = selectors.organization_sandboxes(principal=get_principal(request), status=status)
        paginator = NewestFirstCursorPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(SandboxSerializer(page, many=True).data)

    @extend_schema(request=None, responses={201: SandboxSerializer})
    def post(self, request: Request) -> Response:
        sandbox = services.create_sandbox(principal=get_principal(request), address=client_address(request))
        return Response(SandboxSerializer(sandbox).data, status=201)


class SandboxDetailView(APIView):
    @extend_schema(responses=SandboxSerializer)
    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = selectors.get_sandbox(principal=get_principal(request), sandbox_id=sandbox_id)
        return Response(SandboxSerializer(sandbox).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, sandbox_id: str) -> Response:
        principal = get_principal(request)
        sandbox = selectors.get_sandbox(principal=principal, sandbox_id=sandbox_id)
        # Destroying an already destroyed sandbox is not an error: DELETE is idempotent.
        services.destroy_sandbox(
            sandbox=sandbox, reason=DestroyReason.USER, principal=principal, address=client_address(request)
        )
        return Response(status=204)
