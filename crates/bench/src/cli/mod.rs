//! The command lines of `spindle bench <panel>` and `spindle eval`: their flags, the server they
//! start when no `--base-url` is given, and each run from start to written report. The binary
//! only parses them and supplies a [`ModelResolver`].
//!
//! Panels of the coding-agent workload against any OpenAI-compatible server (Spindle,
//! llama-server, vLLM, LM Studio, Ollama):
//!
//! - `agentic`: cold, warm, prefix-test ×3 and cold-prefix calls, `--runs` times, with the
//!   prefix-cache verdict;
//! - `conversation`: one growing agent conversation of tool calls and results;
//! - `burst`: concurrent calls on a warmed system prompt, at several concurrencies;
//! - `quality`: tool-call cleanliness, its thinking ablation, and instruction following;
//! - `speculation`: decode speed and draft acceptance with speculative decoding on and off.
//!
//! With `--base-url` they measure a running server; without, they start `spindle serve` (and
//! restart it for the cold-prefix phase) and stop it at the end.
//!
//! [`server_process`] (a `spindle serve` child process) and [`running_server`] (what answers at
//! an address) serve `spindle launch` as well: one way to start a server, and no HTTP client
//! of launch's own.

pub mod eval;
mod panels;
pub mod running_server;
pub mod server_process;
mod session;

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

use crate::gates::{GateWatch, IDLE_WATCH};
use crate::report;
use crate::results::Meta;
use panels::{AgenticArgs, BurstArgs, ConversationArgs, QualityArgs, SpeculationArgs};
use server_process::{ServeCommand, ServerProcess};
use session::{clock_salt, Session, Target};

/// Turns a started server's `--model` (None: the default) or `--hybrid` (true: the benchmarks'
/// random-weight Qwen3.5-MoE) into what `spindle serve --model` takes, with the model on disk
/// already (downloaded or written now, not under the readiness timeout). The binary supplies
/// it: the models live in crates this client-side one does not depend on.
pub type ModelResolver<'a> = &'a dyn Fn(Option<&str>, bool) -> anyhow::Result<String>;

#[derive(Subcommand)]
pub enum Panel {
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
    /// Decode speed and draft acceptance with speculative decoding on and off (per request,
    /// `"speculative": true|false`), greedy: a whole-file rename, a tool call that quotes its
    /// context, and prose with nothing to copy.
    Speculation(SpeculationArgs),
}

impl Panel {
    /// The panel's name (of its output files), its server, and its completion budget.
    fn parts(&self) -> (&'static str, &Target, u32) {
        match self {
            Panel::Agentic(a) => ("agentic", &a.target, a.calls.max_tokens),
            Panel::Conversation(c) => ("conversation", &c.target, c.max_tokens),
            Panel::Burst(b) => ("burst", &b.target, b.calls.max_tokens),
            Panel::Quality(q) => ("quality", &q.target, q.max_tokens),
            Panel::Speculation(s) => ("speculation", &s.target, s.max_tokens),
        }
    }
}

/// Runs `panel` against its target, starting (and at the end stopping) a server for it when
/// no `--base-url` is given.
pub fn run_panel_command(panel: Panel, resolve: ModelResolver) -> anyhow::Result<()> {
    let (_, target, max_tokens) = panel.parts();
    let max_queue = match &panel {
        Panel::Burst(b) => b.concurrency.iter().copied().max().unwrap_or(0),
        _ => 0,
    };
    let server = match &target.base_url {
        Some(_) => None,
        None => Some(ServerProcess::start(
            ServeOptions {
                model: resolve(target.model.as_deref(), target.hybrid)?,
                threads: target.threads,
                extra: &target.serve_args,
                max_queue,
                api_key: target.api_key.clone(),
            }
            .command()?,
        )?),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut session = Session::open(target, max_tokens, server).await?;
        let result = run_panel(&mut session, &panel).await;
        session.close();
        result
    })
}

/// How long a started server may take to load its model (already on disk) and listen.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// What the `spindle serve` a panel or the eval starts runs.
struct ServeOptions<'a> {
    /// Catalogue name, .gguf file or folder, already on disk ([`ModelResolver`]).
    model: String,
    threads: Option<usize>,
    /// Extra `serve` arguments, each split at spaces.
    extra: &'a [String],
    /// Requests the queue must hold (the biggest burst).
    max_queue: usize,
    /// The key the server requires.
    api_key: Option<String>,
}

impl ServeOptions<'_> {
    /// The command line, on a port the system picks, logging to a file named after this
    /// process.
    fn command(self) -> anyhow::Result<ServeCommand> {
        let mut args = Vec::new();
        if let Some(threads) = self.threads {
            args.extend(["--threads".to_string(), threads.to_string()]);
        }
        let extra: Vec<String> =
            self.extra.iter().flat_map(|a| a.split_whitespace()).map(String::from).collect();
        // The biggest burst must fit the queue; a --max-queue of the caller's wins.
        if !extra.iter().any(|a| a == "--max-queue" || a.starts_with("--max-queue=")) {
            args.extend(["--max-queue".to_string(), self.max_queue.max(64).to_string()]);
        }
        let run = format!("spindle-bench-{}", std::process::id());
        // The cold-prefix phase is there to measure the disk tier: a started server gets one in
        // a fresh folder unless the caller names its own.
        let scratch_dir = (!extra.iter().any(|a| a.starts_with("--prefix-cache-dir")))
            .then(|| std::env::temp_dir().join(format!("{run}-cache")));
        if let Some(dir) = &scratch_dir {
            args.extend(["--prefix-cache-dir".to_string(), dir.display().to_string()]);
        }
        args.extend(extra);
        Ok(ServeCommand {
            program: std::env::current_exe().context("cannot find the spindle executable")?,
            model: self.model,
            host: "127.0.0.1".to_string(),
            port: 0,
            args,
            api_key: self.api_key,
            log: std::env::temp_dir().join(format!("{run}.log")),
            ready_timeout: Some(READY_TIMEOUT),
            scratch_dir,
        })
    }
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
        Panel::Speculation(args) => panels::speculation(session, args).await?,
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
    let json = crate::json::write(dir, &meta, &outcome.results)?;
    let html = crate::html::write(dir, &meta, &outcome.results)?;
    println!("wrote {} and {}", json.display(), html.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        panel: Panel,
    }

    fn parse(args: &[&str]) -> Result<Panel, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.panel)
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
        let Panel::Agentic(a) = cli else { panic!("agentic") };
        assert_eq!((a.runs, a.calls.max_tokens, a.calls.system_tokens), (3, 16, 2150));
        assert_eq!(a.target.model.as_deref(), Some("m"));
        assert_eq!(a.target.output, Some(PathBuf::from("out")));
        assert!(parse(&["agentic", "--restart-cmd", "true"]).is_err(), "needs --base-url");
        assert!(parse(&["agentic", "--hybrid", "--model", "m"]).is_err());

        let Panel::Burst(b) = parse(&["burst", "--url", "u"]).unwrap() else { panic!("burst") };
        assert_eq!((b.concurrency, b.burst_runs), (vec![8, 30, 60, 80], 1));
        let Panel::Conversation(c) = parse(&["conversation"]).unwrap() else {
            panic!("conversation")
        };
        assert_eq!((c.turns, c.start_tokens, c.end_tokens), (80, 10_000, 50_000));
        let Panel::Quality(q) = parse(&["quality", "--instruct"]).unwrap() else {
            panic!("quality")
        };
        assert!(q.instruct && !q.code && q.max_tokens == 1024);
        let Panel::Speculation(s) = parse(&["speculation"]).unwrap() else { panic!("speculation") };
        assert_eq!((s.max_tokens, s.runs, s.workloads.len()), (2048, 3, 3));
        assert!(s.speculative == panels::SpeculativeRows::Both);
        let Panel::Speculation(s) =
            parse(&["speculation", "--speculative", "server", "--workloads", "prose,code-edit"])
                .unwrap()
        else {
            panic!("speculation")
        };
        use crate::speculation::workloads::Kind;
        assert_eq!(s.workloads, [Kind::Prose, Kind::CodeEdit]);
        assert!(s.speculative == panels::SpeculativeRows::Server);
        assert!(parse(&["speculation", "--workloads", "poetry"]).is_err());
    }
}
