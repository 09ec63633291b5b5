//! `spindle`: the command line. Subcommands wire the crates together; the logic lives there.

mod bench;
mod bench_agent;
mod bench_roofline;
mod byte_size;
mod device_flag;
mod generate;
mod kv_memory;
mod kv_on_gpu;
mod launch;
mod logging;
mod memory;
mod model_loading;
mod placement_flags;
mod random_hybrid;
mod sampling_flags;
mod serve;
mod served_models;
mod started_model;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Each forward pass allocates and frees tensors of megabytes; glibc hands such blocks back to
/// the OS and pays page faults and page zeroing to get them again, mimalloc keeps reusing them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Transparent huge pages cost more than they save for a step's buffers: every fresh or purged
/// 2 MiB of them, or of a recurrent-state copy, would be zeroed whole on first touch (a fifth of
/// a cached call's time). They pay for the weights, which a decode step streams once
/// (`huge_pages` in spindle-models advises them). So the process turns huge pages off except
/// where advised (Linux 6.18+; the allocator is built never to advise its own regions), or,
/// on older kernels, off entirely.
fn use_small_pages() {
    #[cfg(target_os = "linux")]
    {
        /// `PR_THP_DISABLE_EXCEPT_ADVISED` of linux/prctl.h (not in the libc crate yet).
        const EXCEPT_ADVISED: libc::c_ulong = 1 << 1;
        // SAFETY: PR_SET_THP_DISABLE takes plain integers and only sets a flag of this process.
        let set = |flags: libc::c_ulong| unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1 as libc::c_ulong, flags, 0 as libc::c_ulong, 0 as libc::c_ulong)
        } == 0;
        if !set(EXCEPT_ADVISED) && !set(0) {
            tracing::debug!(error = %std::io::Error::last_os_error(), "transparent huge pages stay on");
        }
    }
}

#[derive(Parser)]
#[command(name = "spindle", version, about = "OpenAI-compatible LLM inference server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines on standard error are written: text, or json (one object a line).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Download a model into the cache ($SPINDLE_HOME, default ~/.cache/spindle).
    Pull {
        /// Catalogue name, e.g. smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m.
        name: Option<String>,
        /// List the catalogue instead.
        #[arg(long)]
        list: bool,
    },
    /// Generate text from a prompt, printing it as it is produced.
    Generate(generate::GenerateArgs),
    /// Serve the OpenAI API (pulls the default model on first run).
    // Boxed: its many flags make it the one large variant.
    Serve(Box<serve::ServeArgs>),
    /// Measure prefill and decode speed in-process, or, with a subcommand (agentic,
    /// conversation, burst, quality, speculation), the agent benchmark panel against any
    /// OpenAI-compatible server.
    Bench(bench_agent::BenchCli),
    /// Pass/fail checks of server behaviour against any OpenAI-compatible server: stop strings,
    /// max_tokens, logprobs, reasoning, tool calls, structured output, prefix cache, seed
    /// parity, concurrency isolation, error codes, CORS and usage accounting.
    Eval(spindle_bench::cli::eval::EvalArgs),
    /// Run a coding agent (claude, codex, qwen, opencode) against this server: uses the one
    /// listening on --host/--port or starts one for --model, and stops it when the agent exits.
    /// Arguments after `--` go to the agent.
    Launch(launch::LaunchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    use_small_pages();
    memory::purge_freed_memory_soon();
    match run(cli.command, cli.log_format) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, log_format: logging::LogFormat) -> anyhow::Result<ExitCode> {
    let done = match command {
        // The agent's exit status is launch's.
        Command::Launch(args) => return launch::run(args),
        Command::Pull { name, list } => pull(name, list),
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench_agent::run(args),
        Command::Eval(args) => spindle_bench::cli::eval::run(args, &started_model::resolve),
        Command::Serve(args) => serve::run(*args, log_format),
    };
    done.map(|()| ExitCode::SUCCESS)
}

fn pull(name: Option<String>, list: bool) -> anyhow::Result<()> {
    if list {
        for entry in spindle_hub::catalogue() {
            println!("{}", entry.name);
        }
        return Ok(());
    }
    let name = name.unwrap_or_else(|| spindle_hub::DEFAULT_MODEL.to_string());
    let path = spindle_hub::pull(&name, &spindle_hub::spindle_home())?;
    println!("{}", path.display());
    Ok(())
}

/// Sets the number of CPU threads the tensor kernels use; must run before the first kernel.
fn set_threads(threads: Option<usize>) {
    // SAFETY (both): called at start-up, before any other thread exists.
    if let Some(n) = threads {
        std::env::set_var("RAYON_NUM_THREADS", n.max(1).to_string());
    }
    // candle's own pool waits for its workers by spinning: when another process takes a core,
    // each of the thousands of small products a step runs stalls (decode fell from ~35 to ~2
    // tokens/s at load 4 on 2 cores). candle then runs on the calling thread, and our rayon
    // pool, which sleeps when idle, spreads the work instead (experts, heads, weight rows).
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
