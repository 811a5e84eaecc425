//! How a long image build shows how far it is.

use std::io::{IsTerminal, Write as _};

/// Where a long build reports how far it is.
pub trait Progress: Send + Sync {
    /// A new stage (`resolving`, `downloading`, ...) with `total` steps (0: unknown).
    fn stage(&self, name: &str, total: usize);
    /// `done` of the stage's steps are finished; `item` is the current one.
    fn step(&self, done: usize, item: &str);
    fn finish(&self, message: &str);
}

/// Progress on stderr: a bar redrawn in place on a terminal, a line per stage otherwise.
#[derive(Debug, Default)]
pub struct StderrProgress {
    state: std::sync::Mutex<(String, usize)>,
}

impl Progress for StderrProgress {
    fn stage(&self, name: &str, total: usize) {
        if let Ok(mut state) = self.state.lock() {
            *state = (name.to_owned(), total);
        }
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "evervm image: {name}");
    }

    fn step(&self, done: usize, item: &str) {
        let mut err = std::io::stderr().lock();
        if !err.is_terminal() {
            return;
        }
        let (name, total) = self.state.lock().map(|s| s.clone()).unwrap_or_default();
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(0);
        let bar: String = "#".repeat(filled) + &"-".repeat(width - filled.min(width));
        let item: String = item.chars().take(40).collect();
        let _ = write!(err, "\r  {name:<12} [{bar}] {done}/{total} {item:<40}");
        let _ = err.flush();
    }

    fn finish(&self, message: &str) {
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "evervm image: {message}");
    }
}
