//! The Python tool as a language model sees it: its name, its description and the text of a
//! result. One wording for every door that hands a machine to a model (the Python and Node tool
//! helpers, and the MCP server), so that a model meets the same tool everywhere.

use crate::types::{Execution, RichKind, RichResult};

/// The tool's name.
pub const NAME: &str = "python_repl";

/// What the tool does, written for a model.
pub const DESCRIPTION: &str = "Runs Python code in a persistent, sandboxed interpreter. \
Variables, imports, functions and files persist between calls, so build on earlier results \
instead of recomputing them. Returns what the code printed and the value of its last \
expression; use print() to see intermediate values. numpy, pandas, matplotlib, requests, \
beautifulsoup4 and PyYAML are installed (the standard library only on minimal machines). A \
matplotlib figure comes back as an image: draw it and leave it open or call plt.show(). \
The sandbox has no network access.";

/// What the tool's one argument, `code`, is.
pub const CODE_DESCRIPTION: &str =
    "Python code to run; the value of its last expression is returned.";

/// How many characters of a result's text a model is given at most: the start and the end of a
/// longer one are kept, with a line saying how much was left out.
pub const TEXT_LIMIT: usize = 20_000;

/// The text a model is given for an instruction: its stdout, its stderr, then its error or
/// value, then the text of what it displayed, each figure as a line saying it comes as an image.
pub fn model_text(
    stdout: &str,
    stderr: &str,
    value: Option<&str>,
    error: Option<&str>,
    results: &[RichResult],
) -> String {
    let mut parts: Vec<String> = Vec::new();
    let stdout = stdout.trim_end_matches('\n');
    if !stdout.is_empty() {
        parts.push(stdout.to_owned());
    }
    let stderr = stderr.trim_end_matches('\n');
    if !stderr.is_empty() {
        parts.push(format!("[stderr]\n{stderr}"));
    }
    match (error, value) {
        (Some(error), _) => parts.push(error.trim_end_matches('\n').to_owned()),
        (None, Some(value)) => parts.push(value.to_owned()),
        (None, None) => {}
    }
    let mut figures = 0;
    for rich in results {
        match rich.kind {
            RichKind::Figure => figures += 1,
            RichKind::Display => {
                if let Some(text) = rich.text() {
                    parts.push(text.to_owned());
                }
            }
            // The value's text is the value above.
            RichKind::Value => {}
        }
    }
    match figures {
        0 => {}
        1 => parts.push("[1 figure, attached as an image]".to_owned()),
        n => parts.push(format!("[{n} figures, attached as images]")),
    }
    if parts.is_empty() {
        return "(no output)".to_owned();
    }
    shorten(parts.join("\n"), TEXT_LIMIT)
}

/// `text` if it has at most `limit` characters, else its start and end around a line saying
/// how many characters were left out.
pub(crate) fn shorten(text: String, limit: usize) -> String {
    let count = text.chars().count();
    if count <= limit {
        return text;
    }
    let keep = limit / 2;
    let head: String = text.chars().take(keep).collect();
    let tail: String = text.chars().skip(count - keep).collect();
    format!(
        "{head}\n[... {} characters left out ...]\n{tail}",
        count - 2 * keep
    )
}

impl Execution {
    /// The text a model is given for this instruction ([`model_text`]).
    pub fn model_text(&self) -> String {
        model_text(
            &self.stdout(),
            &self.stderr(),
            self.result.value.as_deref(),
            self.result.error.as_deref(),
            &self.result.results,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rich(kind: RichKind, text: &str) -> RichResult {
        let mut data = serde_json::Map::new();
        data.insert("text/plain".into(), text.into());
        RichResult { kind, data }
    }

    #[test]
    fn output_then_value_then_displays_and_figures() {
        let text = model_text(
            "a\nb\n",
            "warn\n",
            Some("42"),
            None,
            &[
                rich(RichKind::Display, "shown"),
                rich(RichKind::Figure, "<Figure>"),
                rich(RichKind::Figure, "<Figure>"),
                rich(RichKind::Value, "42"),
            ],
        );
        assert_eq!(
            text,
            "a\nb\n[stderr]\nwarn\n42\nshown\n[2 figures, attached as images]"
        );
    }

    #[test]
    fn an_error_replaces_the_value_and_silence_says_so() {
        assert_eq!(
            model_text(
                "",
                "",
                Some("1"),
                Some("Traceback\nZeroDivisionError\n"),
                &[]
            ),
            "Traceback\nZeroDivisionError"
        );
        assert_eq!(model_text("", "", None, None, &[]), "(no output)");
    }

    #[test]
    fn long_text_keeps_its_start_and_end() {
        let long = format!("start{}end", "x".repeat(TEXT_LIMIT * 2));
        let text = model_text(&long, "", None, None, &[]);
        assert!(text.starts_with("start"));
        assert!(text.ends_with("end"));
        assert!(text.contains(&format!(
            "[... {} characters left out ...]",
            long.chars().count() - TEXT_LIMIT
        )));
        assert!(text.chars().count() < TEXT_LIMIT + 100);
    }
}
