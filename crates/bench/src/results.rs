//! Everything one `spindle bench` panel measured, as the JSON and HTML writers read it.

use crate::agentic::AgenticPanel;
use crate::burst::BurstLevel;
use crate::conversation::ConversationRun;
use crate::gates::Gates;
use crate::quality::QualityReport;
use crate::speculation::SpeculationPanel;
use crate::workload::TokenCount;

/// The server and the settings of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// `agentic`, `conversation`, `burst`, `quality` or `speculation`.
    pub panel: String,
    pub server: String,
    pub model: Option<String>,
    pub seed: u64,
    pub max_tokens: u32,
    /// The shared system prompt: characters and tokens.
    pub system_chars: usize,
    pub system_tokens: TokenCount,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
}

/// The measurements of one run: the panel that ran, and the gates over it.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub agentic: Option<AgenticPanel>,
    pub bursts: Vec<BurstLevel>,
    pub conversation: Option<ConversationRun>,
    pub quality: Option<QualityReport>,
    pub speculation: Option<SpeculationPanel>,
    pub gates: Option<Gates>,
}

impl Results {
    /// Completion tokens of every measured call (warm-ups, a burst's lone and warming calls,
    /// the quality probes and the speculation workloads, whose answers differ by design, left
    /// out), for `early_stop`.
    pub fn completions(&self) -> Vec<u32> {
        let agentic = self.agentic.iter().flat_map(|p| p.runs.iter().flatten());
        let bursts = self.bursts.iter().flat_map(|l| &l.runs).flat_map(|r| r.succeeded());
        let turns = self.conversation.iter().flat_map(|c| &c.turns);
        agentic
            .map(|p| p.measurement.completion_tokens)
            .chain(bursts.map(|m| m.completion_tokens))
            .chain(turns.map(|t| t.measurement.completion_tokens))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agentic::tests::agent_phases;
    use crate::burst::tests::burst;

    #[test]
    fn completions_of_every_measured_call() {
        let results = Results {
            agentic: Some(AgenticPanel { runs: vec![agent_phases()] }),
            bursts: vec![BurstLevel { concurrency: 4, runs: vec![burst()] }],
            ..Results::default()
        };
        // Five phases of 16; the burst's three successful calls (16, 16, 8), not its warm-up,
        // lone call or refused call.
        assert_eq!(results.completions(), [16, 16, 16, 16, 16, 16, 16, 8]);
    }
}
