"""evervm guest agent: a persistent Python REPL driven over a framed channel.

Runs inside every sandbox, standard library only. The channel is the process's original
stdin/stdout, moved to private descriptors at start; file descriptors 1 and 2 then become pipes
whose contents are sent to the host as output, so nothing the user's code, a C extension or a
subprocess writes can corrupt the channel.

Frames, both directions: a 4-byte big-endian length, then that many bytes: UTF-8 JSON, or a
binary frame whose first byte says what it is ("O" output, "D" file data).

Host -> agent:
  {"op": "exec", "id": N, "code": "...", "timeout_ms": T, "dialect": D}   (D: "python", the
  default, a plain REPL line; "jupyter", a cell run by IPython's shell; "e2b", a Jupyter cell
  with E2B's formatters: see jupyter.py)
  {"op": "interrupt", "id": N}
  {"op": "reseed"}   (after a fork: new seeds for random and numpy.random; answered by `ready`)
  {"op": "configure", "env": {...}}   (a fresh interpreter becomes a machine's: its environment
  variables are set and the home is the working directory; answered by `ready`)
  File operations, between instructions, each with "path" and "roots" (the directories the
  caller may touch; a path is resolved here, one component at a time, and refused if it or a
  symlink on its way leaves them):
  {"op": "stat", ...}, {"op": "list", ..., "limit": N}, {"op": "mkdir", ..., "parents": B},
  {"op": "remove", ..., "recursive": B}: answered by a `file` event or a `file_error`
  {"op": "read", ..., "limit": BYTES}: `file` (with info), "D" frames, then `file_end`
  {"op": "write", ..., "mode": M | null, "parents": B}: `file` once it may start, then the host
  sends "D" frames (the byte "D", then data) and {"op": "write_end"} or {"op": "write_abort"};
  answered by `file` (with info) or `file_error`. The file appears whole or not at all.
  {"op": "packages"}: answered by `packages` (what the machine runs and has installed)
  {"op": "install", "wheels": [path, ...]}: unpacks the wheels (written by the host, removed
  here afterwards) into the user's site-packages, which becomes importable at once; answered by
  `installed` or `file_error`
  {"op": "proc_start" | "proc_input" | "proc_close_stdin" | "proc_signal", ...}: processes
  beside the interpreter, handled at once even while an instruction runs (see processes.py)
  {"op": "context_create" | "context_list" | "context_restart" | "context_remove", ...}, and
  "context" on `exec`: more interpreters in the machine (see contexts.py)
Agent -> host:
  {"ev": "ready", "python": "3.11.2", "pid": P}
  output, as a binary frame (no JSON escaping of large text): the byte "O", the byte "o"
  (stdout) or "e" (stderr), the instruction id as a big-endian signed 64-bit integer (-1: none),
  then the text as UTF-8
  {"ev": "display", "id": N, "kind": "display" | "figure", "data": {MIME type: value}}
  (a rich result during an instruction: `display(obj)`, `plt.show()`)
  {"ev": "result", "id": N, "value": "..." | null, "results": [{"kind": "value" | "figure",
   "data": {...}}] (absent: none), "runtime_ms": R}
  {"ev": "result", "id": N, "error": "...", "cause": "exception" | "timeout" | "interrupted",
   "exception": {"name", "qualname", "module", "value"} (absent when no exception was raised),
   "results": [...] (figures drawn before an exception), "runtime_ms": R,
   "execution_count": C (a Jupyter cell's number in IPython's shell; absent for a REPL line)}
  {"ev": "file", "info": {...} | null, "entries": [...] | null, "truncated": B}
  {"ev": "file_error", "kind": "not_found" | "denied" | "exists" | ..., "error": "..."}
  file data as binary frames: the byte "D", then the data
  {"ev": "file_end", "size": BYTES}
  {"ev": "packages", "environment": {PEP 508 marker values}, "libc": "glibc 2.36" | null,
   "installed": {normalised name: version}}
  {"ev": "installed", "site": PATH}
"""

import ast
import base64
import fcntl
import io
import json
import linecache
import os
import select
import signal
import struct
import sys
import threading
import time
import traceback
import types

MAX_FRAME = 64 * 1024 * 1024
MAX_TEXT = 1024 * 1024
OUTPUT_FRAME_CHARS = 1024 * 1024
PIPE_READ = 64 * 1024
AGENT_FILE = sys._getframe().f_code.co_filename

# --- the channel -------------------------------------------------------------------------------

# Above 2 whatever the agent was started with: a host may start it with stderr closed (Node.js
# does), and fds 1 and 2 become the output pipes below.
CHAN_IN = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
CHAN_OUT = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
_devnull = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    # 0 reads nothing; a free 1 or 2 is held by /dev/null until the output pipes take it (a
    # pipe must not land there).
    if _fd != _devnull:
        try:
            os.fstat(_fd)
            if _fd == 0:
                os.dup2(_devnull, 0)
        except OSError:
            os.dup2(_devnull, _fd)
if _devnull > 2:
    os.close(_devnull)

_out_lock = threading.Lock()


def send(event):
    """Writes one frame. An interrupt that arrives meanwhile waits until the frame is whole."""
    payload = json.dumps(event, ensure_ascii=False).encode("utf-8", "surrogatepass")
    with _out_lock:
        STATE.enter_critical()
        try:
            _write_all([struct.pack(">I", len(payload)), payload])
        finally:
            STATE.leave_critical()


def send_output(stream, text):
    """Sends output text as binary frames of at most about 1 MiB."""
    kind = b"Oo" if stream == "stdout" else b"Oe"
    current = STATE.current
    ident = struct.pack(">q", -1 if current is None else current)
    for start in range(0, len(text), OUTPUT_FRAME_CHARS):
        data = text[start:start + OUTPUT_FRAME_CHARS].encode("utf-8", "surrogatepass")
        header = struct.pack(">I", len(data) + 10) + kind + ident
        with _out_lock:
            STATE.enter_critical()
            try:
                _write_all([header, data])
            finally:
                STATE.leave_critical()


def _write_all(parts):
    """Writes every part, in order, with as few system calls as the channel allows."""
    views = [memoryview(part) for part in parts if len(part)]
    while views:
        written = os.writev(CHAN_OUT, views)
        while written and views:
            if written >= len(views[0]):
                written -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][written:]
                written = 0


class ChannelReader:
    """Reads frames from the channel, with as few system calls as the host's writes allow.

    Only one thread reads at a time: the main thread between instructions, the watcher while a
    long instruction runs (see `Watcher`).
    """

    def __init__(self, fd):
        self.fd = fd
        self.buffer = bytearray()

    def buffered(self):
        return len(self.buffer) > 0

    def _fill(self, n):
        while len(self.buffer) < n:
            chunk = os.read(self.fd, max(PIPE_READ, n - len(self.buffer)))
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def receive_frame(self):
        """The next frame's bytes, or None once the other end has closed the channel."""
        if not self._fill(4):
            return None
        (length,) = struct.unpack(">I", self.buffer[:4])
        if length > MAX_FRAME:
            raise ValueError("frame of %d bytes is over the limit" % length)
        if not self._fill(4 + length):
            return None
        payload = bytes(self.buffer[4:4 + length])
        del self.buffer[:4 + length]
        return payload

    def receive(self):
        """The next request (a dict, or the bytes of a data frame), or None once the host has
        closed the channel."""
        payload = self.receive_frame()
        if payload is None:
            return None
        if payload[:1] == b"D":
            return payload[1:]
        if payload[:1] == b"T":
            return {"op": "tun_frame", "frame": payload[1:]}
        return json.loads(payload.decode("utf-8"))


CHANNEL = ChannelReader(CHAN_IN)


# --- output capture ----------------------------------------------------------------------------


class Capture:
    """Reads one pipe that stands in for fd 1 or 2 and forwards what arrives as output events."""

    def __init__(self, fd, stream):
        import codecs

        self.stream = stream
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        os.set_blocking(read_end, False)
        self.read_end = read_end
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.lock = threading.Lock()
        _agent_thread(self._pump, "evervm-" + stream)

    def _forward(self, data, final=False):
        text = self.decoder.decode(data, final)
        if text:
            send_output(self.stream, text)

    def _read_available(self):
        """Reads whatever the pipe holds now; returns False when it was empty."""
        try:
            data = os.read(self.read_end, PIPE_READ)
        except BlockingIOError:
            return False
        if data:
            self._forward(data)
            return True
        return False

    def _pump(self):
        while True:
            select.select([self.read_end], [], [])
            with self.lock:
                self._read_available()


def drain(captures):
    """Sends everything written to the pipes so far (one system call when they are empty).
    Called at the end of an instruction."""
    for capture in captures:
        capture.lock.acquire()
    try:
        readable, _, _ = select.select([c.read_end for c in captures], [], [], 0)
        for capture in captures:
            if capture.read_end in readable:
                while capture._read_available():
                    pass
            capture._forward(b"", final=True)
    finally:
        for capture in captures:
            capture.lock.release()


class OutputBuffer:
    """Output written from Python (sys.stdout, sys.stderr), in order across both streams.

    Sent when 256 KiB are waiting, when flushed, at the end of an instruction, and otherwise
    within about 10 ms of being written, so that a print before a long computation shows at once
    while a burst of prints travels in few frames.
    """

    FLUSH_BYTES = 256 * 1024
    DELAY = 0.01

    def __init__(self):
        self.lock = threading.RLock()
        self.segments = []
        self.size = 0
        self.pending = threading.Event()
        _agent_thread(self._flusher, "evervm-flush")

    def write(self, stream, text):
        with self.lock:
            if self.segments and self.segments[-1][0] == stream:
                self.segments[-1][1].append(text)
            else:
                self.segments.append((stream, [text]))
            self.size += len(text)
            if self.size >= self.FLUSH_BYTES:
                self._flush_locked()
            else:
                self.pending.set()

    def flush(self):
        with self.lock:
            self._flush_locked()

    def _flush_locked(self):
        segments, self.segments, self.size = self.segments, [], 0
        for stream, parts in segments:
            send_output(stream, "".join(parts))

    def _flusher(self):
        while True:
            self.pending.wait()
            time.sleep(self.DELAY)
            self.pending.clear()
            self.flush()


class _BytesWriter(io.RawIOBase):
    """`sys.stdout.buffer`: bytes written are decoded as UTF-8 and join the text stream."""

    def __init__(self, text_stream):
        import codecs

        self._text = text_stream
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self):
        return True

    def write(self, data):
        self._text.write(self._decoder.decode(bytes(data)))
        return len(data)

    def flush(self):
        self._text.flush()


class StreamWriter(io.TextIOBase):
    """`sys.stdout` and `sys.stderr`: text goes straight to the channel, in order."""

    def __init__(self, output, stream, fd):
        self._output = output
        self._stream = stream
        self._fd = fd
        self.buffer = _BytesWriter(self)

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "backslashreplace"

    @property
    def name(self):
        return "<%s>" % self._stream

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        if text:
            self._output.write(self._stream, text)
        return len(text)

    def flush(self):
        self._output.flush()


# --- interrupts and timeouts -------------------------------------------------------------------
#
# A short instruction costs no thread switch: the main thread reads the request, runs it and
# answers, with one interval timer armed. Only when an instruction is still running after
# `WATCH_AFTER` seconds (or sooner, at its timeout) does the timer's signal hand the channel to
# the watcher thread, which then reads interrupts as they come and interrupts the instruction at
# its timeout, and again every second while it resists. Interrupts sent in the meantime wait in
# the channel (at most `WATCH_AFTER`). If the user's code takes SIGALRM for itself, the watcher
# starts with every instruction instead.

WATCH_AFTER = 0.05


class State:
    def __init__(self):
        self.current = None
        self.executing = False
        self.reason = None
        self.main_thread = threading.main_thread().ident
        # While the main thread writes a frame, an interrupt is held back (a half-written frame
        # would break the channel) and raised once the frame is whole.
        self.critical = 0
        self.deferred = False
        # Set by the SIGINT handler once it has acted on the last interrupt.
        self.taken = True

    def enter_critical(self):
        if threading.get_ident() == self.main_thread:
            self.critical += 1

    def leave_critical(self):
        if threading.get_ident() != self.main_thread:
            return
        self.critical -= 1
        if self.critical == 0 and self.deferred:
            self.deferred = False
            if self.executing:
                raise KeyboardInterrupt()


STATE = State()
OUTPUT = None
# IPython's shell while a Jupyter cell runs (figures are then shown through its formatters).
CELLS = None


def _on_sigint(signum, frame):
    if not STATE.executing:
        return
    STATE.taken = True
    if STATE.critical:
        STATE.deferred = True
        return
    raise KeyboardInterrupt()


def interrupt(reason):
    if STATE.executing and STATE.reason is None:
        STATE.reason = reason
    if STATE.executing:
        STATE.taken = False
        signal.pthread_kill(STATE.main_thread, signal.SIGINT)


# A SIGINT that arrives while the main thread runs another signal's handler inside a blocking
# call (the SIGALRM that started the watcher, say) waits until that call returns: CPython checks
# signals in number order and resumes the call. An interrupt not taken is therefore sent again.
RESEND_AFTER = 0.05


def _agent_thread(target, name):
    """Starts a daemon thread of the agent's own, which leaves SIGINT and SIGALRM to the main
    thread."""

    def run():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGALRM})
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class Watcher:
    """Watches the channel for interrupts, and the clock for the timeout, of a long instruction."""

    def __init__(self):
        self.wake_read, self.wake_write = os.pipe()
        self.start = threading.Lock()
        self.start.acquire()
        self.stopped = threading.Lock()
        self.stopped.acquire()
        self.active = False
        # Whether the interval timer is set (so that ending twice costs no system call).
        self.armed = False
        self.deadline = 0.0
        # Requests other than interrupts that arrived while watching, for the main thread; None
        # when the host closed the channel.
        self.stash = []
        _agent_thread(self._run, "evervm-watcher")

    def begin(self, timeout_s):
        """Arms the timer for an instruction that starts now."""
        self.deadline = time.monotonic() + timeout_s
        if signal.getsignal(signal.SIGALRM) is _on_sigalrm:
            signal.setitimer(signal.ITIMER_REAL, min(WATCH_AFTER, timeout_s))
            self.armed = True
        else:
            self.activate()

    def activate(self):
        if STATE.executing and not self.active:
            self.active = True
            self.start.release()

    def end(self):
        """Stops watching. Called by the main thread once `STATE.executing` is false."""
        if self.armed:
            self.armed = False
            # A handler the code installed meanwhile owns the timer now.
            if signal.getsignal(signal.SIGALRM) is _on_sigalrm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if self.active:
            os.write(self.wake_write, b".")
            self.stopped.acquire()
            self.active = False

    def _run(self):
        while True:
            self.start.acquire()
            try:
                self._watch()
            except Exception:
                pass
            self.stopped.release()

    def _watch(self):
        # When to send again an interrupt the main thread has not taken yet.
        resend_at = None
        while True:
            now = time.monotonic()
            wait = self.deadline - now
            if resend_at is not None:
                wait = min(wait, resend_at - now)
            if CHANNEL.buffered():
                readable = [CHAN_IN]
            else:
                fds = [self.wake_read] if None in self.stash else [self.wake_read, CHAN_IN]
                readable, _, _ = select.select(fds, [], [], max(0.0, wait))
            if self.wake_read in readable:
                os.read(self.wake_read, 64)
                return
            if CHAN_IN in readable:
                try:
                    request = CHANNEL.receive()
                except Exception:
                    request = None
                if isinstance(request, dict) and request.get("op") == "interrupt":
                    if request.get("id") == STATE.current:
                        interrupt("interrupt")
                        resend_at = time.monotonic() + RESEND_AFTER
                    else:
                        CONTEXTS.pass_interrupt(request)
                elif isinstance(request, dict) and request.get("op") in PROCESS_OPERATIONS:
                    # Processes run beside the instruction: their requests are not held back.
                    PROCESSES.handle(request)
                elif isinstance(request, dict) and request.get("op") in TUNNEL_OPERATIONS:
                    TUNNELS.handle(request)
                else:
                    self.stash.append(request)
                continue
            now = time.monotonic()
            if resend_at is not None and now >= resend_at:
                if STATE.taken or not STATE.executing:
                    resend_at = None
                else:
                    signal.pthread_kill(STATE.main_thread, signal.SIGINT)
                    resend_at = now + RESEND_AFTER
            if now >= self.deadline:
                # The timeout, then once a second while the instruction resists.
                interrupt("timeout")
                self.deadline = now + 1.0
                resend_at = now + RESEND_AFTER


WATCHER = None


def _on_sigalrm(signum, frame):
    WATCHER.activate()


# --- running code ------------------------------------------------------------------------------


def _truncate(text):
    if len(text) > MAX_TEXT:
        return text[:MAX_TEXT] + "... [%d more characters]" % (len(text) - MAX_TEXT)
    return text


def _user_traceback(exc):
    """The traceback as the REPL prints it, without the agent's own frames."""
    if isinstance(exc, SyntaxError) and exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        if all(f.filename == AGENT_FILE or f.filename.endswith("ast.py") for f in frames):
            return "".join(traceback.format_exception_only(type(exc), exc))
    summary = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if frame.filename != AGENT_FILE]
    )
    return "".join(summary.format())


MAX_NAME = 1024


def _exception_info(exc):
    """The exception as data, from the object itself: its class's name, qualified name and
    module, and `str(exc)` (what `traceback` prints when that fails)."""
    cls = type(exc)

    def attribute(name):
        try:
            value = getattr(cls, name)
        except BaseException:
            return ""
        return value[:MAX_NAME] if isinstance(value, str) else ""

    try:
        value = str(exc)
    except BaseException:
        value = "<exception str() failed>"
    if not isinstance(value, str):
        value = "<exception str() failed>"
    return {
        "name": attribute("__name__"),
        "qualname": attribute("__qualname__"),
        "module": attribute("__module__"),
        "value": _truncate(value),
    }


def _cell_traceback(cells):
    """The traceback IPython formatted for the Jupyter cell that just failed, if any."""
    return None if cells is None else cells.traceback


# --- rich results ------------------------------------------------------------------------------
#
# Jupyter's display protocol: an object shows itself through `_repr_mimebundle_` or the
# `_repr_*_` methods, and each result is a MIME bundle (`text/plain` always, plus what the object
# offers; binary images in base64). A result is one of: a `display(obj)` call or `plt.show()`,
# sent at once, in order with the output; at the end of an instruction the last expression's
# value (when it offers more than text) and every matplotlib figure still open, as PNG.

MAX_REPRESENTATION = 16 * 1024 * 1024
MAX_END_RESULTS_BYTES = 32 * 1024 * 1024

_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)


def _warn(text):
    try:
        sys.stderr.write("[evervm] %s\n" % text)
    except BaseException:
        pass


def _real_method(obj, name):
    """The object's method `name`, unless the object claims to have every attribute."""
    try:
        if getattr(obj, "_evervm_no_such_method_", None) is not None:
            return None
        method = getattr(obj, name, None)
    except Exception:
        return None
    return method if callable(method) else None


def _is_json(mime):
    return mime == "application/json" or mime.endswith("+json") or mime in (E2B_DATA, E2B_CHART)


def _representation(mime, value):
    """A representation as it travels (text; base64 for binary images; any JSON value for JSON
    types), or None when it cannot travel or is too large."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        value = value[0]  # (data, metadata)
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        if mime.startswith("image/") and mime != "image/svg+xml":
            value = base64.b64encode(value).decode("ascii")
        else:
            value = bytes(value).decode("utf-8", "replace")
    if _is_json(mime):
        try:
            size = len(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            return None
    elif isinstance(value, str):
        size = len(value)
    else:
        return None
    if size > MAX_REPRESENTATION:
        _warn("a %s representation of %d characters was left out (the most is %d)"
              % (mime, size, MAX_REPRESENTATION))
        return None
    return value


def _checked_bundle(data):
    """A MIME bundle as it travels: the types named like MIME types whose representations can
    travel (`text/plain` only when there is one: `display(raw=True)` may leave it out)."""
    bundle = {}
    for mime, value in data.items():
        if isinstance(mime, str) and "/" in mime and len(mime) <= 128:
            value = _representation(mime, value)
            if value is not None:
                bundle[mime] = value
    return bundle


def _bundle(obj, text=None):
    """The object's MIME bundle."""
    data = {}
    if not isinstance(obj, type):
        method = _real_method(obj, "_repr_mimebundle_")
        if method is not None:
            try:
                offered = method(include=None, exclude=None)
            except Exception as exc:
                _warn("%s._repr_mimebundle_ failed: %s: %s" % (type(obj).__name__, type(exc).__name__, exc))
                offered = None
            if isinstance(offered, tuple) and len(offered) == 2:
                offered = offered[0]
            if isinstance(offered, dict):
                data.update(_checked_bundle(offered))
        for name, mime in _REPR_METHODS:
            if mime in data:
                continue
            method = _real_method(obj, name)
            if method is None:
                continue
            try:
                value = _representation(mime, method())
            except Exception as exc:
                _warn("%s.%s failed: %s: %s" % (type(obj).__name__, name, type(exc).__name__, exc))
                continue
            if value is not None:
                data[mime] = value
    if not isinstance(data.get("text/plain"), str):
        data["text/plain"] = _truncate(repr(obj)) if text is None else text
    return data


def _figure_bundles():
    """Every open matplotlib figure as a PNG bundle, oldest first; the figures are then closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    try:
        figures = [manager.canvas.figure for manager in pyplot._pylab_helpers.Gcf.get_all_fig_managers()]
    except Exception:
        return []
    bundles = []
    total = 0
    try:
        for index, figure in enumerate(figures):
            if total > MAX_END_RESULTS_BYTES:
                _warn("%d more figures were not rendered: the results passed %d bytes"
                      % (len(figures) - index, MAX_END_RESULTS_BYTES))
                break
            if CELLS is not None:
                # As a kernel's inline backend: through the display formatters.
                try:
                    bundle = CELLS.figure_bundle(figure)
                except Exception as exc:
                    _warn("a figure could not be rendered: %s: %s" % (type(exc).__name__, exc))
                    continue
                total += sum(len(json.dumps(v)) for v in bundle.values())
                bundles.append(bundle)
                continue
            buffer = io.BytesIO()
            try:
                figure.savefig(buffer, format="png", bbox_inches="tight")
            except Exception as exc:
                _warn("a figure could not be rendered: %s: %s" % (type(exc).__name__, exc))
                continue
            png = _representation("image/png", buffer.getvalue())
            if png is not None:
                total += len(png)
                bundles.append({"image/png": png, "text/plain": _truncate(repr(figure))})
    finally:
        try:
            pyplot.close("all")
        except Exception:
            pass
    return bundles


def _end_results(bundle):
    """The results an instruction ends with: its value's bundle (when it has more than text),
    then its open figures."""
    results = []
    if bundle is not None and len(bundle) > 1:
        results.append({"kind": "value", "data": bundle})
    results.extend({"kind": "figure", "data": bundle} for bundle in _figure_bundles())
    return results


def _close_figures():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


def _send_display(kind, data):
    """Sends a result now, after the output written before it. Outside an instruction (a
    thread of the user's) it goes nowhere, like output would."""
    current = STATE.current
    if current is None:
        return
    OUTPUT.flush()
    send({"ev": "display", "id": current, "kind": kind, "data": data})


def display(*objs, raw=False, **_ignored):
    """Shows each object as a rich result now, in order with the output, as Jupyter's
    `display` does (`raw=True`: each object is already a MIME bundle, a dict)."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            data = _checked_bundle(obj)
            if not isinstance(data.get("text/plain"), str):
                data["text/plain"] = "<%s>" % ", ".join(sorted(data)) if data else "None"
        else:
            data = _bundle(obj)
        _send_display("display", data)


def _pyplot_show(*_args, **_kwargs):
    """`matplotlib.pyplot.show()`: shows the open figures now and closes them, as Jupyter's
    inline backend does (Agg itself could only warn that it cannot show)."""
    for data in _figure_bundles():
        _send_display("figure", data)


class _PyplotFinder:
    """Gives `matplotlib.pyplot` the `show` above as the module is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _PyplotLoader(spec.loader)
        return spec


class _PyplotLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.show = _pyplot_show

    def __getattr__(self, name):
        return getattr(self._loader, name)


class Machine:
    def __init__(self):
        self.globals = {"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None}
        self.loop = None
        self.jupyter = None

    def cells(self, dialect):
        """IPython's shell over these globals, for Jupyter cells (made on the first one)."""
        if self.jupyter is None:
            self.jupyter = JupyterCells(self.globals)
        if dialect == "e2b":
            self.jupyter.add_e2b_formatters()
        return self.jupyter

    def _await(self, value):
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(value)

    def _run(self, compiled):
        result = eval(compiled, self.globals)
        if compiled.co_flags & 0x80 and isinstance(result, types.CoroutineType):
            result = self._await(result)
        return result

    def execute(self, instruction_id, code):
        filename = "<instruction %d>" % instruction_id
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        if tree.body:
            self._run(compile(tree, filename, "exec", flags=flags))
        if last is None:
            return None
        value = self._run(compile(last, filename, "eval", flags=flags))
        if value is not None:
            self.globals["_"] = value
        return value


def _stop_executing():
    """Ends the instruction's watch. A KeyboardInterrupt raised meanwhile (before `executing`
    turns false) only restarts it."""
    while True:
        try:
            STATE.executing = False
            WATCHER.end()
            return
        except KeyboardInterrupt:
            continue


def run_instruction(machine, captures, request):
    global CELLS
    _notice_user_site()
    instruction_id = request["id"]
    timeout_s = max(0.001, request.get("timeout_ms", 15000) / 1000.0)
    STATE.current = instruction_id
    STATE.reason = None
    started = time.monotonic()
    event = {"ev": "result", "id": instruction_id}
    dialect = request.get("dialect", "python")
    cells = None
    try:
        try:
            STATE.executing = True
            WATCHER.begin(timeout_s)
            if dialect == "python":
                value = machine.execute(instruction_id, request["code"])
                text = None if value is None else _truncate(repr(value))
                bundle = None if value is None else _bundle(value, text)
            else:
                cells = CELLS = machine.cells(dialect)
                bundle = cells.run(request["code"], e2b=dialect == "e2b")
                text = None if bundle is None else _truncate(bundle.get("text/plain", ""))
            results = _end_results(bundle)
        finally:
            _stop_executing()
        event["value"] = text
        if results:
            event["results"] = results
    except KeyboardInterrupt as exc:
        event["exception"] = _exception_info(exc)
        shown = _cell_traceback(cells) or _user_traceback(exc)
        if STATE.reason == "timeout":
            event["error"] = "Timed out: the instruction ran longer than %g s and was " \
                "interrupted (the machine's state is kept)\n%s" % (timeout_s, _truncate(shown))
            event["cause"] = "timeout"
        elif STATE.reason == "interrupt":
            event["error"] = _truncate(shown)
            event["cause"] = "interrupted"
        else:
            event["error"] = _truncate(shown)
            event["cause"] = "exception"
    except BaseException as exc:  # SystemExit included: the REPL outlives exit()
        try:
            text = _cell_traceback(cells) or _user_traceback(exc)
        except BaseException:
            text = "%s: <traceback unavailable>" % type(exc).__name__
        event["error"] = _truncate(text)
        event["exception"] = _exception_info(exc)
        event["cause"] = "exception"
    _stop_executing()
    if "error" in event:
        # Figures drawn before the failure still show, as in Jupyter; not after a timeout or
        # an interrupt, when rendering them could take as long again.
        try:
            if event["cause"] == "exception":
                results = [{"kind": "figure", "data": b} for b in _figure_bundles()]
                if results:
                    event["results"] = results
            else:
                _close_figures()
        except BaseException:
            pass
    if cells is not None and isinstance(getattr(cells, "count", None), int):
        event["execution_count"] = cells.count
    event["runtime_ms"] = int((time.monotonic() - started) * 1000)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    OUTPUT.flush()
    drain(captures)
    STATE.current = None
    CELLS = None
    send(event)


# --- files -------------------------------------------------------------------------------------
#
# Paths are resolved here, inside the sandbox, never on the host: from `/`, one component at a
# time, through directory descriptors, never following a symlink without resolving its target
# the same way. The walk may only pass through the allowed roots and the directories above them,
# so `..`, an absolute path or a symlink that leads elsewhere is refused.

FILE_CHUNK = 256 * 1024
# The most read from a file that gives no size (`/proc/...`).
MAX_UNSIZED_READ = 16 * 1024 * 1024
MAX_SYMLINKS = 40


class FileError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _os_error(exc, path):
    import errno

    kinds = {
        errno.ENOENT: "not_found",
        errno.EEXIST: "exists",
        errno.ENOTEMPTY: "not_empty",
        errno.EISDIR: "is_a_directory",
        errno.ENOTDIR: "not_a_directory",
        errno.EACCES: "denied",
        errno.EPERM: "denied",
        errno.ELOOP: "denied",
        errno.ENOSPC: "no_space",
        errno.EDQUOT: "no_space",
        errno.ENAMETOOLONG: "invalid",
    }
    return FileError(kinds.get(exc.errno, "io"), "%s: %s" % (path, exc.strerror or exc))


def _split(path):
    return [part for part in path.split("/") if part not in ("", ".")]


class Resolved:
    """Where a path leads: the descriptor of the directory that holds it, its name there (None
    for `/` itself) and its components from `/`."""

    def __init__(self, fds, parts, name):
        self.fds = fds
        self.parts = parts
        self.name = name
        # Whether it is one of the roots itself (which is never removed).
        self.is_root = False
        # Whether the path asked for is a symlink (this is where it leads).
        self.via_link = False

    @property
    def dir_fd(self):
        return self.fds[-1]

    @property
    def path(self):
        last = [self.name] if self.name not in (None, ".") else []
        return "/" + "/".join(self.parts + last)

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _open_dir(name, dir_fd):
    flags = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
    return os.open(name, flags, dir_fd=dir_fd)


def resolve(request, follow_last=True, make_parents=False):
    """Resolves the request's path under its roots (see above). Relative paths and `~/` start at
    the home; the last component need not exist. With `make_parents`, missing directories on
    the way are made (inside the roots only)."""
    import stat as stat_module

    path = request.get("path")
    if not isinstance(path, str) or not path or "\0" in path:
        raise FileError("invalid", "the path must be a non-empty string without NUL")
    home = os.path.expanduser("~")
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    elif not path.startswith("/"):
        path = home + "/" + path
    roots = [_split(root) for root in request.get("roots") or [home]]

    def inside(parts):
        return any(parts[:len(root)] == root for root in roots)

    def on_the_way(parts):
        return inside(parts) or any(root[:len(parts)] == parts for root in roots)

    def refused():
        return FileError(
            "denied",
            "%s: outside the directories files may be used in (%s)"
            % (request.get("path"), ", ".join("/" + "/".join(r) for r in roots)),
        )

    def shown(parts):
        return "/" + "/".join(parts)

    fds = [_open_dir("/", None)]
    parts = []
    pending = _split(path)
    name = None
    links = 0
    # Whether the path's last component (or the last one of a target it led to) was a symlink.
    final_link = False
    try:
        while pending:
            part = pending.pop(0)
            if part == "..":
                if parts:
                    parts.pop()
                    os.close(fds.pop())
                continue
            if not on_the_way(parts + [part]):
                raise refused()
            last = not pending
            if last and not follow_last:
                name = part
                break
            try:
                st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    name = part
                    break
                if not make_parents or not inside(parts + [part]):
                    raise FileError("not_found", "%s: no such directory" % shown(parts + [part]))
                os.mkdir(part, 0o755, dir_fd=fds[-1])
                st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            if stat_module.S_ISLNK(st.st_mode):
                final_link = final_link or last
                links += 1
                if links > MAX_SYMLINKS:
                    raise FileError("denied", "%s: too many symlinks" % request.get("path"))
                target = os.readlink(part, dir_fd=fds[-1])
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                    parts = []
                pending = _split(target) + pending
                continue
            if last:
                name = part
                break
            if not stat_module.S_ISDIR(st.st_mode):
                raise FileError("not_a_directory", "%s: not a directory" % shown(parts + [part]))
            fds.append(_open_dir(part, fds[-1]))
            parts.append(part)
        if name is None:
            # The path ends at a directory the walk entered (`/tmp`, `a/..`): its parent holds it.
            if not parts:
                if [] not in roots:
                    raise refused()
                # `/` itself, when it is a root: it holds itself.
                resolved = Resolved(fds, [], ".")
                resolved.is_root = True
                return resolved
            name = parts.pop()
            os.close(fds.pop())
        if not inside(parts + [name]):
            raise refused()
        resolved = Resolved(fds, parts, name)
        resolved.is_root = parts + [name] in roots
        resolved.via_link = final_link
        return resolved
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _file_info(resolved_path, st):
    import stat as stat_module

    if stat_module.S_ISREG(st.st_mode):
        kind = "file"
    elif stat_module.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat_module.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "other"
    info = {
        "path": resolved_path,
        "type": kind,
        "size": st.st_size,
        "mode": stat_module.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    metadata = _metadata(resolved_path) if kind in ("file", "directory") else None
    if metadata:
        info["metadata"] = metadata
    return info


# E2B's file metadata: extended attributes named `user.e2b.<name>`, at most this many kept.
METADATA_PREFIX = "user.e2b."
MAX_METADATA = 64


def _metadata(path):
    try:
        names = [n for n in os.listxattr(path, follow_symlinks=False)
                 if n.startswith(METADATA_PREFIX)]
    except OSError:
        return None
    metadata = {}
    for name in sorted(names)[:MAX_METADATA]:
        key = name[len(METADATA_PREFIX):]
        try:
            value = os.getxattr(path, name, follow_symlinks=False).decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        token = all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in key)
        if token and 0 < len(key) <= 200 and len(value) <= 4096 and value.isprintable():
            metadata[key] = value
    return metadata


def _stat(resolved, follow=True):
    try:
        st = os.stat(resolved.name, dir_fd=resolved.dir_fd, follow_symlinks=follow)
    except OSError as exc:
        raise _os_error(exc, resolved.path)
    return _file_info(resolved.path, st)


def op_stat(request):
    resolved = resolve(request)
    try:
        info = _stat(resolved)
        if resolved.via_link:
            info["symlink_target"] = resolved.path
        send({"ev": "file", "info": info})
    finally:
        resolved.close()


def op_list(request):
    resolved = resolve(request)
    try:
        try:
            fd = os.open(resolved.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                         dir_fd=resolved.dir_fd)
        except OSError as exc:
            raise _os_error(exc, resolved.path)
        limit = max(0, int(request.get("limit", 10000)))
        entries = []
        truncated = False
        try:
            for name in sorted(os.listdir(fd)):
                if len(entries) >= limit:
                    truncated = True
                    break
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                entry = _file_info(resolved.path.rstrip("/") + "/" + name, st)
                if entry["type"] == "symlink":
                    entry["symlink_target"] = os.path.realpath(entry["path"])
                entries.append(entry)
        finally:
            os.close(fd)
        send({"ev": "file", "info": _stat(resolved), "entries": entries, "truncated": truncated})
    finally:
        resolved.close()


def op_mkdir(request):
    parents = bool(request.get("parents"))
    resolved = resolve(request, make_parents=parents)
    try:
        try:
            os.mkdir(resolved.name, 0o755, dir_fd=resolved.dir_fd)
        except FileExistsError as exc:
            if not parents or _stat(resolved)["type"] != "directory":
                raise _os_error(exc, resolved.path)
        except OSError as exc:
            raise _os_error(exc, resolved.path)
        PROCESSES.drain_watches()
        send({"ev": "file", "info": _stat(resolved)})
    finally:
        resolved.close()


def op_remove(request):
    import shutil

    resolved = resolve(request, follow_last=False)
    try:
        if resolved.is_root:
            raise FileError("denied", "%s: a root of the files may not be removed" % resolved.path)
        info = _stat(resolved, follow=False)
        try:
            if info["type"] != "directory":
                os.unlink(resolved.name, dir_fd=resolved.dir_fd)
            elif request.get("recursive"):
                shutil.rmtree(resolved.name, dir_fd=resolved.dir_fd)
            else:
                os.rmdir(resolved.name, dir_fd=resolved.dir_fd)
        except OSError as exc:
            raise _os_error(exc, resolved.path)
        PROCESSES.drain_watches()
        send({"ev": "file", "info": info})
    finally:
        resolved.close()


def op_read(request):
    import stat as stat_module

    resolved = resolve(request)
    try:
        try:
            # Non-blocking: a FIFO must not hold the agent (it is refused below).
            fd = os.open(resolved.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=resolved.dir_fd)
        except OSError as exc:
            raise _os_error(exc, resolved.path)
    finally:
        resolved.close()
    try:
        st = os.fstat(fd)
        if stat_module.S_ISDIR(st.st_mode):
            raise FileError("is_a_directory", "%s: is a directory" % resolved.path)
        if not stat_module.S_ISREG(st.st_mode):
            raise FileError("invalid", "%s: not a regular file" % resolved.path)
        limit = request.get("limit")
        if limit is not None and st.st_size > limit:
            raise FileError(
                "too_large", "%s: %d bytes, over the limit of %d" % (resolved.path, st.st_size, limit)
            )
        info = _file_info(resolved.path, st)
        if st.st_size == 0:
            # /proc and /sys files say they are empty and are not: read them whole (bounded).
            data = _read_unsized(fd, resolved.path, limit)
            info["size"] = len(data)
            send({"ev": "file", "info": info})
            if data:
                _send_data(data)
            send({"ev": "file_end", "size": len(data)})
            return
        send({"ev": "file", "info": info})
        # The size announced is the most that is sent: a file that grows meanwhile is cut there,
        # one that shrinks ends early (and the host reports it incomplete).
        remaining = st.st_size
        sent = 0
        while remaining > 0:
            data = os.read(fd, min(FILE_CHUNK, remaining))
            if not data:
                break
            _send_data(data)
            sent += len(data)
            remaining -= len(data)
        send({"ev": "file_end", "size": sent})
    finally:
        os.close(fd)


def _read_unsized(fd, path, limit):
    """What a file that gives no size holds, up to `limit` bytes (more is refused)."""
    cap = MAX_UNSIZED_READ if limit is None else min(limit, MAX_UNSIZED_READ)
    data = bytearray()
    while True:
        try:
            chunk = os.read(fd, FILE_CHUNK)
        except BlockingIOError:
            break
        except OSError as exc:
            raise _os_error(exc, path)
        if not chunk:
            break
        data += chunk
        if len(data) > cap:
            raise FileError("too_large", "%s: over the limit of %d bytes" % (path, cap))
    return bytes(data)


def _send_data(data):
    with _out_lock:
        _write_all([struct.pack(">I", len(data) + 1), b"D", data])


def op_write(request):
    import secrets

    parents = bool(request.get("parents"))
    resolved = resolve(request, make_parents=parents)
    temp = None
    fd = None
    try:
        try:
            existing = _stat(resolved)
        except FileError as exc:
            if exc.kind != "not_found":
                raise
            existing = None
        if existing is not None and existing["type"] == "directory":
            raise FileError("is_a_directory", "%s: is a directory" % resolved.path)
        mode = request.get("mode")
        if mode is None:
            mode = existing["mode"] if existing is not None else 0o644
        temp = ".%s.evervm-%s" % (resolved.name[:64], secrets.token_hex(6))
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=resolved.dir_fd)
        except OSError as exc:
            temp = None
            raise _os_error(exc, resolved.path)
        send({"ev": "file"})
        failure = None
        while True:
            frame = CHANNEL.receive()
            if frame is None:
                return
            if isinstance(frame, bytes):
                if failure is None:
                    try:
                        view = memoryview(frame)
                        while view:
                            view = view[os.write(fd, view):]
                    except OSError as exc:
                        failure = _os_error(exc, resolved.path)
                continue
            op = frame.get("op")
            if op == "write_end" and failure is None:
                try:
                    for key, value in (request.get("metadata") or {}).items():
                        os.setxattr(fd, METADATA_PREFIX + str(key), str(value).encode("ascii"))
                    os.fchmod(fd, mode & 0o7777)
                    os.close(fd)
                    fd = None
                    os.rename(temp, resolved.name, src_dir_fd=resolved.dir_fd,
                              dst_dir_fd=resolved.dir_fd)
                    temp = None
                except OSError as exc:
                    raise _os_error(exc, resolved.path)
                PROCESSES.upload_done(resolved.path, existing is not None)
                send({"ev": "file", "info": _stat(resolved)})
                return
            if op in ("write_end", "write_abort"):
                raise failure or FileError("aborted", "%s: the upload was abandoned" % resolved.path)
    finally:
        if fd is not None:
            os.close(fd)
        if temp is not None:
            try:
                os.unlink(temp, dir_fd=resolved.dir_fd)
            except OSError:
                pass
        resolved.close()


_PACKAGES_HELPER = r'''
"""evervm's package helper: run by the agent as a child process (`python3 -I -c`), so that
what it imports and reads (importlib.metadata, zipfile, every distribution's metadata) never
weighs on the machine's own interpreter and its snapshots. `report PATH_JSON` prints what the
machine runs and has on that sys.path; `install SITE BASE WHEEL...` unpacks wheels. Prints one
JSON object."""

import json
import os
import sys


class FileError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _canonical_name(name):
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _report(path):
    import importlib.metadata
    import platform

    installed = {}
    for dist in importlib.metadata.distributions(path=path):
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception:
            continue
        if name and version:
            # The first on sys.path is what an import finds.
            installed.setdefault(_canonical_name(name), version)
    implementation = sys.implementation
    version = implementation.version
    implementation_version = "%d.%d.%d" % (version.major, version.minor, version.micro)
    if version.releaselevel != "final":
        implementation_version += version.releaselevel[0] + str(version.serial)
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        libc = None
    return {
        "ev": "packages",
        "environment": {
            "implementation_name": implementation.name,
            "implementation_version": implementation_version,
            "os_name": os.name,
            "platform_machine": platform.machine(),
            "platform_python_implementation": platform.python_implementation(),
            "platform_release": platform.release(),
            "platform_system": platform.system(),
            "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "python_version": ".".join(platform.python_version_tuple()[:2]),
            "sys_platform": sys.platform,
        },
        "libc": libc,
        "installed": installed,
    }


def _uninstall(site_dir, project):
    """Removes what an earlier install of `project` put into `site_dir` (by its RECORD)."""
    import csv
    import shutil

    try:
        names = os.listdir(site_dir)
    except FileNotFoundError:
        return
    for entry in names:
        if not entry.endswith(".dist-info"):
            continue
        if _canonical_name(entry[: -len(".dist-info")].rsplit("-", 1)[0]) != project:
            continue
        dist_info = os.path.join(site_dir, entry)
        try:
            with open(os.path.join(dist_info, "RECORD"), newline="") as record:
                rows = list(csv.reader(record))
        except OSError:
            rows = []
        home = os.path.realpath(os.path.expanduser("~"))
        for row in rows:
            if not row:
                continue
            path = os.path.realpath(os.path.join(site_dir, row[0]))
            if path.startswith(home + os.sep) and not os.path.isdir(path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        shutil.rmtree(dist_info, ignore_errors=True)


def _install_wheel(path, site_dir, user_base):
    """Unpacks one wheel the way pip does for a user install (without running anything in it):
    its files into site-packages, `.data/scripts` into ~/.local/bin (shebangs pointed at this
    Python), `.data/data` and `.data/headers` under ~/.local; a RECORD of what was written."""
    import csv
    import shutil
    import zipfile

    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        dist_infos = {m.filename.split("/")[0] for m in members
                      if m.filename.count("/") == 1 and m.filename.endswith(".dist-info/WHEEL")}
        if len(dist_infos) != 1:
            raise FileError("invalid", "%s: not a wheel (no single .dist-info/WHEEL)"
                            % os.path.basename(path))
        dist_info = dist_infos.pop()
        project = _canonical_name(dist_info[: -len(".dist-info")].rsplit("-", 1)[0])
        data_dir = dist_info[: -len(".dist-info")] + ".data"
        _uninstall(site_dir, project)
        schemes = {
            "purelib": site_dir,
            "platlib": site_dir,
            "scripts": os.path.join(user_base, "bin"),
            "data": user_base,
            "headers": os.path.join(user_base, "include", "python%d.%d" % sys.version_info[:2],
                                    project),
        }
        written = []
        for member in members:
            name = member.filename
            if name.endswith("/"):
                continue
            parts = name.split("/")
            if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
                raise FileError("invalid", "%s: unsafe path %r in the wheel"
                                % (os.path.basename(path), name))
            scheme = None
            if parts[0] == data_dir:
                if len(parts) < 3 or parts[1] not in schemes:
                    continue
                scheme = parts[1]
                base, rest = schemes[scheme], parts[2:]
            else:
                base, rest = site_dir, parts
            if rest[-1] == "RECORD" and len(rest) == 2 and rest[0] == dist_info:
                continue
            target = os.path.join(base, *rest)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            temp = target + ".evervm-part"
            with archive.open(member) as source, open(temp, "wb") as out:
                if scheme == "scripts":
                    first = source.readline()
                    if first.startswith(b"#!python"):
                        first = b"#!" + sys.executable.encode() + first[len(b"#!python"):]
                    out.write(first)
                shutil.copyfileobj(source, out, 1024 * 1024)
            mode = (member.external_attr >> 16) & 0o777
            executable = scheme == "scripts" or bool(mode & 0o111)
            os.chmod(temp, 0o755 if executable else 0o644)
            os.replace(temp, target)
            written.append(os.path.relpath(target, site_dir))
        installer = os.path.join(site_dir, dist_info, "INSTALLER")
        with open(installer, "w") as out:
            out.write("evervm\n")
        written.append(os.path.relpath(installer, site_dir))
        record = os.path.join(site_dir, dist_info, "RECORD")
        with open(record, "w", newline="") as out:
            writer = csv.writer(out)
            for relative in written:
                writer.writerow([relative, "", ""])
            writer.writerow([os.path.relpath(record, site_dir), "", ""])



def _main(argv):
    try:
        if argv[0] == "report":
            answer = _report(json.loads(argv[1]))
        else:
            site_dir, user_base = argv[1], argv[2]
            os.makedirs(site_dir, exist_ok=True)
            for path in argv[3:]:
                try:
                    _install_wheel(path, site_dir, user_base)
                except FileError:
                    raise
                except Exception as exc:
                    raise FileError("invalid", "%s: %s: %s"
                                    % (os.path.basename(path), type(exc).__name__, exc))
            answer = {"ev": "installed", "site": site_dir}
    except FileError as exc:
        answer = {"ev": "file_error", "kind": exc.kind, "error": str(exc)}
    except Exception as exc:
        answer = {"ev": "file_error", "kind": "io", "error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(answer))


_main(sys.argv[1:])
'''


def _run_package_helper(args):
    """Runs the package helper in a child process and sends its answer on."""
    read_end, write_end = os.pipe()
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-c", _PACKAGES_HELPER] + args,
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, write_end, 1), (os.POSIX_SPAWN_CLOSE, read_end)],
        )
    finally:
        os.close(write_end)
    chunks = []
    try:
        while True:
            data = os.read(read_end, 1 << 16)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise FileError("io", "the package helper stopped without an answer")
    if not isinstance(answer, dict):
        raise FileError("io", "the package helper answered something else")
    return answer


def op_packages(request):
    send(_run_package_helper(["report", json.dumps([p for p in sys.path if isinstance(p, str)])]))


# The user's site-packages while it does not exist yet.
_PENDING_SITE = None


def _notice_user_site():
    """Once the user's site-packages exists (`pip install` in a subprocess made it), imports look
    in it: Python remembers a missing directory on sys.path as having no finder. One stat per
    instruction until then."""
    global _PENDING_SITE
    if _PENDING_SITE is not None and os.path.isdir(_PENDING_SITE):
        sys.path_importer_cache.pop(_PENDING_SITE, None)
        _PENDING_SITE = None


def _activate_site(site_dir):
    """Puts the user's site-packages on sys.path where Python would have at start (before the
    system's), runs its .pth files, and forgets what imports looked up before."""
    import importlib
    import site

    if site_dir not in sys.path:
        position = len(sys.path)
        for i, entry in enumerate(sys.path):
            if entry.endswith(("site-packages", "dist-packages")):
                position = i
                break
        before = list(sys.path)
        site.addsitedir(site_dir)
        added = [p for p in sys.path if p not in before]
        for entry in added:
            sys.path.remove(entry)
        sys.path[position:position] = added
    sys.path_importer_cache.pop(site_dir, None)
    importlib.invalidate_caches()


def op_install(request):
    import site

    wheels = [w for w in request.get("wheels") or [] if isinstance(w, str)]
    try:
        site_dir = site.getusersitepackages()
        answer = _run_package_helper(["install", site_dir, site.getuserbase()] + wheels)
        if answer.get("ev") == "installed":
            _activate_site(site_dir)
            _notice_user_site()
        send(answer)
    finally:
        for path in wheels:
            try:
                os.unlink(path)
            except OSError:
                pass


FILE_OPERATIONS = {
    "stat": op_stat,
    "list": op_list,
    "mkdir": op_mkdir,
    "remove": op_remove,
    "read": op_read,
    "write": op_write,
    "packages": op_packages,
    "install": op_install,
}


def file_operation(request):
    try:
        FILE_OPERATIONS[request["op"]](request)
    except FileError as exc:
        send({"ev": "file_error", "kind": exc.kind, "error": str(exc)})
    except OSError as exc:
        error = _os_error(exc, request.get("path"))
        send({"ev": "file_error", "kind": error.kind, "error": str(error)})
    except Exception as exc:
        send({"ev": "file_error", "kind": "io", "error": "%s: %s" % (type(exc).__name__, exc)})



def reseed():
    """New seeds from the kernel for the generators a copy of this process would share."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass


def configure(request):
    """Makes a fresh interpreter a given machine's: the home as the working directory, then the
    machine's environment variables (which child processes inherit too)."""
    try:
        os.chdir(os.path.expanduser("~"))
    except OSError:
        pass
    env = request.get("env")
    if isinstance(env, dict):
        for name, value in env.items():
            if isinstance(name, str) and isinstance(value, str):
                os.environ[name] = value


def next_request():
    """The next request for the main thread: one the watcher kept, else one from the channel.
    Interrupts for instructions that already ended are dropped."""
    while True:
        if WATCHER.stash:
            request = WATCHER.stash.pop(0)
        else:
            try:
                request = CHANNEL.receive()
            except Exception:
                request = None
        if request is None or (isinstance(request, dict) and request.get("op") != "interrupt"):
            return request
        if isinstance(request, dict):
            # For an instruction another context runs (contexts.py).
            CONTEXTS.pass_interrupt(request)


def main():
    # Started as root (a gVisor sandbox): keep a root helper for `sudo`, then become the user.
    if len(sys.argv) == 3 and sys.argv[1] == "--root-helper" and os.getuid() == 0:
        uid = int(sys.argv[2])
        start_root_helper(uid, uid)
    # Started by another agent as one of its contexts (contexts.py), in a working directory that
    # may not exist (then the home, as IPython's `%cd` leaves it).
    in_context = len(sys.argv) == 3 and sys.argv[1] == "--context"
    if in_context:
        try:
            os.chdir(sys.argv[2])
        except OSError:
            pass
    threading.stack_size(512 * 1024)
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.meta_path.insert(0, _PyplotFinder())
    import builtins

    builtins.display = display
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGALRM, _on_sigalrm)
    global OUTPUT, WATCHER, PROCESSES, CONTEXTS, TUNNELS, _PENDING_SITE
    WATCHER = Watcher()
    PROCESSES = Processes()
    CONTEXTS = Contexts()
    TUNNELS = Tunnels()
    if not in_context:
        loopback_up()
    if not in_context:
        start_health_check()
    captures = [Capture(1, "stdout"), Capture(2, "stderr")]
    # Writes to fds 1 and 2 (C code, subprocesses) arrive through the pipes; Python's own
    # sys.stdout and sys.stderr skip them and keep their order.
    sys.__stdout__ = io.TextIOWrapper(
        os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )
    sys.__stderr__ = io.TextIOWrapper(
        os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )
    OUTPUT = OutputBuffer()
    sys.stdout = StreamWriter(OUTPUT, "stdout", 1)
    sys.stderr = StreamWriter(OUTPUT, "stderr", 2)
    sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False), encoding="utf-8")
    sys.argv = [""]
    if sys.path and sys.path[0] in ("", os.path.dirname(AGENT_FILE)):
        sys.path[0] = os.getcwd()
    # The user's site-packages is on sys.path from the start, even before it exists, so that
    # what `pip install` (into it, as the image's own is not writable) or `install` puts there
    # is importable at once (see `_notice_user_site`).
    try:
        import site

        _activate_site(site.getusersitepackages())
        if not os.path.isdir(site.getusersitepackages()):
            _PENDING_SITE = site.getusersitepackages()
    except Exception:
        pass
    machine = Machine()
    send({"ev": "ready", "python": sys.version.split()[0], "pid": os.getpid()})
    while True:
        try:
            request = next_request()
            if request is None:
                break
            if request.get("op") == "exec":
                if request.get("context") not in (None, DEFAULT_CONTEXT):
                    CONTEXTS.execute(request)
                else:
                    run_instruction(machine, captures, request)
            elif request.get("op") == "reseed":
                reseed()
                CONTEXTS.reseed()
                TUNNELS.reset_all()
                send({"ev": "ready", "python": sys.version.split()[0], "pid": os.getpid()})
            elif request.get("op") == "configure":
                configure(request)
                send({"ev": "ready", "python": sys.version.split()[0], "pid": os.getpid()})
            elif request.get("op") in FILE_OPERATIONS:
                file_operation(request)
            elif request.get("op") in PROCESS_OPERATIONS:
                PROCESSES.handle(request)
            elif request.get("op") in TUNNEL_OPERATIONS:
                TUNNELS.handle(request)
            elif request.get("op") in CONTEXT_OPERATIONS:
                CONTEXTS.handle(request)
        except KeyboardInterrupt:
            continue
    os._exit(0)


if __name__ == "__main__":
    main()
