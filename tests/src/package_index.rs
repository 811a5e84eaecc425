//! A package index for tests and benchmarks: PEP 691 pages and wheel files served over HTTP
//! by a thread, and wheels made on the spot.
// Test support: a failed set-up should stop the test at once.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

/// What an index serves: paths to bodies.
#[derive(Default, Clone)]
pub struct Routes(HashMap<String, Vec<u8>>);

/// A file of a project: its name, bytes, and the sha256 its page lists (`None`: the real one).
pub type ProjectFile = (String, Vec<u8>, Option<String>);

/// A wheel: its file name and bytes, made from `files` (path in the archive, contents) plus the
/// dist-info this needs.
pub fn wheel(
    name: &str,
    version: &str,
    tag: &str,
    requires: &[&str],
    files: &[(&str, Vec<u8>)],
) -> (String, Vec<u8>) {
    let dist = name.replace('-', "_");
    let dist_info = format!("{dist}-{version}.dist-info");
    let mut metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    for requirement in requires {
        writeln!(metadata, "Requires-Dist: {requirement}").unwrap();
    }
    let wheel_file = format!(
        "Wheel-Version: 1.0\nGenerator: evervm-tests\nRoot-Is-Purelib: {}\nTag: {tag}\n",
        tag.ends_with("-any")
    );
    let mut entries: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(path, data)| ((*path).to_owned(), data.clone()))
        .collect();
    entries.push((format!("{dist_info}/METADATA"), metadata.into_bytes()));
    entries.push((format!("{dist_info}/WHEEL"), wheel_file.into_bytes()));
    let mut record = String::new();
    for (path, _) in &entries {
        writeln!(record, "{path},,").unwrap();
    }
    writeln!(record, "{dist_info}/RECORD,,").unwrap();
    entries.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (path, data) in entries {
        out.start_file(path, options).unwrap();
        out.write_all(&data).unwrap();
    }
    let bytes = out.finish().unwrap().into_inner();
    (format!("{dist}-{version}-{tag}.whl"), bytes)
}

/// A package index: PEP 691 pages and files, from a map of paths to bodies, served on
/// `listener` by a thread (for the life of the test binary). Counts requests, so that a test can
/// see the engine's wheel cache at work.
pub struct Index {
    pub url: String,
    requests: Arc<AtomicUsize>,
}

pub fn serve(listener: std::net::TcpListener, routes: Routes, host: &str) -> Index {
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let routes = Arc::new(routes);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            let routes = Arc::clone(&routes);
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    if stream.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (status, body) = match routes.0.get(&path) {
                    Some(body) => ("200 OK", body.clone()),
                    None => ("404 Not Found", b"not found".to_vec()),
                };
                let kind = if path.starts_with("/files/") {
                    "application/octet-stream"
                } else {
                    "application/vnd.pypi.simple.v1+json"
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: {kind}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
                let _ = stream.write_all(&body);
            });
        }
    });
    Index {
        url: format!("http://{host}:{port}/simple/"),
        requests,
    }
}

/// Adds a project to the index's routes: its page lists `files` (name, bytes, listed sha256 or
/// the real one).
pub fn project(routes: &mut Routes, name: &str, files: Vec<ProjectFile>) {
    let mut listed = Vec::new();
    for (file_name, bytes, sha256) in files {
        let sha256 = sha256.unwrap_or_else(|| hex::encode(Sha256::digest(&bytes)));
        listed.push(serde_json::json!({
            "filename": file_name,
            "url": format!("../../files/{file_name}"),
            "hashes": {"sha256": sha256},
            "requires-python": ">=3.8",
        }));
        routes.0.insert(format!("/files/{file_name}"), bytes);
    }
    let page = serde_json::json!({"meta": {"api-version": "1.1"}, "name": name, "files": listed});
    routes.0.insert(
        format!("/simple/{name}/"),
        serde_json::to_vec(&page).unwrap(),
    );
}

impl Index {
    /// How many requests the index has answered.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Routes for every wheel in `dir`, one project page per distribution.
pub fn routes_for_wheels(dir: &std::path::Path) -> std::io::Result<Routes> {
    let mut by_project: HashMap<String, Vec<ProjectFile>> = HashMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".whl") else {
            continue;
        };
        let project = stem
            .split('-')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase()
            .replace(['_', '.'], "-");
        let bytes = std::fs::read(&path)?;
        by_project
            .entry(project)
            .or_default()
            .push((name, bytes, None));
    }
    let mut routes = Routes::default();
    for (name, files) in by_project {
        project(&mut routes, &name, files);
    }
    Ok(routes)
}
