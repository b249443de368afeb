"""The files that are data, not code: YAML manifests and JSON records, written the same way each time.

The YAML writer is the package's own so no value can change type or add a key on reading:
block style, insertion order, every string a double-quoted scalar with every non-printable
character escaped.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def to_yaml(obj: Any) -> bytes:
    """Block-style YAML of dicts/lists/scalars, keys in insertion order, strings double-quoted.

    Deterministic and dependency-free; every string is a double-quoted scalar with every
    non-printable character escaped, so no value is ever re-typed by a YAML reader (`"1"` stays a
    string, `"on"` is not a boolean) and none can break a line (YAML also breaks at U+2028).
    """
    lines: list[str] = []
    if isinstance(obj, dict):
        _yaml_map(obj, 0, lines)
    elif isinstance(obj, list):
        _yaml_list(obj, 0, lines)
    else:
        lines.append(_yaml_scalar(obj))
    return ("\n".join(lines) + "\n").encode()


def _yaml_string(text: str) -> str:
    """A YAML double-quoted scalar: `\\`, `"` and every non-printable character escaped."""
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return '"' + "".join(out) + '"'


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format(v, ".9g") if math.isfinite(v) else ".nan" if v != v else ".inf" if v > 0 else "-.inf"
    if isinstance(v, str):
        return _yaml_string(v)
    if isinstance(v, dict) and not v:
        return "{}"
    if isinstance(v, list) and not v:
        return "[]"
    raise TypeError(f"cannot write {type(v).__name__} as YAML")


def _yaml_key(k: str) -> str:
    plain = _PLAIN_KEY.fullmatch(k) and k.lower() not in ("true", "false", "null", "yes", "no", "on", "off")
    return k if plain else _yaml_string(k)


_IMPLICIT_KEY_MAX = 1000  # YAML limits an implicit key to 1024 characters; past that `? key` is explicit


def _yaml_map(d: dict, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for k, v in d.items():
        key = _yaml_key(str(k))
        if len(key) > _IMPLICIT_KEY_MAX:  # `? key` on its line, then `: value`
            lines.append(f"{pad}? {key}")
            key = ""
        if isinstance(v, dict) and v:
            lines.append(f"{pad}{key}:")
            _yaml_map(v, indent + 2, lines)
        elif isinstance(v, list) and v:
            lines.append(f"{pad}{key}:")
            _yaml_list(v, indent + 2, lines)
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(v)}")


def _yaml_list(items: list, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for item in items:
        if isinstance(item, dict) and item:
            sub: list[str] = []
            _yaml_map(item, indent + 2, sub)
            lines.append(f"{pad}- {sub[0].lstrip()}")
            lines.extend(sub[1:])
        elif isinstance(item, list) and item:
            raise TypeError("nested lists are not written")
        else:
            lines.append(f"{pad}- {_yaml_scalar(item)}")


def strict_schema(schema):
    """A CRD schema as `kubectl apply --validate=strict` reads it: the API server's pruning of
    unknown fields made an error (an object schema with `properties` gets `additionalProperties:
    false`), so a misspelt field fails validation instead of vanishing."""
    if isinstance(schema, dict):
        out = {k: ({pk: strict_schema(pv) for pk, pv in v.items()} if k == "properties" else strict_schema(v))
               for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(x) for x in schema]
    return schema
