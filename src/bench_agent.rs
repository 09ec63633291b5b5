//! `spindle bench`: without a subcommand, the in-process prefill and decode speed of models
//! (`src/bench.rs`); with one, a panel of the coding-agent workload against any
//! OpenAI-compatible server (`spindle_bench::cli`).

use clap::Args;
use spindle_bench::cli::{run_panel_command, Panel};

/// `spindle bench [--models …]` or `spindle bench <panel> …`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCli {
    #[command(subcommand)]
    panel: Option<Panel>,
    #[command(flatten)]
    speed: crate::bench::BenchArgs,
}

pub fn run(cli: BenchCli) -> anyhow::Result<()> {
    match cli.panel {
        Some(panel) => run_panel_command(panel, &crate::started_model::resolve),
        None => crate::bench::run(cli.speed),
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
}
