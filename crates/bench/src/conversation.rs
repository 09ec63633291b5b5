//! A growing agent conversation: every call sends the previous call's messages again, then the
//! model's reply to it and a tool result of about `turn_tokens` tokens, as a coding agent does
//! 60-80 times per task. A server that resumes where the previous call ended reads only the new
//! turn each call; one that resumes only after the system prompt reads the whole history again,
//! so its cost per call grows with the conversation.

use serde_json::{json, Value};

use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::{tool_result, user_message};
use crate::sse::Measurement;

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
        self.measurement.prompt_tokens.saturating_sub(self.measurement.cached_tokens)
    }
}

/// Runs `turns` calls on `system`, each `max_tokens` at most, appending the reply and a tool
/// result of `turn_chars` characters after each.
pub async fn conversation(
    client: &Client,
    system: &str,
    turns: usize,
    turn_chars: usize,
    max_tokens: u32,
) -> Result<Vec<Turn>, BenchError> {
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": user_message(0)}),
    ];
    let mut done = Vec::with_capacity(turns);
    for index in 0..turns {
        let history = Value::Array(messages.clone());
        let (measurement, reply) = client.chat_messages(&history, max_tokens).await?;
        done.push(Turn { index, measurement });
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": tool_result(index, turn_chars)}));
    }
    Ok(done)
}

/// How the time to first token grows with the prompt over the calls after the first (which
/// reads the whole system prompt on any server): the least-squares slope in milliseconds per
/// 1,000 prompt tokens (near 0 when each call reads only its new turn and depth costs nothing).
/// `None` for fewer than two such calls or prompts all of one length.
pub fn ttft_growth_ms_per_1k(turns: &[Turn]) -> Option<f64> {
    let points: Vec<(f64, f64)> = turns
        .iter()
        .skip(1)
        .map(|t| {
            let m = &t.measurement;
            (f64::from(m.prompt_tokens) / 1000.0, m.ttft.as_secs_f64() * 1000.0)
        })
        .collect();
    let n = points.len() as f64;
    let (mean_x, mean_y) =
        (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| sxy / sxx)
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

    #[test]
    fn growth_is_the_slope_of_ttft_over_prompt_length() {
        // Re-reading everything at 100 tokens/s: 10 s more per 1,000 tokens.
        let rereads: Vec<Turn> =
            (0..4).map(|i| turn(i, 1000 * (i as u32 + 1), 0, 10_000 * (i as u64 + 1))).collect();
        assert!((ttft_growth_ms_per_1k(&rereads).unwrap() - 10_000.0).abs() < 1e-6);
        // Reading only the new turn after a slow cold first call: flat.
        let resumed: Vec<Turn> = (0..4)
            .map(|i| {
                let ttft = if i == 0 { 30_000 } else { 1_000 };
                turn(i, 1000 * (i as u32 + 1), 1000 * i as u32, ttft)
            })
            .collect();
        assert!(ttft_growth_ms_per_1k(&resumed).unwrap().abs() < 1e-6);
        assert_eq!(resumed[3].read(), 1000);
        assert_eq!(ttft_growth_ms_per_1k(&resumed[..2]), None);
    }
}
