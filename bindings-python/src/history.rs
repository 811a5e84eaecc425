//! A machine's history and family: what a rewind did, its latest instructions (`history`), and
//! the tree of forks it is in (`lineage`).

use pyo3::prelude::*;

/// A bool as Python writes it, for `__repr__`.
fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// What a rewind (`Machine.rewind`, `Machine.undo`) did.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct Rewound {
    /// The undo point the machine is at now: the state after instruction `to` (`-1`: before
    /// its first instruction).
    pub to: i64,
    /// How many instructions it marked rewound.
    pub rewound: i64,
}

#[pymethods]
impl Rewound {
    fn __repr__(&self) -> String {
        format!("Rewound(to={}, rewound={})", self.to, self.rewound)
    }
}

impl From<evervm::Rewound> for Rewound {
    fn from(r: evervm::Rewound) -> Self {
        Self {
            to: r.to,
            rewound: r.rewound,
        }
    }
}

/// One instruction in a machine's history.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct HistoryEntry {
    pub seq: i64,
    pub code: String,
    /// Its value (the `repr` of its last expression), shortened; `None` for none.
    pub value: Option<String>,
    /// Its error's last line (`"ZeroDivisionError: division by zero"`), shortened.
    pub error: Option<String>,
    /// False while it runs or waits.
    pub finished: bool,
    /// Taken back by a rewind or a rollback (it stays in the history).
    pub rewound: bool,
    /// Whether an undo point for the state after it is kept (`rewind` to its seq).
    pub undo_point: bool,
}

#[pymethods]
impl HistoryEntry {
    fn __repr__(&self) -> String {
        format!(
            "HistoryEntry(seq={}, code={:?}, rewound={}, undo_point={})",
            self.seq,
            self.code,
            py_bool(self.rewound),
            py_bool(self.undo_point)
        )
    }
}

impl From<evervm::HistoryEntry> for HistoryEntry {
    fn from(e: evervm::HistoryEntry) -> Self {
        Self {
            seq: e.seq,
            code: e.code,
            value: e.value,
            error: e.error,
            finished: e.finished,
            rewound: e.rewound,
            undo_point: e.undo_point,
        }
    }
}

/// A machine's history: its latest instructions and which of them can be rewound to.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct MachineHistory {
    /// How many undo points the machine keeps (`0`: none).
    pub keeps: u32,
    /// Whether the state before its first instruction is kept (an undo of that instruction).
    pub initial_point: bool,
    /// Oldest first.
    pub instructions: Vec<HistoryEntry>,
}

#[pymethods]
impl MachineHistory {
    fn __repr__(&self) -> String {
        format!(
            "MachineHistory(keeps={}, initial_point={}, instructions={})",
            self.keeps,
            py_bool(self.initial_point),
            self.instructions.len()
        )
    }
}

impl From<evervm::MachineHistory> for MachineHistory {
    fn from(h: evervm::MachineHistory) -> Self {
        Self {
            keeps: h.keeps,
            initial_point: h.initial_point,
            instructions: h.instructions.into_iter().map(Into::into).collect(),
        }
    }
}

/// A checkpoint in a [`LineageNode`]: its name and the instruction count when it was taken.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct LineageCheckpoint {
    pub name: String,
    pub instruction_count: i64,
}

#[pymethods]
impl LineageCheckpoint {
    fn __repr__(&self) -> String {
        format!(
            "LineageCheckpoint(name={:?}, instruction_count={})",
            self.name, self.instruction_count
        )
    }
}

/// Consecutive instructions taken back by one rewind or rollback.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct TakenBack {
    /// The first and last seq taken back.
    pub first: i64,
    pub last: i64,
    /// What took them back: `"rewind to N"` or a checkpoint's name.
    pub by: String,
}

#[pymethods]
impl TakenBack {
    fn __repr__(&self) -> String {
        format!(
            "TakenBack(first={}, last={}, by={:?})",
            self.first, self.last, self.by
        )
    }
}

/// One machine in a [`Lineage`].
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct LineageNode {
    pub name: String,
    /// ISO 8601, UTC.
    pub created_at: String,
    /// The machine it was forked from; `None` for the root. A parent deleted since is named
    /// here but not in the tree.
    pub parent: Option<String>,
    /// The parent's last instruction the fork holds (`-1`: none).
    pub forked_at: Option<i64>,
    pub instruction_count: i64,
    /// Its checkpoints, with the instruction count when each was taken.
    pub checkpoints: Vec<LineageCheckpoint>,
    /// The runs of its instructions that a rewind or rollback took back.
    pub taken_back: Vec<TakenBack>,
}

#[pymethods]
impl LineageNode {
    fn __repr__(&self) -> String {
        format!(
            "LineageNode(name={:?}, parent={}, forked_at={}, instruction_count={})",
            self.name,
            self.parent
                .as_ref()
                .map_or_else(|| "None".to_owned(), |p| format!("{p:?}")),
            self.forked_at
                .map_or_else(|| "None".to_owned(), |n| n.to_string()),
            self.instruction_count
        )
    }
}

/// A machine's family tree of forks: its oldest ancestor still there and every machine forked
/// from it since.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct Lineage {
    /// The oldest ancestor (the machine itself when it was not forked).
    pub root: String,
    /// Every machine of the tree, parents before their children.
    pub machines: Vec<LineageNode>,
}

#[pymethods]
impl Lineage {
    fn __repr__(&self) -> String {
        format!(
            "Lineage(root={:?}, machines={})",
            self.root,
            self.machines.len()
        )
    }
}

impl From<evervm::Lineage> for Lineage {
    fn from(l: evervm::Lineage) -> Self {
        Self {
            root: l.root,
            machines: l
                .machines
                .into_iter()
                .map(|m| LineageNode {
                    name: m.name,
                    created_at: m.created_at.to_rfc3339(),
                    parent: m.parent,
                    forked_at: m.forked_at,
                    instruction_count: m.instruction_count,
                    checkpoints: m
                        .checkpoints
                        .into_iter()
                        .map(|c| LineageCheckpoint {
                            name: c.name,
                            instruction_count: c.instruction_count,
                        })
                        .collect(),
                    taken_back: m
                        .taken_back
                        .into_iter()
                        .map(|t| TakenBack {
                            first: t.first,
                            last: t.last,
                            by: t.by,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}
