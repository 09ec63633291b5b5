//! `spindle bench`: without a subcommand, the in-process prefill and decode speed of models
//! (`src/bench.rs`); with one, a panel of the coding-agent workload (crate `spindle-bench`)
//! against any OpenAI-compatible server (Spindle, llama-server, vLLM, LM Studio, Ollama):
//!
//! - `agentic`: cold, warm, prefix-test ×3 and cold-prefix calls, `--runs` times, with the
//!   prefix-cache verdict;
//! - `conversation`: one growing agent conversation of tool calls and results;
//! - `burst`: concurrent calls on a warmed system prompt, at several concurrencies;
//! - `quality`: tool-call cleanliness, its thinking ablation, and instruction following.
//!
//! With `--base-url` it measures a running server; without, it starts `spindle serve` itself
//! (and restarts it for the cold-prefix phase) and stops it at the end.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use spindle_bench::gates::{GateWatch, Probe, IDLE_WATCH};
use spindle_bench::results::Meta;
use spindle_bench::{report, Client, TokenCount, Workload};

use crate::bench_panels as panels;
use crate::bench_server::{ServeOptions, ServerProcess};

/// `spindle bench [--models …]` or `spindle bench <panel> …`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCli {
    #[command(subcommand)]
    panel: Option<Panel>,
    #[command(flatten)]
    speed: crate::bench::BenchArgs,
}

#[derive(Subcommand)]
enum Panel {
    /// Cold, warm, prefix-test ×3 (same system prompt, new user text) and, when the server can
    /// be restarted, cold-prefix calls: TTFT, prefill and decode speed, prompt / cached /
    /// completion tokens, and the verdict on prefix cache reuse.
    Agentic(AgenticArgs),
    /// One growing agent conversation (each turn adds a tool call and its result): per-turn
    /// latency, tokens re-read and cached, and how the cost per turn grows with depth.
    Conversation(ConversationArgs),
    /// Bursts of concurrent calls on a warmed system prompt: errors, 429s, latency and TTFT
    /// percentiles, throughput, calls that re-read the prompt, and whether calls serialise.
    Burst(BurstArgs),
    /// Agent quality probes at temperature 0 with a fixed seed: tool-call cleanliness over a
    /// multi-turn edit task (--code), its thinking ablation, and instruction following.
    Quality(QualityArgs),
}

/// The server measured and how to reach it; shared by every panel.
#[derive(Args)]
struct Target {
    /// A running OpenAI-compatible server, e.g. http://127.0.0.1:8080 (with or without /v1);
    /// without it, `spindle serve` is started on a free port.
    #[arg(long, visible_alias = "url")]
    base_url: Option<String>,
    /// With --base-url: the model name sent in requests (default: the first of /v1/models).
    /// Without: the model the started server serves (catalogue name, .gguf file or folder;
    /// default smollm2-135m).
    #[arg(long)]
    model: Option<String>,
    /// Serve a random-weight Qwen3.5-MoE instead of --model: 8 layers (2 × [3 linear + 1 full
    /// attention]), hidden 1024, 64 experts top-8, the default model's tokenizer.
    #[arg(long, conflicts_with_all = ["base_url", "model"])]
    hybrid: bool,
    /// CPU threads of the started server (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Extra arguments for the started `spindle serve`, split at spaces; repeatable, e.g.
    /// --serve-arg "--max-concurrent 8".
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    serve_args: Vec<String>,
    /// Bearer key for the server.
    #[arg(long, env = "SPINDLE_API_KEY")]
    api_key: Option<String>,
    /// Salt of the system prompts (default: from the clock, so no cache from an earlier run can
    /// serve the cold call). Printed, so a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Also write DIR/<panel>.json (every measurement) and DIR/<panel>.html (a self-contained
    /// report with charts).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

/// The agent calls the agentic and burst panels send: one shared system prompt, short answers.
#[derive(Args)]
pub struct AgentCalls {
    /// Completion tokens per call at most.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Size of the shared system prompt in tokens (8-9 KB of rules, tool schemas and notes at
    /// the default; sized with the server's tokenizer when it has /v1/tokenize, else at 4
    /// characters per token).
    #[arg(long, default_value_t = 2150)]
    pub system_tokens: usize,
}

#[derive(Args)]
pub struct AgenticArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    pub calls: AgentCalls,
    /// Repeats of the whole panel, each with a new system prompt; figures are then
    /// median [min–max].
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Restarts a server given by --base-url (run with `sh -c`), so the cold-prefix phase can
    /// measure a persistent cache. A started server is restarted without it.
    #[arg(long, requires = "base_url")]
    pub restart_cmd: Option<String>,
}

#[derive(Args)]
pub struct ConversationArgs {
    #[command(flatten)]
    target: Target,
    /// Completion tokens per call at most.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Calls of the conversation.
    #[arg(long, default_value_t = 80)]
    pub turns: usize,
    /// Prompt tokens of the first call (the system prompt).
    #[arg(long, default_value_t = 10_000)]
    pub start_tokens: usize,
    /// Prompt tokens of the last call: each turn adds (end - start) / turns tokens.
    #[arg(long, default_value_t = 50_000)]
    pub end_tokens: usize,
}

#[derive(Args)]
pub struct BurstArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    pub calls: AgentCalls,
    /// Concurrent calls of each burst, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 30, 60, 80])]
    pub concurrency: Vec<usize>,
    /// Bursts at each concurrency; figures are then median [min–max].
    #[arg(long, default_value_t = 1)]
    pub burst_runs: usize,
}

#[derive(Args)]
pub struct QualityArgs {
    #[command(flatten)]
    target: Target,
    /// Completion tokens per call at most (room for a tool call, or a brief, after thinking).
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: u32,
    /// Tool-call cleanliness over a scripted multi-turn edit task (the default probe).
    #[arg(long)]
    pub code: bool,
    /// The code probe with thinking off, on and preserved, and on but dropped
    /// (chat_template_kwargs enable_thinking / preserve_thinking).
    #[arg(long)]
    pub thinking_ablation: bool,
    /// A research brief with five required sections, thinking off and on.
    #[arg(long)]
    pub instruct: bool,
    /// Repeats of every probe (greedy with a fixed seed: runs should agree).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
}

impl Panel {
    /// The panel's name (of its output files), its server, and its completion budget.
    fn parts(&self) -> (&'static str, &Target, u32) {
        match self {
            Panel::Agentic(a) => ("agentic", &a.target, a.calls.max_tokens),
            Panel::Conversation(c) => ("conversation", &c.target, c.max_tokens),
            Panel::Burst(b) => ("burst", &b.target, b.calls.max_tokens),
            Panel::Quality(q) => ("quality", &q.target, q.max_tokens),
        }
    }
}

pub fn run(cli: BenchCli) -> anyhow::Result<()> {
    let Some(panel) = cli.panel else { return crate::bench::run(cli.speed) };
    let (_, target, max_tokens) = panel.parts();
    let max_queue = match &panel {
        Panel::Burst(b) => b.concurrency.iter().copied().max().unwrap_or(0),
        _ => 0,
    };
    let server = match &target.base_url {
        Some(_) => None,
        None => Some(ServerProcess::new(&ServeOptions {
            model: target.model.as_deref(),
            hybrid: target.hybrid,
            threads: target.threads,
            extra: &target.serve_args,
            max_queue,
        })?),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut session = Session::open(target, max_tokens, server).await?;
        let result = run_panel(&mut session, &panel).await;
        session.close();
        result
    })
}

/// Runs one panel with the gates watching, prints the gates, and writes the output files.
async fn run_panel(session: &mut Session, panel: &Panel) -> anyhow::Result<()> {
    let started_unix = clock_salt() / 1_000_000_000;
    let (name, target, _) = panel.parts();
    let watch = GateWatch::begin(session.probe(), IDLE_WATCH).await;
    let mut outcome = match panel {
        Panel::Agentic(args) => panels::agentic(session, args).await?,
        Panel::Conversation(args) => panels::conversation(session, args).await?,
        Panel::Burst(args) => panels::burst(session, args).await?,
        Panel::Quality(args) => panels::quality(session, args).await?,
    };
    let gates = watch.end(&outcome.results.completions()).await;
    report::gate_lines(&gates).iter().for_each(|l| println!("{l}"));
    outcome.results.gates = Some(gates);
    let Some(dir) = &target.output else { return Ok(()) };
    let meta = Meta {
        panel: name.to_string(),
        server: session.url.clone(),
        model: session.client.model().map(str::to_string),
        seed: session.salt,
        max_tokens: session.max_tokens,
        system_chars: outcome.system_chars,
        system_tokens: outcome.system_tokens,
        started_unix,
    };
    let json = spindle_bench::json::write(dir, &meta, &outcome.results)?;
    let html = spindle_bench::html::write(dir, &meta, &outcome.results)?;
    println!("wrote {} and {}", json.display(), html.display());
    Ok(())
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
    /// Starts the server when there is one to start, and names the model.
    async fn open(
        target: &Target,
        max_tokens: u32,
        mut server: Option<ServerProcess>,
    ) -> anyhow::Result<Self> {
        let url = match (&target.base_url, &server) {
            (Some(url), _) => url.clone(),
            (None, Some(s)) => s.url(),
            (None, None) => unreachable!("a server is started when no --base-url is given"),
        };
        let mut client = Client::new(&url, target.api_key.clone())?;
        if let Some(s) = &mut server {
            s.start()?;
            s.wait_ready(&client).await?;
        }
        match (&target.base_url, &target.model) {
            (Some(_), Some(model)) => client.set_model(model),
            _ => client.discover_model().await,
        }
        let salt = target.seed.unwrap_or_else(clock_salt);
        Ok(Self { client, server, url, salt, max_tokens })
    }

    /// Where the server's footprint is read.
    fn probe(&self) -> Probe {
        let pid = self.server.as_ref().map_or_else(Default::default, ServerProcess::pid);
        Probe::new(self.client.clone(), pid)
    }

    fn close(&mut self) {
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
fn clock_salt() -> u64 {
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchCli,
    }

    fn parse(args: &[&str]) -> Result<BenchCli, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn the_speed_invocation_is_unchanged() {
        let cli = parse(&["--models", "smollm2-135m", "--prompt-tokens", "512"]).unwrap();
        assert!(cli.panel.is_none());
        assert!(parse(&[]).unwrap().panel.is_none());
        // As scripts/bench/against_llama_bench.sh calls it.
        let script = "--threads 2 --repeats 1 --models smollm2-135m --decode-tokens 64 \
                      --hybrid-blocks 1 --prompt-tokens 1024 --depth 8192 --concurrent 1";
        let script: Vec<&str> = script.split_whitespace().collect();
        assert!(parse(&script).unwrap().panel.is_none());
        assert!(parse(&["--prompt-tokens", "8", "agentic"]).is_err(), "flags or a panel, not both");
    }

    #[test]
    fn panels_and_their_flags() {
        let cli = parse(&[
            "agentic",
            "--base-url",
            "http://h:1",
            "--model",
            "m",
            "--runs",
            "3",
            "--restart-cmd",
            "true",
            "--output",
            "out",
        ])
        .unwrap();
        let Some(Panel::Agentic(a)) = cli.panel else { panic!("agentic") };
        assert_eq!((a.runs, a.calls.max_tokens, a.calls.system_tokens), (3, 16, 2150));
        assert_eq!(a.target.model.as_deref(), Some("m"));
        assert_eq!(a.target.output, Some(PathBuf::from("out")));
        assert!(parse(&["agentic", "--restart-cmd", "true"]).is_err(), "needs --base-url");
        assert!(parse(&["agentic", "--hybrid", "--model", "m"]).is_err());

        let Some(Panel::Burst(b)) = parse(&["burst", "--url", "u"]).unwrap().panel else {
            panic!("burst")
        };
        assert_eq!((b.concurrency, b.burst_runs), (vec![8, 30, 60, 80], 1));
        let Some(Panel::Conversation(c)) = parse(&["conversation"]).unwrap().panel else {
            panic!("conversation")
        };
        assert_eq!((c.turns, c.start_tokens, c.end_tokens), (80, 10_000, 50_000));
        let Some(Panel::Quality(q)) = parse(&["quality", "--instruct"]).unwrap().panel else {
            panic!("quality")
        };
        assert!(q.instruct && !q.code && q.max_tokens == 1024);
    }
}
