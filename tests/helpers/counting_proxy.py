"""A TCP proxy on 127.0.0.1 that counts the bytes a server sends its clients: what
"bytes fetched over the network" is for a build reading a test server (a signed
request passes through unchanged, the Host header being the proxy's own as the
client sent it). Threads, one pair per connection; stopped by :meth:`stop`. Not used
by imgpack itself.
"""

from __future__ import annotations

import socket
import threading


class CountingProxy:
    """Listen on a free port of 127.0.0.1, forward each connection to ``port``;
    :attr:`down` is the bytes sent from the server to the clients so far."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.down = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if count:
                    with self._lock:
                        self.down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
