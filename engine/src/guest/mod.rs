//! The guest side of a machine: the agent program that runs inside every sandbox, and the host
//! side of its channel.

pub mod channel;
pub mod connection;
pub mod contexts;
pub mod image;
pub mod processes;
pub mod tunnels;

/// The agent's source: its Jupyter cells' part, its health check, its root helper for `sudo`,
/// the processes it runs beside the interpreter, its watches, its other contexts' interpreters, its tunnels to ports,
/// then the rest (one program). The process backend runs it with `python3 -I -c`; images carry
/// it as a file.
pub const AGENT_SOURCE: &str = concat!(
    include_str!("jupyter.py"),
    include_str!("health.py"),
    include_str!("root.py"),
    include_str!("processes.py"),
    include_str!("watches.py"),
    include_str!("contexts.py"),
    include_str!("tunnels.py"),
    include_str!("agent.py")
);

/// The flag, then the uid, with which a gVisor sandbox starts the agent as root: it keeps a root
/// helper for `sudo` (`root.py`) and runs as that uid.
pub const ROOT_HELPER_FLAG: &str = "--root-helper";

/// `sudo` in an image: asks the agent's root helper to run a command as root.
pub const SUDO_SOURCE: &str = include_str!("sudo.py");

/// The port on which a gVisor machine's interpreter answers `GET /health` from inside the machine
/// (`health.py`): E2B's code interpreter's, which programs in an E2B sandbox ask.
pub const HEALTH_PORT: u16 = 49999;
