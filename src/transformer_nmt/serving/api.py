"""serve.py's HTTP API: the request bodies, the limits a request must keep and the errors
it can get, each one JSON line with its status (serving/server.py answers them)."""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import json
import re
import time
from typing import Any, Optional, TypeVar

import fastapi
import numpy as np
import pydantic
from fastapi.exceptions import RequestValidationError
from starlette.requests import ClientDisconnect

RETRY_AFTER_S = 1  # what a 503 (queue full, warming up) tells the client to wait
# Deepest nesting of arrays and objects a body may have (ours need 2). Checked before parsing:
# json.loads recurses once per level and fails with RecursionError near 1,000.
MAX_JSON_DEPTH = 32
SHOWN_CHARS = 40  # the most of a client's value that an error message quotes
Body = TypeVar('Body', bound=pydantic.BaseModel)


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
  """The first validation error as 'where: what' (where: the field's path, each part
  shortened: an unknown field's name is the client's)."""
  first = e.errors()[0]
  where = '.'.join(shown(part) for part in first.get('loc', ()) if part != 'body') or 'body'
  more = f' (and {len(e.errors()) - 1} more)' if len(e.errors()) > 1 else ''
  return f'{where}: {first.get("msg", "invalid")}{more}'


def shown(value: Any) -> str:
  """`value` as an error message quotes it: at most SHOWN_CHARS characters, so that a client's
  huge value (a 4,000-digit number, a long field name) is not sent back whole."""
  text = str(value)
  return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + '...'


def is_json_type(content_type: Optional[str]) -> bool:
  """Whether a Content-Type header says JSON in UTF-8: `application/json`, optionally with
  `charset=utf-8` (case-insensitive). Only these: a browser sends other types (text/plain,
  forms) from any web page without asking the server first (no CORS preflight), so accepting
  them would let any page a user opens post to a server on their machine."""
  media, *params = (content_type or '').split(';')
  if media.strip().lower() != 'application/json':
    return False
  for param in filter(str.strip, params):
    name, _, value = param.partition('=')
    if name.strip().lower() != 'charset' or value.strip().strip('"').lower() != 'utf-8':
      return False
  return True


_OTHER_UNICODE = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE,
                  codecs.BOM_UTF16_BE)
# A JSON string, or an unterminated one up to the end: the closing quote is optional so that
# every match attempt at a quote succeeds, which keeps the scan linear on hostile input.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?')
_NOT_BRACKET = re.compile(r'[^\[\]{}]+')


def json_depth(text: str) -> int:
  """The deepest nesting of arrays and objects in a JSON text (brackets inside strings do not
  count), found without recursing: a running sum over the brackets."""
  brackets = _NOT_BRACKET.sub('', _STRING.sub('', text)).encode('ascii')
  if not brackets:
    return 0
  codes = np.frombuffer(brackets, np.uint8)
  steps = np.where((codes == ord('[')) | (codes == ord('{')), 1, -1)
  return int(np.cumsum(steps).max())


def parsed_json(body: bytes) -> Any:
  """A request body as JSON: UTF-8 only (a UTF-8 byte order mark is skipped), nested at most
  MAX_JSON_DEPTH deep; else ApiError 400. Decoded here, since json.loads of bytes would take
  UTF-16 and UTF-32 as well."""
  if body.startswith(_OTHER_UNICODE):
    raise ApiError(400, 'the body is UTF-16 or UTF-32 (it starts with a byte order mark): '
                   'send JSON in UTF-8', 'bad_json')
  try:
    text = body.decode('utf-8-sig')
    # More brackets in all than the limit is the only way to nest deeper: most bodies skip
    # the scan.
    if text.count('[') + text.count('{') > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
      raise ApiError(400, f'the body nests arrays or objects deeper than {MAX_JSON_DEPTH} '
                     'levels', 'bad_json')
    return json.loads(text)
  except ValueError as e:  # invalid UTF-8 too (UnicodeDecodeError)
    raise ApiError(400, f'the body is not JSON in UTF-8: {" ".join(str(e).split())}',
                   'bad_json') from None


def body_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
  """The OpenAPI description of a body the endpoint reads itself (to bound its size)."""
  return {'requestBody': {'required': True, 'content': {
      'application/json': {'schema': model.model_json_schema()}}}}


async def read_body(request: fastapi.Request, model: type[Body], limits: Limits) -> Body:
  """The body as `model`: declared as JSON, read up to max_body_bytes before the request's
  deadline (`request.state.deadline`, time.monotonic), UTF-8 (parsed_json)."""
  given = request.headers.get('content-type')
  if not is_json_type(given):
    raise ApiError(415, 'the body must be sent as "Content-Type: application/json" (UTF-8), '
                   f'not {shown(given) if given else "without a Content-Type"}',
                   'content_type')
  limit = limits.max_body_bytes
  declared = request.headers.get('content-length', '')
  size, chunks = int(declared) if declared.isdigit() else 0, []

  async def read() -> int:
    got = 0
    try:
      async for chunk in request.stream():
        got += len(chunk)
        if got > limit:
          break
        chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was whole: nobody to answer
      raise ApiError(499, 'the client closed the request', 'disconnected') from None
    return got
  if size <= limit:
    try:  # a body sent slowly (slow loris) holds its connection until the deadline only
      size = await asyncio.wait_for(read(), request.state.deadline - time.monotonic())
    except asyncio.TimeoutError:
      raise ApiError(408, f'the body did not arrive within timeout_s='
                     f'{limits.timeout_s:g} seconds', 'slow_body') from None
  if size > limit:
    raise ApiError(413, f'the body is over max_body_bytes={limit}', 'body_too_large')
  data = parsed_json(b''.join(chunks))
  try:
    return model.model_validate(data)
  except pydantic.ValidationError as e:
    raise ApiError(422, one_line(e), 'invalid') from None



async def client_gone(request: fastapi.Request) -> None:
  """Returns once the client has closed the connection: the ASGI server's next message
  after the body is `http.disconnect`."""
  while (await request.receive())['type'] != 'http.disconnect':
    pass

def check_lines(limits: Limits, lines: list[str], field: str) -> None:
  """A request's sentences (`field`: its name in the body) against max_sentences and
  max_chars, and valid Unicode (no lone surrogate)."""
  if len(lines) > limits.max_sentences:
    raise ApiError(422, f'{field} has {len(lines)} sentences, over max_sentences='
                   f'{limits.max_sentences}', 'limit')
  for i, line in enumerate(lines):
    if len(line) > limits.max_chars:
      raise ApiError(422, f'{field}[{i}] has {len(line)} characters, over max_chars='
                     f'{limits.max_chars}', 'limit')
    try:
      line.encode('utf-8')
    except UnicodeEncodeError:
      raise ApiError(400, f'{field}[{i}] is not valid Unicode (a lone surrogate)',
                     'bad_json') from None


def with_hypotheses(source: list[str], hyps: list[Any], alignment: bool,
                     attention: bool = False) -> dict[str, Any]:
  """One sentence's answer: its best text and hypotheses, with `source_tokens` when an
  alignment or attention (rows: `tokens`, columns: `source_tokens`) is asked for."""
  fields = ('text', 'score', 'logprob', 'tokens', 'token_logprobs') + (
      ('alignment',) if alignment else ())
  answer: dict[str, Any] = {'text': hyps[0].text if hyps else '',
                            'hypotheses': [{f: getattr(h, f) for f in fields} for h in hyps]}
  if attention:  # 6 decimals: the JSON about half as long, weights still to 1e-6
    for shown, h in zip(answer['hypotheses'], hyps):
      shown['attention'] = np.round(h.attention.astype(np.float64), 6).tolist()
  if alignment or attention:
    answer['source_tokens'] = source
  return answer
