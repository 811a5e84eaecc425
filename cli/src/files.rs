//! `evervm cp`, `ls`, `rm`, `mkdir`: a machine's files from the shell. A machine's path is written
//! `MACHINE:PATH` (`PATH` absolute, or relative to the machine's home); anything else is a local
//! path, and `-` is standard input or output.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use evervm::{Client, FileInfo, FileKind, WriteFileOptions};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Args)]
pub(crate) struct CopyArgs {
    /// What to copy: a local path, `-` (standard input) or `MACHINE:PATH`.
    source: String,
    /// Where to: a local path, `-` (standard output) or `MACHINE:PATH`. A path ending in `/`, or
    /// an existing directory, receives the file under its own name.
    destination: String,
    /// Make missing parent directories in the machine.
    #[arg(long, short)]
    parents: bool,
    /// Permission bits of the file written in the machine, in octal (`600`).
    #[arg(long)]
    mode: Option<String>,
}

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    Machine { name: String, path: String },
    Local(PathBuf),
    Std,
}

/// `MACHINE:PATH` when the part before the first `:` is a machine name; `-`; else a local path
/// (write `./a:b` for a local file with a colon).
fn place(text: &str) -> Place {
    if text == "-" {
        return Place::Std;
    }
    if let Some((name, path)) = text.split_once(':')
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        let path = if path.is_empty() { "~" } else { path };
        return Place::Machine {
            name: name.to_owned(),
            path: path.to_owned(),
        };
    }
    Place::Local(PathBuf::from(text))
}

fn parse_mode(text: &str) -> Result<u32> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o7777 => Ok(mode),
        _ => bail!("--mode {text:?} is not a permission mode in octal (such as 600)"),
    }
}

fn file_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "~" && *n != "." && *n != "..")
}

pub(crate) async fn copy(client: &Client, args: CopyArgs) -> Result<()> {
    let options = WriteFileOptions {
        mode: args.mode.as_deref().map(parse_mode).transpose()?,
        make_parents: args.parents,
    };
    match (place(&args.source), place(&args.destination)) {
        (Place::Machine { .. }, Place::Machine { .. }) => {
            bail!("copy between two machines through the local disk: one side must be local")
        }
        (Place::Local(_) | Place::Std, Place::Local(_) | Place::Std) => {
            bail!("neither side is in a machine: write one as MACHINE:PATH")
        }
        (source, Place::Machine { name, path }) => {
            let machine = client.machine(&name);
            let local_name = match &source {
                Place::Local(local) => local.file_name().map(|n| n.to_string_lossy().into_owned()),
                _ => None,
            };
            let path = into_directory(&machine, &path, local_name.as_deref()).await?;
            let info = match source {
                Place::Local(local) => machine
                    .upload(&local, &path, options)
                    .await
                    .with_context(|| format!("copying {} to {name}:{path}", local.display()))?,
                _ => {
                    let stdin = futures::stream::unfold(tokio::io::stdin(), |mut input| async {
                        let mut buffer = bytes::BytesMut::with_capacity(1 << 20);
                        match input.read_buf(&mut buffer).await {
                            Ok(0) => None,
                            Ok(_) => Some((Ok(buffer.freeze()), input)),
                            Err(e) => Some((
                                Err(evervm::Error::new(
                                    evervm::ErrorKind::InvalidInput,
                                    format!("reading standard input: {e}"),
                                )),
                                input,
                            )),
                        }
                    })
                    .boxed();
                    machine
                        .write_file_stream(&path, stdin, None, options)
                        .await
                        .with_context(|| format!("copying standard input to {name}:{path}"))?
                }
            };
            eprintln!("{} bytes -> {name}:{}", info.size, info.path);
        }
        (Place::Machine { name, path }, destination) => {
            let machine = client.machine(&name);
            match destination {
                Place::Local(local) => {
                    let local = if local.is_dir() || args.destination.ends_with('/') {
                        let Some(file) = file_name(&path) else {
                            bail!(
                                "{name}:{path} names no file to copy into {}",
                                local.display()
                            );
                        };
                        local.join(file)
                    } else {
                        local
                    };
                    let info = machine
                        .download(&path, &local)
                        .await
                        .with_context(|| format!("copying {name}:{path} to {}", local.display()))?;
                    eprintln!("{name}:{} -> {} bytes", info.path, info.size);
                }
                _ => {
                    let read = machine
                        .read_file_stream(&path)
                        .await
                        .with_context(|| format!("reading {name}:{path}"))?;
                    let mut out = tokio::io::stdout();
                    let mut data = read.data;
                    while let Some(piece) = data.next().await {
                        out.write_all(&piece.with_context(|| format!("reading {name}:{path}"))?)
                            .await?;
                    }
                    out.flush().await?;
                }
            }
        }
    }
    Ok(())
}

/// Where a file copied into the machine goes: into `path` under its own name when `path` ends
/// in `/` or is a directory there.
async fn into_directory(
    machine: &evervm::Machine,
    path: &str,
    local_name: Option<&str>,
) -> Result<String> {
    let is_directory = path.ends_with('/')
        || path == "~"
        || matches!(machine.stat_file(path).await, Ok(info) if info.kind == FileKind::Directory);
    if !is_directory {
        return Ok(path.to_owned());
    }
    let Some(name) = local_name else {
        bail!("{path} is a directory: name the file to write standard input to");
    };
    Ok(format!("{}/{name}", path.trim_end_matches('/')))
}

#[derive(Args)]
pub(crate) struct ListArgs {
    /// `MACHINE` or `MACHINE:PATH` (default: the machine's home).
    target: String,
    /// Long format: type and mode, size, modification time, name.
    #[arg(long, short)]
    long: bool,
    /// Print the listing as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn list(client: &Client, args: ListArgs) -> Result<()> {
    let (name, path) = match place(&args.target) {
        Place::Machine { name, path } => (name, path),
        _ => (args.target.clone(), "~".to_owned()),
    };
    let listing = client
        .machine(&name)
        .list_files(&path)
        .await
        .with_context(|| format!("listing {name}:{path}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    for entry in &listing.entries {
        if args.long {
            println!("{}", long_line(entry));
        } else if entry.kind == FileKind::Directory {
            println!("{}/", entry.name);
        } else {
            println!("{}", entry.name);
        }
    }
    if listing.truncated {
        eprintln!(
            "(only the first {} entries are listed)",
            listing.entries.len()
        );
    }
    Ok(())
}

fn long_line(entry: &FileInfo) -> String {
    let kind = match entry.kind {
        FileKind::File => '-',
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::Other => '?',
    };
    let modified = entry.modified_at.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M").to_string(),
    );
    format!(
        "{kind}{:04o} {:>12} {modified} {}",
        entry.mode, entry.size, entry.name
    )
}

#[derive(Args)]
pub(crate) struct RemoveArgs {
    /// `MACHINE:PATH`.
    target: String,
    /// Remove a directory and everything in it.
    #[arg(long, short)]
    recursive: bool,
}

pub(crate) async fn remove(client: &Client, args: RemoveArgs) -> Result<()> {
    let Place::Machine { name, path } = place(&args.target) else {
        bail!("{:?} is not MACHINE:PATH", args.target);
    };
    client
        .machine(&name)
        .remove_file(&path, args.recursive)
        .await
        .with_context(|| format!("removing {name}:{path}"))?;
    Ok(())
}

#[derive(Args)]
pub(crate) struct MakeDirArgs {
    /// `MACHINE:PATH`.
    target: String,
    /// Make missing parents too; an existing directory is no error.
    #[arg(long, short)]
    parents: bool,
}

pub(crate) async fn make_dir(client: &Client, args: MakeDirArgs) -> Result<()> {
    let Place::Machine { name, path } = place(&args.target) else {
        bail!("{:?} is not MACHINE:PATH", args.target);
    };
    client
        .machine(&name)
        .make_dir(&path, args.parents)
        .await
        .with_context(|| format!("making {name}:{path}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_read_as_written() {
        assert_eq!(
            place("m-1:/tmp/a.csv"),
            Place::Machine {
                name: "m-1".into(),
                path: "/tmp/a.csv".into()
            }
        );
        assert_eq!(
            place("m:"),
            Place::Machine {
                name: "m".into(),
                path: "~".into()
            }
        );
        assert_eq!(place("./a:b"), Place::Local("./a:b".into()));
        assert_eq!(place("data.csv"), Place::Local("data.csv".into()));
        assert_eq!(place("-"), Place::Std);
        assert_eq!(file_name("/tmp/x/"), Some("x"));
        assert_eq!(file_name("~"), None);
        assert_eq!(parse_mode("0o640").unwrap(), 0o640);
        assert!(parse_mode("8").is_err());
    }
}
