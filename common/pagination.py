"""Cursor pagination: stable under inserts, which offset pagination is not."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination


class NewestFirstCursorPagination(CursorPagination):
    ordering = ("-created_at", "-pk")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200
