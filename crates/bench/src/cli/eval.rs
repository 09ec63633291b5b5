//! `spindle eval`: the pass/fail suite of server behaviour (crate `spindle-bench`, module
//! `eval`) against any OpenAI-compatible server. Each check prints what it expected and what
//! it saw; the exit status is non-zero when a server check fails (model-dependent checks are
//! reported apart and never fail the run).
//!
//! With `--base-url` it tests a running server; without, it starts `spindle serve` itself, as
//! the bench panels do, with a small queue (so the queue-full check can fill it) and an API key
//! (so the wrong-key check has one to refuse).

use std::path::PathBuf;

use super::server_process::{ServeCommand, ServerProcess};
use super::{ModelResolver, ServeOptions};
use crate::eval::report::{self, EvalMeta};
use crate::eval::{self as suite, EvalContext, Tier};
use crate::Client;
use anyhow::Context;
use clap::Args;

/// Running and waiting requests of a started server: small, so the queue-full check needs few
/// calls, and above the full tier's 16 concurrent calls.
const STARTED_MAX_CONCURRENT: usize = 4;
const STARTED_MAX_QUEUE: usize = 16;

#[derive(Args)]
pub struct EvalArgs {
    /// A running OpenAI-compatible server, e.g. http://127.0.0.1:8080 (with or without /v1);
    /// without it, `spindle serve` is started on a free port.
    #[arg(long, visible_alias = "url")]
    base_url: Option<String>,
    /// With --base-url: the model name sent in requests (default: the first of /v1/models).
    /// Without: the model the started server serves (default smollm2-135m).
    #[arg(long)]
    model: Option<String>,
    /// smoke (a handful of fast checks), standard (every server check) or full (standard with
    /// more repetitions and larger concurrency).
    #[arg(long, default_value = "standard", value_parser = parse_tier)]
    tier: Tier,
    /// Run one section only.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(suite::SECTIONS))]
    section: Option<String>,
    /// Bearer key for the server (a started server gets one of its own).
    #[arg(long, env = "SPINDLE_API_KEY")]
    api_key: Option<String>,
    /// Requests the server holds at once (running + waiting; Spindle: --max-concurrent +
    /// --max-queue): the queue-full check sends more and expects 429. Skipped when unknown.
    #[arg(long)]
    queue_capacity: Option<usize>,
    /// CPU threads of the started server (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Extra arguments for the started `spindle serve`, split at spaces; repeatable.
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    serve_args: Vec<String>,
    /// Salt that makes the run's prompts unique (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Also write DIR/eval.jsonl (one line per check) and DIR/eval.html.
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

fn parse_tier(name: &str) -> Result<Tier, String> {
    Tier::from_name(name)
        .ok_or_else(|| format!("unknown tier `{name}`; expected one of {}", Tier::NAMES.join(", ")))
}

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Smoke => "smoke",
        Tier::Standard => "standard",
        Tier::Full => "full",
    }
}

pub fn run(args: EvalArgs, resolve: ModelResolver) -> anyhow::Result<()> {
    let started_unix = unix_time().as_secs();
    let salt = args.seed.unwrap_or_else(|| unix_time().as_nanos() as u64);
    let (mut server, api_key, queue_capacity) = match &args.base_url {
        Some(_) => (None, args.api_key.clone(), args.queue_capacity),
        None => {
            let model = resolve(args.model.as_deref(), false)?;
            let (command, key, capacity) = start_options(&args, model, salt)?;
            (Some(ServerProcess::start(command)?), Some(key), capacity)
        }
    };
    let url = match (&args.base_url, &server) {
        (Some(url), _) => url.clone(),
        (_, Some(server)) => server.base_url().to_string(),
        (None, None) => anyhow::bail!("no server to test: give --base-url"),
    };
    let mut client = Client::new(&url, api_key)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let passed = runtime.block_on(async {
        match (&args.base_url, &args.model) {
            (Some(_), Some(model)) => client.set_model(model),
            _ => client.discover_model().await,
        }
        println!(
            "spindle eval: server {url}  model {}  tier {}  salt {salt}",
            client.model().unwrap_or("(unnamed)"),
            tier_name(args.tier)
        );
        let context = EvalContext { client: client.clone(), tier: args.tier, queue_capacity, salt };
        let results = suite::run_eval(&context, args.section.as_deref(), &mut |section| {
            section.iter().for_each(|r| println!("{}", report::line(r)));
        })
        .await
        .map_err(anyhow::Error::msg)?;
        report::summary(&results).iter().for_each(|l| println!("{l}"));
        if let Some(dir) = &args.output {
            let meta = EvalMeta {
                server: url.clone(),
                model: client.model().map(str::to_string),
                tier: tier_name(args.tier).to_string(),
                started_unix,
            };
            let (log, page) = report::write(dir, &meta, &results)
                .with_context(|| format!("cannot write to {}", dir.display()))?;
            println!("wrote {} and {}", log.display(), page.display());
        }
        anyhow::Ok(suite::passed(&results))
    });
    if let Some(server) = &mut server {
        server.stop();
    }
    anyhow::ensure!(passed?, "server checks failed");
    Ok(())
}

/// The server to start, its API key and its queue capacity (unknown when the
/// caller's --serve-arg sets the limits).
fn start_options(
    args: &EvalArgs,
    model: String,
    salt: u64,
) -> anyhow::Result<(ServeCommand, String, Option<usize>)> {
    let key = args.api_key.clone().unwrap_or_else(|| format!("spindle-eval-{salt:x}"));
    let own_limits = args
        .serve_args
        .iter()
        .flat_map(|a| a.split_whitespace())
        .any(|a| a.starts_with("--max-concurrent") || a.starts_with("--max-queue"));
    let mut extra = args.serve_args.clone();
    let capacity = if own_limits {
        args.queue_capacity
    } else {
        extra.push(format!(
            "--max-concurrent {STARTED_MAX_CONCURRENT} --max-queue {STARTED_MAX_QUEUE}"
        ));
        Some(STARTED_MAX_CONCURRENT + STARTED_MAX_QUEUE)
    };
    let command = ServeOptions {
        model,
        threads: args.threads,
        extra: &extra,
        max_queue: STARTED_MAX_QUEUE,
        api_key: Some(key.clone()),
    }
    .command()?;
    Ok((command, key, capacity))
}

fn unix_time() -> std::time::Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        eval: EvalArgs,
    }

    fn parse(args: &[&str]) -> Result<EvalArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("eval").chain(args.iter().copied())).map(|c| c.eval)
    }

    #[test]
    fn flags_and_defaults() {
        let args =
            parse(&["--url", "http://h:1", "--tier", "smoke", "--section", "tools"]).unwrap();
        assert_eq!((args.tier, args.section.as_deref()), (Tier::Smoke, Some("tools")));
        assert_eq!(parse(&[]).unwrap().tier, Tier::Standard);
        let error = parse(&["--tier", "quick"]).err().unwrap().to_string();
        assert!(error.contains("expected one of smoke, standard, full"), "{error}");
        let error = parse(&["--section", "speed"]).err().unwrap().to_string();
        assert!(error.contains("sampling") && error.contains("protocol"), "{error}");
    }

    #[test]
    fn a_started_server_gets_a_key_and_a_small_queue_unless_told_otherwise() {
        let args = parse(&["--model", "smollm2-135m"]).unwrap();
        let (_, key, capacity) = start_options(&args, "smollm2-135m".into(), 0xab).unwrap();
        assert_eq!((key.as_str(), capacity), ("spindle-eval-ab", Some(20)));
        let args = parse(&["--serve-arg", "--max-queue 2", "--queue-capacity", "6"]).unwrap();
        assert_eq!(start_options(&args, "m".into(), 1).unwrap().2, Some(6));
    }
}
