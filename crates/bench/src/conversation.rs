//! A growing agent conversation (asiai's proposed endurance workload): every call sends the
//! previous call's messages again, then an assistant tool call and the tool's result, as a
//! coding agent does 60-80 times per task, the context growing from `start_tokens` to
//! `end_tokens`. A server that resumes where the previous call ended reads only the new turn
//! each call; one that resumes only after the system prompt reads the whole history again, so
//! its cost per call grows with the conversation.
//!
//! The tool calls are scripted ([`tool_call`]), not the model's: every server sees the same
//! prompts, whatever it answers.

use serde_json::{json, Value};

use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::{tool_call, tool_result, user_message};
use crate::sse::Measurement;
use crate::stats::{median, slope};
use crate::workload::{TokenCount, Workload};

/// One call of the conversation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    /// From 0.
    pub index: usize,
    pub measurement: Measurement,
}

impl Turn {
    /// Prompt tokens the server read rather than took from its cache.
    pub fn read(&self) -> u32 {
        self.measurement.read_tokens()
    }
}

/// What one conversation sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationOptions {
    pub salt: u64,
    pub turns: usize,
    /// Prompt tokens of the first call: the system prompt.
    pub start_tokens: usize,
    /// Prompt tokens of the last call; each turn adds `(end - start) / turns`.
    pub end_tokens: usize,
    pub max_tokens: u32,
}

impl ConversationOptions {
    /// Tokens each turn's tool call and result add.
    pub fn turn_tokens(&self) -> usize {
        self.end_tokens.saturating_sub(self.start_tokens) / self.turns.max(1)
    }
}

/// A finished conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationRun {
    pub system_chars: usize,
    pub system_tokens: TokenCount,
    pub turns: Vec<Turn>,
    /// Why the conversation ended before its last turn (e.g. the server's context ran out).
    pub stopped: Option<String>,
}

impl ConversationRun {
    /// Seconds of all calls together.
    pub fn total_seconds(&self) -> f64 {
        self.turns.iter().map(|t| t.measurement.latency.as_secs_f64()).sum()
    }

    /// `(prompt, cached, read)` tokens summed over the turns.
    pub fn total_tokens(&self) -> (u64, u64, u64) {
        self.turns.iter().fold((0, 0, 0), |(p, c, r), t| {
            let m = &t.measurement;
            (
                p + u64::from(m.prompt_tokens),
                c + u64::from(m.cached_tokens),
                r + u64::from(t.read()),
            )
        })
    }

    /// How a call's latency grows with its prompt over the calls after the first (which reads
    /// the whole system prompt on any server): the least-squares slope in milliseconds per
    /// 1,000 prompt tokens, near 0 when each call reads only its new turn.
    pub fn latency_growth_ms_per_1k(&self) -> Option<f64> {
        self.growth(|m| m.latency.as_secs_f64())
    }

    /// The same slope for the time to first token.
    pub fn ttft_growth_ms_per_1k(&self) -> Option<f64> {
        self.growth(|m| m.ttft.as_secs_f64())
    }

    fn growth(&self, seconds: fn(&Measurement) -> f64) -> Option<f64> {
        let points: Vec<(f64, f64)> = self
            .turns
            .iter()
            .skip(1)
            .map(|t| {
                (f64::from(t.measurement.prompt_tokens) / 1000.0, seconds(&t.measurement) * 1000.0)
            })
            .collect();
        slope(&points)
    }

    /// Median latency of the last quarter of the calls after the first over that of the first
    /// quarter: how much dearer a deep call is than a shallow one (1 when depth costs nothing).
    pub fn depth_cost_ratio(&self) -> Option<f64> {
        let rest: Vec<_> = self.turns.iter().skip(1).map(|t| t.measurement.latency).collect();
        let quarter = rest.len() / 4;
        if quarter == 0 {
            return None;
        }
        let first = median(&rest[..quarter])?;
        let last = median(&rest[rest.len() - quarter..])?;
        Some(last.as_secs_f64() / first.as_secs_f64())
    }
}

/// Runs the conversation: a warm-up, then `options.turns` calls, each followed by an assistant
/// tool call and its result of [`ConversationOptions::turn_tokens`]. `progress` hears each turn.
/// A failed call ends the conversation with the turns so far (a server whose context is too
/// short for the last turns still shows how the first ones grew); a failed warm-up fails it.
pub async fn run_conversation(
    client: &Client,
    options: &ConversationOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ConversationRun, BenchError> {
    let workload =
        Workload::prepare(client, options.salt, options.start_tokens, options.max_tokens).await;
    workload.warm_up(client).await?;
    let turn_chars = (options.turn_tokens() as f64 * workload.chars_per_token()).round() as usize;
    let mut messages = vec![
        json!({"role": "system", "content": workload.system}),
        json!({"role": "user", "content": user_message(0)}),
    ];
    let mut turns = Vec::with_capacity(options.turns);
    for index in 0..options.turns {
        let history = Value::Array(messages.clone());
        let measurement = match client.chat_messages(&history, options.max_tokens).await {
            Ok((measurement, _)) => measurement,
            Err(e) => {
                let (system_chars, system_tokens) = (workload.system.len(), workload.system_tokens);
                let stopped = Some(format!("turn {index}: {e}"));
                return Ok(ConversationRun { system_chars, system_tokens, turns, stopped });
            }
        };
        progress(&format!(
            "conversation turn {}/{}: {} prompt tokens, {} cached, {:.0} ms",
            index + 1,
            options.turns,
            measurement.prompt_tokens,
            measurement.cached_tokens,
            measurement.latency.as_secs_f64() * 1000.0
        ));
        turns.push(Turn { index, measurement });
        messages.extend(tool_turn(index, turn_chars));
    }
    let (system_chars, system_tokens) = (workload.system.len(), workload.system_tokens);
    Ok(ConversationRun { system_chars, system_tokens, turns, stopped: None })
}

/// The assistant's tool call of turn `index` and the tool's answer of `chars` characters.
fn tool_turn(index: usize, chars: usize) -> [Value; 2] {
    let (name, arguments) = tool_call(index);
    let id = format!("call_{index}");
    [
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ]}),
        json!({"role": "tool", "tool_call_id": id, "content": tool_result(index, chars)}),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn turn(index: usize, prompt: u32, cached: u32, ttft_ms: u64) -> Turn {
        let measurement = Measurement {
            ttft: Duration::from_millis(ttft_ms),
            latency: Duration::from_millis(ttft_ms + 100),
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: 8,
        };
        Turn { index, measurement }
    }

    fn run(turns: Vec<Turn>) -> ConversationRun {
        ConversationRun {
            system_chars: 4000,
            system_tokens: TokenCount::Estimated(1000),
            turns,
            stopped: None,
        }
    }

    #[test]
    fn growth_is_the_slope_of_time_over_prompt_length() {
        // Re-reading everything at 100 tokens/s: 10 s more per 1,000 tokens.
        let rereads = run((0..4)
            .map(|i| turn(i, 1000 * (i as u32 + 1), 0, 10_000 * (i as u64 + 1)))
            .collect());
        assert!((rereads.ttft_growth_ms_per_1k().unwrap() - 10_000.0).abs() < 1e-6);
        assert!((rereads.latency_growth_ms_per_1k().unwrap() - 10_000.0).abs() < 1e-6);
        // Reading only the new turn after a slow cold first call: flat.
        let resumed = run((0..4)
            .map(|i| {
                let ttft = if i == 0 { 30_000 } else { 1_000 };
                turn(i, 1000 * (i as u32 + 1), 1000 * i as u32, ttft)
            })
            .collect());
        assert!(resumed.ttft_growth_ms_per_1k().unwrap().abs() < 1e-6);
        assert_eq!(resumed.turns[3].read(), 1000);
        assert_eq!(resumed.total_tokens(), (10_000, 6000, 4000));
        assert!((resumed.total_seconds() - 33.4).abs() < 1e-9);
        assert_eq!(run(resumed.turns[..2].to_vec()).ttft_growth_ms_per_1k(), None);
    }

    #[test]
    fn depth_cost_compares_the_last_quarter_with_the_first() {
        // Turn 0 is left out; turns 1..=8 take 1..=8 s (+0.1 s): quarters of 2.
        let growing = run((0..9).map(|i| turn(i, 1000, 0, 1000 * i as u64)).collect());
        let ratio = growing.depth_cost_ratio().unwrap();
        assert!((ratio - 7.6 / 1.6).abs() < 1e-9, "{ratio}");
        let flat = run((0..9).map(|i| turn(i, 1000, 0, 500)).collect());
        assert_eq!(flat.depth_cost_ratio(), Some(1.0));
        assert_eq!(run(flat.turns[..4].to_vec()).depth_cost_ratio(), None);
    }

    #[test]
    fn a_tool_turn_is_a_call_and_its_answer() {
        let [call, result] = tool_turn(1, 300);
        assert_eq!(call["role"], "assistant");
        assert_eq!(call["tool_calls"][0]["id"], "call_1");
        assert_eq!(call["tool_calls"][0]["function"]["name"], "grep");
        assert_eq!(result["role"], "tool");
        assert_eq!(result["tool_call_id"], "call_1");
        assert!(result["content"].as_str().unwrap().len() >= 300);
    }
}
