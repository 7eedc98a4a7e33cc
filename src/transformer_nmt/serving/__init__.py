"""serve.py's HTTP server: an `Engine` behind a FastAPI app (`make_app`, server.py), with its
request bodies and errors (api.py), connection limits (connections.py), batching across
requests (scheduler.py), Prometheus metrics (server_metrics.py) and web page (page.py).
Imported only by programs that serve: it loads the HTTP stack (FastAPI, uvicorn)."""

from transformer_nmt.serving.server import make_app

__all__ = ['make_app']
