//! `spindle bench-agent`: the agent workload of `spindle-bench` (cold, warm, new-user, restart
//! calls; concurrent bursts), or one growing conversation, against a server. With `--url` it measures any running
//! OpenAI-compatible server and skips the restart; otherwise it starts `spindle serve` itself,
//! restarts it for the restart phase, and stops it at the end.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use spindle_bench::conversation::conversation;
use spindle_bench::{report, Client, TokenCount, Workload};

use crate::random_hybrid::{shape_path, HybridShape};

/// How long a started server may take to load its model and answer `/health`.
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a started server gets to shut down after SIGINT before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct BenchAgentArgs {
    /// A running OpenAI-compatible server, e.g. http://127.0.0.1:8080 (the restart phase is
    /// skipped); without it, `spindle serve` is started on a free port.
    #[arg(long)]
    url: Option<String>,
    /// Model for the started server: catalogue name, .gguf file or folder.
    #[arg(long, default_value = spindle_hub::DEFAULT_MODEL)]
    model: String,
    /// Serve a random-weight Qwen3.5-MoE instead of --model: 8 layers (2 × [3 linear + 1 full
    /// attention]), hidden 1024, 64 experts top-8, the default model's tokenizer. Written once
    /// under $SPINDLE_HOME/bench.
    #[arg(long, conflicts_with_all = ["url", "model"])]
    hybrid: bool,
    /// Size of the system prompt in tokens (sized with the server's tokenizer when it has
    /// /v1/tokenize, else at 4 characters per token).
    #[arg(long, default_value_t = 2150)]
    system_tokens: usize,
    /// Concurrent calls of each burst, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 32, 64])]
    burst: Vec<usize>,
    /// Completion tokens per call at most.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// CPU threads of the started server (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Extra arguments for the started `spindle serve`, split at spaces; repeatable, e.g.
    /// --serve-arg "--max-concurrent 8".
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    serve_args: Vec<String>,
    /// Salt of the system prompts (default: from the clock, so no cache from an earlier run can
    /// serve the cold call). Printed, so a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Instead of the agent phases and bursts: one growing conversation of this many calls,
    /// each adding the reply and a tool result of --turn-tokens to the previous call's messages.
    #[arg(long, value_name = "TURNS")]
    conversation: Option<usize>,
    /// Tokens of each tool result in --conversation (sized like the system prompt).
    #[arg(long, default_value_t = 1000)]
    turn_tokens: usize,
    /// Bearer key for the server.
    #[arg(long, env = "SPINDLE_API_KEY")]
    api_key: Option<String>,
}

pub fn run(args: BenchAgentArgs) -> anyhow::Result<()> {
    let server = match &args.url {
        Some(_) => None,
        None => Some(ServerProcess::new(&args)?),
    };
    tokio::runtime::Runtime::new()?.block_on(bench(args, server))
}

async fn bench(args: BenchAgentArgs, mut server: Option<ServerProcess>) -> anyhow::Result<()> {
    let url = match (&args.url, &server) {
        (Some(url), _) => url.clone(),
        (None, Some(s)) => s.url(),
        (None, None) => unreachable!("a server is started when no --url is given"),
    };
    let mut client = Client::new(&url, args.api_key.clone())?;
    if let Some(s) = &mut server {
        s.start()?;
        s.wait_ready(&client).await?;
    }
    client.discover_model().await;
    let salt = args.seed.unwrap_or_else(clock_salt);
    let workload = Workload::prepare(&client, salt, args.system_tokens, args.max_tokens).await;
    let system_tokens = match workload.system_tokens {
        TokenCount::Counted(n) => format!("{n} (counted by /v1/tokenize)"),
        TokenCount::Estimated(n) => format!("≈{n} (estimated from characters)"),
    };
    println!(
        "server {url}  model {}  seed {salt}  max_tokens {}  system prompt {} chars, shared prefix {system_tokens} tokens",
        client.model().unwrap_or("(unnamed)"),
        args.max_tokens,
        workload.system.len()
    );
    if let Some(turns) = args.conversation {
        workload.warm_up(&client).await?;
        let turn_chars = (args.turn_tokens as f64 * workload.chars_per_token()).round() as usize;
        let done =
            conversation(&client, &workload.system, turns, turn_chars, args.max_tokens).await?;
        done.iter().for_each(|t| println!("{}", report::turn_line(t)));
        println!("{}", report::conversation_summary(&done));
        if let Some(s) = &mut server {
            s.stop();
        }
        return Ok(());
    }
    let mut phases = workload.agent(&client).await?;
    phases.iter().for_each(|p| println!("{}", report::phase_line(p)));
    match &mut server {
        Some(s) => {
            s.restart(&client).await?;
            let phase = workload.after_restart(&client).await?;
            println!("{}", report::phase_line(&phase));
            phases.push(phase);
        }
        None => println!("restart    skipped (--url: the server is not ours to restart)"),
    }
    report::ratio_lines(&phases).iter().for_each(|l| println!("{l}"));
    let mut failed = 0;
    for (index, &n) in args.burst.iter().enumerate().filter(|(_, &n)| n > 0) {
        let run = workload.burst(&client, index, n).await?;
        println!("{}", report::burst_line(&run, workload.system_tokens.value()));
        if let Some(first) = run.errors().first() {
            eprintln!("burst {n}: first error: {first}");
        }
        failed += run.errors().len();
    }
    if let Some(s) = &mut server {
        s.stop();
    }
    anyhow::ensure!(failed == 0, "{failed} burst calls failed");
    Ok(())
}

/// A salt no earlier run used: nanoseconds since the epoch.
fn clock_salt() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A `spindle serve` child process on a free local port, its output in a log file.
struct ServerProcess {
    port: u16,
    args: Vec<String>,
    log: PathBuf,
    /// The disk tier folder made for this run, removed at the end.
    cache_dir: Option<PathBuf>,
    child: Option<Child>,
}

impl ServerProcess {
    /// Resolves the model (downloading or writing it now, not under the readiness timeout) and
    /// prepares the command line; nothing is started yet.
    fn new(args: &BenchAgentArgs) -> anyhow::Result<Self> {
        let model = if args.hybrid {
            shape_path(&HybridShape::AGENT_BAR, 2)?.display().to_string()
        } else {
            spindle_hub::resolve(&args.model, &spindle_hub::spindle_home(), true)?;
            args.model.clone()
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut serve: Vec<String> =
            ["serve", "--model", &model, "--host", "127.0.0.1", "--port", &port.to_string()]
                .map(String::from)
                .into();
        if let Some(threads) = args.threads {
            serve.extend(["--threads".to_string(), threads.to_string()]);
        }
        let extra: Vec<String> =
            args.serve_args.iter().flat_map(|a| a.split_whitespace()).map(String::from).collect();
        // The biggest burst must fit the queue; a --max-queue of the caller's wins.
        let biggest = args.burst.iter().copied().max().unwrap_or(0);
        if !extra.iter().any(|a| a == "--max-queue" || a.starts_with("--max-queue=")) {
            serve.extend(["--max-queue".to_string(), biggest.max(64).to_string()]);
        }
        // The restart phase is there to measure the disk tier: a started server gets one in a
        // fresh folder unless the caller names its own.
        let cache_dir = (!extra.iter().any(|a| a.starts_with("--prefix-cache-dir")))
            .then(|| std::env::temp_dir().join(format!("spindle-bench-agent-{port}-cache")));
        if let Some(dir) = &cache_dir {
            serve.extend(["--prefix-cache-dir".to_string(), dir.display().to_string()]);
        }
        serve.extend(extra);
        let log = std::env::temp_dir().join(format!("spindle-bench-agent-{port}.log"));
        Ok(Self { port, args: serve, log, cache_dir, child: None })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let exe = std::env::current_exe().context("cannot find the spindle executable")?;
        eprintln!(
            "starting {} {} (log: {})",
            exe.display(),
            self.args.join(" "),
            self.log.display()
        );
        let child = Command::new(exe)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start spindle serve")?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits for `/health`; fails with the end of the log if the server exits first.
    async fn wait_ready(&mut self, client: &Client) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) =
                self.child.as_mut().and_then(|c| c.try_wait().transpose()).transpose()?
            {
                anyhow::bail!(
                    "spindle serve exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if client.is_ready().await {
                eprintln!("server ready after {:.1} s", start.elapsed().as_secs_f64());
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < READY_TIMEOUT,
                "spindle serve not ready after {READY_TIMEOUT:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn restart(&mut self, client: &Client) -> anyhow::Result<()> {
        self.stop();
        self.start()?;
        self.wait_ready(client).await
    }

    /// SIGINT (a graceful shutdown, as Ctrl-C), then SIGKILL if it lingers.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let interrupted = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let start = Instant::now();
        while interrupted && start.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.cache_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
