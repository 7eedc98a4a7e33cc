"""serve.py's connections: uvicorn's HTTP/1.1 protocol (h11) with a time limit on request
heads, a connection limit answered in JSON, and half-closed clients answered
(`connection_protocol`, for `server.make_app`'s app)."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any, Optional

import fastapi
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from transformer_nmt.serving.api import RETRY_AFTER_S, ApiError

if TYPE_CHECKING:  # server.py imports nothing of this module
  from transformer_nmt.serving.server import Service

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

  service: Service
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
