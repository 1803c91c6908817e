"""Errors as the OpenAI API shapes them: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

    400 invalid_request_error   a value out of range or a body that is not JSON (param names the field)
    401 authentication_error    a missing or wrong API key
    404 not_found_error         an unknown model or endpoint
    408 timeout_error           a body of which nothing came for the server's timeout (it restarts with each chunk)
    413 invalid_request_error   a body larger than the server takes
    422 invalid_request_error   a field of the wrong type, or missing
    429 rate_limit_error        the queue is full (Retry-After says when to try again)
    500 server_error            anything else; the message never carries a traceback
    503 server_error            the server is shutting down (a request in flight, or one that arrives then), or
                                generation has stopped (the scheduler's thread ended)
    504 timeout_error           the request took longer than the server's timeout
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi.responses import JSONResponse

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               408: "timeout_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 503: "server_error", 504: "timeout_error"}
SHUTTING_DOWN = "the server is shutting down; send the request again once it is back"  # 503's message
STOPPED = "generation has stopped (the batching scheduler's thread ended; the log says why): restart the server"


class APIError(Exception):
    """An error answered as OpenAI-style JSON with `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        from fastapi.responses import JSONResponse  # here: the messages above import without FastAPI

        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)
