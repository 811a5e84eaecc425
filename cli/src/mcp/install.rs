//! `evervm mcp install --claude-desktop|--claude-code|--cursor|--vscode|--windsurf|--goose`:
//! the entry that starts `evervm mcp`, written into each assistant's own configuration file.
//!
//! The file is edited, not rewritten from what was understood of it: other keys keep their
//! order and their text (JSON), other lines and comments stay as they were (Goose's YAML). A file
//! that changes is copied to a backup first and replaced durably (a temporary file, fsync,
//! rename); one that already has the same entry is left alone.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{ArgGroup, Args};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::StdioTarget;

/// The name the server is known by in every configuration.
const SERVER_NAME: &str = "evervm";

#[derive(Args, Debug, Default)]
#[command(group(ArgGroup::new("assistant").required(true).multiple(true)))]
pub struct InstallArgs {
    /// Claude Desktop (claude_desktop_config.json).
    #[arg(long, group = "assistant")]
    pub claude_desktop: bool,
    /// Claude Code, for every project of this user (~/.claude.json).
    #[arg(long, group = "assistant")]
    pub claude_code: bool,
    /// Cursor (~/.cursor/mcp.json).
    #[arg(long, group = "assistant")]
    pub cursor: bool,
    /// VS Code, the user's mcp.json.
    #[arg(long, group = "assistant")]
    pub vscode: bool,
    /// Windsurf (~/.codeium/windsurf/mcp_config.json).
    #[arg(long, group = "assistant")]
    pub windsurf: bool,
    /// Goose (~/.config/goose/config.yaml).
    #[arg(long, group = "assistant")]
    pub goose: bool,
    /// Print each entry and the file it belongs in; write nothing.
    #[arg(long)]
    pub print: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Assistant {
    ClaudeDesktop,
    ClaudeCode,
    Cursor,
    VsCode,
    Windsurf,
    Goose,
}

/// How an assistant's file holds its servers.
enum Format {
    /// A JSON object under `key`, the entry with `"type": "stdio"` when `typed`.
    Json { key: &'static str, typed: bool },
    /// Goose's YAML: a mapping under `extensions`.
    GooseYaml,
}

impl Assistant {
    fn chosen(args: &InstallArgs) -> Vec<Assistant> {
        [
            (args.claude_desktop, Assistant::ClaudeDesktop),
            (args.claude_code, Assistant::ClaudeCode),
            (args.cursor, Assistant::Cursor),
            (args.vscode, Assistant::VsCode),
            (args.windsurf, Assistant::Windsurf),
            (args.goose, Assistant::Goose),
        ]
        .into_iter()
        .filter_map(|(chosen, assistant)| chosen.then_some(assistant))
        .collect()
    }

    fn label(self) -> &'static str {
        match self {
            Assistant::ClaudeDesktop => "Claude Desktop",
            Assistant::ClaudeCode => "Claude Code",
            Assistant::Cursor => "Cursor",
            Assistant::VsCode => "VS Code",
            Assistant::Windsurf => "Windsurf",
            Assistant::Goose => "Goose",
        }
    }

    fn format(self) -> Format {
        match self {
            Assistant::ClaudeDesktop | Assistant::Cursor | Assistant::Windsurf => Format::Json {
                key: "mcpServers",
                typed: false,
            },
            Assistant::ClaudeCode => Format::Json {
                key: "mcpServers",
                typed: true,
            },
            Assistant::VsCode => Format::Json {
                key: "servers",
                typed: true,
            },
            Assistant::Goose => Format::GooseYaml,
        }
    }

    /// The user-level configuration file, on Linux and macOS.
    fn path(self, env: &Environment) -> PathBuf {
        let home = &env.home;
        let config = env
            .xdg_config
            .clone()
            .unwrap_or_else(|| home.join(".config"));
        let app_support = home.join("Library/Application Support");
        match self {
            Assistant::ClaudeDesktop if env.macos => {
                app_support.join("Claude/claude_desktop_config.json")
            }
            Assistant::ClaudeDesktop => config.join("Claude/claude_desktop_config.json"),
            Assistant::ClaudeCode => env
                .claude_config_dir
                .clone()
                .unwrap_or_else(|| home.clone())
                .join(".claude.json"),
            Assistant::Cursor => home.join(".cursor/mcp.json"),
            Assistant::VsCode if env.macos => app_support.join("Code/User/mcp.json"),
            Assistant::VsCode => config.join("Code/User/mcp.json"),
            Assistant::Windsurf => home.join(".codeium/windsurf/mcp_config.json"),
            Assistant::Goose => config.join("goose/config.yaml"),
        }
    }

    /// What the user does for the assistant to see the change.
    fn next_step(self) -> &'static str {
        match self {
            Assistant::ClaudeDesktop => "quit Claude Desktop completely and start it again",
            Assistant::ClaudeCode => "start a new Claude Code session (`/mcp` shows the server)",
            Assistant::Cursor => "reload Cursor (Settings, then MCP, shows the server)",
            Assistant::VsCode => "VS Code reads it at once (`MCP: List Servers` shows it)",
            Assistant::Windsurf => "press refresh in the MCP panel of Windsurf's Cascade",
            Assistant::Goose => "start a new Goose session",
        }
    }
}

/// Where the files are: from the environment, so that tests can point it elsewhere.
struct Environment {
    home: PathBuf,
    xdg_config: Option<PathBuf>,
    claude_config_dir: Option<PathBuf>,
    macos: bool,
}

impl Environment {
    fn current() -> Result<Self> {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let Some(home) = var("HOME") else {
            bail!("HOME is not set: it says where the assistants' configuration files are");
        };
        Ok(Self {
            home,
            xdg_config: var("XDG_CONFIG_HOME"),
            claude_config_dir: var("CLAUDE_CONFIG_DIR"),
            macos: cfg!(target_os = "macos"),
        })
    }
}

/// The command an assistant runs: this very binary, by its absolute path (an assistant started
/// from a desktop does not have the shell's `PATH`), with where its tools act.
struct Launch {
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Launch {
    fn for_target(target: &StdioTarget) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot tell where this evervm binary is")?;
        let exe = exe.canonicalize().unwrap_or(exe);
        let Some(command) = exe.to_str().map(str::to_owned) else {
            bail!("the path of this binary, {}, is not UTF-8", exe.display());
        };
        let mut args = vec!["mcp".to_owned()];
        let mut env = Vec::new();
        match (&target.url, &target.token) {
            (Some(url), Some(token)) => {
                env.push(("EVERVM_URL".to_owned(), url.clone()));
                env.push(("EVERVM_TOKEN".to_owned(), token.clone()));
                if let Some(ca_file) = &target.ca_file {
                    let ca_file = ca_file.canonicalize().unwrap_or_else(|_| ca_file.clone());
                    let Some(ca_file) = ca_file.to_str() else {
                        bail!("the CA file's path, {}, is not UTF-8", ca_file.display());
                    };
                    env.push((evervm::CA_FILE_ENV.to_owned(), ca_file.to_owned()));
                }
            }
            (Some(_), None) => bail!(
                "--url (or EVERVM_URL) is given without a token: pass --token or set EVERVM_TOKEN"
            ),
            (None, _) => {
                if let Some(home) = &target.home {
                    let home = home.canonicalize().unwrap_or_else(|_| home.clone());
                    let Some(home) = home.to_str() else {
                        bail!("the home {} is not UTF-8", home.display());
                    };
                    args.extend(["--home".to_owned(), home.to_owned()]);
                }
                if let Some(backend) = &target.backend {
                    args.extend(["--backend".to_owned(), backend.clone()]);
                }
            }
        }
        Ok(Self { command, args, env })
    }

    fn json(&self, typed: bool) -> Value {
        let mut entry = serde_json::Map::new();
        if typed {
            entry.insert("type".into(), "stdio".into());
        }
        entry.insert("command".into(), self.command.clone().into());
        entry.insert("args".into(), self.args.clone().into());
        if !self.env.is_empty() {
            let env = self
                .env
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.clone())))
                .collect();
            entry.insert("env".into(), Value::Object(env));
        }
        Value::Object(entry)
    }

    /// Goose's entry, its lines indented by `indent` spaces (its key) and `indent + 2`.
    fn goose_yaml(&self, indent: usize) -> String {
        let quote = |s: &str| Value::from(s).to_string();
        let key = " ".repeat(indent);
        let field = " ".repeat(indent + 2);
        let mut text = format!("{key}{SERVER_NAME}:\n");
        let mut line = |l: String| {
            text.push_str(&field);
            text.push_str(&l);
            text.push('\n');
        };
        line("enabled: true".into());
        line("type: stdio".into());
        line(format!("name: {SERVER_NAME}"));
        line(format!(
            "description: {}",
            quote("Persistent Python REPLs in sandboxes (evervm)")
        ));
        line(format!("cmd: {}", quote(&self.command)));
        line("args:".into());
        for arg in &self.args {
            line(format!("- {}", quote(arg)));
        }
        if self.env.is_empty() {
            line("envs: {}".into());
        } else {
            line("envs:".into());
            for (k, v) in &self.env {
                line(format!("  {}: {}", quote(k), quote(v)));
            }
        }
        line("env_keys: []".into());
        line("timeout: 300".into());
        line("bundled: null".into());
        line("available_tools: []".into());
        text
    }
}

pub fn install(args: &InstallArgs, target: &StdioTarget) -> Result<()> {
    let env = Environment::current()?;
    let launch = Launch::for_target(target)?;
    if !launch.env.is_empty() && !args.print {
        eprintln!(
            "note: the token is written into each configuration file (EVERVM_TOKEN in the \
             entry's environment); those files are yours to keep private"
        );
    }
    for assistant in Assistant::chosen(args) {
        let path = assistant.path(&env);
        if args.print {
            println!("# {} ({})", assistant.label(), path.display());
            match assistant.format() {
                Format::Json { key, typed } => {
                    let entry = serde_json::json!({ key: { SERVER_NAME: launch.json(typed) } });
                    println!("{}", serde_json::to_string_pretty(&entry)?);
                }
                Format::GooseYaml => print!("extensions:\n{}", launch.goose_yaml(2)),
            }
            continue;
        }
        let existing = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let edited = match assistant.format() {
            Format::Json { key, typed } => {
                json_with_entry(existing.as_deref(), key, &launch.json(typed))
            }
            Format::GooseYaml => goose_with_entry(existing.as_deref(), &launch),
        }
        .with_context(|| {
            format!(
                "{} ({}): nothing was written; `evervm mcp install --print` shows the entry to \
                 add by hand",
                assistant.label(),
                path.display()
            )
        })?;
        let Some(text) = edited else {
            println!(
                "{}: {} already has this evervm entry; nothing changed",
                assistant.label(),
                path.display()
            );
            continue;
        };
        let backup = match &existing {
            Some(_) => Some(back_up(&path)?),
            None => None,
        };
        write_durably(&path, &text)?;
        match backup {
            Some(backup) => println!(
                "{}: added evervm to {} (the previous file is in {}); {}",
                assistant.label(),
                path.display(),
                backup.display(),
                assistant.next_step()
            ),
            None => println!(
                "{}: wrote {} with evervm in it; {}",
                assistant.label(),
                path.display(),
                assistant.next_step()
            ),
        }
    }
    Ok(())
}

/// A copy of `path` beside it, named with the time: `mcp.json.evervm-backup-20261202T101500`.
fn back_up(path: &Path) -> Result<PathBuf> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3f");
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".evervm-backup-{stamp}"));
    let backup = path.with_file_name(name);
    std::fs::copy(path, &backup).with_context(|| {
        format!(
            "cannot back {} up to {}: nothing was changed",
            path.display(),
            backup.display()
        )
    })?;
    Ok(backup)
}

/// Replaces `path` with `text` so that it is either the old file or the whole new one: a
/// temporary file beside it (with the old file's permissions), fsync, rename, fsync of the
/// directory.
fn write_durably(path: &Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut temporary = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    if let Ok(old) = std::fs::metadata(path) {
        temporary
            .as_file()
            .set_permissions(old.permissions())
            .with_context(|| format!("cannot give the new {} its permissions", path.display()))?;
    }
    temporary.write_all(text.as_bytes())?;
    temporary.as_file().sync_all()?;
    temporary
        .persist(path)
        .with_context(|| format!("cannot replace {}", path.display()))?;
    if let Ok(dir) = std::fs::File::open(dir) {
        dir.sync_all()
            .with_context(|| format!("cannot sync {}", dir_name(path)))?;
    }
    Ok(())
}

fn dir_name(path: &Path) -> String {
    path.parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default()
}

/// A JSON object with its keys in their order and each value as it was written.
struct Ordered(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                    entries.push(entry);
                }
                Ok(Ordered(entries))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

impl Ordered {
    fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    fn set(&mut self, key: &str, value: Box<RawValue>) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, slot)) => *slot = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }

    /// The object written with one key per line at `depth` (two spaces a level), each value
    /// as it was.
    fn render(&self, depth: usize) -> String {
        if self.0.is_empty() {
            return "{}".to_owned();
        }
        let inner = "  ".repeat(depth + 1);
        let entries: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{inner}{}: {}", Value::from(k.as_str()), v.get()))
            .collect();
        format!("{{\n{}\n{}}}", entries.join(",\n"), "  ".repeat(depth))
    }
}

/// `value` as JSON text laid out for `depth` (the lines after the first indented to it).
fn raw_at(value: &Value, depth: usize) -> Result<Box<RawValue>> {
    let pretty = serde_json::to_string_pretty(value)?;
    let indented = pretty.replace('\n', &format!("\n{}", "  ".repeat(depth)));
    Ok(RawValue::from_string(indented)?)
}

/// The JSON file's text with `entry` as `SERVER_NAME` under `key`; `None` when it is there
/// already.
fn json_with_entry(existing: Option<&str>, key: &str, entry: &Value) -> Result<Option<String>> {
    let mut top = match existing.filter(|t| !t.trim().is_empty()) {
        None => Ordered(Vec::new()),
        Some(text) => serde_json::from_str::<Ordered>(text).context(
            "the file is not a plain JSON object (a comment or a trailing comma is enough to \
             make it JSONC, which this command does not rewrite)",
        )?,
    };
    let mut servers = match top.get(key) {
        None => Ordered(Vec::new()),
        Some(raw) => serde_json::from_str::<Ordered>(raw.get())
            .with_context(|| format!("its {key:?} is not a JSON object"))?,
    };
    if let Some(current) = servers.get(SERVER_NAME)
        && serde_json::from_str::<Value>(current.get()).ok().as_ref() == Some(entry)
    {
        return Ok(None);
    }
    servers.set(SERVER_NAME, raw_at(entry, 2)?);
    top.set(key, RawValue::from_string(servers.render(1))?);
    let text = format!("{}\n", top.render(0));
    // What was written must read back as what was meant.
    let check: Value = serde_json::from_str(&text)?;
    if check.get(key).and_then(|s| s.get(SERVER_NAME)) != Some(entry) {
        bail!("the edited file does not read back with the entry in it");
    }
    Ok(Some(text))
}

/// Goose's YAML with the entry under `extensions`, every other line as it was; `None` when the
/// entry is there already.
fn goose_with_entry(existing: Option<&str>, launch: &Launch) -> Result<Option<String>> {
    use yaml_rust2::{Yaml, YamlLoader};
    let parse = |text: &str| -> Result<Yaml> {
        let docs = YamlLoader::load_from_str(text).context("the file is not YAML")?;
        Ok(docs.into_iter().next().unwrap_or(Yaml::Null))
    };
    let wanted = parse(&launch.goose_yaml(0))?;
    let wanted = wanted[SERVER_NAME].clone();
    let existing = existing.unwrap_or_default();
    let before = parse(existing)?;
    if !matches!(before, Yaml::Hash(_) | Yaml::Null) {
        bail!("the file is not a YAML mapping");
    }
    if before["extensions"][SERVER_NAME] == wanted {
        return Ok(None);
    }
    let lines: Vec<&str> = existing.lines().collect();
    let is_content = |line: &str| {
        let trimmed = line.trim_start();
        !trimmed.is_empty() && !trimmed.starts_with('#')
    };
    let indent_of = |line: &str| line.len() - line.trim_start().len();
    let top_level = lines
        .iter()
        .position(|l| l.starts_with("extensions:") || l.starts_with("\"extensions\":"));
    let mut out: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    match top_level {
        None => {
            if out.last().is_some_and(|l| !l.trim().is_empty()) {
                out.push(String::new());
            }
            out.push("extensions:".to_owned());
            out.extend(launch.goose_yaml(2).lines().map(str::to_owned));
        }
        Some(at) => {
            let rest = lines[at].split_once(':').map_or("", |(_, r)| r.trim());
            let rest = rest.split(" #").next().unwrap_or("").trim();
            match rest {
                "" | "#" => {}
                "{}" | "null" | "~" => "extensions:".clone_into(&mut out[at]),
                _ => bail!("its `extensions` is written inline; write it as a block first"),
            }
            // The block: the lines after `extensions:` up to the next top-level key.
            let end = (at + 1..lines.len())
                .find(|&i| is_content(lines[i]) && indent_of(lines[i]) == 0)
                .unwrap_or(lines.len());
            let child = (at + 1..end)
                .find(|&i| is_content(lines[i]))
                .map(|i| indent_of(lines[i]))
                .filter(|&i| i > 0)
                .unwrap_or(2);
            let block = launch.goose_yaml(child);
            let ours = (at + 1..end).find(|&i| {
                indent_of(lines[i]) == child
                    && matches!(
                        lines[i].trim().trim_end_matches(':'),
                        s if s == SERVER_NAME || s == format!("\"{SERVER_NAME}\"")
                    )
            });
            match ours {
                Some(start) => {
                    let stop = (start + 1..end)
                        .find(|&i| is_content(lines[i]) && indent_of(lines[i]) <= child)
                        .unwrap_or(end);
                    out.splice(start..stop, block.lines().map(str::to_owned));
                }
                None => {
                    // After the block's last line of content.
                    let last = (at..end)
                        .rev()
                        .find(|&i| is_content(lines[i]))
                        .unwrap_or(at);
                    let at_end = last + 1;
                    out.splice(at_end..at_end, block.lines().map(str::to_owned));
                }
            }
        }
    }
    let text = format!("{}\n", out.join("\n"));
    // The edit must leave every other setting as it was and put exactly our entry in.
    let after = parse(&text)?;
    if after["extensions"][SERVER_NAME] != wanted {
        bail!("the edited file does not read back with the entry in it");
    }
    let without_ours = |doc: &Yaml| -> Yaml {
        let mut doc = doc.clone();
        if let Yaml::Hash(top) = &mut doc
            && let Some(Yaml::Hash(extensions)) =
                top.get_mut(&Yaml::String("extensions".to_owned()))
        {
            extensions.remove(&Yaml::String(SERVER_NAME.to_owned()));
        }
        doc
    };
    let unchanged = |before: &Yaml, after: &Yaml| {
        let (Yaml::Hash(before), Yaml::Hash(after)) = (before, after) else {
            return matches!(before, Yaml::Null);
        };
        before.iter().all(|(k, v)| match after.get(k) {
            Some(w) if k.as_str() == Some("extensions") => match (v, w) {
                (Yaml::Hash(v), Yaml::Hash(w)) => v.iter().all(|(k, v)| w.get(k) == Some(v)),
                (Yaml::Null, _) => true,
                _ => false,
            },
            Some(w) => w == v,
            None => false,
        })
    };
    if !unchanged(&without_ours(&before), &without_ours(&after)) {
        bail!("the edit would change other settings");
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            command: "/opt/evervm/bin/evervm".to_owned(),
            args: vec!["mcp".to_owned()],
            env: Vec::new(),
        }
    }

    #[test]
    fn json_keeps_other_keys_in_order_and_as_written() {
        let existing = "{\n  \"numStartups\": 3,\n  \"projects\": {\"/a\": {\"x\": [1, 2]}},\n  \
                        \"mcpServers\": {\n    \"other\": {\"command\": \"o\"}\n  },\n  \
                        \"zeta\": true\n}\n";
        let entry = launch().json(true);
        let Some(text) = json_with_entry(Some(existing), "mcpServers", &entry).unwrap() else {
            panic!("the entry is new");
        };
        let keys: Vec<usize> = ["numStartups", "projects", "mcpServers", "zeta"]
            .iter()
            .map(|k| text.find(&format!("\"{k}\"")).unwrap_or(usize::MAX))
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(text.contains("{\"/a\": {\"x\": [1, 2]}}"), "{text}");
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["mcpServers"]["other"]["command"], "o");
        assert_eq!(value["mcpServers"]["evervm"], entry);
        assert_eq!(value["mcpServers"]["evervm"]["type"], "stdio");
        // Again: nothing to do.
        assert_eq!(
            json_with_entry(Some(&text), "mcpServers", &entry).unwrap(),
            None
        );
        // A changed entry replaces the old one in place.
        let mut moved = launch();
        moved.command = "/usr/local/bin/evervm".to_owned();
        let again = json_with_entry(Some(&text), "mcpServers", &moved.json(true))
            .unwrap()
            .unwrap();
        let value: Value = serde_json::from_str(&again).unwrap();
        assert_eq!(
            value["mcpServers"]["evervm"]["command"],
            "/usr/local/bin/evervm"
        );
        assert_eq!(again.matches("\"evervm\"").count(), 1);
    }

    #[test]
    fn json_files_are_made_and_jsonc_is_refused() {
        let entry = launch().json(false);
        for empty in [None, Some(""), Some("  \n")] {
            let text = json_with_entry(empty, "servers", &entry).unwrap().unwrap();
            let value: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(value["servers"]["evervm"], entry);
        }
        let jsonc = "{\n  // mine\n  \"servers\": {}\n}\n";
        let error = json_with_entry(Some(jsonc), "servers", &entry).unwrap_err();
        assert!(format!("{error:#}").contains("JSONC"), "{error:#}");
        let error = json_with_entry(Some("[1]"), "servers", &entry).unwrap_err();
        assert!(format!("{error:#}").contains("not a plain JSON object"));
        let error = json_with_entry(Some("{\"servers\": 3}"), "servers", &entry).unwrap_err();
        assert!(format!("{error:#}").contains("not a JSON object"));
    }

    #[test]
    fn goose_keeps_comments_and_other_extensions() {
        let existing = "# my goose\nGOOSE_PROVIDER: anthropic\nextensions:\n    developer:\n        \
                        enabled: true   # keep\n        type: builtin\n        name: developer\n\
                        GOOSE_MODEL: claude\n";
        let text = goose_with_entry(Some(existing), &launch())
            .unwrap()
            .unwrap();
        assert!(text.starts_with("# my goose\nGOOSE_PROVIDER: anthropic\nextensions:\n"));
        assert!(text.contains("enabled: true   # keep"));
        assert!(
            text.contains("\n    evervm:\n      enabled: true\n"),
            "{text}"
        );
        assert!(text.ends_with("GOOSE_MODEL: claude\n"), "{text}");
        // Again: nothing to do.
        assert_eq!(goose_with_entry(Some(&text), &launch()).unwrap(), None);
        // A changed entry replaces the old one, not the neighbours.
        let mut moved = launch();
        moved.env = vec![("EVERVM_URL".to_owned(), "http://h:1".to_owned())];
        let again = goose_with_entry(Some(&text), &moved).unwrap().unwrap();
        assert_eq!(again.matches("evervm:").count(), 1, "{again}");
        assert!(again.contains("EVERVM_URL"));
        assert!(again.contains("name: developer\n    evervm:\n"), "{again}");
        assert!(
            again.ends_with("available_tools: []\nGOOSE_MODEL: claude\n"),
            "{again}"
        );
    }

    #[test]
    fn goose_files_without_extensions_get_them() {
        for existing in [
            None,
            Some(""),
            Some("GOOSE_MODEL: x\n"),
            Some("extensions: {}\n"),
        ] {
            let text = goose_with_entry(existing, &launch()).unwrap().unwrap();
            let doc = yaml_rust2::YamlLoader::load_from_str(&text).unwrap();
            let entry = &doc[0]["extensions"]["evervm"];
            assert_eq!(
                entry["cmd"].as_str(),
                Some("/opt/evervm/bin/evervm"),
                "{text}"
            );
            assert_eq!(entry["args"][0].as_str(), Some("mcp"));
            assert_eq!(entry["type"].as_str(), Some("stdio"));
            assert_eq!(entry["enabled"].as_bool(), Some(true));
        }
        let error = goose_with_entry(Some("extensions: {a: 1}\n"), &launch()).unwrap_err();
        assert!(format!("{error:#}").contains("inline"), "{error:#}");
        let error = goose_with_entry(Some("- a\n- b\n"), &launch()).unwrap_err();
        assert!(format!("{error:#}").contains("not a YAML mapping"));
    }
}
