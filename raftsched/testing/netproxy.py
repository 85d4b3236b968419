"""A TCP relay for one Raft link, able to cut it off: the network partition of
`raftsched chaos`, on 127.0.0.1 only.

A LocalCluster built with `partitionable=True` routes every Raft link through
one LinkProxy (see `raftsched node --peers ADDR@VIA`). `cut()` turns the relay
into a black hole: bytes already in flight and any new connection are held
silently, as a dead switch would, so the peers see silence (not a reset) and
must notice it by their own timeouts. `heal()` drops the held connections so
both ends reconnect, and relays again.

`tap`, when given, is called (on a relay thread) with every chunk a client
sends through the relay: what tests read to see what crosses a link.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable


class LinkProxy:
    def __init__(self, listen_port: int, target: tuple[str, int], name: str = "",
                 tap: Callable[[bytes], None] | None = None) -> None:
        self.name = name
        self._tap = tap
        self.target = target
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = False
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", listen_port))
        self._server.listen(64)
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name=f"proxy-{name}")
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        """Drop what the cut held (both ends see the connection close and
        reconnect), and relay new connections again.

        The swap of the held set and the clearing of the cut happen under the
        lock `_accept` takes to decide, so a connection accepted during the
        heal is either dropped here or relayed, never held silent for good (a
        silent connection on the side that never sends is not noticed by
        either peer, and can keep a node from ever electing)."""
        with self._lock:
            socks, self._socks = self._socks, set()
            self._cut.clear()
        self._close_all(socks)

    def close(self) -> None:
        self._closed = True
        self._cut.set()
        try:
            self._server.close()
        except OSError:
            pass
        self._drop_all()
        self._thread.join(2)

    def _drop_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, set()
        self._close_all(socks)

    @staticmethod
    def _close_all(socks: set[socket.socket]) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.add(s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._socks.add(client)
                held = self._cut.is_set()
            if held:
                continue   # held open and silent until heal() drops it
            try:
                upstream = socket.create_connection(self.target, timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()   # the peer process is down: refuse like it would
                continue
            self._track(upstream)
            for src, dst, tap in ((client, upstream, self._tap), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(src, dst, tap), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket,
              tap: Callable[[bytes], None] | None = None) -> None:
        broken = False   # bytes were dropped: the stream is torn, never relay again
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if broken or self._cut.is_set():
                    broken = True
                    continue   # the black hole: read and drop
                if tap is not None:
                    tap(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._socks.discard(src)
            src.close()
