"""The JSON checks of what a job carries: its arguments, its return value, its progress.

Every value must survive a JSON round trip unchanged, so the worker calls the task with what the
caller passed; errors name the argument (``args[0] is a datetime, which is not JSON; ...``).
Part of :mod:`django_jobs.spec`: the backend checks an enqueue's arguments here, the executor a
return value, ``context.set_progress`` a progress value, a schedule declaration its arguments.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..exceptions import (
    ArgumentOutOfRange,
    ArgumentTooDeep,
    InvalidArgumentValue,
    InvalidTaskArguments,
    PayloadTooLarge,
)

#: How deep one task argument (a return value, progress) may nest lists and dicts: ``[[1]]`` is
#: 2 levels. Deeper values would exhaust Python's recursion limit in ``json`` (and in Django's
#: ``normalize_json``) somewhere between enqueue and the worker; ArgumentTooDeep says so first.
#: 30: MariaDB refuses JSON nested 32 levels (its JSON columns check ``JSON_VALID``), and an
#: argument sits one level down in the stored ``args`` list; one limit on every database, so a
#: task that enqueues on one enqueues on all.
MAX_JSON_DEPTH = 30


def check_json(value: Any, where: str) -> None:
    """Raise InvalidTaskArguments naming ``where`` unless ``value`` survives a JSON round trip
    unchanged: str, int, finite float, bool, None, and lists, tuples and dicts with string keys
    of those, at most :data:`MAX_JSON_DEPTH` levels deep."""
    _json_value(value, where, where, 1, normalize=False)


def normalize_argument(value: Any, where: str) -> Any:
    """``value`` as Django's ``normalize_json`` makes it (what Django's ``TaskResult`` does to
    ``args`` and ``kwargs``): bytes decoded from UTF-8, any other sequence a list, any mapping a
    dict, and a subclass of str, int or float (a StrEnum, an IntEnum) its plain value, as JSON
    stores it. Then checked as :func:`check_json` checks. So the value returned is what
    ``json.loads`` gives back from its JSON (fresh lists and dicts, plain leaves): exactly what
    the worker will get.

    One difference, on purpose: a mapping key must be a string (or UTF-8 bytes). Django keeps
    ``{1: "a"}`` as it is, but JSON stores ``{"1": "a"}``, so the task would be called with a
    different key than the caller gave; that raises InvalidTaskArguments instead.
    """
    return _json_value(value, where, where, 1, normalize=True)


def _json_value(value: Any, where: str, top: str, depth: int, *, normalize: bool) -> Any:
    """:func:`check_json` and :func:`normalize_argument`, in Django's order of cases. ``top``:
    the argument ``where`` is inside (the depth error names it, not a path 100 levels long)."""
    if isinstance(value, dict) or (normalize and isinstance(value, Mapping)):
        return _json_object(value, where, top, depth, normalize=normalize)
    if normalize and isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise InvalidArgumentValue(
                f"{where} is bytes that are not UTF-8, which Django's tasks decode to text; pass text, or "
                "base64-encode binary data (base64.b64encode(data).decode())."
            ) from None
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidArgumentValue(
                f"{where} contains a NUL character (\\x00), which PostgreSQL cannot store in JSON; remove it "
                "or pass the data base64-encoded."
            )
        # A subclass's text, as json writes it (str.__str__ ignores an overridden __str__).
        return value if type(value) is str else str.__str__(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        _check_int(value, where)
        return value if type(value) is int else int.__int__(value)  # json writes int.__repr__
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentValue(f"{where} is {value!r}; JSON has no NaN or infinity.")
        return value if type(value) is float else float.__float__(value)  # json writes float.__repr__
    if isinstance(value, (list, tuple)) or (normalize and isinstance(value, Sequence) and not isinstance(value, bytes)):
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(top)
        return [_json_value(item, f"{where}[{i}]", top, depth + 1, normalize=normalize) for i, item in enumerate(value)]
    _not_json(value, where)


def _json_object(value: Mapping[Any, Any], where: str, top: str, depth: int, *, normalize: bool) -> dict[str, Any]:
    if depth > MAX_JSON_DEPTH:
        raise _too_deep(top)
    result: dict[str, Any] = {}
    for key, item in value.items():
        if normalize and isinstance(key, bytes):
            key = _json_value(key, f"a key of {where}", top, depth, normalize=True)
        if not isinstance(key, str):
            raise InvalidTaskArguments(
                f"{where} has a {type(key).__name__} key {key!r}; JSON object keys must be strings."
            )
        key = _json_value(key, f"a key of {where}", top, depth, normalize=normalize)
        result[key] = _json_value(item, f"{where}[{key!r}]", top, depth + 1, normalize=normalize)
    return result


def _too_deep(top: str) -> ArgumentTooDeep:
    return ArgumentTooDeep(
        f"{top} nests lists and dicts deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH); flatten it, or "
        "store the structure elsewhere (a model, a file) and pass its key."
    )


def _check_int(value: int, where: str) -> None:
    """Raise ArgumentOutOfRange for an integer with more digits than Python converts to and from
    text (``sys.get_int_max_str_digits()``, 4,300 by default): json could not write it, and a
    worker could not read it back."""
    limit = sys.get_int_max_str_digits()
    if not limit or value.bit_length() < 3 * limit:  # 3 bits a digit at most: a cheap test first
        return
    magnitude = abs(int(value))
    digits = math.floor(magnitude.bit_length() * math.log10(2))  # exact, or one short
    digits += magnitude >= 10**digits
    if digits > limit:
        raise ArgumentOutOfRange(
            f"{where} is an integer of {digits} digits, more than the {limit} Python's JSON reads back; pass it "
            "as a string (str(value)) and convert it in the task."
        )


def _not_json(value: Any, where: str) -> NoReturn:
    hint = {
        "datetime": "pass .isoformat() and parse it in the task",
        "date": "pass .isoformat() and parse it in the task",
        "Decimal": "pass str(value)",
        "UUID": "pass str(value)",
        "set": "pass a sorted list",
        "frozenset": "pass a sorted list",
        "bytes": "pass base64 text or store the data and pass a key",
    }.get(type(value).__name__, "pass its primary key or a plain dict instead")
    raise InvalidTaskArguments(f"{where} is a {type(value).__name__}, which is not JSON; {hint}.")


#: ``json.dumps(value, ensure_ascii=False)`` without building an encoder per call (json.dumps
#: makes one whenever an option differs from its defaults).
_encode_json = json.JSONEncoder(ensure_ascii=False).encode


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def encode_payload(args: Any, kwargs: Any, *, cap: int) -> tuple[list[Any], dict[str, Any], str, str]:
    """Validate one job's arguments; return them as the worker will read them back (what
    ``json.loads`` of their JSON gives: :func:`normalize_argument` makes exactly that, no
    decode needed), then the JSON of its args and of its kwargs.

    ``cap``: MAX_PAYLOAD_BYTES; more bytes of JSON raise PayloadTooLarge.
    """
    if not isinstance(kwargs, dict):
        raise InvalidTaskArguments("kwargs must be a dict.")
    if not isinstance(args, (list, tuple)):
        args = list(args)
    # Normalised as Django's TaskResult normalises them (bytes decoded, sequences as lists).
    args = [normalize_argument(value, f"args[{i}]") for i, value in enumerate(args)]
    named = {}
    for key, value in kwargs.items():
        if isinstance(key, bytes):
            key = normalize_argument(key, "a keyword argument name")
        if not isinstance(key, str):
            raise InvalidTaskArguments(f"kwargs has a {type(key).__name__} key {key!r}; names must be strings.")
        key = normalize_argument(key, "a keyword argument name")
        named[key] = normalize_argument(value, f"kwargs[{key!r}]")
    # Most jobs have no args or no kwargs: their JSON needs no encoder.
    args_json = _encode_json(args) if args else "[]"
    kwargs_json = _encode_json(named) if named else "{}"
    try:
        size = _utf8_len(args_json) + _utf8_len(kwargs_json)
    except UnicodeEncodeError:
        raise InvalidArgumentValue(
            "The job's arguments contain a lone surrogate (such as '\\ud800'), which is not valid UTF-8 and "
            "PostgreSQL cannot store; pass valid text or the data base64-encoded."
        ) from None
    if size > cap:
        raise PayloadTooLarge(
            f"The job's arguments are {size} bytes of JSON, over MAX_PAYLOAD_BYTES={cap}; store "
            "large data elsewhere (a model, a file) and pass its key."
        )
    return args, named, args_json, kwargs_json


def check_payload(args: Any, kwargs: Any, *, cap: int) -> tuple[list[Any], dict[str, Any]]:
    """:func:`encode_payload` without the JSON: the arguments as the worker will read them back."""
    args, kwargs, _, _ = encode_payload(args, kwargs, cap=cap)
    return args, kwargs


__all__ = ["MAX_JSON_DEPTH", "check_json", "check_payload", "encode_payload", "normalize_argument"]
