"""Public object ids: a short type prefix and 26 random base32 characters (e.g. ``sbx_…``).

Random ids cannot be enumerated across organizations, and the prefix tells a reader (and a log
line) what kind of object an id names.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from django.db import models
from django.utils.deconstruct import deconstructible


def new_id(prefix: str) -> str:
    raw = base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()
    return f"{prefix}_{raw}"


@deconstructible
class IdFactory:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self) -> str:
        return new_id(self.prefix)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdFactory) and other.prefix == self.prefix

    def __hash__(self) -> int:
        return hash(self.prefix)


class PublicIdField(models.CharField):  # type: ignore[type-arg,unused-ignore]
    """A primary key filled with ``new_id(prefix)``; having a default lets Django skip the UPDATE probe."""

    def __init__(self, prefix: str = "obj", **kwargs: Any) -> None:
        self.prefix = prefix
        kwargs.setdefault("max_length", 40)
        kwargs.setdefault("primary_key", True)
        kwargs.setdefault("editable", False)
        kwargs["default"] = IdFactory(prefix)
        super().__init__(**kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("default", None)
        kwargs["prefix"] = self.prefix
        return name, path, args, kwargs
