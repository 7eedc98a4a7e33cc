"""serve.py's HTTP API on an Engine: translations and scores as JSON, batched across requests
by scheduler.py, with limits, an optional API key, a health check, Prometheus metrics and a
web page. Every error is one JSON line `{"error": ...}` with a 4xx or 5xx status, never a
traceback; no request field names a file (unknown fields are refused). Its connections
(connection_protocol) bound slow request heads, refuse past max_connections in JSON and
answer half-closed clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import hmac
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import fastapi
import h11
import numpy as np
import prometheus_client as prom
import pydantic
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from transformer_nmt.decoding import ensemble
from transformer_nmt.errors import UserError
from transformer_nmt.inference.api import (
  RETRY_AFTER_S,
  ApiError,
  Limits,
  ScoreRequest,
  TranslateRequest,
  body_schema,
  is_json_type,
  one_line,
  parsed_json,
  shown,
)
from transformer_nmt.inference.engine import Engine
from transformer_nmt.inference.page import PAGE
from transformer_nmt.inference.programs import Unprepared
from transformer_nmt.inference.scheduler import DeadlineExceeded, QueueFull, Scheduler
from transformer_nmt.inference.server_metrics import Metrics


@dataclasses.dataclass(frozen=True)
class _Item:
  """One sentence of a request as the scheduler queues it: what to do, on what, its cost."""

  kind: str  # 'translate', 'hypotheses' or 'score'
  payload: Any  # a line, or a (source, target) pair
  tokens: int
  prefix: str = ''  # the translation's required start


class _Service:
  """What the endpoints share: the engine behind its scheduler, the limits, the metrics, the
  API key and whether warm-up has finished."""

  def __init__(self, engine: Engine, limits: Limits, api_key: Optional[str],
               max_wait_ms: float, tokens_per_batch: Optional[int], mix_requests: bool,
               batches_in_flight: int):
    self.engine, self.limits, self.api_key = engine, limits, api_key
    self.model_info = {'steps': list(engine.model.steps), 'n_best': engine.n_best,
                       'dtype': ensemble.dtypes(engine.model.cfg),  # the compute precision
                       'settings': dataclasses.asdict(engine.decode)}
    self.metrics = Metrics(lambda: self.scheduler, engine)
    self.budget = tokens_per_batch or engine.decode.tokens_per_batch
    self.scheduler = Scheduler(self.run_batch, tokens_per_batch=self.budget,
                               count_tokens=lambda item: item.tokens, max_wait_ms=max_wait_ms,
                               max_queue_sentences=limits.max_queue_sentences,
                               mix_requests=mix_requests, workers=batches_in_flight,
                               on_batch=self.on_batch)
    self.ready = threading.Event()

  def run_batch(self, items: list[_Item]) -> list[Any]:
    """The engine's answers for a batch of mixed items, in their order (called from the
    scheduler's worker threads, `batches_in_flight` batches at once)."""
    engine, out = self.engine, [None] * len(items)
    for kind in ('translate', 'hypotheses', 'score'):
      where = [i for i, item in enumerate(items) if item.kind == kind]
      if not where:
        continue
      payloads = [items[i].payload for i in where]
      prefixes = [items[i].prefix for i in where]
      given = {'prefixes': prefixes} if any(prefixes) else {}
      if kind == 'translate':
        found: list[Any] = engine.translate(payloads, **given)
        self.metrics.target_tokens.inc(
            sum(len(ids) for ids in engine.model.tgt_tok.encode(found)))
      elif kind == 'hypotheses':
        found = engine.hypotheses(payloads, **given)
        self.metrics.target_tokens.inc(sum(len(h[0].tokens) - 1 for _, h in found if h))
      else:
        found = engine.score([s for s, _ in payloads], [t for _, t in payloads])
      for i, answer in zip(where, found):
        out[i] = answer
    return out

  def on_batch(self, sentences: int, tokens: int, seconds: float) -> None:
    self.metrics.batches.inc()
    self.metrics.sentences.inc(sentences)
    self.metrics.batch_fill.observe(tokens / self.budget)
    self.metrics.batch_seconds.inc(seconds)

  def error_response(self, e: ApiError) -> JSONResponse:
    self.metrics.errors.labels(e.kind).inc()
    return JSONResponse({'error': e.message}, e.status, headers=e.headers)

  async def answered(self, endpoint: str, request: fastapi.Request,
                     work: Callable[[], Awaitable[Response]]) -> Response:
    """`work`'s response, or its error as one JSON line; counted and timed."""
    t0 = time.monotonic()
    request.state.deadline = t0 + self.limits.timeout_s  # reading the body counts too
    try:
      # The page holds no secret and has a field for the key, which its requests send.
      if self.api_key is not None and endpoint not in ('health', 'page'):
        given = request.headers.get('authorization', '').encode()
        if not hmac.compare_digest(given, f'Bearer {self.api_key}'.encode()):
          raise ApiError(401, 'missing or wrong API key (header "Authorization: Bearer KEY")',
                         'unauthorized', {'WWW-Authenticate': 'Bearer'})
      response = await work()
    except ApiError as e:
      response = self.error_response(e)
    except Unprepared as e:  # a sealed engine's limit (Engine.seal): nothing compiles
      response = self.error_response(ApiError(422, str(e), 'unprepared'))
    except Exception as e:  # noqa: BLE001 -- one log line and a 500, not a traceback
      logging.error('%s: %s: %s', endpoint, type(e).__name__, ' '.join(str(e).split()))
      response = self.error_response(ApiError(500, f'internal error: {type(e).__name__}',
                                              'internal'))
    self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
    self.metrics.latency.labels(endpoint).observe(time.monotonic() - t0)
    return response

  def submit(self, request: fastapi.Request, items: list[_Item],
             on_item: Optional[Callable[[int, Any], None]] = None
             ) -> concurrent.futures.Future:
    """Queues a request's items (503 while warming up or when the queue is full)."""
    if not self.ready.is_set():
      raise ApiError(503, 'not ready: the model is warming up', 'not_ready',
                     {'Retry-After': str(RETRY_AFTER_S)})
    try:
      return self.scheduler.submit(items, request.state.deadline, on_item)
    except QueueFull as e:
      raise ApiError(503, f'busy: {e}', 'queue_full',
                     {'Retry-After': str(RETRY_AFTER_S)}) from None

  def late(self) -> ApiError:
    return ApiError(504, f'not answered within timeout_s={self.limits.timeout_s:g} seconds',
                    'deadline')

  async def waited(self, request: fastapi.Request, task: asyncio.Future) -> Any:
    """`task`'s result, unless the request's deadline passes (504) or its client leaves.
    A task waiting on the connection hears the client leave (as Starlette's streamed
    responses listen): polling `request.is_disconnected()` four times a second kept the event
    loop holding the GIL for much of its time when many clients waited."""
    gone = asyncio.ensure_future(_disconnect(request))
    try:
      done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED,
                                   timeout=max(request.state.deadline - time.monotonic(), 0))
    finally:
      gone.cancel()
    if task in done:
      try:
        return task.result()
      except DeadlineExceeded:  # the scheduler's own deadline check came first
        raise self.late() from None
    if gone in done:
      raise ApiError(499, 'the client closed the request', 'disconnected')
    raise self.late()

  async def run(self, request: fastapi.Request, items: list[_Item]) -> list[Any]:
    """Queues a request's items and waits for their answers, the deadline or the client
    leaving (whose work is then dropped)."""
    future = self.submit(request, items)
    try:
      return await self.waited(request, asyncio.wrap_future(future))
    finally:
      future.cancel()  # a no-op once answered; else the scheduler drops what is left

  def streamed(self, request: fastapi.Request, items: list[_Item],
               answer: Callable[[Any], dict[str, Any]]) -> Response:
    """Queues a request's items and answers one JSON line per item as it finishes
    ({"index": i, **answer(output)}), then {"model": ...}. An error after the first line
    (deadline, a failed batch) ends the stream with {"error": ..., "status": ...}; a client
    that leaves has its work dropped."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    put = lambda *x: loop.call_soon_threadsafe(queue.put_nowait, x)
    future = self.submit(request, items, on_item=put)
    future.add_done_callback(lambda f: put(None, f))

    async def lines() -> AsyncIterator[str]:
      try:
        for _ in range(len(items) + 1):
          getter = asyncio.ensure_future(queue.get())
          try:
            i, output = await self.waited(request, getter)
          finally:
            getter.cancel()
          if i is not None:
            yield json.dumps({'index': i, **answer(output)}) + '\n'
          elif output.cancelled() or output.exception() is None:
            yield json.dumps({'model': self.model_info}) + '\n'
            return
          elif isinstance(output.exception(), DeadlineExceeded):
            raise self.late()
          elif isinstance(output.exception(), Unprepared):
            raise ApiError(422, str(output.exception()), 'unprepared')
          else:
            raise output.exception()
      except ApiError as e:
        if e.kind == 'disconnected':
          self.metrics.errors.labels(e.kind).inc()  # nobody is left to read a line
        else:
          yield self.stream_error(e)
      except Exception as e:  # noqa: BLE001 -- as in `answered`: one log line, one error line
        logging.error('stream: %s: %s', type(e).__name__, ' '.join(str(e).split()))
        yield self.stream_error(ApiError(500, f'internal error: {type(e).__name__}',
                                         'internal'))
      finally:
        future.cancel()  # the client left, or the stream ended: drop what is left

    return StreamingResponse(lines(), media_type='application/x-ndjson')

  def stream_error(self, e: ApiError) -> str:
    self.metrics.errors.labels(e.kind).inc()
    return json.dumps({'error': e.message, 'status': e.status}) + '\n'

  async def parsed(self, request: fastapi.Request, model: type[pydantic.BaseModel]) -> Any:
    """The body as `model`: declared as JSON, read up to max_body_bytes, UTF-8
    (api.parsed_json)."""
    given = request.headers.get('content-type')
    if not is_json_type(given):
      raise ApiError(415, 'the body must be sent as "Content-Type: application/json" (UTF-8), '
                     f'not {shown(given) if given else "without a Content-Type"}',
                     'content_type')
    limit = self.limits.max_body_bytes
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
                       f'{self.limits.timeout_s:g} seconds', 'slow_body') from None
    if size > limit:
      raise ApiError(413, f'the body is over max_body_bytes={limit}', 'body_too_large')
    data = parsed_json(b''.join(chunks))
    try:
      return model.model_validate(data)
    except pydantic.ValidationError as e:
      raise ApiError(422, one_line(e), 'invalid') from None

  def checked(self, lines: list[str], field: str) -> None:
    limits = self.limits
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

  def items(self, kind: str, lines: list[str], payloads: Optional[list[Any]] = None,
            prefixes: Optional[list[str]] = None) -> list[_Item]:
    """A request's sentences as the scheduler queues them (payloads: the lines themselves
    unless given), each costed by its source subwords with EOS, in one call of the
    tokenizer."""
    costs = [len(ids) + 1 for ids in self.engine.model.src_tok.encode(lines)]
    return [_Item(kind, payload, tokens, prefix) for payload, tokens, prefix in
            zip(lines if payloads is None else payloads, costs, prefixes or [''] * len(lines))]

  async def translate(self, request: fastapi.Request) -> Response:
    body = await self.parsed(request, TranslateRequest)
    self.checked(body.text, 'text')
    prefixes = body.prefix or [''] * len(body.text)
    if len(prefixes) != len(body.text):
      raise ApiError(422, f'prefix has {len(prefixes)} entries and text {len(body.text)}: '
                     'give one per sentence', 'invalid')
    self.checked(prefixes, 'prefix')
    self.engine.check_prepared(prefixes=prefixes)  # before queueing: it fails alone
    if body.n_best > self.engine.n_best:
      raise ApiError(422, f'n_best={shown(body.n_best)} is over the '
                     f'n_best={self.engine.n_best} this server was started with (serve.py '
                     '--n_best)', 'limit')
    scored = (body.return_scores or body.return_alignment or body.return_attention
              or body.n_best > 1)
    kind = 'hypotheses' if scored else 'translate'
    items = self.items(kind, body.text, prefixes=prefixes)
    if not scored:
      answer: Callable[[Any], dict[str, Any]] = lambda text: {'text': text}
    else:
      answer = lambda found: _with_hypotheses(found[0], found[1][:body.n_best],
                                              body.return_alignment, body.return_attention)
    if body.stream:
      return self.streamed(request, items, answer)
    found = await self.run(request, items)
    return JSONResponse({'translations': [answer(x) for x in found],
                         'model': self.model_info})

  async def score(self, request: fastapi.Request) -> Response:
    body = await self.parsed(request, ScoreRequest)
    self.checked(body.source, 'source')
    self.checked(body.target, 'target')
    if len(body.source) != len(body.target):
      raise ApiError(422, f'source has {len(body.source)} sentences and target '
                     f'{len(body.target)}: they must pair up', 'invalid')
    pairs = list(zip(body.source, body.target))
    self.engine.check_prepared(pairs=pairs)  # before queueing: it fails alone
    found = await self.run(request, self.items('score', body.source, pairs))
    scores = [{'logprob': h.logprob, 'score': h.score} for _, h in found]
    return JSONResponse({'scores': scores, 'model': self.model_info})

  async def health(self, request: fastapi.Request) -> Response:
    up = self.ready.is_set()
    return JSONResponse({'status': 'ok' if up else 'warming up', 'ready': up},
                        200 if up else 503)

  async def metrics_text(self, request: fastapi.Request) -> Response:
    return Response(prom.generate_latest(self.metrics.registry),
                    media_type=prom.CONTENT_TYPE_LATEST)

  async def page(self, request: fastapi.Request) -> Response:
    return HTMLResponse(PAGE)


def warm_up(warm: Callable[[], None], ready: threading.Event,
            end: Callable[[int], None] = os._exit, freeze: bool = True) -> None:
  """Runs `warm`, then sets `ready`. A server that cannot warm up cannot serve: a UserError
  (e.g. heap.check_memory_maps) ends the process with its one line and code 2, anything else
  with its traceback and code 1 (`end`: os._exit, since this is not the main thread; no
  request is in flight before ready). With `freeze`, the objects alive once warm are left out
  of garbage collection from then on (`gc.freeze`): compiling leaves millions of them (traces
  and lowered programs that live as long as the process), and every full collection walked
  them all while holding the GIL, so that no request moved meanwhile. The price: a reference
  cycle among them that becomes garbage later is never freed."""
  try:
    warm()
    if freeze:
      gc.collect()
      gc.freeze()
  except UserError as e:
    print(f'error: warm-up stopped: {e}', file=sys.stderr, flush=True)
    end(2)
  except Exception:  # noqa: BLE001 -- a bug: its traceback, and the server ends
    traceback.print_exc()
    sys.stderr.flush()
    end(1)
  else:
    ready.set()


def make_app(engine: Engine, limits: Limits = Limits(), *, api_key: Optional[str] = None,
             max_wait_ms: float = 5.0, tokens_per_batch: Optional[int] = None,
             mix_requests: bool = True, batches_in_flight: int = 1,
             warm: Optional[Callable[[], None]] = None,
             freeze_after_warm: bool = True) -> fastapi.FastAPI:
  """The API on `engine`. Batches hold up to `tokens_per_batch` source subwords (default: the
  engine's decode.tokens_per_batch) from any requests, waiting at most `max_wait_ms` to fill.
  `warm` (e.g. precompiling) runs in a thread at start-up; until it returns /health answers
  503 and the /v1 endpoints 503 with Retry-After; then, with `freeze_after_warm`, what it
  left alive is frozen out of garbage collection (warm_up). `api_key` guards everything but
  /health (header `Authorization: Bearer KEY`). With `mix_requests` off each batch holds one
  request's sentences (no batching across requests, to measure what that batching gains).
  `batches_in_flight` batches run at once (Scheduler's `workers`). Its connections are
  uvicorn's with `http=connection_protocol(app, ...)`: time limits on request heads, the
  connection limit and half-closed clients.

  FastAPI's /docs and /redoc are off (they load their scripts from a CDN, and no page of
  ours may need the internet); /openapi.json is served as any endpoint, behind the API key."""
  limits.check()
  service = _Service(engine, limits, api_key, max_wait_ms, tokens_per_batch, mix_requests,
                     batches_in_flight)

  @contextlib.asynccontextmanager
  async def lifespan(_: fastapi.FastAPI):
    if warm is not None:
      args = (warm, service.ready, os._exit, freeze_after_warm)
      threading.Thread(target=warm_up, args=args, name='warm', daemon=True).start()
    yield
    service.scheduler.close()  # uvicorn has finished the requests in flight by now

  if warm is None:
    service.ready.set()
  app = fastapi.FastAPI(title='Transformer NMT', lifespan=lifespan, docs_url=None,
                        redoc_url=None, openapi_url=None)
  app.state.scheduler, app.state.metrics = service.scheduler, service.metrics
  app.state.ready, app.state.service = service.ready, service

  async def openapi(_: fastapi.Request) -> Response:
    return JSONResponse(app.openapi())
  routes = [('post', '/v1/translate', 'translate', service.translate,
             body_schema(TranslateRequest)),
            ('post', '/v1/score', 'score', service.score, body_schema(ScoreRequest)),
            ('get', '/health', 'health', service.health, None),
            ('get', '/metrics', 'metrics', service.metrics_text, None),
            ('get', '/', 'page', service.page, None),
            ('get', '/openapi.json', 'openapi', openapi, None)]
  for method, path, name, handler, body in routes:
    _route(app, service, method, path, name, handler, body)

  @app.exception_handler(HTTPException)
  async def http_error(_: fastapi.Request, e: HTTPException) -> Response:  # 404, 405
    return service.error_response(ApiError(e.status_code, str(e.detail), 'http',
                                           dict(e.headers or {})))

  @app.exception_handler(RequestValidationError)
  async def invalid(_: fastapi.Request, e: RequestValidationError) -> Response:
    return service.error_response(ApiError(422, one_line(e), 'invalid'))

  return app


async def _disconnect(request: fastapi.Request) -> None:
  """Returns once the client has closed the connection: the ASGI server's next message
  after the body is `http.disconnect`."""
  while (await request.receive())['type'] != 'http.disconnect':
    pass


def _route(app: fastapi.FastAPI, service: _Service, method: str, path: str, name: str,
           handler: Callable[[fastapi.Request], Awaitable[Response]],
           body: Optional[dict[str, Any]]) -> None:
  """`handler` at `path`, answered through `service.answered` (key, errors, metrics)."""
  async def endpoint(request: fastapi.Request) -> Response:
    return await service.answered(name, request, lambda: handler(request))
  endpoint.__name__ = name
  extra: dict[str, Any] = {'openapi_extra': body} if body else {}
  if path == '/':
    extra['response_class'] = HTMLResponse
  if name == 'openapi':
    extra['include_in_schema'] = False
  getattr(app, method)(path, **extra)(endpoint)


HEADER_TIMEOUT_S = 10.0  # serve.py --header_timeout_s
_PEER_CHECKS_S = (0.02, 1.0)  # the first and the longest wait between checks of a half-close


def connection_protocol(app: fastapi.FastAPI, header_timeout_s: float = HEADER_TIMEOUT_S,
                        max_connections: Optional[int] = None) -> type[asyncio.Protocol]:
  """uvicorn's `http` for `make_app`'s app (uvicorn.Config(app, http=...)): uvicorn's
  HTTP/1.1 connection (h11) with a time limit on request heads, `max_connections` (in place of
  uvicorn's limit_concurrency, which must stay unset) and half-closed clients answered
  (_Connection)."""
  if header_timeout_s <= 0:
    raise ValueError(f'header_timeout_s={header_timeout_s} must be positive')
  if max_connections is not None and max_connections < 1:
    raise ValueError(f'max_connections={max_connections} must be positive')
  return type('Connection', (_Connection,), {'service': app.state.service,
                                             'header_timeout_s': header_timeout_s,
                                             'max_connections': max_connections})


class _Connection(H11Protocol):
  """A client's connection: uvicorn's h11 protocol with three changes.

  A request head must arrive within `header_timeout_s` of the connection's start, or on a
  kept-alive connection of the first byte after an answer; else the connection closes, with
  a 408 JSON line if part of a head came. uvicorn bounds an idle kept-alive connection
  (timeout_keep_alive) and the app bounds a slow body (its deadline), but nothing bounded a
  head that never ends: such connections stayed open until they filled max_connections, and
  then every client got 503.

  Past `max_connections` open connections or requests in flight a request gets 503, one JSON
  line with Retry-After, counted in /metrics (uvicorn's own refusal is plain text, uncounted).

  A client that half-closes after its request (shutdown(SHUT_WR): no more to send, still
  reading) gets its answer. TCP cannot tell that from a client that has gone: both send FIN,
  on which uvicorn closed the connection, so the half-closed client got nothing. Only a write
  tells them apart: a client that has gone answers it with a reset. So on FIN with a request
  in flight the connection stays open, sends a probe every client must accept (an interim
  `100 Continue` before the answer on HTTP/1.1; a space before the next line of a streamed
  answer, as JSON allows whitespace before a value), and reads the socket's error soon after
  and then every second: on a reset it closes, and the request hears its client leave, as
  when the connection drops. An HTTP/1.0 request before its answer gets no probe (1xx
  answers are not HTTP/1.0): a client of it that has gone is found once the answer is
  written."""

  service: _Service
  header_timeout_s: float
  max_connections: Optional[int]

  def __init__(self, *args: Any, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self._app, self.app = self.app, self._limited  # uvicorn runs `self.app` per request
    self._head_timer: Optional[asyncio.TimerHandle] = None
    self._peer_timer: Optional[asyncio.TimerHandle] = None
    self._ndjson = False  # the answer under way is a stream of JSON lines

  async def _limited(self, scope: Any, receive: Any, send: Any) -> None:
    """The app, unless more than max_connections connections or requests are open (this one
    counted): then 503, and the connection closes."""
    limit = self.max_connections
    if limit is not None and max(len(self.connections), len(self.tasks)) > limit:
      refusal = self.service.error_response(ApiError(
          503, f'busy: over max_connections={limit} connections or requests at once',
          'connection_limit', {'Retry-After': str(RETRY_AFTER_S), 'Connection': 'close'}))
      await refusal(scope, receive, send)
      return
    self._ndjson = False

    async def watched(message: Any) -> None:
      if message['type'] == 'http.response.start':
        self._ndjson = any(name.lower() == b'content-type' and
                           value.startswith(b'application/x-ndjson')
                           for name, value in message.get('headers', ()))
      await send(message)
    await self._app(scope, receive, watched)

  def connection_made(self, transport: asyncio.BaseTransport) -> None:
    super().connection_made(transport)  # type: ignore[arg-type]
    self._watch_head(arrived=True)  # from the connection's start

  def connection_lost(self, exc: Optional[Exception]) -> None:
    for timer in (self._head_timer, self._peer_timer):
      if timer is not None:
        timer.cancel()
    super().connection_lost(exc)

  def data_received(self, data: bytes) -> None:
    super().data_received(data)
    self._watch_head(arrived=True)

  def on_response_complete(self) -> None:
    super().on_response_complete()  # runs a pipelined request already received
    self._watch_head(arrived=bool(self.conn.trailing_data[0])
                     or self.conn.their_state is not h11.IDLE)

  def _between_requests(self) -> bool:
    return self.cycle is None or self.cycle.response_complete

  def _watch_head(self, arrived: bool) -> None:
    """Stops the head's clock once a request is under way; starts it between requests when
    bytes have `arrived` (an idle kept-alive connection is uvicorn's timeout_keep_alive's)."""
    if not self._between_requests():
      if self._head_timer is not None:
        self._head_timer.cancel()
        self._head_timer = None
    elif arrived and self._head_timer is None and not self.transport.is_closing():
      self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

  def _head_too_slow(self) -> None:
    self._head_timer = None
    if self.transport.is_closing() or not self._between_requests():
      return
    if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of a head
      response = self.service.error_response(ApiError(
          408, 'the request head did not arrive within '
          f'header_timeout_s={self.header_timeout_s:g} seconds', 'slow_head',
          {'Connection': 'close'}))
      head = [b'HTTP/1.1 408 Request Timeout'] + [
          name + b': ' + value for name, value in response.raw_headers]
      self.transport.write(b'\r\n'.join(head) + b'\r\n\r\n' + response.body)
    else:  # nothing came (a browser may open a connection ahead of need), or a body's rest
      self.service.metrics.errors.labels('idle_connection').inc()
    self.transport.close()

  def eof_received(self) -> Optional[bool]:
    """The client will send no more: the connection stays open while its whole request is
    answered (and the client probed); otherwise it closes, as uvicorn's does."""
    cycle = self.cycle
    if (cycle is None or cycle.response_complete
        or self.conn.their_state not in (h11.DONE, h11.MUST_CLOSE)):
      return None
    cycle.keep_alive = False  # closed once answered: nothing more can come
    if not cycle.response_started and self.scope['http_version'] == '1.1':
      cycle.waiting_for_100_continue = False
      self.transport.write(self.conn.send(h11.InformationalResponse(
          status_code=100, headers=[], reason=b'Continue')))
    elif cycle.response_started and self._ndjson:
      self.transport.write(self.conn.send(h11.Data(data=b' ')))
    wait = _PEER_CHECKS_S[0]
    self._peer_timer = self.loop.call_later(wait, self._check_peer, wait)
    return True

  def _check_peer(self, wait: float) -> None:
    """Closes the connection once the socket has an error (the client reset it: it had
    gone), until the answer is complete."""
    self._peer_timer = None
    if self.transport.is_closing() or self._between_requests():
      return
    sock = self.transport.get_extra_info('socket')
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
      self.transport.abort()  # connection_lost: the request hears its client leave
      return
    wait = min(2 * wait, _PEER_CHECKS_S[1])
    self._peer_timer = self.loop.call_later(wait, self._check_peer, wait)


def _with_hypotheses(source: list[str], hyps: list[Any], alignment: bool,
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
