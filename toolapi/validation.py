"""Arguments: form-field coercion by the tool's schema, and validation with cached compiled validators."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

_CACHE_SIZE = 4096
_cache: OrderedDict[str, Validator] = OrderedDict()
_cache_lock = threading.Lock()


def schema_digest(schema: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def validator_for(schema: dict[str, Any]) -> Validator:
    """A compiled validator, cached by the schema's content so an unchanged tool never recompiles."""
    key = schema_digest(schema)
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    # Tool schemas without $schema follow MCP's default dialect, JSON Schema 2020-12.
    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
        validator: Validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    except SchemaError:
        # An upstream with a malformed schema still gets its calls through; the upstream validates.
        validator = Draft202012Validator({})
    with _cache_lock:
        _cache[key] = validator
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return validator


def _pointer(path: Any) -> str:
    return "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in path) if path else ""


def _field(path: Any) -> str:
    return ".".join(str(part) for part in path) or "nonFieldErrors"


def validation_details(schema: dict[str, Any], arguments: Any) -> dict[str, Any] | None:
    """None when ``arguments`` is valid; otherwise the error details (fields, and path/rule/message)."""
    errors = sorted(validator_for(schema).iter_errors(arguments), key=lambda error: (list(error.path), error.validator))
    if not errors:
        return None
    fields: dict[str, list[str]] = {}
    items: list[dict[str, Any]] = []
    # Only top-level errors: for anyOf/oneOf, "is not valid under any of the given schemas" is what the
    # caller needs; the per-branch errors in its context would read as contradictions.
    for error in errors:
        fields.setdefault(_field(error.absolute_path), []).append(error.message)
        items.append(
            {
                "path": _pointer(error.absolute_path),
                "rule": str(error.validator),
                "expected": _jsonable(error.validator_value),
                "message": error.message,
            }
        )
    return {"fields": fields, "errors": items}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


# -- form-encoded bodies --------------------------------------------------------------------------

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _types_of(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [item for item in declared if isinstance(item, str)]
    found: list[str] = []
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            found.extend(_types_of(branch))
    if "enum" in schema and not found:
        found.extend(sorted({_json_type(value) for value in schema["enum"]}))
    if "const" in schema and not found:
        found.append(_json_type(schema["const"]))
    return found


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    # Local refs only (#/$defs/X): enough to learn a form field's type.
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 32:
        ref: str = schema["$ref"]
        if not ref.startswith("#"):
            return schema
        node: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        schema = node
        seen += 1
    return schema


def _coerce_scalar(raw: str, kinds: list[str]) -> Any:
    """The first reading of ``raw`` that the schema's types allow; unchanged when none fits.

    An unconvertible value is left as the string, so validation reports it against the schema's
    type instead of the coercion inventing its own error.
    """
    for kind in kinds or ["string"]:
        if kind == "string":
            return raw
        if kind == "integer":
            try:
                return int(raw.strip())
            except ValueError:
                try:
                    number = float(raw.strip())
                except ValueError:
                    continue
                if number.is_integer():
                    return int(number)
        elif kind == "number":
            try:
                number = float(raw.strip())
            except ValueError:
                continue
            return int(number) if number.is_integer() and "." not in raw and "e" not in raw.lower() else number
        elif kind == "boolean":
            lowered = raw.strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
        elif kind == "null":
            if raw.strip().lower() in {"", "null"}:
                return None
        elif kind in {"object", "array"}:
            try:
                parsed = json.loads(raw)
            except ValueError:
                continue
            if _json_type(parsed) == kind:
                return parsed
    return raw


def coerce_form(values: dict[str, list[str]], schema: dict[str, Any]) -> dict[str, Any]:
    """Turn form fields (all strings, possibly repeated) into arguments typed by the tool's schema."""
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    arguments: dict[str, Any] = {}
    for key, raw_values in values.items():
        prop = _resolve(properties.get(key), schema) if properties else None
        kinds = _types_of(prop)
        if "array" in kinds and isinstance(prop, dict):
            if len(raw_values) == 1:
                parsed = _coerce_scalar(raw_values[0], ["array"])
                if isinstance(parsed, list):
                    arguments[key] = parsed
                    continue
            item_kinds = _types_of(_resolve(prop.get("items"), schema))
            arguments[key] = [_coerce_scalar(value, item_kinds) for value in raw_values]
        else:
            arguments[key] = _coerce_scalar(raw_values[-1], kinds)
    return arguments
