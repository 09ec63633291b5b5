//! The server's log as an operator ships it: written to a file it holds no terminal escapes,
//! `--log-format json` writes one parseable object a line, and every request's line names its
//! endpoint and HTTP status.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn smollm2() -> PathBuf {
    static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
    let files = spindle_hub::resolve(
        "smollm2-135m",
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    match files {
        spindle_hub::ModelFiles::Gguf(p) => p,
        other => panic!("unexpected {other:?}"),
    }
}

/// The name the server gives a model served from a path: the file's stem.
fn model_id() -> String {
    smollm2().file_stem().unwrap().to_str().unwrap().to_string()
}

/// A `spindle serve` whose standard error goes to a file, as under a service manager.
struct LoggedServer {
    child: Child,
    log: PathBuf,
    address: String,
    _dir: tempfile::TempDir,
}

impl LoggedServer {
    fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["serve", "--model"])
            .arg(smollm2())
            .args(["--port", "0", "--kv-cache-memory", "64MiB", "--batch-dir"])
            .arg(dir.path().join("batches"))
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let address = wait_for_address(&mut child, &log);
        Self { child, log, address, _dir: dir }
    }

    /// Sends one request and returns the response's status line and body.
    fn post(&self, path: &str, body: &str) -> String {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    /// Stops the server and returns its whole log.
    fn stop(mut self) -> Vec<u8> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::fs::read(&self.log).unwrap()
    }
}

/// Reads the log until the server says where it listens (text `listening on http://A`, or the
/// same as a JSON event's message); fails if the server exits first.
fn wait_for_address(child: &mut Child, log: &Path) -> String {
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("listening on http://").nth(1) {
            let end = rest.find(|c: char| c == '"' || c.is_whitespace()).unwrap_or(rest.len());
            return rest[..end].to_string();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the server exited ({status}) before listening:\n{text}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
    "temperature": 0}"#;
const UNKNOWN_MODEL: &str = r#"{"model": "no-such-model", "messages": [{"role": "user",
    "content": "Hi"}]}"#;

#[test]
fn a_log_written_to_a_file_has_no_escapes_and_names_status_and_endpoint() {
    let server = LoggedServer::start(&[]);
    assert!(server.post("/v1/chat/completions", CHAT).starts_with("HTTP/1.1 200"));
    assert!(server.post("/v1/chat/completions", UNKNOWN_MODEL).starts_with("HTTP/1.1 404"));
    let log = server.stop();
    assert!(!log.contains(&0x1b), "an escape byte in:\n{}", String::from_utf8_lossy(&log));
    let log = String::from_utf8(log).unwrap();
    let line_with = |needle: &str| {
        log.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle:?} in:\n{log}"))
    };
    let done = line_with("request done");
    let model = format!("model={}", model_id());
    for field in ["endpoint=\"/v1/chat/completions\"", "status=200", &model] {
        assert!(done.contains(field), "{field} not in {done}");
    }
    let refused = line_with("request refused");
    for field in ["endpoint=\"/v1/chat/completions\"", "status=404"] {
        assert!(refused.contains(field), "{field} not in {refused}");
    }
}

#[test]
fn json_logs_are_one_object_a_line_with_the_request_fields() {
    let server = LoggedServer::start(&["--log-format", "json"]);
    assert!(server.post("/v1/chat/completions", CHAT).starts_with("HTTP/1.1 200"));
    let log = String::from_utf8(server.stop()).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for event in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(event.get(key).is_some(), "no {key} in {event}");
        }
    }
    let done = events.iter().find(|e| e["message"] == "request done").expect("a request line");
    assert_eq!(done["endpoint"], "/v1/chat/completions");
    assert_eq!(done["status"], 200);
    assert_eq!(done["model"], model_id().as_str());
    assert_eq!(done["generated"], 2);
    assert!(done["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl")), "{done}");
    for number in ["prompt", "cached", "prefill_tok_s", "decode_tok_s"] {
        assert!(done[number].is_number(), "{number} in {done}");
    }
    let summary = events.iter().find(|e| e["target"] == "spindle::startup");
    assert!(summary.is_some_and(|e| e["message"].as_str().unwrap().contains("KV cache")), "{log}");
}
