//! The guest side of a machine: the agent program that runs inside every sandbox, and the host
//! side of its channel.

pub mod channel;
pub mod connection;
pub mod image;

/// The agent's source: its Jupyter cells' part, then the rest (one program). The process
/// backend runs it with `python3 -I -c`; images carry it as a file.
pub const AGENT_SOURCE: &str = concat!(include_str!("jupyter.py"), include_str!("agent.py"));
