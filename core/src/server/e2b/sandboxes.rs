//! E2B's sandbox lifecycle over evervm machines: every sandbox has a timeout, and when it passes
//! E2B kills the sandbox. Here the machine is swapped out instead (E2B's "paused": its state
//! kept on disk, no memory held), and `connect` (or any request to it) brings it back.
//!
//! The clocks live in this process only. A machine without one is paused: after a restart every
//! machine is (the engine's shutdown swapped them out), and the next `connect` starts its clock.
//! The map holds one entry per running sandbox, bounded by the machines the accounts may have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use evervm_engine::{Account, Engine};

use super::lock;
use tokio::time::Instant;

/// The timeout of a sandbox created or connected without one (E2B's default).
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest timeout a sandbox may be given (E2B's limit for its largest plans).
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// How often the reaper looks for sandboxes whose timeout passed.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// A running sandbox's clock.
#[derive(Debug, Clone)]
pub(super) struct Clock {
    pub(super) account: Account,
    /// When it was last started (created, connected or resumed).
    pub(super) started_at: DateTime<Utc>,
    /// When its timeout passes.
    pub(super) end_at: DateTime<Utc>,
    /// The same, on the monotonic clock the reaper reads.
    deadline: Instant,
}

/// The running sandboxes' clocks, by machine name.
#[derive(Debug, Default)]
pub(crate) struct Sandboxes {
    clocks: Mutex<HashMap<String, Clock>>,
}

/// Checks a timeout in seconds given by a caller.
pub(super) fn timeout_from_seconds(seconds: i64) -> Result<Duration, super::E2bFailure> {
    let max = MAX_TIMEOUT.as_secs();
    match u64::try_from(seconds) {
        Ok(s) if (1..=max).contains(&s) => Ok(Duration::from_secs(s)),
        _ => Err(super::E2bFailure::bad_request(format!(
            "timeout {seconds} s: a sandbox's timeout is between 1 and {max} seconds"
        ))),
    }
}

impl Sandboxes {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The clock of a running sandbox (`None`: it is paused).
    pub(super) fn clock(&self, name: &str) -> Option<Clock> {
        lock(&self.clocks).get(name).cloned()
    }

    /// Starts (or starts again) the sandbox's clock: it runs for `timeout` from now.
    pub(super) fn start(&self, account: &Account, name: &str, timeout: Duration) -> Clock {
        let now = Utc::now();
        let mut clocks = lock(&self.clocks);
        let started_at = clocks.get(name).map_or(now, |c| c.started_at);
        let clock = Clock {
            account: account.clone(),
            started_at,
            end_at: now + chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::MAX),
            deadline: Instant::now() + timeout,
        };
        clocks.insert(name.to_owned(), clock.clone());
        clock
    }

    /// Starts the clock of a sandbox a request reached while it was paused (E2B's auto-resume),
    /// for the default timeout. A running sandbox's clock is left as it is.
    pub(super) fn touch(&self, account: &Account, name: &str) {
        if lock(&self.clocks).contains_key(name) {
            return;
        }
        self.start(account, name, DEFAULT_TIMEOUT);
    }

    /// Stops the sandbox's clock (it was paused or killed). True if it was running.
    pub(super) fn stop(&self, name: &str) -> bool {
        lock(&self.clocks).remove(name).is_some()
    }

    /// Takes out the clock of `account`'s sandbox `name` (it is being killed), which reads as
    /// gone from then on; [`Sandboxes::put_back`] returns it if the kill fails.
    pub(super) fn take(&self, account: &Account, name: &str) -> Option<Clock> {
        let mut clocks = lock(&self.clocks);
        if clocks.get(name).is_some_and(|c| c.account.id == account.id) {
            clocks.remove(name)
        } else {
            None
        }
    }

    /// Returns a clock [`Sandboxes::take`] took out, unless the sandbox has one again.
    pub(super) fn put_back(&self, name: &str, clock: Clock) {
        lock(&self.clocks).entry(name.to_owned()).or_insert(clock);
    }

    /// Takes the clocks whose timeout passed by `now`.
    fn take_expired(&self, now: Instant) -> Vec<(String, Account)> {
        let mut clocks = lock(&self.clocks);
        let expired: Vec<String> = clocks
            .iter()
            .filter(|(_, clock)| clock.deadline <= now)
            .map(|(name, _)| name.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|name| {
                let clock = clocks.remove(&name)?;
                Some((name, clock.account))
            })
            .collect()
    }
}

/// Swaps out every sandbox whose timeout passed, once a second, until the listener's sandboxes
/// are dropped or the engine closes.
pub(super) fn spawn_reaper(engine: Engine, sandboxes: Weak<Sandboxes>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(REAP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(sandboxes) = sandboxes.upgrade() else {
                return;
            };
            let expired = sandboxes.take_expired(Instant::now());
            drop(sandboxes);
            for (name, account) in expired {
                match engine.swap_out(&account, &name).await {
                    Ok(()) => tracing::debug!(machine = name, "E2B timeout: swapped out"),
                    Err(e) if e.kind() == evervm_engine::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(machine = name, "E2B timeout: cannot swap out: {e}");
                    }
                }
            }
            if engine.is_closed() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        Account {
            id: 1,
            name: "a".into(),
        }
    }

    #[test]
    fn clocks_run_out_and_restart() {
        let sandboxes = Sandboxes::new();
        sandboxes.start(&account(), "m", Duration::from_secs(10));
        assert!(sandboxes.take_expired(Instant::now()).is_empty());
        let expired = sandboxes.take_expired(Instant::now() + Duration::from_secs(11));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].0, "m");
        assert!(
            sandboxes.clock("m").is_none(),
            "an expired sandbox is paused"
        );

        // A request to a paused sandbox starts its clock again; one to a running one does not.
        sandboxes.touch(&account(), "m");
        let first = sandboxes.clock("m").unwrap();
        sandboxes.touch(&account(), "m");
        assert_eq!(sandboxes.clock("m").unwrap().end_at, first.end_at);
        assert!(sandboxes.stop("m"));
        assert!(!sandboxes.stop("m"));
    }

    #[test]
    fn a_kill_takes_only_its_own_accounts_clock_and_can_return_it() {
        let sandboxes = Sandboxes::new();
        sandboxes.start(&account(), "m", Duration::from_secs(10));
        let other = Account {
            id: 2,
            name: "b".into(),
        };
        assert!(sandboxes.take(&other, "m").is_none());
        assert!(
            sandboxes.clock("m").is_some(),
            "another account's kill leaves it running"
        );
        let clock = sandboxes.take(&account(), "m").unwrap();
        assert!(sandboxes.clock("m").is_none(), "being killed reads as gone");
        sandboxes.put_back("m", clock.clone());
        assert_eq!(sandboxes.clock("m").unwrap().end_at, clock.end_at);
    }

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(timeout_from_seconds(60).unwrap(), Duration::from_secs(60));
        for bad in [0, -1, 24 * 3600 + 1] {
            assert!(timeout_from_seconds(bad).is_err(), "{bad}");
        }
    }
}
