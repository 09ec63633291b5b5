//! The panels of `spindle bench` (agentic, conversation, burst, quality, speculation): each one's flags, and
//! its run of the workload from `spindle-bench` against the session's server, printing its table
//! as it goes.

use std::time::Duration;

use super::server_process::ServerProcess;
use super::session::{finish_progress, header_line, progress, Session, Target};
use crate::agentic::{run_panel, AgenticOptions, Restart};
use crate::burst::run_bursts;
use crate::conversation::{run_conversation, ConversationOptions};
use crate::quality::{run_code, run_instruct, QualityReport, Thinking, SEED};
use crate::results::Results;
use crate::speculation::workloads::Kind;
use crate::speculation::{run_speculation, Mode, SpeculationOptions};
use crate::{report, BenchError, Client, PhaseKind, TokenCount, Workload};
use clap::{Args, ValueEnum};

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
    pub target: Target,
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
    pub target: Target,
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
    pub target: Target,
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
    pub target: Target,
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

#[derive(Args)]
pub struct SpeculationArgs {
    #[command(flatten)]
    pub target: Target,
    /// Completion tokens per call at most: the code edit's whole file is ~1,600.
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: u32,
    /// Rounds, each with new versions of the requests (picked by --seed); figures are then
    /// median [min–max].
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Which rows: `both` sends each request with `"speculative": true` and then `false`
    /// (Spindle), `on` / `off` one of them, `server` leaves the field out (llama-server: the
    /// row is the server's own setting).
    #[arg(long, value_enum, default_value_t = SpeculativeRows::Both)]
    pub speculative: SpeculativeRows,
    /// Workloads, comma-separated: code-edit, tool-call, prose.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind,
        default_values = ["code-edit", "tool-call", "prose"])]
    pub workloads: Vec<Kind>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SpeculativeRows {
    Both,
    On,
    Off,
    Server,
}

impl SpeculativeRows {
    /// The modes of a round, in order: on before off (see [`crate::speculation`]).
    fn modes(self) -> Vec<Mode> {
        match self {
            SpeculativeRows::Both => vec![Mode::On, Mode::Off],
            SpeculativeRows::On => vec![Mode::On],
            SpeculativeRows::Off => vec![Mode::Off],
            SpeculativeRows::Server => vec![Mode::Server],
        }
    }
}

fn parse_kind(name: &str) -> Result<Kind, String> {
    Kind::parse(name)
        .ok_or_else(|| format!("unknown workload {name} (code-edit, tool-call, prose)"))
}

/// What a panel measured, and the system prompt it measured with.
pub struct Outcome {
    pub results: Results,
    pub system_chars: usize,
    pub system_tokens: TokenCount,
}

pub async fn agentic(session: &mut Session, args: &AgenticArgs) -> anyhow::Result<Outcome> {
    let options = AgenticOptions {
        salt: session.salt,
        system_tokens: args.calls.system_tokens,
        max_tokens: session.max_tokens,
        runs: args.runs,
    };
    let mut restarter = match (&mut session.server, &args.restart_cmd) {
        (Some(server), _) => Restarter::Own(server),
        (None, Some(command)) => Restarter::Command(command, &session.client),
        (None, None) => Restarter::Cannot,
    };
    let header = |w: &Workload| header_line(&session.url, &session.client, w);
    let mut first = None;
    let panel = run_panel(&session.client, &options, &mut restarter, &mut progress, &mut |w| {
        println!("{}", header(w));
        first.get_or_insert((w.system.len(), w.system_tokens));
    })
    .await?;
    finish_progress();
    report::agentic_table(&panel).iter().for_each(|l| println!("{l}"));
    if !panel.kinds().contains(&PhaseKind::ColdPrefix) {
        println!("cold-prefix    skipped (--base-url without --restart-cmd)");
    }
    report::verdict_lines(&panel).iter().for_each(|l| println!("{l}"));
    let results = Results { agentic: Some(panel), ..Results::default() };
    let (system_chars, system_tokens) = first.unwrap_or((0, TokenCount::Estimated(0)));
    Ok(Outcome { results, system_chars, system_tokens })
}

/// How the cold-prefix phase restarts the server.
enum Restarter<'a> {
    /// The server this command started.
    Own(&'a mut ServerProcess),
    /// The caller's `--restart-cmd`.
    Command(&'a str, &'a Client),
    Cannot,
}

impl Restart for Restarter<'_> {
    async fn restart(&mut self) -> Result<bool, BenchError> {
        let failed = |e: anyhow::Error| BenchError::Restart(format!("{e:#}"));
        match self {
            // Blocks this thread while the server loads: nothing else runs meanwhile.
            Restarter::Own(server) => server.restart().map_err(failed)?,
            Restarter::Command(command, client) => {
                run_restart_command(command, client).await.map_err(failed)?
            }
            Restarter::Cannot => return Ok(false),
        }
        Ok(true)
    }
}

/// Runs the caller's `--restart-cmd` through `sh -c` and waits for the server to answer again.
async fn run_restart_command(command: &str, client: &Client) -> anyhow::Result<()> {
    eprintln!("restarting the server: {command}");
    // Nothing else runs meanwhile, so the blocking wait holds up no other task.
    let status = std::process::Command::new("sh").args(["-c", command]).status()?;
    anyhow::ensure!(status.success(), "--restart-cmd failed ({status})");
    // The old process may still answer for a moment; give it time to go away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.wait_ready(super::READY_TIMEOUT).await?;
    Ok(())
}

pub async fn conversation(
    session: &mut Session,
    args: &ConversationArgs,
) -> anyhow::Result<Outcome> {
    let options = ConversationOptions {
        salt: session.salt,
        turns: args.turns,
        start_tokens: args.start_tokens,
        end_tokens: args.end_tokens,
        max_tokens: session.max_tokens,
    };
    println!(
        "server {}  model {}  seed {}  max_tokens {}  {} turns, {} -> {} prompt tokens",
        session.url,
        session.client.model().unwrap_or("(unnamed)"),
        session.salt,
        session.max_tokens,
        args.turns,
        args.start_tokens,
        args.end_tokens
    );
    let run = run_conversation(&session.client, &options, &mut progress).await?;
    finish_progress();
    run.turns.iter().for_each(|t| println!("{}", report::turn_line(t)));
    report::conversation_summary(&run).iter().for_each(|l| println!("{l}"));
    let (system_chars, system_tokens) = (run.system_chars, run.system_tokens);
    let results = Results { conversation: Some(run), ..Results::default() };
    Ok(Outcome { results, system_chars, system_tokens })
}

pub async fn burst(session: &mut Session, args: &BurstArgs) -> anyhow::Result<Outcome> {
    let workload = session.workload(session.salt, args.calls.system_tokens).await;
    let system_tokens = workload.system_tokens.value();
    let runs = args.burst_runs.max(1);
    let levels = args.concurrency.iter().copied().filter(|&n| n > 0).collect::<Vec<_>>();
    if let Some(&first) = levels.first() {
        progress(&format!("burst {first}: run 1/{runs}"));
    }
    let mut next = levels.iter().flat_map(|&n| (1..=runs).map(move |r| (n, r))).skip(1);
    let levels = run_bursts(&session.client, &workload, &levels, runs, &mut |run, _| {
        finish_progress();
        println!("{}", report::burst_line(run, system_tokens));
        if let Some(first) = run.errors().first() {
            println!("burst {}: first error: {first}", run.concurrency);
        }
        if let Some((n, r)) = next.next() {
            progress(&format!("burst {n}: run {r}/{runs}"));
        }
    })
    .await?;
    report::burst_table(&levels, system_tokens).iter().for_each(|l| println!("{l}"));
    let results = Results { bursts: levels, ..Results::default() };
    let (system_chars, system_tokens) = (workload.system.len(), workload.system_tokens);
    Ok(Outcome { results, system_chars, system_tokens })
}

pub async fn quality(session: &mut Session, args: &QualityArgs) -> anyhow::Result<Outcome> {
    println!(
        "server {}  model {}  seed {SEED} (fixed)  temperature 0  max_tokens {}",
        session.url,
        session.client.model().unwrap_or("(unnamed)"),
        session.max_tokens
    );
    let code = args.code || !(args.thinking_ablation || args.instruct);
    let ablation = [Thinking::Off, Thinking::OnPreserved, Thinking::OnDropped];
    let code_runs = code.then_some(Thinking::Default).into_iter();
    let code_runs: Vec<Thinking> =
        code_runs.chain(ablation.into_iter().filter(|_| args.thinking_ablation)).collect();
    let instruct_runs =
        if args.instruct { vec![Thinking::Off, Thinking::OnPreserved] } else { vec![] };
    let (runs, client, max_tokens) = (args.runs.max(1), &session.client, session.max_tokens);
    let mut report = QualityReport::default();
    for run in 1..=runs {
        for &thinking in &code_runs {
            progress(&format!("quality run {run}/{runs}: code [{thinking}]"));
            report.code.push(run_code(client, thinking, max_tokens).await);
        }
        for &thinking in &instruct_runs {
            progress(&format!("quality run {run}/{runs}: instruct [{thinking}]"));
            report.instruct.push(run_instruct(client, thinking, max_tokens).await);
        }
    }
    finish_progress();
    report::quality_lines(&report).iter().for_each(|l| println!("{l}"));
    let results = Results { quality: Some(report), ..Results::default() };
    Ok(Outcome { results, system_chars: 0, system_tokens: TokenCount::Estimated(0) })
}

pub async fn speculation(session: &mut Session, args: &SpeculationArgs) -> anyhow::Result<Outcome> {
    println!(
        "server {}  model {}  seed {} (request versions; sampling seed {} fixed)  temperature 0  \
         max_tokens {}  {} rounds",
        session.url,
        session.client.model().unwrap_or("(unnamed)"),
        session.salt,
        crate::speculation::SEED,
        session.max_tokens,
        args.runs
    );
    let options = SpeculationOptions {
        kinds: args.workloads.clone(),
        modes: args.speculative.modes(),
        rounds: args.runs.max(1),
        max_tokens: session.max_tokens,
        salt: session.salt,
    };
    let panel = run_speculation(&session.client, &options, &mut progress).await?;
    finish_progress();
    crate::speculation::report::table(&panel).iter().for_each(|l| println!("{l}"));
    let results = Results { speculation: Some(panel), ..Results::default() };
    Ok(Outcome { results, system_chars: 0, system_tokens: TokenCount::Estimated(0) })
}
