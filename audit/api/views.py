from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.generics import ListAPIView

from audit import selectors
from audit.api.serializers import AuditEventSerializer, AuditQuerySerializer
from audit.models import AuditEvent
from common.auth import get_principal
from common.errors import not_found
from common.pagination import NewestFirstCursorPagination


@extend_schema(
    parameters=[
        OpenApiParameter("type", OpenApiTypes.STR, many=True, description="Event type; repeat for several."),
        OpenApiParameter("since", OpenApiTypes.DATETIME, description="Events at or after this time."),
        OpenApiParameter("until", OpenApiTypes.DATETIME, description="Events before this time."),
        OpenApiParameter("limit", OpenApiTypes.INT, description="Page size, at most 200."),
    ]
)
class SandboxAuditLogView(ListAPIView[AuditEvent]):
    """A sandbox's audit log, newest first; still readable after the sandbox is destroyed."""

    serializer_class = AuditEventSerializer
    pagination_class = NewestFirstCursorPagination

    def get_queryset(self):  # type: ignore[no-untyped-def]
        principal = get_principal(self.request)
        sandbox_id = self.kwargs["sandbox_id"]
        if not selectors.sandbox_is_known(organization=principal.organization, sandbox_id=sandbox_id):
            raise not_found("Sandbox")
        query = AuditQuerySerializer(
            data={
                "type": self.request.query_params.getlist("type"),
                **{k: v for k in ("since", "until") if (v := self.request.query_params.get(k))},
            }
        )
        query.is_valid(raise_exception=True)
        return selectors.sandbox_events(
            organization=principal.organization,
            sandbox_id=sandbox_id,
            types=query.validated_data.get("type"),
            since=query.validated_data.get("since"),
            until=query.validated_data.get("until"),
        )
