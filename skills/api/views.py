"""Skills API. Views are thin: parse, fetch through a selector (which applies the permission rule),
call a service, serialize."""

from __future__ import annotations

import hashlib
from typing import Any

from django.http import HttpResponse
from django.utils.http import parse_etags, quote_etag
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.auth import get_principal
from common.errors import ApiError
from common.pagination import NewestFirstCursorPagination
from common.principal import Principal
from skills import selectors, services
from skills.api.serializers import (
    CollectionSkillsSerializer,
    CollectionWriteSerializer,
    SkillCollectionSerializer,
    SkillDetailSerializer,
    SkillSerializer,
    SkillWriteSerializer,
)
from skills.models import Skill, SkillCollection, Visibility

_PRIVATE_CACHE = "private, no-cache"


def _not_modified(request: Request, etag: str) -> bool:
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    # Weak comparison (RFC 9110 13.1.2): a W/ prefix does not stop a match for GET.
    candidates = {tag.removeprefix("W/") for tag in parse_etags(header)}
    return "*" in candidates or quote_etag(etag) in candidates


def _with_etag(response: HttpResponse, etag: str) -> HttpResponse:
    response["ETag"] = quote_etag(etag)
    response["Cache-Control"] = _PRIVATE_CACHE
    return response


def _visibility_param(request: Request) -> str | None:
    value = request.query_params.get("visibility") or None
    if value is not None and value not in Visibility.values:
        raise ApiError(
            status_code=400,
            code="validation_error",
            message="Request is invalid.",
            details={"fields": {"visibility": [f"visibility must be one of: {', '.join(Visibility.values)}."]}},
        )
    return value


def _sharing(data: dict[str, Any]) -> services.Sharing:
    return services.Sharing(
        shared_with_user_ids=data.get("sharedWithUserIds"),
        shared_with_team_ids=data.get("sharedWithTeamIds"),
        maintainer_user_ids=data.get("maintainerUserIds"),
        maintainer_team_ids=data.get("maintainerTeamIds"),
    )


def _skill_input(request: Request) -> services.SkillInput:
    serializer = SkillWriteSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    return services.SkillInput(
        markdown=data.get("markdown"),
        name=data.get("name"),
        description=data.get("description"),
        content=data.get("content"),
        visibility=data.get("visibility"),
        set_collection="collectionId" in data,
        collection_id=data.get("collectionId"),
        sharing=_sharing(data),
    )


def _collection_input(request: Request) -> services.CollectionInput:
    serializer = CollectionWriteSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    return services.CollectionInput(
        name=data.get("name"),
        description=data.get("description"),
        visibility=data.get("visibility"),
        sharing=_sharing(data),
    )


def _skill_response(principal: Principal, skill: Skill, status: int = 200) -> Response:
    # Re-read through the organization-scoped selector: the write may have changed what the caller
    # can see (an admin making someone's skill private), but the answer is still the written object.
    fresh = selectors.organization_skills(principal, with_content=True).get(pk=skill.pk)
    return Response(SkillDetailSerializer(fresh).data, status=status)


def _collection_response(principal: Principal, collection: SkillCollection, status: int = 200) -> Response:
    fresh = selectors.organization_collections(principal).get(pk=collection.pk)
    return Response(SkillCollectionSerializer(fresh).data, status=status)


_LIST_PARAMS = [
    OpenApiParameter("q", str, description="Text contained in the name or description."),
    OpenApiParameter("visibility", str, enum=Visibility.values),
    OpenApiParameter("limit", int, description="Page size, at most 200."),
    OpenApiParameter("cursor", str),
]


class SkillListView(APIView):
    @extend_schema(
        operation_id="skills_list",
        parameters=[
            *_LIST_PARAMS,
            OpenApiParameter("collectionId", str, description="A collection id, or `root` for skills outside any."),
        ],
        responses=SkillSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        principal = get_principal(request)
        queryset = selectors.filter_skills(
            selectors.readable_skills(principal),
            collection_id=request.query_params.get("collectionId") or None,
            visibility=_visibility_param(request),
            text=request.query_params.get("q", "").strip(),
        )
        paginator = NewestFirstCursorPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(SkillSerializer(page, many=True).data)

    @extend_schema(operation_id="skills_create", request=SkillWriteSerializer, responses={201: SkillDetailSerializer})
    def post(self, request: Request) -> Response:
        principal = get_principal(request)
        skill = services.create_skill(actor=principal, data=_skill_input(request))
        return _skill_response(principal, skill, status=201)


class SkillDetailView(APIView):
    @extend_schema(operation_id="skills_retrieve", responses=SkillDetailSerializer)
    def get(self, request: Request, skill_id: str) -> Response:
        principal = get_principal(request)
        return Response(SkillDetailSerializer(selectors.get_readable_skill(principal, skill_id)).data)

    @extend_schema(operation_id="skills_update", request=SkillWriteSerializer, responses=SkillDetailSerializer)
    def put(self, request: Request, skill_id: str) -> Response:
        principal = get_principal(request)
        skill = selectors.get_editable_skill(principal, skill_id)
        skill = services.update_skill(actor=principal, skill=skill, data=_skill_input(request))
        return _skill_response(principal, skill)

    @extend_schema(operation_id="skills_destroy", responses={204: None})
    def delete(self, request: Request, skill_id: str) -> Response:
        principal = get_principal(request)
        services.delete_skill(actor=principal, skill=selectors.get_editable_skill(principal, skill_id))
        return Response(status=204)


class SkillByNameView(APIView):
    @extend_schema(operation_id="skills_by_name", responses=SkillDetailSerializer)
    def get(self, request: Request, name: str) -> Response:
        principal = get_principal(request)
        return Response(SkillDetailSerializer(selectors.get_readable_skill_by_name(principal, name)).data)


class _MarkdownRenderer(BaseRenderer):
    media_type = "text/markdown"
    format = "md"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return data.encode("utf-8") if isinstance(data, str) else b""


class SkillMarkdownView(APIView):
    # Listed so `Accept: text/markdown` negotiates; errors are still rendered as JSON (see below).
    renderer_classes = [JSONRenderer, _MarkdownRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        # The document itself is returned as a plain HttpResponse; whatever the client accepts,
        # error bodies keep the one JSON error shape.
        return JSONRenderer(), "application/json"

    @extend_schema(
        operation_id="skills_markdown",
        responses={
            (200, "text/markdown"): OpenApiResponse(OpenApiTypes.STR, description="The SKILL.md, with an ETag."),
            304: OpenApiResponse(description="Unchanged since the ETag given in If-None-Match."),
        },
        parameters=[OpenApiParameter("If-None-Match", str, OpenApiParameter.HEADER)],
    )
    def get(self, request: Request, skill_id: str) -> HttpResponse:
        principal = get_principal(request)
        # The stored ETag answers a conditional request without loading the (up to 200 KiB) content.
        skill = selectors.get_readable_skill(principal, skill_id, with_content=False)
        if _not_modified(request, skill.etag):
            return _with_etag(HttpResponse(status=304), skill.etag)
        response = HttpResponse(skill.markdown(), content_type="text/markdown; charset=utf-8")
        return _with_etag(response, skill.etag)


class CollectionListView(APIView):
    @extend_schema(
        operation_id="skill_collections_list", parameters=_LIST_PARAMS, responses=SkillCollectionSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        principal = get_principal(request)
        queryset = selectors.filter_collections(
            selectors.readable_collections(principal),
            visibility=_visibility_param(request),
            text=request.query_params.get("q", "").strip(),
        )
        paginator = NewestFirstCursorPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(SkillCollectionSerializer(page, many=True).data)

    @extend_schema(
        operation_id="skill_collections_create",
        request=CollectionWriteSerializer,
        responses={201: SkillCollectionSerializer},
    )
    def post(self, request: Request) -> Response:
        principal = get_principal(request)
        collection = services.create_collection(actor=principal, data=_collection_input(request))
        return _collection_response(principal, collection, status=201)


class CollectionDetailView(APIView):
    @extend_schema(operation_id="skill_collections_retrieve", responses=SkillCollectionSerializer)
    def get(self, request: Request, collection_id: str) -> Response:
        principal = get_principal(request)
        return Response(SkillCollectionSerializer(selectors.get_readable_collection(principal, collection_id)).data)

    @extend_schema(
        operation_id="skill_collections_update", request=CollectionWriteSerializer, responses=SkillCollectionSerializer
    )
    def put(self, request: Request, collection_id: str) -> Response:
        principal = get_principal(request)
        collection = selectors.get_editable_collection(principal, collection_id)
        collection = services.update_collection(actor=principal, collection=collection, data=_collection_input(request))
        return _collection_response(principal, collection)

    @extend_schema(
        operation_id="skill_collections_destroy", responses={204: None, 409: OpenApiResponse(description="Not empty.")}
    )
    def delete(self, request: Request, collection_id: str) -> Response:
        principal = get_principal(request)
        collection = selectors.get_editable_collection(principal, collection_id)
        services.delete_collection(actor=principal, collection=collection)
        return Response(status=204)


class CollectionByNameView(APIView):
    @extend_schema(operation_id="skill_collections_by_name", responses=SkillCollectionSerializer)
    def get(self, request: Request, name: str) -> Response:
        principal = get_principal(request)
        return Response(SkillCollectionSerializer(selectors.get_readable_collection_by_name(principal, name)).data)


class CollectionSkillsView(APIView):
    """Every skill of a collection in one answer, with an ETag, so a client syncs with one request."""

    @extend_schema(
        operation_id="skill_collections_skills",
        responses={200: CollectionSkillsSerializer, 304: OpenApiResponse(description="Unchanged.")},
        parameters=[OpenApiParameter("If-None-Match", str, OpenApiParameter.HEADER)],
    )
    def get(self, request: Request, collection_id: str) -> HttpResponse:
        principal = get_principal(request)
        collection = selectors.get_readable_collection(principal, collection_id)
        skills = selectors.collection_skills(principal, collection)
        data = {
            "collection": SkillCollectionSerializer(collection).data,
            "results": SkillSerializer(skills, many=True).data,
        }
        # The ETag is the body's hash, so anything in the answer that changes (a skill's content, its
        # sharing, the collection itself) changes it, with no bookkeeping to forget.
        body = JSONRenderer().render(data)
        etag = hashlib.sha256(body).hexdigest()
        if _not_modified(request, etag):
            return _with_etag(HttpResponse(status=304), etag)
        return _with_etag(HttpResponse(body, content_type="application/json"), etag)
