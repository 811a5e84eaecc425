# --- contexts: more interpreters in one machine --------------------------------------------------
#
# A context is another interpreter in the same sandbox (E2B's code contexts): its own globals and
# working directory; the same files, packages and environment. Each is a child process running
# this agent with `--context CWD`, which speaks the same channel over a pair of pipes. An
# instruction the host sends with a "context" is passed to that child, and what the child answers
# is relayed to the host frame by frame, whole, by a thread per context. The default context is
# this process's own interpreter. A context that runs past its instruction's timeout and ignores
# the interrupt is killed (its variables are lost, and the result says so); one whose interpreter
# exited is started again by its next instruction, which says so on stderr.
#
# Host -> agent:
#   {"op": "exec", ..., "context": ID}   (an instruction for that context)
#   {"op": "context_create", "cwd": "..." | null} (`~` the home; none: the home),
#   {"op": "context_list"},
#   {"op": "context_restart", "context": ID}, {"op": "context_remove", "context": ID}
# Agent -> host:
#   {"ev": "contexts", "contexts": [{"id": ID, "cwd": "...", "pid": P | null}]}: every context,
#   the default first (list); the one made or restarted (create, restart); none (remove). Or a
#   `file_error` ("not_found": no such context; "invalid": the default; "no_space": too many).

CONTEXT_OPERATIONS = ("context_create", "context_list", "context_restart", "context_remove")
DEFAULT_CONTEXT = "default"
MAX_CONTEXTS = 32
# How long past its timeout a context's instruction may run before its interpreter is killed.
CONTEXT_STOP_GRACE = 3.0
# How long a context's interpreter may take to read a request before it counts as stuck.
CONTEXT_WRITE_TIMEOUT = 10.0


class _ContextError(Exception):
    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind


def _agent_argv(cwd):
    """How to start this agent again, as a context's interpreter in `cwd`."""
    argv = [sys.executable]
    if sys.flags.isolated:
        argv.append("-I")
    if os.path.isfile(AGENT_FILE):
        argv.append(AGENT_FILE)
    else:
        # Started with `-c SOURCE` (the process backend): the source is in the command line.
        with open("/proc/self/cmdline", "rb") as f:
            words = f.read().split(b"\0")
        source = words[words.index(b"-c") + 1].decode("utf-8", "surrogateescape")
        argv += ["-c", source]
    return argv + ["--context", cwd]


def _result_error(instruction_id, name, message, cause="exception", started=None):
    """A result that ends an instruction with an error the agent raised, not the user's code."""
    runtime = 0 if started is None else int((time.monotonic() - started) * 1000)
    return {"ev": "result", "id": instruction_id, "error": "%s: %s" % (name, message),
            "cause": cause, "runtime_ms": runtime,
            "exception": {"name": name, "qualname": name, "module": "evervm", "value": message}}


def _send_stderr(instruction_id, text):
    data = text.encode("utf-8", "surrogatepass")
    header = struct.pack(">I", len(data) + 10) + b"Oe" + struct.pack(">q", instruction_id)
    with _out_lock:
        _write_all([header, data])


class _Relay:
    """One run of a context's interpreter: its process and the pipe that wakes its relay thread
    (closed by that thread when it ends)."""

    def __init__(self, popen):
        self.popen = popen
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.closed = False


class _Interpreter:
    """One context's child process, and the thread that relays what it sends."""

    def __init__(self, ident, cwd):
        self.ident = ident
        self.cwd = cwd
        self.lock = threading.Lock()
        self.relay = None
        # While an instruction runs: its id, when it started and when to stop waiting for it.
        self.running = None

    @property
    def popen(self):
        return None if self.relay is None else self.relay.popen

    def info(self):
        alive = self.alive()
        return {"id": self.ident, "cwd": self.cwd, "pid": self.popen.pid if alive else None}

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def spawn(self):
        """Starts the interpreter (again). Called by the main thread only, which alone writes to
        and closes the interpreters' stdin."""
        import subprocess

        self.close_stdin()
        # `~` is the machine's home; a directory that does not exist, or that the user may not
        # enter, leaves the home.
        target = os.path.expanduser(self.cwd)
        usable = os.path.isdir(target) and os.access(target, os.X_OK)
        cwd = target if usable else os.path.expanduser("~")
        try:
            popen = subprocess.Popen(
                _agent_argv(target), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            raise _ContextError("io", "the context's interpreter did not start: %s" % exc)
        try:
            os.set_blocking(popen.stdin.fileno(), False)
            relay = _Relay(popen)
            _agent_thread(lambda: self._relay(relay), "evervm-context")
        except Exception as exc:
            # No thread (or no descriptor) for it under the machine's limits.
            popen.kill()
            popen.wait()
            popen.stdin.close()
            popen.stdout.close()
            raise _ContextError("no_space", "the context's interpreter did not start: %s" % exc)
        with self.lock:
            self.relay = relay
            self.running = None

    def close_stdin(self):
        popen = self.popen
        if popen is not None:
            try:
                popen.stdin.close()
            except OSError:
                pass

    def kill(self):
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except OSError:
            try:
                popen.kill()
            except OSError:
                pass

    def send(self, request):
        """Writes one request to the interpreter; kills it if it does not read it in time."""
        payload = json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogatepass")
        view = memoryview(struct.pack(">I", len(payload)) + payload)
        deadline = time.monotonic() + CONTEXT_WRITE_TIMEOUT
        try:
            fd = self.popen.stdin.fileno()
            while view:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise OSError("the context's interpreter does not read its requests")
                _, writable, _ = select.select([], [fd], [], wait)
                if writable:
                    try:
                        view = view[os.write(fd, view):]
                    except BlockingIOError:
                        continue
        except (OSError, ValueError, AttributeError):
            self.kill()
            return False
        return True

    def begin(self, instruction_id, timeout_s):
        with self.lock:
            now = time.monotonic()
            self.running = (instruction_id, now, now + timeout_s + CONTEXT_STOP_GRACE)
            relay = self.relay
            if relay is not None and not relay.closed:
                try:
                    os.write(relay.wake_write, b".")
                except OSError:
                    pass

    def _relay(self, relay):
        """Relays the interpreter's frames to the host until it exits, then ends the instruction
        it was running, if any."""
        popen = relay.popen
        source = popen.stdout.fileno()
        reader = ChannelReader(source)
        killed_at_timeout = False
        while True:
            with self.lock:
                running = self.running if self.relay is relay else None
            wait = None
            if running is not None and not killed_at_timeout:
                wait = max(0.0, running[2] - time.monotonic())
            if not reader.buffered():
                readable, _, _ = select.select([source, relay.wake_read], [], [], wait)
                if relay.wake_read in readable:
                    try:
                        os.read(relay.wake_read, 64)
                    except OSError:
                        pass
                    continue
                if not readable:
                    killed_at_timeout = True
                    self.kill()
                    continue
            try:
                frame = reader.receive_frame()
            except Exception:
                frame = None
            if frame is None:
                break
            if frame[:1] == b"{":
                try:
                    event = json.loads(frame)
                except ValueError:
                    continue
                # Only what an instruction answers: the host hears nothing else from a context.
                if not isinstance(event, dict) or event.get("ev") not in ("result", "display"):
                    continue
                if event.get("ev") == "result":
                    with self.lock:
                        if self.running is not None and self.running[0] == event.get("id"):
                            self.running = None
            elif frame[:1] != b"O":
                continue
            with _out_lock:
                _write_all([struct.pack(">I", len(frame)), frame])
        try:
            popen.wait()
        except Exception:
            pass
        try:
            popen.stdout.close()
        except OSError:
            pass
        with self.lock:
            relay.closed = True
            os.close(relay.wake_read)
            os.close(relay.wake_write)
            running = None
            if self.relay is relay:
                running, self.running = self.running, None
        if running is not None:
            if killed_at_timeout:
                message = ("the instruction ran past its timeout and did not stop when "
                           "interrupted, so the context's interpreter was killed: its variables "
                           "are gone")
                send(_result_error(running[0], "ContextKilled", message, "timeout", running[1]))
            else:
                message = "the context's interpreter exited: its variables are gone"
                send(_result_error(running[0], "ContextExited", message, "exception", running[1]))


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}

    def _list(self):
        home = os.path.expanduser("~")
        default = {"id": DEFAULT_CONTEXT, "cwd": home, "pid": os.getpid()}
        with self.lock:
            return [default] + [i.info() for i in self.by_id.values()]

    def _get(self, ident):
        if ident == DEFAULT_CONTEXT:
            raise _ContextError("invalid", "the default context cannot be restarted or removed")
        with self.lock:
            interpreter = self.by_id.get(ident)
        if interpreter is None:
            raise _ContextError("not_found", "no context %r" % (ident,))
        return interpreter

    def handle(self, request):
        op = request.get("op")
        try:
            self._handle(op, request)
        except Exception as exc:
            send({"ev": "file_error", "kind": "io", "error": "%s: %s" % (type(exc).__name__, exc)})

    def _handle(self, op, request):
        try:
            if op == "context_list":
                contexts = self._list()
            elif op == "context_create":
                contexts = [self._create(request.get("cwd"))]
            elif op == "context_restart":
                interpreter = self._get(request.get("context"))
                interpreter.kill()
                interpreter.spawn()
                contexts = [interpreter.info()]
            elif op == "context_remove":
                interpreter = self._get(request.get("context"))
                with self.lock:
                    self.by_id.pop(interpreter.ident, None)
                interpreter.kill()
                interpreter.close_stdin()
                contexts = []
            else:
                return
        except _ContextError as exc:
            send({"ev": "file_error", "kind": exc.kind, "error": str(exc)})
            return
        send({"ev": "contexts", "contexts": contexts})

    def _create(self, cwd):
        import uuid

        if not isinstance(cwd, str) or not cwd:
            cwd = os.path.expanduser("~")
        if "\0" in cwd:
            raise _ContextError("invalid", "a context's working directory cannot hold NUL")
        with self.lock:
            if len(self.by_id) >= MAX_CONTEXTS:
                raise _ContextError("no_space", "a machine holds at most %d contexts besides "
                                    "the default; remove one first" % MAX_CONTEXTS)
            interpreter = _Interpreter(str(uuid.uuid4()), cwd)
            self.by_id[interpreter.ident] = interpreter
        try:
            interpreter.spawn()
        except _ContextError:
            with self.lock:
                self.by_id.pop(interpreter.ident, None)
            raise
        return interpreter.info()

    def execute(self, request):
        """Runs an instruction in the context it names; its result comes from the relay."""
        try:
            self._execute(request)
        except Exception as exc:
            message = "%s: %s" % (type(exc).__name__, exc)
            send(_result_error(request.get("id"), "ContextExited", message))

    def _execute(self, request):
        instruction_id = request.get("id")
        ident = request.get("context")
        with self.lock:
            interpreter = self.by_id.get(ident) if isinstance(ident, str) else None
        if interpreter is None:
            send(_result_error(instruction_id, "ContextNotFound", "no context %r" % (ident,)))
            return
        forward = {k: v for k, v in request.items() if k != "context"}
        timeout_s = max(0.001, request.get("timeout_ms", 15000) / 1000.0)
        if not interpreter.alive():
            try:
                interpreter.spawn()
            except _ContextError as exc:
                send(_result_error(instruction_id, "ContextExited", str(exc)))
                return
            _send_stderr(instruction_id, "[evervm] this context's interpreter had exited and was "
                                         "started again: its variables are gone\n")
        interpreter.begin(instruction_id, timeout_s)
        # A request the interpreter did not take ends in its relay, as an exit.
        interpreter.send(forward)

    def pass_interrupt(self, request):
        with self.lock:
            interpreters = list(self.by_id.values())
        for interpreter in interpreters:
            running = interpreter.running
            if running is not None and running[0] == request.get("id") and interpreter.alive():
                interpreter.send(request)

    def reseed(self):
        with self.lock:
            interpreters = list(self.by_id.values())
        for interpreter in interpreters:
            if interpreter.alive():
                interpreter.send({"op": "reseed"})


CONTEXTS = None
