"""An in-process cache server: uvicorn on a loopback port in a background thread.

Example:
    >>> with EmbeddedServer("sqlite:///demo.db") as server:  # doctest: +SKIP
    ...     server.url
    'http://127.0.0.1:54321'
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from cache_server import tokens
from cache_server.app import create_app
from cache_server.migrate import upgrade
from cache_server.settings import ServerSettings
from tunecache.tokens import Scope


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedServer:
    """Migrates ``db`` to the head revision and serves it until the context exits."""

    def __init__(self, db: str, *, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.db = db
        self.host = host
        self.port = port or free_port(host)
        self.app: FastAPI | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        upgrade(self.db)
        self.app = app = create_app(ServerSettings(db=self.db))
        config = uvicorn.Config(
            app,
            host=self.host,
            port=self.port,
            log_level="warning",
            http="cache_server.header_deadline:HeaderDeadline",
            ws="none",  # no WebSocket routes: an upgrade would leave the protocol uncounted
            proxy_headers=False,  # a caller is its connection's address
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, name="tunecache-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"embedded server on {self.url} did not start")
            time.sleep(0.02)

    def issue_token(self, name: str, scope: Scope) -> str:
        """A new API token on this server's database (the embedded owner needs no admin)."""
        if self.app is None:
            raise RuntimeError("the embedded server is not started")
        with self.app.state.sessionmaker.begin() as session:
            token, _row = tokens.issue(session, name=name, scope=scope)
        return token

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
