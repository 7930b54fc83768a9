"""Length-prefixed JSON frames: the worker protocol's wire format (standard library only).

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Both ends refuse
frames longer than an agreed maximum, so neither side can be made to buffer unbounded output.
"""

from __future__ import annotations

import json
import struct

HEADER = struct.Struct(">I")


class FrameTooLarge(ValueError):
    pass


def pack(message: dict, max_bytes: int) -> bytes:
    body = json.dumps(message, ensure_ascii=False, allow_nan=True).encode("utf-8")
    if len(body) > max_bytes:
        raise FrameTooLarge(f"message of {len(body)} bytes exceeds the {max_bytes}-byte limit")
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes, max_bytes: int) -> int:
    (length,) = HEADER.unpack(header)
    if length > max_bytes:
        raise FrameTooLarge(f"peer announced a {length}-byte message; the limit is {max_bytes}")
    return length


def unpack(body: bytes) -> dict:
    message = json.loads(body.decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message
