"""serve.py's HTTP API: the request bodies, the limits a request must keep and the errors
it can get, each one JSON line with its status (inference/server.py answers them)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pydantic
from fastapi.exceptions import RequestValidationError

RETRY_AFTER_S = 1  # what a 503 (queue full, warming up) tells the client to wait


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask; each breach is a 4xx JSON error naming the limit."""

  max_chars: int = 2000  # per sentence (characters)
  max_sentences: int = 256  # per request
  max_body_bytes: int = 1 << 20  # 413 above
  timeout_s: float = 60.0  # a request not answered by then gets 504 and its work is dropped
  max_queue_sentences: int = 4096  # sentences waiting for a batch: 503 + Retry-After above

  def check(self) -> None:
    for name, value in dataclasses.asdict(self).items():
      if value <= 0:
        raise ValueError(f'{name}={value} must be positive')
    if self.max_sentences > self.max_queue_sentences:
      raise ValueError(f'max_sentences={self.max_sentences} must not exceed '
                       f'max_queue_sentences={self.max_queue_sentences}: such a request would '
                       'never fit the queue')


class TranslateRequest(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra='forbid', strict=True)
  text: list[str] = pydantic.Field(min_length=1)
  # one target text per sentence that its translation must start with ('' for none)
  prefix: Optional[list[str]] = None
  n_best: int = pydantic.Field(1, ge=1)
  return_scores: bool = False
  return_alignment: bool = False
  # one JSON line per sentence as it finishes ({"index": i, ...}), then {"model": ...}
  stream: bool = False
  return_attention: bool = False  # per hypothesis [tokens][source_tokens]: larger answers


class ScoreRequest(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra='forbid', strict=True)
  source: list[str] = pydantic.Field(min_length=1)
  target: list[str] = pydantic.Field(min_length=1)


class ApiError(Exception):
  """An answer other than 200: status, one-line message, error kind (metrics), headers."""

  def __init__(self, status: int, message: str, kind: str,
               headers: Optional[dict[str, str]] = None):
    super().__init__(message)
    self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def one_line(e: pydantic.ValidationError | RequestValidationError) -> str:
  """The first validation error as 'where: what' (where: the field's path)."""
  first = e.errors()[0]
  where = '.'.join(str(part) for part in first.get('loc', ()) if part != 'body') or 'body'
  more = f' (and {len(e.errors()) - 1} more)' if len(e.errors()) > 1 else ''
  return f'{where}: {first.get("msg", "invalid")}{more}'


def body_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
  """The OpenAPI description of a body the endpoint reads itself (to bound its size)."""
  return {'requestBody': {'required': True, 'content': {
      'application/json': {'schema': model.model_json_schema()}}}}
