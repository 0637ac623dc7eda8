"""Read message and field declarations out of a .proto file's text (enough to compare a hand-written schema
with the real one; not a protobuf parser)."""
from __future__ import annotations

import re

_TOKENS = re.compile(r"(message\s+(\w+)\s*\{)|(\})|((repeated\s+)?([\w.]+|map<[^>]+>)\s+(\w+)\s*=\s*(\d+)\s*(\[[^\]]*\])?\s*;)"
                     r"|(oneof\s+\w+\s*\{)|(enum\s+(\w+)\s*\{)|((\w+)\s*=\s*(\d+)\s*;)")


def proto_messages(text: str) -> tuple[dict[str, dict[str, tuple[int, str, bool]]], dict[str, dict[str, int]]]:
    """({message: {field: (number, type, repeated)}}, {enum: {value: number}}), nested names joined with '.'."""
    text = re.sub(r"//[^\n]*", "", text)
    messages: dict[str, dict[str, tuple[int, str, bool]]] = {}
    enums: dict[str, dict[str, int]] = {}
    stack: list[tuple[str, str | None]] = []
    for m in _TOKENS.finditer(text):
        names = [n for k, n in stack if k in ("msg", "enum")]
        if m.group(1):
            stack.append(("msg", m.group(2)))
            messages[".".join(names + [m.group(2)])] = {}
        elif m.group(10):
            stack.append(("oneof", None))
        elif m.group(11):
            stack.append(("enum", m.group(12)))
            enums[".".join(names + [m.group(12)])] = {}
        elif m.group(3):
            if stack:
                stack.pop()
        elif m.group(4) and stack and stack[-1][0] != "enum":
            msgs = [n for k, n in stack if k == "msg"]
            if msgs:
                messages[".".join(msgs)][m.group(7)] = (int(m.group(8)), m.group(6), bool(m.group(5)))
        elif m.group(13) and stack and stack[-1][0] == "enum":
            enums[".".join(names)][m.group(14)] = int(m.group(15))
    return messages, enums
