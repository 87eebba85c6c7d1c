"""The codec of what django-jobs stores encrypted: a JSON value in, an envelope out, and back.

The pair any stored payload goes through (a job's arguments, return value and error tracebacks;
a topic's message payloads):

* :func:`encrypt_json` ``(value) -> {"$encrypted": token}``: the value's JSON (UTF-8) encrypted
  with the first of ``DJANGO_JOBS["ENCRYPTION_KEYS"]``, as a Fernet token (AES-128-CBC and
  HMAC-SHA256, from the cryptography package). The envelope is JSON itself, so it goes into the
  JSON column the value would have gone into.
* :func:`decrypt_json` ``(envelope) -> value``: any of the keys decrypts (``MultiFernet``).

:func:`rotate_json` re-encrypts an envelope with the first key (``MultiFernet.rotate``), for
``manage.py jobs rotate-keys``. An envelope is recognised only where the owner of the value says
it is encrypted (a job's ``options["encrypt"]``), never by its shape alone, with two exceptions
documented in docs/howto/encryption.md: a flow child's value copied to its dependency row, and a
topic's message, whose payload is decrypted whenever it has the envelope's shape (publishing a
plain payload of that shape is refused).

Text columns (a dead letter's error and traceback, a blocked partition's last error) hold an
envelope as its JSON text, after the exception's name when there is one
(``ValueError: {"$encrypted":"gAAAA..."}``): :func:`encrypt_text`, :func:`decrypt_text`,
:func:`shown_text` (``ValueError: encrypted (not shown)``).

The cryptography package is an optional extra (``django-db-jobs[encryption]``), imported on the
first use of a key: the package imports without it, and encrypting without it raises
:class:`~django_jobs.exceptions.CryptographyMissing`. The key ring is built once per list of keys,
so ``override_settings(DJANGO_JOBS={"ENCRYPTION_KEYS": [...]})`` takes effect at once.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
from typing import Any

from ..conf import get_settings
from ..exceptions import CryptographyMissing, DecryptionFailed, EncryptionKeysMissing, InvalidEncryptionKeys

#: The one key of an envelope.
ENVELOPE = "$encrypted"
#: What the admin, ``manage.py jobs`` and the log show where an encrypted value would be.
SHOWN = "encrypted (not shown)"

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
#: An exception's name, as an error line starts with it ("ValueError: ...", "myapp.errors.Refused: ...").
_LABEL = r"[A-Za-z_][A-Za-z0-9_.]{0,199}"
#: A text column's encrypted value: an optional readable label, then the envelope's JSON.
_SEALED_TEXT = re.compile(rf'(?:({_LABEL}): )?(\{{"\$encrypted":"[A-Za-z0-9_=-]+"\}})')


def encrypt_json(value: Any) -> dict[str, str]:
    """``{"$encrypted": token}``: the JSON of ``value`` (already checked to be JSON) encrypted with
    the first key. Raises EncryptionKeysMissing when no key is configured, CryptographyMissing
    without the cryptography package."""
    token = _ring(_keys()).encrypt(_encode(value).encode())
    return {ENVELOPE: token.decode("ascii")}


def decrypt_json(envelope: Any) -> Any:
    """The value :func:`encrypt_json` put in ``envelope``. Raises DecryptionFailed when it is not
    an envelope or no configured key decrypts it (EncryptionKeysMissing when there is none)."""
    ring = _ring(_keys())
    token = _token(envelope)
    try:
        plain = ring.decrypt(token)
    except _invalid_token():
        raise DecryptionFailed() from None
    return json.loads(plain)


def rotate_json(envelope: Any) -> dict[str, str]:
    """``envelope`` re-encrypted with the first key (any key may have encrypted it); an envelope
    that the first key encrypted already is encrypted again (a new token). Raises as
    :func:`decrypt_json`."""
    ring = _ring(_keys())
    try:
        token = ring.rotate(_token(envelope))
    except _invalid_token():
        raise DecryptionFailed() from None
    return {ENVELOPE: token.decode("ascii")}


def is_current(envelope: Any) -> bool:
    """``envelope`` was encrypted with the first key (a rotation may leave it); raises as
    :func:`decrypt_json` when no key decrypts it."""
    keys = _keys()
    fernet = _cryptography()
    token = _token(envelope)
    try:
        _first(keys[0]).decrypt(token)
        return True
    except fernet.InvalidToken:
        pass
    try:
        _ring(keys).decrypt(token)
    except fernet.InvalidToken:
        raise DecryptionFailed() from None
    return False


def errors_current(errors: Any) -> bool:
    """Every encrypted traceback of ``errors`` was encrypted with the first key."""
    return all(is_current(e["traceback"]) for e in errors if _sealed_error(e)) if isinstance(errors, list) else True


def is_encrypted(value: Any) -> bool:
    """``value`` has the shape of an envelope (a dict of one string under ``"$encrypted"``)."""
    return type(value) is dict and len(value) == 1 and isinstance(value.get(ENVELOPE), str)


def encrypt_text(text: str, label: str = "") -> str:
    """What a text column stores for ``text`` encrypted: the JSON of :func:`encrypt_json`'s
    envelope, after ``label`` and ": " when given (the exception's name an error starts with, see
    :func:`error_label`, so monitoring can still say ``ValueError``). Raises as encrypt_json."""
    sealed = _encode(encrypt_json(text))
    return f"{label}: {sealed}" if label else sealed


def is_encrypted_text(value: Any) -> bool:
    """``value`` is what :func:`encrypt_text` stores (a plain error line never has that shape:
    it does not end with an envelope's JSON)."""
    return isinstance(value, str) and _SEALED_TEXT.fullmatch(value) is not None


def decrypt_text(value: Any) -> str:
    """The text :func:`encrypt_text` stored in ``value``. Raises DecryptionFailed when it is not
    an encrypted text or no configured key decrypts it (EncryptionKeysMissing when there is none)."""
    return str(decrypt_json(_text_envelope(value)))


def shown_text(value: Any) -> Any:
    """A text column as monitoring shows it: an encrypted one as :data:`SHOWN`, after its label
    (``ValueError: encrypted (not shown)``); any other value as it is."""
    if not is_encrypted_text(value):
        return value
    label = _SEALED_TEXT.fullmatch(value).group(1)  # type: ignore[union-attr]
    return f"{label}: {SHOWN}" if label else SHOWN


def rotate_text(value: Any) -> str:
    """:func:`rotate_json` of an encrypted text's envelope, its label kept."""
    label = _SEALED_TEXT.fullmatch(value).group(1) if is_encrypted_text(value) else None  # type: ignore[union-attr]
    sealed = _encode(rotate_json(_text_envelope(value)))
    return f"{label}: {sealed}" if label else sealed


def text_current(value: Any) -> bool:
    """An encrypted text was encrypted with the first key (a plain one needs no key: True)."""
    return not is_encrypted_text(value) or is_current(_text_envelope(value))


def error_label(error: str) -> str:
    """The exception's name an error line starts with (``"ValueError: boom"`` gives
    ``"ValueError"``), kept readable beside its encrypted text; "" when it starts with none."""
    name, sep, _ = error.partition(": ")
    return name if sep and re.fullmatch(_LABEL, name) else ""


def _text_envelope(value: Any) -> Any:
    found = _SEALED_TEXT.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise DecryptionFailed(f"Expected an encrypted text ('{{\"{ENVELOPE}\":...}}'); got a {type(value).__name__}.")
    return json.loads(found.group(2))


def require_keys() -> None:
    """Raise EncryptionKeysMissing (nothing configured) or CryptographyMissing unless a value can
    be encrypted now; what ``enqueue()`` of an ``encrypt=True`` task checks first."""
    _ring(_keys())


def hash_key(key: str) -> str:
    """What an encrypted job stores for a dedup or idempotency key: ``sha256:`` and the hex digest
    of its UTF-8, so the key's text is never stored and equal keys still meet."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


# -- a job's parts -------------------------------------------------------------------------------


def encrypt_arguments(args: list[Any], kwargs: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The stored ``args`` and ``kwargs`` of an encrypted job: an envelope each."""
    return encrypt_json(args), encrypt_json(kwargs)


def decrypt_arguments(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """The plain ``args`` and ``kwargs`` of an encrypted job's stored ones."""
    return decrypt_json(args), decrypt_json(kwargs)


def encrypt_error(error: dict[str, Any]) -> dict[str, Any]:
    """An attempt's error record with its traceback encrypted (it holds the exception's message,
    which may quote the arguments); the exception's class path stays readable."""
    return {**error, "traceback": encrypt_json(error.get("traceback", ""))}


def decrypt_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An encrypted job's error records with their tracebacks decrypted (those the engine wrote
    itself, a stall or a cancel, were never encrypted)."""
    return [{**e, "traceback": decrypt_json(e["traceback"])} if _sealed_error(e) else e for e in errors]


def shown_errors(errors: Any) -> Any:
    """An encrypted job's error records as monitoring shows them: each encrypted traceback
    replaced by :data:`SHOWN`."""
    if not isinstance(errors, list):
        return errors
    return [{**e, "traceback": SHOWN} if _sealed_error(e) else e for e in errors]


def rotate_errors(errors: Any) -> Any:
    """:func:`rotate_json` of each encrypted traceback of an encrypted job's errors."""
    if not isinstance(errors, list):
        return errors
    return [{**e, "traceback": rotate_json(e["traceback"])} if _sealed_error(e) else e for e in errors]


def _sealed_error(error: Any) -> bool:
    return isinstance(error, dict) and is_encrypted(error.get("traceback"))


# -- keys ----------------------------------------------------------------------------------------


def key_problems(keys: Any) -> list[str]:
    """What is wrong with an ``ENCRYPTION_KEYS`` value (empty: nothing), without cryptography:
    check E009."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        return [f"ENCRYPTION_KEYS must be a list of Fernet keys (the first encrypts); got {_kind(keys)}."]
    problems = []
    for i, key in enumerate(keys):
        if not _is_fernet_key(key):
            # Never the key itself in a message: it may be a real key with a typo.
            problems.append(
                f"ENCRYPTION_KEYS[{i}] is not a Fernet key (44 characters of URL-safe base64 encoding 32 bytes, "
                f"as Fernet.generate_key() makes); got {_kind(key)}."
            )
    if len({_as_bytes(k) for k in keys if _is_fernet_key(k)}) < len([k for k in keys if _is_fernet_key(k)]):
        problems.append("ENCRYPTION_KEYS lists the same key twice.")
    return problems


def _kind(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return f"{'a str' if isinstance(value, str) else 'bytes'} of {len(value)} characters"
    return f"a {type(value).__name__}"


def _as_bytes(key: Any) -> bytes:
    return key.encode("ascii") if isinstance(key, str) else key


def _is_fernet_key(key: Any) -> bool:
    if not isinstance(key, (str, bytes)):
        return False
    try:
        return len(base64.urlsafe_b64decode(_as_bytes(key))) == 32
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False


def _keys() -> tuple[bytes, ...]:
    keys = get_settings().ENCRYPTION_KEYS
    if not keys:
        raise EncryptionKeysMissing()
    if not isinstance(keys, (list, tuple)):
        raise InvalidEncryptionKeys(" ".join(key_problems(keys)))
    try:
        return _validated(tuple(keys))
    except TypeError:  # an unhashable entry: not a key
        raise InvalidEncryptionKeys(" ".join(key_problems(keys))) from None


@functools.lru_cache(maxsize=8)
def _validated(keys: Any) -> tuple[bytes, ...]:
    """``keys`` as bytes, checked once per list; InvalidEncryptionKeys names what is wrong."""
    problems = key_problems(keys)
    if problems:
        raise InvalidEncryptionKeys(" ".join(problems) + " See docs/howto/encryption.md.")
    return tuple(_as_bytes(k) for k in keys)


@functools.lru_cache(maxsize=8)
def _ring(keys: tuple[bytes, ...]) -> Any:
    """The ``MultiFernet`` of ``keys``, built once per list (settings may change in tests)."""
    fernet = _cryptography()
    return fernet.MultiFernet([fernet.Fernet(k) for k in keys])


@functools.lru_cache(maxsize=8)
def _first(key: bytes) -> Any:
    return _cryptography().Fernet(key)


def _cryptography() -> Any:
    try:
        # Optional: the "encryption" extra; imported on first use so the package imports without it.
        from cryptography import fernet
    except ImportError:
        raise CryptographyMissing() from None
    return fernet


def _invalid_token() -> type[Exception]:
    return _cryptography().InvalidToken


def _token(envelope: Any) -> bytes:
    if not is_encrypted(envelope):
        raise DecryptionFailed(
            f"Expected an encrypted value ({{{ENVELOPE!r}: token}}); got a {type(envelope).__name__}."
        )
    try:
        return envelope[ENVELOPE].encode("ascii")
    except UnicodeEncodeError:
        raise DecryptionFailed() from None


__all__ = [
    "ENVELOPE", "SHOWN", "decrypt_arguments", "decrypt_errors", "decrypt_json", "decrypt_text", "encrypt_arguments",
    "encrypt_error", "encrypt_json", "encrypt_text", "error_label", "errors_current", "hash_key", "is_current",
    "is_encrypted", "is_encrypted_text", "key_problems", "require_keys", "rotate_errors", "rotate_json", "rotate_text",
    "shown_errors", "shown_text", "text_current",
]  # fmt: skip
