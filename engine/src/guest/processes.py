# --- processes: commands that run beside the interpreter -----------------------------------------
#
# A process is a command the host starts in the sandbox (E2B's `commands.run`): a real process in
# its own session, its stdout and stderr streamed to the host as they come, its stdin fed by the
# host when it asked for one. They run beside the interpreter: an instruction may run meanwhile,
# and whichever thread reads the channel (the main thread between instructions, the watcher
# during one) hands process requests here at once. One thread moves every process's bytes.
#
# Host -> agent:
#   {"op": "proc_start", "id": N, "argv": [...], "env": {...}, "cwd": "..." | null,
#    "stdin": B}: answered by {"ev": "proc_started", "id": N, "pid": P} or
#    {"ev": "proc_failed", "id": N, "error": "..."}
#   {"op": "proc_input", "id": N, "data": BASE64}, {"op": "proc_close_stdin", "id": N},
#   {"op": "proc_signal", "id": N, "signal": S} (to the process's whole group)
#   with "pty": {"cols": C, "rows": R} on proc_start, the process runs on a terminal of that size
#   (its controlling terminal; stdout and stderr are one stream, "o", and input goes to it);
#   {"op": "proc_resize", "id": N, "cols": C, "rows": R} changes the size
# Agent -> host:
#   output, as a binary frame: the byte "P", the byte "o" (stdout) or "e" (stderr), the id as a
#   big-endian unsigned 64-bit integer, then the bytes as the process wrote them
#   {"ev": "proc_exit", "id": N, "exit_code": C | null, "signal": S | null, "error": "..." | null}

PROCESS_OPERATIONS = ("proc_start", "proc_input", "proc_close_stdin", "proc_signal", "proc_resize",
                      "watch_start")
MAX_PROCESSES = 64
MAX_PENDING_STDIN = 4 * 1024 * 1024
PROCESS_READ = 64 * 1024


class _Process:
    def __init__(self, ident, popen, stdin_fd, terminal=None):
        self.ident = ident
        self.popen = popen
        # fd -> (b"o" or b"e", the pipe), while the pipe is open.
        if terminal is None:
            self.outputs = {popen.stdout.fileno(): (b"o", popen.stdout),
                            popen.stderr.fileno(): (b"e", popen.stderr)}
        else:
            self.outputs = {terminal.fileno(): (b"o", terminal)}
        # The terminal's controlling side (its input and output), for a process on one.
        self.terminal = terminal
        self.stdin_fd = stdin_fd
        self.pending = bytearray()
        self.close_when_written = False
        self.error = None


class _Pump:
    """What moves bytes beside the interpreter (processes here, tunnels in tunnels.py): a lock,
    a thread of the agent's own that works in rounds (`_pump_once`), and a pipe that wakes it."""

    WHAT = "pump"

    def __init__(self):
        self.lock = threading.Lock()
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.thread = None

    def _wake(self):
        try:
            os.write(self.wake_write, b".")
        except BlockingIOError:
            pass

    def _pump(self):
        while True:
            try:
                self._pump_once()
            except Exception as exc:
                _warn("the %s pump stopped a round: %s: %s" % (self.WHAT, type(exc).__name__, exc))
                # A round that keeps failing must not spin a core: at most ten tries a second.
                time.sleep(0.1)


class Processes(_Pump):
    WHAT = "process"

    def __init__(self):
        super().__init__()
        self.running = {}
        # Watches (watches.py), by id: they count among the processes.
        self.watches = {}

    def handle(self, request):
        op = request.get("op")
        ident = request.get("id")
        if not isinstance(ident, int) or ident < 0:
            return
        if op == "proc_start":
            self._start(ident, request)
            return
        if op == "watch_start":
            self._start_watch(ident, request)
            return
        if op == "proc_signal" and self._stop_watch(ident):
            return
        with self.lock:
            process = self.running.get(ident)
            if process is None:
                return
            if op == "proc_input":
                try:
                    data = base64.b64decode(request.get("data") or "", validate=True)
                except (ValueError, TypeError):
                    return
                if process.stdin_fd is None or process.close_when_written:
                    return
                if len(process.pending) + len(data) > MAX_PENDING_STDIN:
                    process.error = "stdin: more than %d bytes waiting" % MAX_PENDING_STDIN
                    return
                process.pending += data
            elif op == "proc_close_stdin":
                process.close_when_written = True
            elif op == "proc_resize":
                if process.terminal is not None and process.stdin_fd is not None:
                    _set_terminal_size(process.stdin_fd, request)
            elif op == "proc_signal":
                number = request.get("signal")
                if isinstance(number, int) and 0 < number < signal.NSIG:
                    try:
                        os.killpg(process.popen.pid, number)
                    except OSError:
                        try:
                            process.popen.send_signal(number)
                        except OSError:
                            pass
        self._wake()

    def _start(self, ident, request):
        import subprocess

        argv = request.get("argv")
        if (not isinstance(argv, list) or not argv
                or not all(isinstance(a, str) and "\0" not in a for a in argv)):
            send({"ev": "proc_failed", "id": ident, "error": "argv must be non-empty strings"})
            return
        env = dict(os.environ)
        extra = request.get("env")
        if isinstance(extra, dict):
            for name, value in extra.items():
                if (isinstance(name, str) and isinstance(value, str) and name and "=" not in name
                        and "\0" not in name and "\0" not in value):
                    env[name] = value
        cwd = request.get("cwd")
        if not isinstance(cwd, str) or not cwd:
            cwd = os.path.expanduser("~")
        with self.lock:
            if len(self.running) + len(self.watches) >= MAX_PROCESSES:
                send({"ev": "proc_failed", "id": ident,
                      "error": "%d processes are running already" % MAX_PROCESSES})
                return
            if ident in self.running:
                send({"ev": "proc_failed", "id": ident, "error": "id %d is taken" % ident})
                return
            terminal = None
            try:
                if isinstance(request.get("pty"), dict):
                    env.setdefault("TERM", "xterm-256color")
                    popen, terminal = _start_on_terminal(argv, cwd, env, request["pty"])
                else:
                    popen = subprocess.Popen(
                        argv, cwd=cwd, env=env, start_new_session=True,
                        stdin=subprocess.PIPE if request.get("stdin") else subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    )
            except OSError as exc:
                send({"ev": "proc_failed", "id": ident,
                      "error": "%s: %s" % (argv[0], exc.strerror or exc)})
                return
            stdin_fd = None
            if terminal is not None:
                stdin_fd = terminal.fileno()
                os.set_blocking(stdin_fd, False)
            elif popen.stdin is not None:
                stdin_fd = popen.stdin.fileno()
                os.set_blocking(stdin_fd, False)
                for pipe in (popen.stdout, popen.stderr):
                    os.set_blocking(pipe.fileno(), False)
            else:
                for pipe in (popen.stdout, popen.stderr):
                    os.set_blocking(pipe.fileno(), False)
            self.running[ident] = _Process(ident, popen, stdin_fd, terminal)
            send({"ev": "proc_started", "id": ident, "pid": popen.pid})
            if self.thread is None:
                self.thread = _agent_thread(self._pump, "evervm-processes")
        self._wake()

    def _start_watch(self, ident, request):
        try:
            resolved = resolve(request)
        except FileError as exc:
            send({"ev": "proc_failed", "id": ident, "error": str(exc), "kind": exc.kind})
            return
        try:
            path = resolved.path
            if _stat(resolved)["type"] != "directory":
                send({"ev": "proc_failed", "id": ident, "kind": "not_a_directory",
                      "error": "%s: not a directory" % path})
                return
        except FileError as exc:
            send({"ev": "proc_failed", "id": ident, "error": str(exc), "kind": exc.kind})
            return
        finally:
            resolved.close()
        with self.lock:
            if len(self.running) + len(self.watches) >= MAX_PROCESSES:
                send({"ev": "proc_failed", "id": ident,
                      "error": "%d processes and watches are running already" % MAX_PROCESSES})
                return
            try:
                watch = _Watch(ident, path, bool(request.get("recursive")))
            except OSError as exc:
                error = _os_error(exc, path)
                send({"ev": "proc_failed", "id": ident, "error": str(error), "kind": error.kind})
                return
            self.watches[ident] = watch
            send({"ev": "proc_started", "id": ident, "pid": os.getpid()})
            if self.thread is None:
                self.thread = _agent_thread(self._pump, "evervm-processes")
        self._wake()

    def _stop_watch(self, ident):
        with self.lock:
            watch = self.watches.pop(ident, None)
            if watch is None:
                return False
            self._send_watch(watch)
            watch.close()
            send({"ev": "proc_exit", "id": ident, "exit_code": 0, "signal": None, "error": None})
        self._wake()
        return True

    def _send_watch(self, watch, extra=()):
        """Sends what the watch has seen (then `extra`). Called with the lock held."""
        events = watch.read_events() + list(extra)
        data = _watch_lines(events)
        # In pieces of at most PROCESS_READ bytes, whole lines each (the host refuses more).
        while data:
            cut = len(data) if len(data) <= PROCESS_READ else data.rfind(b"\n", 0, PROCESS_READ) + 1
            if cut <= 0:
                cut = PROCESS_READ
            piece, data = data[:cut], data[cut:]
            header = struct.pack(">IccQ", len(piece) + 10, b"P", b"o", watch.ident)
            with _out_lock:
                _write_all([header, piece])

    def drain_watches(self):
        """Sends what every watch has seen so far: called before a file operation answers."""
        if not self.watches:
            return
        with self.lock:
            for watch in self.watches.values():
                self._send_watch(watch)

    def upload_done(self, path, existed):
        """The host wrote `path` whole (by a rename): watches report it as envd's uploads."""
        if not self.watches:
            return
        with self.lock:
            for watch in self.watches.values():
                name = watch.relative(path)
                extra = ()
                if name is not None:
                    extra = [(name, "write" if existed else "create"), (name, "chmod"),
                             (name, "write")]
                self._send_watch(watch, extra)

    def _pump_once(self):
        with self.lock:
            reads = {fd: p for p in self.running.values() for fd in p.outputs}
            writes = {p.stdin_fd: p for p in self.running.values()
                      if p.stdin_fd is not None and p.pending}
            watched = {w.fd: w for w in self.watches.values()}
            for process in list(self.running.values()):
                if (process.stdin_fd is not None and process.close_when_written
                        and not process.pending):
                    self._close_stdin(process)
            busy = bool(self.running)
        readable, writable, _ = select.select(
            list(reads) + list(watched) + [self.wake_read], list(writes), [],
            0.05 if busy else None)
        if self.wake_read in readable:
            try:
                os.read(self.wake_read, 4096)
            except BlockingIOError:
                pass
        for fd in readable:
            process = reads.get(fd)
            if process is not None:
                self._read(process, fd)
        with self.lock:
            for fd in readable:
                watch = watched.get(fd)
                if watch is not None and self.watches.get(watch.ident) is watch:
                    self._send_watch(watch)
            for fd in writable:
                process = writes.get(fd)
                if process is not None and process.stdin_fd == fd:
                    self._write(process)
            ended = [p for p in self.running.values() if p.popen.poll() is not None]
        for process in ended:
            # What it wrote before it ended, then its end (a child that keeps the pipes open
            # does not hold the end back, as with E2B).
            for fd in list(process.outputs):
                while fd in process.outputs and self._read(process, fd):
                    pass
                if fd in process.outputs:
                    process.outputs.pop(fd)[1].close()
            with self.lock:
                self.running.pop(process.ident, None)
                self._close_stdin(process)
            code = process.popen.returncode
            send({
                "ev": "proc_exit", "id": process.ident,
                "exit_code": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "error": process.error,
            })

    def _read(self, process, fd):
        """Sends what `fd` has; False once it has nothing (now or ever)."""
        try:
            data = os.read(fd, PROCESS_READ)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            if process.terminal is not None:
                # The terminal is one fd for both ways: its input ends with it.
                process.stdin_fd = None
                process.pending.clear()
            process.outputs.pop(fd)[1].close()
            return False
        header = struct.pack(">IccQ", len(data) + 10, b"P", process.outputs[fd][0], process.ident)
        with _out_lock:
            _write_all([header, data])
        return True

    def _write(self, process):
        try:
            written = os.write(process.stdin_fd, process.pending[:PROCESS_READ])
            del process.pending[:written]
        except BlockingIOError:
            pass
        except OSError:
            # The process closed its stdin: what is left goes nowhere.
            process.pending.clear()
            self._close_stdin(process)

    def _close_stdin(self, process):
        if process.terminal is not None:
            # A terminal's input is its output's fd: closed with the output.
            return
        if process.stdin_fd is not None:
            try:
                process.popen.stdin.close()
            except OSError:
                pass
            process.stdin_fd = None


def _set_terminal_size(fd, size):
    import fcntl
    import termios

    cols, rows = size.get("cols"), size.get("rows")
    if not all(isinstance(n, int) and 0 < n < 65536 for n in (cols, rows)):
        return
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    except OSError:
        pass


def _start_on_terminal(argv, cwd, env, size):
    """Starts `argv` in a session of its own whose controlling terminal is a new pty of `size`;
    gives the process and the pty's controlling side (a file open for reading and writing)."""
    import subprocess
    import termios

    controller, terminal = os.openpty()
    try:
        _set_terminal_size(terminal, size)

        def take_terminal():
            # After the new session began: the pty becomes its controlling terminal.
            import fcntl

            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        popen = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True, stdin=terminal, stdout=terminal,
            stderr=terminal, preexec_fn=take_terminal,
        )
    except BaseException:
        os.close(controller)
        raise
    finally:
        os.close(terminal)
    return popen, os.fdopen(controller, "r+b", buffering=0)


# Made by `main` (the modules it needs are imported after this part of the program).
PROCESSES = None
