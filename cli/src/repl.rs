//! `evervm repl`: line editing, multi-line blocks, output as it comes, Ctrl-C interrupts.

use std::time::Duration;

use anyhow::Result;
use evervm::{Client, ExecOptions};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

/// Whether `source` needs more lines before it can run, like Python's interactive prompt: an
/// open bracket or string, a trailing backslash, or a block whose header ends with `:` (which
/// then ends at an empty line).
pub(crate) fn needs_more(source: &str) -> bool {
    let mut depth = 0i32;
    let mut chars = source.chars().peekable();
    let mut in_string: Option<(char, bool)> = None;
    while let Some(c) = chars.next() {
        match in_string {
            Some((quote, triple)) => {
                if c == '\\' {
                    chars.next();
                } else if c == quote {
                    if triple {
                        if chars.peek() == Some(&quote) {
                            chars.next();
                            if chars.peek() == Some(&quote) {
                                chars.next();
                                in_string = None;
                            }
                        }
                    } else {
                        in_string = None;
                    }
                } else if c == '\n' && !triple {
                    in_string = None;
                }
            }
            None => match c {
                '#' => {
                    while chars.peek().is_some_and(|c| *c != '\n') {
                        chars.next();
                    }
                }
                '\'' | '"' => {
                    let mut lookahead = chars.clone();
                    if lookahead.next() == Some(c) && lookahead.next() == Some(c) {
                        chars.next();
                        chars.next();
                        in_string = Some((c, true));
                    } else {
                        in_string = Some((c, false));
                    }
                }
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            },
        }
    }
    if depth > 0 || matches!(in_string, Some((_, true))) {
        return true;
    }
    let trimmed = source.trim_end_matches([' ', '\t']);
    if trimmed.ends_with('\\') {
        return true;
    }
    let opens_block = source
        .lines()
        .any(|line| strip_comment(line).trim_end().ends_with(':'));
    // A block runs once an empty line follows it.
    opens_block && !source.ends_with('\n')
}

fn strip_comment(line: &str) -> &str {
    match line.find('#') {
        Some(i) => &line[..i],
        None => line,
    }
}

pub(crate) async fn run(client: Client, machine: Option<String>, timeout: Duration) -> Result<()> {
    let mut session = match machine {
        Some(name) => client.machine(&name).connect().await?,
        None => client.connect_new().await?,
    };
    let name = session.machine_name().to_owned();
    let handle = client.machine(&name);
    eprintln!(
        "evervm REPL on machine {name} ({}). Blocks end with an empty line; Ctrl-C interrupts, Ctrl-D exits.",
        client.describe()
    );
    let mut editor = DefaultEditor::new()?;
    let options = ExecOptions {
        timeout,
        interrupt: false,
        ..ExecOptions::default()
    };
    loop {
        let mut source = String::new();
        let mut prompt = ">>> ";
        loop {
            match editor.readline(prompt) {
                Ok(line) => {
                    if !source.is_empty() {
                        source.push('\n');
                    }
                    source.push_str(&line);
                    if !needs_more(&source) || (line.trim().is_empty() && source.trim().is_empty())
                    {
                        break;
                    }
                    prompt = "... ";
                }
                Err(ReadlineError::Interrupted) => {
                    source.clear();
                    break;
                }
                Err(ReadlineError::Eof) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        if source.trim().is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(source.as_str());
        let execution = {
            let run = session.exec(&source, &options, crate::print_chunk);
            tokio::pin!(run);
            loop {
                tokio::select! {
                    result = &mut run => break result,
                    _ = tokio::signal::ctrl_c() => {
                        if let Err(e) = handle.interrupt().await {
                            eprintln!("could not interrupt: {e}");
                        }
                    }
                }
            }
        };
        match execution {
            Ok(execution) => {
                let results = execution.result.results.iter();
                for rich in results.filter(|r| r.kind != evervm::RichKind::Value) {
                    crate::print_rich(rich);
                }
                if let Some(value) = &execution.result.value {
                    println!("{value}");
                }
                if let Some(error) = &execution.result.error {
                    eprint!("{error}");
                    if !error.ends_with('\n') {
                        eprintln!();
                    }
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                if e.kind() == evervm::ErrorKind::Transport {
                    return Err(e.into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::needs_more;

    #[test]
    fn knows_when_a_block_is_complete() {
        assert!(!needs_more("1 + 1"));
        assert!(!needs_more("x = {'a': 1}"));
        assert!(needs_more("def f():"));
        assert!(needs_more("def f():\n    return 1"));
        assert!(!needs_more("def f():\n    return 1\n"));
        assert!(needs_more("x = [1,"));
        assert!(!needs_more("x = [1,\n2]"));
        assert!(needs_more("s = '''abc"));
        assert!(!needs_more("s = '''abc\n'''"));
        assert!(!needs_more("d = {'a:': 1}  # x:"));
        assert!(needs_more("x = 1 + \\"));
    }
}
