"""serve.py's HTTP API on an Engine: translations and scores as JSON, batched across requests
by scheduler.py, with limits, an optional API key, a health check, Prometheus metrics and a
web page. Every error is one JSON line `{"error": ...}` with a 4xx or 5xx status, never a
traceback; no request field names a file (unknown fields are refused). Its connections:
connections.py."""

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
import sys
import threading
import time
import traceback
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import fastapi
import prometheus_client as prom
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from transformer_nmt.decoding import ensemble
from transformer_nmt.errors import UserError
from transformer_nmt.inference.engine import Engine
from transformer_nmt.runtime.programs import Unprepared
from transformer_nmt.serving.api import (
  RETRY_AFTER_S,
  ApiError,
  Limits,
  ScoreRequest,
  TranslateRequest,
  body_schema,
  check_lines,
  client_gone,
  one_line,
  read_body,
  shown,
  with_hypotheses,
)
from transformer_nmt.serving.page import PAGE
from transformer_nmt.serving.scheduler import DeadlineExceeded, QueueFull, Scheduler
from transformer_nmt.serving.server_metrics import Metrics


@dataclasses.dataclass(frozen=True)
class _Item:
  """One sentence of a request as the scheduler queues it: what to do, on what, its cost."""

  kind: str  # 'translate', 'hypotheses' or 'score'
  payload: Any  # a line, or a (source, target) pair
  tokens: int
  prefix: str = ''  # the translation's required start


class Service:
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
    gone = asyncio.ensure_future(client_gone(request))
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

  def items(self, kind: str, lines: list[str], payloads: Optional[list[Any]] = None,
            prefixes: Optional[list[str]] = None) -> list[_Item]:
    """A request's sentences as the scheduler queues them (payloads: the lines themselves
    unless given), each costed by its source subwords with EOS, in one call of the
    tokenizer."""
    costs = [len(ids) + 1 for ids in self.engine.model.src_tok.encode(lines)]
    return [_Item(kind, payload, tokens, prefix) for payload, tokens, prefix in
            zip(lines if payloads is None else payloads, costs, prefixes or [''] * len(lines))]

  async def translate(self, request: fastapi.Request) -> Response:
    body = await read_body(request, TranslateRequest, self.limits)
    check_lines(self.limits, body.text, 'text')
    prefixes = body.prefix or [''] * len(body.text)
    if len(prefixes) != len(body.text):
      raise ApiError(422, f'prefix has {len(prefixes)} entries and text {len(body.text)}: '
                     'give one per sentence', 'invalid')
    check_lines(self.limits, prefixes, 'prefix')
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
      answer = lambda found: with_hypotheses(found[0], found[1][:body.n_best],
                                              body.return_alignment, body.return_attention)
    if body.stream:
      return self.streamed(request, items, answer)
    found = await self.run(request, items)
    return JSONResponse({'translations': [answer(x) for x in found],
                         'model': self.model_info})

  async def score(self, request: fastapi.Request) -> Response:
    body = await read_body(request, ScoreRequest, self.limits)
    check_lines(self.limits, body.source, 'source')
    check_lines(self.limits, body.target, 'target')
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
    planned = self.engine.planned
    programs = {'ready': self.engine.programs_ready,
                'planned': None if planned is None else planned.programs}
    return JSONResponse({'status': 'ok' if up else 'warming up', 'ready': up,
                         'programs': programs}, 200 if up else 503)

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
  `batches_in_flight` batches run at once (Scheduler's `workers`). Serve it with uvicorn's
  `http=connections.connection_protocol(app, ...)`.

  FastAPI's /docs and /redoc are off (they load their scripts from a CDN, and no page of
  ours may need the internet); /openapi.json is served as any endpoint, behind the API key."""
  limits.check()
  service = Service(engine, limits, api_key, max_wait_ms, tokens_per_batch, mix_requests,
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


def _route(app: fastapi.FastAPI, service: Service, method: str, path: str, name: str,
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
