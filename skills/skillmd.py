"""SKILL.md documents (the Agent Skills format): a YAML frontmatter block, then Markdown instructions.

Parsing is strict where leniency would corrupt data or cost resources: YAML aliases (billion-laughs
bombs), duplicate keys (which value wins is loader-dependent), and `name: 123` or `description: yes`
(silently coerced by YAML 1.1) are errors, each message naming the field and the rule. Optional spec
fields and unknown fields are kept, in document order, so a document survives a round trip.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

NAME_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
NAME_MAX = 64
DESCRIPTION_MAX = 1024
COLLECTION_DESCRIPTION_MAX = 1024
CONTENT_MAX = 204_800
MARKDOWN_MAX = 204_800
COMPATIBILITY_MAX = 500
# Frontmatter is a few lines in practice; the cap bounds the pure-Python YAML parser's work.
FRONTMATTER_MAX = 32 * 1024
# Deep nesting would otherwise reach Python's recursion limit inside the YAML composer.
MAX_NESTING = 16

_DELIMITER = re.compile(r"^---[ \t]*$", re.MULTILINE)
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class SkillFormatError(ValueError):
    """A SKILL.md (or one of its fields) breaks a rule; ``field`` names the frontmatter field, if any."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class SkillDocument:
    name: str
    description: str
    content: str
    # Every other frontmatter field (license, compatibility, metadata, allowed-tools, unknown ones).
    extra: dict[str, Any] = field(default_factory=dict)


# --- field rules, shared by the SKILL.md parser and the plain JSON fields -------------------------


def text_problem(value: str) -> str | None:
    """Strings the database or UTF-8 cannot hold (PostgreSQL text refuses NUL; lone surrogates do not encode)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (it contains an unpaired surrogate)"
    return None


def name_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > NAME_MAX:
        return f"must be at most {NAME_MAX} characters (it has {len(value)})"
    if NAME_RE.fullmatch(value) is None:
        return "must be lowercase letters, digits and single dashes, not starting or ending with a dash (^[a-z0-9]+(-[a-z0-9]+)*$)"
    return None


def description_problem(value: str, *, maximum: int = DESCRIPTION_MAX, required: bool = True) -> str | None:
    problem = text_problem(value)
    if problem:
        return problem
    if required and not value.strip():
        return "must not be empty"
    if len(value) > maximum:
        return f"must be at most {maximum} characters (it has {len(value)})"
    return None


def content_problem(value: str) -> str | None:
    problem = text_problem(value)
    if problem:
        return problem
    if not value.strip():
        return "must not be empty"
    if len(value) > CONTENT_MAX:
        return f"must be at most {CONTENT_MAX} characters (it has {len(value)})"
    return None


def normalize_text(text: str) -> str:
    """Drop a leading byte-order mark and turn CRLF and lone CR line ends into LF."""
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_content(text: str) -> str:
    # Blank lines between the closing --- and the instructions are layout, not content; dropping them
    # keeps parse(render(x)) == x whichever way the instructions were given.
    return normalize_text(text).lstrip("\n")


# --- YAML ---------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases, anchors, merge keys, duplicate keys, non-string keys or timestamps."""

    # Dates stay strings: a datetime could not be stored as JSON or rendered back unchanged.
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise ComposerError(None, None, "aliases (*name) are not allowed", mark)
        if getattr(event, "anchor", None) is not None:
            raise ComposerError(None, None, "anchors (&name) are not allowed", mark)
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise ComposerError(None, None, f"nesting deeper than {MAX_NESTING} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                raise ConstructorError(None, None, "merge keys (<<) are not allowed", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ConstructorError(None, None, f"keys must be strings, not {_type_name(key)}", key_node.start_mark)
            if key in seen:
                raise ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _load_yaml(text: str) -> Any:
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "invalid YAML"
        mark = exc.problem_mark or exc.context_mark
        # +2: marks count from 0 and the frontmatter starts on the document's second line.
        where = f" (line {mark.line + 2}, column {mark.column + 1})" if mark is not None else ""
        raise SkillFormatError(f"Invalid YAML in frontmatter: {problem}{where}.") from None
    except yaml.YAMLError as exc:
        raise SkillFormatError(f"Invalid YAML in frontmatter: {exc}.") from None
    finally:
        loader.dispose()


def _check_json_value(value: Any, path: str) -> None:
    """Extra fields are stored as JSON, so only JSON's types are accepted (no sets, bytes or NaN)."""
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SkillFormatError(f"Frontmatter field '{path}' must be a finite number.", field=path.split(".")[0])
        return
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise SkillFormatError(f"Frontmatter field '{path}' {problem}.", field=path.split(".")[0])
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_json_value(item, f"{path}.{key}")
        return
    raise SkillFormatError(
        f"Frontmatter field '{path}' has {_type_name(value)}, which is not supported.", field=path.split(".")[0]
    )


def _required_string(data: dict[str, Any], key: str) -> str:
    if key not in data:
        raise SkillFormatError(f"Missing required field in frontmatter: {key}.", field=key)
    value = data[key]
    if not isinstance(value, str):
        raise SkillFormatError(
            f"Frontmatter field '{key}' must be a string, not {_type_name(value)} (quote it if you mean the text).",
            field=key,
        )
    return value


def _validate_extra(extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        _check_json_value(value, key)
    if "license" in extra and not isinstance(extra["license"], str):
        raise SkillFormatError(
            f"Frontmatter field 'license' must be a string, not {_type_name(extra['license'])}.", field="license"
        )
    if "compatibility" in extra:
        value = extra["compatibility"]
        if not isinstance(value, str):
            raise SkillFormatError(
                f"Frontmatter field 'compatibility' must be a string, not {_type_name(value)}.", field="compatibility"
            )
        if not value.strip() or len(value) > COMPATIBILITY_MAX:
            raise SkillFormatError(
                f"Frontmatter field 'compatibility' must be 1 to {COMPATIBILITY_MAX} characters (it has {len(value)}).",
                field="compatibility",
            )
    if "metadata" in extra:
        value = extra["metadata"]
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise SkillFormatError(
                "Frontmatter field 'metadata' must be a mapping of strings to strings.", field="metadata"
            )
    if "allowed-tools" in extra and not isinstance(extra["allowed-tools"], str):
        raise SkillFormatError(
            f"Frontmatter field 'allowed-tools' must be a space-separated string, not {_type_name(extra['allowed-tools'])}.",
            field="allowed-tools",
        )


# --- parse and render ---------------------------------------------------------------------------


def parse_skill_md(markdown: str) -> SkillDocument:
    """Parse and validate a whole SKILL.md; raise SkillFormatError naming the broken rule."""
    if len(markdown) > MARKDOWN_MAX:
        raise SkillFormatError(f"SKILL.md must be at most {MARKDOWN_MAX} characters (it has {len(markdown)}).")
    problem = text_problem(markdown)
    if problem:
        raise SkillFormatError(f"SKILL.md {problem}.")
    text = normalize_text(markdown)
    first_end = text.find("\n")
    first_line = text if first_end < 0 else text[:first_end]
    if _DELIMITER.fullmatch(first_line) is None:
        raise SkillFormatError("SKILL.md must start with YAML frontmatter: the first line must be ---.")
    start = len(text) if first_end < 0 else first_end + 1
    closing = _DELIMITER.search(text, start)
    if closing is None:
        raise SkillFormatError("SKILL.md frontmatter is not closed: end it with a line containing only ---.")
    frontmatter = text[start : closing.start()]
    if len(frontmatter) > FRONTMATTER_MAX:
        raise SkillFormatError(
            f"SKILL.md frontmatter must be at most {FRONTMATTER_MAX} characters (it has {len(frontmatter)})."
        )
    data = _load_yaml(frontmatter)
    if not isinstance(data, dict):
        raise SkillFormatError(f"SKILL.md frontmatter must be a YAML mapping, not {_type_name(data)}.")

    name = _required_string(data, "name")
    problem = text_problem(name) or name_problem(name)
    if problem:
        raise SkillFormatError(f"Frontmatter field 'name' {problem}.", field="name")
    description = _required_string(data, "description")
    problem = description_problem(description)
    if problem:
        raise SkillFormatError(f"Frontmatter field 'description' {problem}.", field="description")
    extra = {key: value for key, value in data.items() if key not in ("name", "description")}
    _validate_extra(extra)

    content = normalize_content(text[closing.end() :])
    problem = content_problem(content)
    if problem:
        raise SkillFormatError(f"SKILL.md instructions (the Markdown after the frontmatter) {problem}.")
    return SkillDocument(name=name, description=description, content=content, extra=extra)


class _Dumper(yaml.SafeDumper):
    pass


# YAML counts NEL and the Unicode line and paragraph separators as line breaks; PyYAML writes them raw
# in plain and single-quoted scalars, where reading folds them into spaces. Double quotes escape them.
_UNICODE_BREAKS = frozenset("\x85\u2028\u2029")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if _UNICODE_BREAKS.intersection(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def render_frontmatter(*, name: str, description: str, extra: dict[str, Any]) -> str:
    return yaml.dump(
        {"name": name, "description": description, **extra},
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        # Long descriptions stay on one line instead of being folded.
        width=1 << 20,
    )


def render_skill_md(document: SkillDocument) -> str:
    frontmatter = render_frontmatter(name=document.name, description=document.description, extra=document.extra)
    return f"---\n{frontmatter}---\n\n{document.content}"


def dump_extra(extra: dict[str, Any]) -> str:
    # Stored as JSON text rather than jsonb, which would reorder keys (and so reorder the frontmatter).
    return json.dumps(extra, ensure_ascii=False, allow_nan=False)


def load_extra(raw: str) -> dict[str, Any]:
    value = json.loads(raw) if raw else {}
    return value if isinstance(value, dict) else {}
