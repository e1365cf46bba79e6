"""Error answers shared by the FastAPI app and the lean ``/v1/select`` handler, so that
both give the same bytes for the same mistake."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

_KEPT = ("type", "loc", "msg")


def validation_error_response(errors: Sequence[Any]) -> JSONResponse:
    """FastAPI's 422, with a body that can always be encoded.

    An echoed ``input`` that is not text (a lone surrogate, bytes that are not UTF-8)
    is sent with U+FFFD in place; a number JSON cannot hold (``NaN``, ``Infinity``,
    which pydantic's parser accepts) is sent as that name in a string. Either would
    otherwise make the answer itself fail: a 500 instead of the 422.
    """
    body: list[Any] = []
    for error in errors:
        try:
            body.append(_json_safe(jsonable_encoder(error)))
        except (UnicodeError, ValueError, TypeError):
            kept = {k: v for k, v in error.items() if k in _KEPT}
            body.append(_json_safe(jsonable_encoder(kept)))
    return JSONResponse({"detail": body}, status_code=422)


def http_error_response(exc: HTTPException) -> JSONResponse:
    """What FastAPI's ``http_exception_handler`` answers for ``exc`` (a status with a
    body: the lean handler raises no 204 or 304)."""
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _json_safe(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
