//! `evervm undo`, `rewind` and `history`: a machine's undo points from the shell (machines
//! created with `machine new --history N`).

use anyhow::Result;
use clap::Args;
use evervm::{Client, Lineage, MachineHistory, Rewound};

#[derive(Args)]
pub(crate) struct UndoArgs {
    /// The machine.
    machine: String,
}

#[derive(Args)]
pub(crate) struct RewindArgs {
    /// The machine.
    machine: String,
    /// The seq of the instruction whose after-state to go back to (`evervm history` lists
    /// them); -1 takes back the last instruction, as `undo` does.
    #[arg(allow_negative_numbers = true)]
    seq: i64,
}

#[derive(Args)]
pub(crate) struct HistoryArgs {
    /// The machine.
    machine: String,
    /// How many of its latest instructions (at most 1000).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Print it as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct LineageArgs {
    /// The machine.
    machine: String,
    /// Print it as JSON.
    #[arg(long)]
    json: bool,
}

/// `evervm lineage MACHINE`: the tree of forks it is in, one machine a line, indented under its
/// parent, with where it was forked, its checkpoints and what rewinds took back.
pub(crate) async fn lineage(client: &Client, args: LineageArgs) -> Result<()> {
    let lineage = client.machine(&args.machine).lineage().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lineage)?);
        return Ok(());
    }
    print!("{}", render_lineage(&lineage, &args.machine));
    Ok(())
}

fn render_lineage(lineage: &Lineage, asked: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut depth: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for node in &lineage.machines {
        let level = node
            .parent
            .as_deref()
            .and_then(|p| depth.get(p))
            .map_or(0, |d| d + 1);
        depth.insert(&node.name, level);
        let indent = "  ".repeat(level);
        let here = if node.name == asked { "  <-" } else { "" };
        let forked = match (level, node.forked_at) {
            (0, _) | (_, None) => String::new(),
            (_, Some(at)) => format!(" (forked after its parent's instruction {at})"),
        };
        let _ = writeln!(
            out,
            "{indent}{} [{} instructions]{forked}{here}",
            node.name, node.instruction_count
        );
        for checkpoint in &node.checkpoints {
            let _ = writeln!(
                out,
                "{indent}    checkpoint {} (after {} instructions)",
                checkpoint.name, checkpoint.instruction_count
            );
        }
        for run in &node.taken_back {
            let seqs = if run.first == run.last {
                format!("{}", run.first)
            } else {
                format!("{} to {}", run.first, run.last)
            };
            let _ = writeln!(
                out,
                "{indent}    instructions {seqs} taken back ({})",
                run.by
            );
        }
    }
    out
}

fn say(machine: &str, rewound: &Rewound) {
    let taken = match rewound.rewound {
        1 => "1 instruction taken back".to_owned(),
        n => format!("{n} instructions taken back"),
    };
    if rewound.to < 0 {
        println!("{machine}: back before its first instruction ({taken})");
    } else {
        println!(
            "{machine}: back to the state after instruction {} ({taken})",
            rewound.to
        );
    }
}

/// `evervm undo MACHINE`.
pub(crate) async fn undo(client: &Client, args: UndoArgs) -> Result<()> {
    let rewound = client.machine(&args.machine).undo().await?;
    say(&args.machine, &rewound);
    Ok(())
}

/// `evervm rewind MACHINE SEQ`.
pub(crate) async fn rewind(client: &Client, args: RewindArgs) -> Result<()> {
    let rewound = client.machine(&args.machine).rewind(args.seq).await?;
    say(&args.machine, &rewound);
    Ok(())
}

/// `evervm history MACHINE`: one line per instruction: its seq, `*` where an undo point after
/// it is kept, `rewound` where it was taken back, its first code line and its result.
pub(crate) async fn history(client: &Client, args: HistoryArgs) -> Result<()> {
    let history = client
        .machine(&args.machine)
        .history(Some(args.limit))
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&history)?);
        return Ok(());
    }
    print!("{}", render(&history));
    Ok(())
}

fn render(history: &MachineHistory) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if history.keeps == 0 {
        out.push_str("(this machine keeps no undo points: create one with --history N)\n");
    } else if history.initial_point {
        out.push_str("   * -1  (before the first instruction)\n");
    }
    for entry in &history.instructions {
        let mark = if entry.undo_point { '*' } else { ' ' };
        let first = entry.code.lines().next().unwrap_or("");
        let more = if entry.code.lines().nth(1).is_some() {
            " ..."
        } else {
            ""
        };
        let outcome = match (&entry.value, &entry.error, entry.finished) {
            (_, Some(error), _) => format!("  ! {error}"),
            (Some(value), None, _) => format!("  = {value}"),
            (None, None, false) => "  (running)".to_owned(),
            (None, None, true) => String::new(),
        };
        let rewound = if entry.rewound { "  [rewound]" } else { "" };
        let _ = writeln!(
            out,
            "   {mark} {:>2}  {first}{more}{outcome}{rewound}",
            entry.seq
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use evervm::HistoryEntry;

    #[test]
    fn the_lineage_is_a_tree() {
        let node = |name: &str, parent: Option<&str>| evervm::LineageNode {
            name: name.into(),
            created_at: chrono::Utc::now(),
            parent: parent.map(Into::into),
            forked_at: parent.map(|_| 2),
            instruction_count: 3,
            checkpoints: Vec::new(),
            taken_back: Vec::new(),
        };
        let mut root = node("a", None);
        root.taken_back.push(evervm::TakenBack {
            first: 1,
            last: 2,
            by: "rewind to 0".into(),
        });
        let lineage = Lineage {
            root: "a".into(),
            machines: vec![root, node("b", Some("a")), node("c", Some("b"))],
        };
        let lines = [
            "a [3 instructions]",
            "    instructions 1 to 2 taken back (rewind to 0)",
            "  b [3 instructions] (forked after its parent's instruction 2)  <-",
            "    c [3 instructions] (forked after its parent's instruction 2)",
        ];
        assert_eq!(render_lineage(&lineage, "b"), lines.join("\n") + "\n");
    }

    #[test]
    fn the_history_shows_points_results_and_rewinds() {
        let entry =
            |seq, code: &str, value: Option<&str>, error: Option<&str>, rewound| HistoryEntry {
                seq,
                code: code.into(),
                value: value.map(Into::into),
                error: error.map(Into::into),
                finished: true,
                rewound,
                undo_point: seq > 0,
            };
        let history = MachineHistory {
            keeps: 5,
            initial_point: true,
            instructions: vec![
                entry(
                    0,
                    "import pandas as pd\ndf = pd.DataFrame()",
                    None,
                    None,
                    false,
                ),
                entry(
                    1,
                    "1/0",
                    None,
                    Some("ZeroDivisionError: division by zero"),
                    true,
                ),
                entry(2, "len(df)", Some("0"), None, false),
            ],
        };
        let lines = [
            "   * -1  (before the first instruction)",
            "      0  import pandas as pd ...",
            "   *  1  1/0  ! ZeroDivisionError: division by zero  [rewound]",
            "   *  2  len(df)  = 0",
        ];
        assert_eq!(render(&history), lines.join("\n") + "\n");
    }
}
