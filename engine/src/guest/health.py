# evervm guest agent, the interpreter's health check. The engine joins this file with the others
# into the one source the agent runs (it only defines; agent.py starts it).
#
# E2B's code interpreter is a server inside the sandbox whose `GET /health` answers 200 while it
# can run cells; programs in the sandbox (and E2B's own tests) ask it with curl. In a gVisor
# machine, whose network stack is its own, the agent answers the same question on the same port
# from a thread of its own, so the answer means what E2B's means: the interpreter is alive. The
# process backend shares the host's network, and the engine does not ask for it there.

import socket as _health_socket

# The most of a request the health check reads: a request line and a few headers.
HEALTH_REQUEST_LIMIT = 8192
# How long one connection may take to send its request.
HEALTH_READ_TIMEOUT_S = 2.0


def _health_answer(request):
    """The response to one request's bytes: 200 for `GET /health` (or HEAD), else 404/405."""
    line = request.split(b"\r\n", 1)[0].split(b" ")
    if len(line) < 2:
        return b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    method, target = line[0], line[1].split(b"?", 1)[0]
    if target != b"/health":
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    if method not in (b"GET", b"HEAD"):
        return (
            b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n"
        )
    body = b'"ok"' if method == b"GET" else b""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n"
        b"Connection: close\r\n\r\n" + body
    )


def _health_serve(listener):
    """Answers connections one at a time; each gets a short deadline, so a stuck client holds
    the check up for at most that long."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            time.sleep(0.1)
            continue
        try:
            conn.settimeout(HEALTH_READ_TIMEOUT_S)
            request = b""
            while b"\r\n\r\n" not in request and len(request) < HEALTH_REQUEST_LIMIT:
                chunk = conn.recv(HEALTH_REQUEST_LIMIT - len(request))
                if not chunk:
                    break
                request += chunk
            conn.sendall(_health_answer(request))
        except OSError:
            pass
        finally:
            conn.close()


def start_health_check():
    """Listens on the port the engine names in EVERVM_HEALTH_PORT (taken out of the environment,
    which the machine's code sees), if any."""
    port = os.environ.pop("EVERVM_HEALTH_PORT", "")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return
    try:
        listener = _health_socket.socket(_health_socket.AF_INET, _health_socket.SOCK_STREAM)
        listener.setsockopt(_health_socket.SOL_SOCKET, _health_socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", int(port)))
        listener.listen(16)
    except OSError:
        return
    _agent_thread(lambda: _health_serve(listener), "evervm-health")
