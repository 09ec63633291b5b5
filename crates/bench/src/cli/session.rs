//! The session of one `spindle bench` panel: the server measured (started here or reached by
//! `--base-url`), the client that reaches it, the run's salt, and the progress line.

use std::io::IsTerminal;
use std::path::PathBuf;

use super::server_process::ServerProcess;
use crate::gates::Probe;
use crate::{Client, TokenCount, Workload};
use clap::Args;

/// The server measured and how to reach it; shared by every panel.
#[derive(Args)]
pub struct Target {
    /// A running OpenAI-compatible server, e.g. http://127.0.0.1:8080 (with or without /v1);
    /// without it, `spindle serve` is started on a free port.
    #[arg(long, visible_alias = "url")]
    pub base_url: Option<String>,
    /// With --base-url: the model name sent in requests (default: the first of /v1/models).
    /// Without: the model the started server serves (catalogue name, .gguf file or folder;
    /// default smollm2-135m).
    #[arg(long)]
    pub model: Option<String>,
    /// Serve a random-weight Qwen3.5-MoE instead of --model: 8 layers (2 × [3 linear + 1 full
    /// attention]), hidden 1024, 64 experts top-8, the default model's tokenizer.
    #[arg(long, conflicts_with_all = ["base_url", "model"])]
    pub hybrid: bool,
    /// CPU threads of the started server (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Extra arguments for the started `spindle serve`, split at spaces; repeatable, e.g.
    /// --serve-arg "--max-concurrent 8".
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Bearer key for the server.
    #[arg(long, env = "SPINDLE_API_KEY")]
    pub api_key: Option<String>,
    /// Salt of the system prompts (default: from the clock, so no cache from an earlier run can
    /// serve the cold call). Printed, so a run can be repeated.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Also write DIR/<panel>.json (every measurement) and DIR/<panel>.html (a self-contained
    /// report with charts).
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
}

/// The server under test, the client that reaches it, and the run's salt.
pub struct Session {
    pub client: Client,
    pub server: Option<ServerProcess>,
    pub url: String,
    pub salt: u64,
    pub max_tokens: u32,
}

impl Session {
    /// Reaches the server (`--base-url`, else the one started for the session), and names the
    /// model.
    pub async fn open(
        target: &Target,
        max_tokens: u32,
        server: Option<ServerProcess>,
    ) -> anyhow::Result<Self> {
        let url = match (&target.base_url, &server) {
            (Some(url), _) => url.clone(),
            (None, Some(s)) => s.base_url().to_string(),
            (None, None) => anyhow::bail!("no server to measure: give --base-url"),
        };
        let mut client = Client::new(&url, target.api_key.clone())?;
        match (&target.base_url, &target.model) {
            (Some(_), Some(model)) => client.set_model(model),
            _ => client.discover_model().await,
        }
        let salt = target.seed.unwrap_or_else(clock_salt);
        Ok(Self { client, server, url, salt, max_tokens })
    }

    /// Where the server's footprint is read.
    pub fn probe(&self) -> Probe {
        let pid = self.server.as_ref().map_or_else(Default::default, ServerProcess::pid);
        Probe::new(self.client.clone(), pid)
    }

    pub fn close(&mut self) {
        finish_progress();
        if let Some(s) = &mut self.server {
            s.stop();
        }
    }

    /// The system prompt for `salt` of `tokens` tokens, and the run's header line.
    pub async fn workload(&self, salt: u64, tokens: usize) -> Workload {
        let workload = Workload::prepare(&self.client, salt, tokens, self.max_tokens).await;
        println!("{}", header_line(&self.url, &self.client, &workload));
        workload
    }
}

/// `server URL  model M  seed S  max_tokens N  system prompt C chars, shared prefix T tokens`.
pub fn header_line(url: &str, client: &Client, workload: &Workload) -> String {
    let shared = match workload.system_tokens {
        TokenCount::Counted(n) => format!("{n} (counted by /v1/tokenize)"),
        TokenCount::Estimated(n) => format!("≈{n} (estimated from characters)"),
    };
    finish_progress();
    format!(
        "server {url}  model {}  seed {}  max_tokens {}  system prompt {} chars, shared prefix {shared} tokens",
        client.model().unwrap_or("(unnamed)"),
        workload.salt(),
        workload.max_tokens(),
        workload.system.len()
    )
}

/// A salt no earlier run used: nanoseconds since the epoch.
pub fn clock_salt() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Rewrites the progress line on a terminal (nothing when stderr is a file or pipe).
pub fn progress(text: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K{text}");
    }
}

/// Clears the progress line before a result is printed.
pub fn finish_progress() {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K");
    }
}
