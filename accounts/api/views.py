from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import selectors, services
from accounts.api.serializers import (
    MeSerializer,
    OrganizationSerializer,
    OrganizationUpdateSerializer,
    TeamSerializer,
    TokenCreateSerializer,
    TokenSerializer,
)
from common.auth import get_principal
from common.errors import not_found
from common.permissions import IsOrganizationAdmin


class MeView(APIView):
    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        principal = get_principal(request)
        data = {
            "user": principal.user,
            "organization": principal.organization,
            "role": principal.role,
            "teams": selectors.teams_of_user(user=principal.user, organization=principal.organization).prefetch_related(
                "members"
            ),
            "tokenReadOnly": principal.read_only,
        }
        return Response(MeSerializer(data).data)


class TeamListView(APIView):
    @extend_schema(responses=TeamSerializer(many=True))
    def get(self, request: Request) -> Response:
        principal = get_principal(request)
        teams = selectors.organization_teams(organization=principal.organization)
        return Response({"results": TeamSerializer(teams, many=True).data})


class OrganizationView(APIView):
    permission_classes = [IsOrganizationAdmin]

    @extend_schema(responses=OrganizationSerializer)
    def get(self, request: Request) -> Response:
        return Response(OrganizationSerializer(get_principal(request).organization).data)

    @extend_schema(request=OrganizationUpdateSerializer, responses=OrganizationSerializer)
    def patch(self, request: Request) -> Response:
        principal = get_principal(request)
        serializer = OrganizationUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        organization = services.update_organization(
            organization=principal.organization,
            name=serializer.validated_data.get("name"),
            sandboxes_enabled=serializer.validated_data.get("sandboxesEnabled"),
        )
        return Response(OrganizationSerializer(organization).data)


class TokenListView(APIView):
    @extend_schema(responses=TokenSerializer(many=True))
    def get(self, request: Request) -> Response:
        principal = get_principal(request)
        tokens = selectors.user_tokens(user=principal.user, organization=principal.organization)
        return Response({"results": TokenSerializer(tokens, many=True).data})

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenSerializer})
    def post(self, request: Request) -> Response:
        principal = get_principal(request)
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        days = serializer.validated_data.get("expiresInDays")
        issued = services.create_token(
            user=principal.user,
            organization=principal.organization,
            name=serializer.validated_data["name"],
            expires_at=timezone.now() + timedelta(days=days) if days else None,
        )
        # The raw token is in this response and nowhere else, ever.
        return Response({**TokenSerializer(issued.token).data, "token": issued.raw}, status=201)


class TokenDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, token_id: str) -> Response:
        principal = get_principal(request)
        token = (
            selectors.user_tokens(user=principal.user, organization=principal.organization).filter(pk=token_id).first()
        )
        if token is None:
            raise not_found("Token")
        services.revoke_token(token=token)
        return Response(status=204)
