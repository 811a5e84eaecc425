"""evervm: Python REPLs that never die, for AI agents.

Each machine is a persistent CPython interpreter in its own sandbox; variables, imports,
functions and files persist across instructions.

    import evervm
    client = evervm.Client.local()          # or evervm.Client(url, token) for a server
    machine = client.create_machine(tags={"agent": "demo"})
    machine.exec("x = 20")
    print(machine.exec("x + 1").value)      # '21'
    machine.files.write("data.csv", "a,b\n1,2\n")
    print(machine.files.read_text("data.csv"))

`AsyncClient` and `AsyncMachine` have the same methods for asyncio. Every error is an
`EvervmError`, with one subclass per kind.
"""

from evervm._native import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    AsyncClient,
    AsyncExecStream,
    AsyncFiles,
    AsyncMachine,
    Checkpoint,
    Client,
    ConflictError,
    EvervmError,
    ExceptionInfo,
    ExecResult,
    ExecStream,
    FileInfo,
    FileList,
    Files,
    HistoryEntry,
    InstalledPackage,
    InstallReport,
    InternalError,
    InvalidInputError,
    LimitExceededError,
    Lineage,
    LineageCheckpoint,
    LineageNode,
    Machine,
    MachineCrashedError,
    MachineHistory,
    MachineInfo,
    MachinePage,
    NotFoundError,
    OutputChunk,
    PermissionDeniedError,
    Rewound,
    RichResult,
    SatisfiedPackage,
    TakenBack,
    TooLargeError,
    TransportError,
    UnauthorizedError,
    UnsupportedError,
    __version__,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "AsyncClient",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncMachine",
    "Checkpoint",
    "Client",
    "ConflictError",
    "EvervmError",
    "ExceptionInfo",
    "ExecResult",
    "ExecStream",
    "FileInfo",
    "FileList",
    "Files",
    "HistoryEntry",
    "InstalledPackage",
    "InstallReport",
    "InternalError",
    "InvalidInputError",
    "LimitExceededError",
    "Lineage",
    "LineageCheckpoint",
    "LineageNode",
    "Machine",
    "MachineCrashedError",
    "MachineHistory",
    "MachineInfo",
    "MachinePage",
    "NotFoundError",
    "OutputChunk",
    "PermissionDeniedError",
    "Rewound",
    "RichResult",
    "SatisfiedPackage",
    "TakenBack",
    "TooLargeError",
    "TransportError",
    "UnauthorizedError",
    "UnsupportedError",
    "__version__",
]
