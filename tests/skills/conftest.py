from __future__ import annotations

from typing import Any

from django.test import Client

from tests.conftest import Actor

SKILL_MD = """---
name: pdf-tools
description: Use when the user asks to read, fill or merge PDF files.
license: Apache-2.0
compatibility: Needs python3 and poppler-utils.
metadata:
  author: acme
  version: "1.2"
allowed-tools: Bash(pdftotext:*) Read
x-custom-flag: true
---

# PDF tools

1. Extract text with `pdftotext`.
2. Check the result.
"""


def api(client: Client, method: str, path: str, body: Any = None, **extra: Any) -> Any:
    """A JSON request; returns the response (``.json()`` for the body)."""
    kwargs: dict[str, Any] = dict(extra)
    if body is not None:
        kwargs["data"] = body
        kwargs["content_type"] = "application/json"
    return getattr(client, method)(path, **kwargs)


def create_skill(actor: Actor, **fields: Any) -> dict[str, Any]:
    body = {"name": "a-skill", "description": "Use for tests.", "content": "# Steps\n\nDo it.\n", **fields}
    response = api(actor.client(), "post", "/api/v1/skills", body)
    assert response.status_code == 201, response.content
    return response.json()


def create_collection(actor: Actor, **fields: Any) -> dict[str, Any]:
    body = {"name": "a-collection", "description": "Things.", **fields}
    response = api(actor.client(), "post", "/api/v1/skill-collections", body)
    assert response.status_code == 201, response.content
    return response.json()
