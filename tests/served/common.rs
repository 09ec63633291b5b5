//! The test model, and a `spindle serve` child process whose standard error goes to a file, as
//! under a service manager.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// SmolLM2-135M's GGUF, pulled on first use.
pub use spindle_testkit::smollm2_gguf as smollm2;

/// The name the server gives a model served from a path: the file's stem.
pub fn model_id() -> String {
    smollm2().file_stem().unwrap().to_str().unwrap().to_string()
}

/// A `spindle serve` whose standard error goes to a file, as under a service manager.
pub struct LoggedServer {
    child: Child,
    log: PathBuf,
    address: String,
    _dir: tempfile::TempDir,
}

impl LoggedServer {
    /// `spindle serve --model SmolLM2 …extra`.
    pub fn start(extra: &[&str]) -> Self {
        Self::serving(&smollm2(), extra)
    }

    /// `spindle serve --model MODEL …extra`, with a small KV pool and its own batch folder.
    pub fn serving(model: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["--model", model.to_str().unwrap()];
        args.extend(extra);
        Self::with_args(&args)
    }

    /// `spindle serve …args`, with a small KV pool (unless `args` size it) and its own batch
    /// folder.
    pub fn with_args(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let kv_memory: &[&str] =
            if args.contains(&"--kv-cache-memory") { &[] } else { &["--kv-cache-memory", "64MiB"] };
        let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .arg("serve")
            .args(args)
            .args(kv_memory)
            .args(["--port", "0", "--batch-dir"])
            .arg(dir.path().join("batches"))
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
    pub fn post(&self, path: &str, body: &str) -> String {
        self.send("POST", path, body)
    }

    /// The JSON body of a POST that must answer 200.
    pub fn post_ok(&self, path: &str, body: &str) -> serde_json::Value {
        json_of(&self.post(path, body))
    }

    /// The JSON body of a GET that must answer 200.
    pub fn get_json(&self, path: &str) -> serde_json::Value {
        json_of(&self.get(path))
    }

    /// Sends a GET and returns the response's status line, headers and body.
    pub fn get(&self, path: &str) -> String {
        self.send("GET", path, "")
    }

    fn send(&self, method: &str, path: &str, body: &str) -> String {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    /// A connection to the server, for a client that leaves before its answer ends.
    pub fn connect(&self) -> TcpStream {
        TcpStream::connect(&self.address).unwrap()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// Sends `signal` (`libc::SIGTERM`, `libc::SIGINT`) to the server.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill takes plain integers; the child is ours and not reaped yet.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "{}", std::io::Error::last_os_error());
    }

    /// Waits for the server to exit by itself; fails after `bound`, so that a server that
    /// never exits fails its test instead of hanging it.
    pub fn wait_for_exit(&mut self, bound: std::time::Duration) -> std::process::ExitStatus {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < bound, "the server still runs:\n{}", self.log());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Stops the server and returns its whole log.
    pub fn stop(mut self) -> Vec<u8> {
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

/// The JSON body of a 200 response.
fn json_of(response: &str) -> serde_json::Value {
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"))
}
