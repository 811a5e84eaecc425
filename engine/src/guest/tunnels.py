# --- tunnels: the host's connections to servers listening in the sandbox ------------------------
#
# A tunnel is one TCP connection the host asked for (a request to E2B's `get_host(port)`, say):
# the agent connects to the port on the sandbox's own loopback and moves the bytes both ways over
# the channel. Each side may send only as many bytes as the other has granted (a window of
# TUNNEL_WINDOW to start with, then what it grants back as it hands bytes on), so that neither
# side holds more than a window per tunnel. One thread moves every tunnel's bytes.
#
# Host -> agent:
#   {"op": "tun_open", "id": N, "port": P}: answered by {"ev": "tun_opened", "id": N} or
#   {"ev": "tun_failed", "id": N, "kind": "refused" | "limit" | "invalid", "error": "..."}
#   {"op": "tun_shutdown", "id": N} (no more bytes from the host), {"op": "tun_reset", "id": N}
#   (the host dropped it), {"op": "tun_reset_all"} (the host knows of none: sent before its first
#   open on a channel, so that tunnels restored from a snapshot end)
#   binary frames: the byte "T", then "d" (data) or "c" (credit), the id as a big-endian unsigned
#   64-bit integer, then the bytes (at most TUNNEL_PIECE) or a big-endian u32 of bytes granted
# Agent -> host: the same binary frames, {"ev": "tun_eof", "id": N} after the server's last byte,
#   {"ev": "tun_closed", "id": N, "error": "..."} when the connection broke.
#
# The host sends no binary frame for a tunnel before the agent said it opened, so that an agent
# from before tunnels (which ignores the JSON ops) never sees one.

TUNNEL_OPERATIONS = ("tun_open", "tun_shutdown", "tun_reset", "tun_reset_all", "tun_frame")
MAX_TUNNELS = 64
TUNNEL_WINDOW = 256 * 1024
TUNNEL_PIECE = 64 * 1024
# A server still starting (E2B's `background=True` commands) is tried again, as E2B's proxy does.
TUNNEL_CONNECT_TRIES = 5
TUNNEL_ADDRESSES = ((2, "127.0.0.1"), (10, "::1"))  # AF_INET, AF_INET6


class _Tunnel:
    def __init__(self, ident, port):
        self.ident = ident
        self.port = port
        self.sock = None
        self.connected = False
        # Connecting: which address is tried next, the rounds made, when the next one is due.
        self.address = 0
        self.rounds = 0
        self.retry_at = 0.0
        self.errors = []
        # Bytes the host still takes; bytes from the host not yet written to the server.
        self.credit = TUNNEL_WINDOW
        self.pending = bytearray()
        self.written = 0
        self.shutdown_wanted = False
        self.write_shut = False
        self.read_eof = False


class Tunnels(_Pump):
    WHAT = "tunnel"

    def __init__(self):
        super().__init__()
        self.open = {}

    def handle(self, request):
        """A request from the host; never raises (a bad one is dropped)."""
        try:
            self._handle(request)
        except Exception as exc:
            _warn("a tunnel request failed: %s: %s" % (type(exc).__name__, exc))

    def _handle(self, request):
        op = request.get("op")
        if op == "tun_frame":
            self._frame(request.get("frame") or b"")
            return
        if op == "tun_reset_all":
            self.reset_all()
            return
        ident = request.get("id")
        if not isinstance(ident, int) or isinstance(ident, bool) or ident < 0:
            return
        if op == "tun_open":
            self._open(ident, request.get("port"))
            return
        with self.lock:
            tunnel = self.open.get(ident)
            if tunnel is None:
                return
            if op == "tun_shutdown":
                tunnel.shutdown_wanted = True
            elif op == "tun_reset":
                self._drop(tunnel)
        self._wake()

    def reset_all(self):
        with self.lock:
            for tunnel in list(self.open.values()):
                self._drop(tunnel)

    def _open(self, ident, port):
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            send({"ev": "tun_failed", "id": ident, "kind": "invalid",
                  "error": "a port is a number from 1 to 65535"})
            return
        with self.lock:
            if len(self.open) >= MAX_TUNNELS:
                send({"ev": "tun_failed", "id": ident, "kind": "limit",
                      "error": "%d connections to this sandbox's ports are open already"
                      % MAX_TUNNELS})
                return
            if ident in self.open:
                send({"ev": "tun_failed", "id": ident, "kind": "invalid",
                      "error": "id %d is taken" % ident})
                return
            if self.thread is None:
                try:
                    self.thread = _agent_thread(self._pump, "evervm-tunnels")
                except Exception as exc:
                    send({"ev": "tun_failed", "id": ident, "kind": "invalid",
                          "error": "the agent could not start its tunnel thread: %s" % exc})
                    return
            # Connected by the pump, never here: a server still starting takes retries.
            self.open[ident] = _Tunnel(ident, port)
        self._wake()

    def _start_connect(self, tunnel):
        """Starts connecting to the next address. Called with the lock held."""
        import errno
        import socket

        family, address = TUNNEL_ADDRESSES[tunnel.address]
        try:
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        except OSError as exc:
            self._connect_failed(tunnel, exc)
            return
        sock.setblocking(False)
        code = sock.connect_ex((address, tunnel.port))
        if code in (0, errno.EINPROGRESS):
            tunnel.sock = sock
            if code == 0:
                self._connected(tunnel)
        else:
            sock.close()
            self._connect_failed(tunnel, OSError(code, os.strerror(code)))

    def _connected(self, tunnel):
        tunnel.connected = True
        send({"ev": "tun_opened", "id": tunnel.ident})

    def _connect_failed(self, tunnel, error):
        """One address refused (or failed): the next one, another round a little later, or the
        end. Called with the lock held."""
        if tunnel.sock is not None:
            tunnel.sock.close()
            tunnel.sock = None
        if not tunnel.errors or tunnel.address == 0:
            tunnel.errors.append(error)
        tunnel.address += 1
        if tunnel.address < len(TUNNEL_ADDRESSES):
            tunnel.retry_at = 0.0
            return
        tunnel.address = 0
        tunnel.rounds += 1
        if tunnel.rounds < TUNNEL_CONNECT_TRIES:
            tunnel.retry_at = time.monotonic() + 0.1 * tunnel.rounds
            return
        del self.open[tunnel.ident]
        send({"ev": "tun_failed", "id": tunnel.ident, "kind": "refused",
              "error": "%s" % tunnel.errors[0]})

    def _frame(self, frame):
        """A binary frame from the host (its leading "T" taken off)."""
        if len(frame) < 9:
            return
        kind = frame[:1]
        (ident,) = struct.unpack(">Q", frame[1:9])
        body = frame[9:]
        with self.lock:
            tunnel = self.open.get(ident)
            if tunnel is None or not tunnel.connected:
                return
            if kind == b"d":
                if len(tunnel.pending) + len(body) > TUNNEL_WINDOW:
                    self._drop(tunnel, "the host sent more than it was granted")
                    return
                tunnel.pending += body
            elif kind == b"c" and len(body) == 4:
                (granted,) = struct.unpack(">I", body)
                tunnel.credit = min(tunnel.credit + granted, TUNNEL_WINDOW)
        self._wake()

    def _drop(self, tunnel, error=None):
        """Ends a tunnel. Called with the lock held."""
        self.open.pop(tunnel.ident, None)
        if tunnel.sock is not None:
            try:
                tunnel.sock.close()
            except OSError:
                pass
            tunnel.sock = None
        if error is not None:
            send({"ev": "tun_closed", "id": tunnel.ident, "error": error})

    def _pump_once(self):
        import socket

        with self.lock:
            now = time.monotonic()
            wait = None
            for tunnel in list(self.open.values()):
                if tunnel.sock is None and not tunnel.connected:
                    if tunnel.retry_at <= now:
                        self._start_connect(tunnel)
                    else:
                        due = tunnel.retry_at - now
                        wait = due if wait is None else min(wait, due)
            live = [t for t in self.open.values() if t.connected]
            for tunnel in live:
                if tunnel.shutdown_wanted and not tunnel.pending and not tunnel.write_shut:
                    tunnel.write_shut = True
                    try:
                        tunnel.sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
            connecting = {t.sock.fileno(): t for t in self.open.values()
                          if t.sock is not None and not t.connected}
            reads = {t.sock.fileno(): t for t in live if t.credit > 0 and not t.read_eof}
            writes = {t.sock.fileno(): t for t in live if t.pending}
        readable, writable, _ = select.select(
            list(reads) + [self.wake_read], list(writes) + list(connecting), [], wait)
        if self.wake_read in readable:
            try:
                os.read(self.wake_read, 4096)
            except BlockingIOError:
                pass
        with self.lock:
            current = lambda t: self.open.get(t.ident) is t and t.sock is not None
            for fd in writable:
                tunnel = connecting.get(fd)
                if tunnel is not None and current(tunnel):
                    code = tunnel.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code == 0:
                        self._connected(tunnel)
                    else:
                        self._connect_failed(tunnel, OSError(code, os.strerror(code)))
            for fd in readable:
                tunnel = reads.get(fd)
                if tunnel is not None and current(tunnel):
                    self._read(tunnel)
            for fd in writable:
                tunnel = writes.get(fd)
                if tunnel is not None and current(tunnel):
                    self._write(tunnel)
            for tunnel in live:
                if tunnel.read_eof and tunnel.write_shut and self.open.get(tunnel.ident) is tunnel:
                    self._drop(tunnel)

    def _read(self, tunnel):
        """Called with the lock held."""
        try:
            data = tunnel.sock.recv(min(TUNNEL_PIECE, tunnel.credit))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(tunnel, "the connection broke: %s" % exc)
            return
        if not data:
            tunnel.read_eof = True
            send({"ev": "tun_eof", "id": tunnel.ident})
            return
        tunnel.credit -= len(data)
        header = struct.pack(">IccQ", len(data) + 10, b"T", b"d", tunnel.ident)
        with _out_lock:
            _write_all([header, data])

    def _write(self, tunnel):
        """Called with the lock held."""
        try:
            written = tunnel.sock.send(tunnel.pending[:TUNNEL_PIECE])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(tunnel, "the connection broke: %s" % exc)
            return
        del tunnel.pending[:written]
        tunnel.written += written
        # Granted back once a quarter of the window is written (or all the host sent).
        if tunnel.written >= TUNNEL_WINDOW // 4 or not tunnel.pending:
            frame = struct.pack(">IccQI", 14, b"T", b"c", tunnel.ident, tunnel.written)
            tunnel.written = 0
            with _out_lock:
                _write_all([frame])


def loopback_up():
    """Brings the loopback interface up if it is down (a fresh network namespace of the process
    backend's): the sandbox's own servers are reached there. gVisor's is up already."""
    import fcntl
    import socket

    get_flags, set_flags, up = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock, get_flags, request))[1]
            if not flags & up:
                fcntl.ioctl(sock, set_flags, struct.pack("16sH14x", b"lo", flags | up))
    except OSError:
        pass


# Made by `main`.
TUNNELS = None
