//! The guest side of a machine: the agent program that runs inside every sandbox, and the host
//! side of its channel.

pub mod channel;
pub mod connection;
pub mod image;

/// The agent's source. Backends run it with `python3 -I -c`, so it needs no file in the sandbox.
pub const AGENT_SOURCE: &str = include_str!("agent.py");
