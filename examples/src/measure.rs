//! Latency figures and memory readings for the benchmark and load programs.

use std::time::Duration;

use anyhow::{Result, bail};
use evervm::{Client, CreateMachineOptions, Machine};

/// The `p`th percentile (0 to 100) of samples sorted in ascending order; zero when there are
/// none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// A duration in milliseconds, two decimals: `3.70 ms`.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Prints one line: the label, p50 and p99 of the samples, and how many there were.
#[allow(clippy::print_stdout)]
pub fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "  {label:<42} p50 {:>10}  p99 {:>10}  (n={})",
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        samples.len()
    );
}

/// The `Pss:` line of a `smaps_rollup` file, in bytes.
fn pss_in(rollup: &str) -> Option<u64> {
    let kb = rollup.lines().find_map(|l| l.strip_prefix("Pss:"))?;
    let kb = kb
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Proportional set size of every process whose command line contains `needle`, in bytes.
pub fn pss_of(needle: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(needle) {
            continue;
        }
        if let Ok(rollup) = std::fs::read_to_string(path.join("smaps_rollup")) {
            total += pss_in(&rollup).unwrap_or(0);
        }
    }
    total
}

/// Proportional set size of this process, in bytes (0 where `/proc` does not say).
pub fn own_pss() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|rollup| pss_in(&rollup))
        .unwrap_or(0)
}

/// A new machine that has run its first instruction, so that what is measured next is the round
/// trip alone (not the sandbox's start).
pub async fn ready_machine(client: &Client) -> Result<Machine> {
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    let first = machine.exec("1+1").await?;
    if first.result.value.as_deref() != Some("2") {
        bail!("1+1 gave {:?}", first.result);
    }
    Ok(machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(51));
        assert_eq!(percentile(&samples, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&samples, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn pss_is_read_in_bytes() {
        let rollup = "Rss:                1000 kB\nPss:                 512 kB\n";
        assert_eq!(pss_in(rollup), Some(512 * 1024));
        assert_eq!(pss_in("Rss: 1 kB\n"), None);
    }
}
