//! One streamed chat call of the speculation panel, timed for decode speed: the arrival of the
//! first and of the last chunk that carries a token. The panel's decode speed is tokens after
//! the first over the time between them, so neither the prompt's reading nor the closing
//! chunks (usage, `[DONE]`) count. It also keeps the answer (text, and tool-call arguments
//! with their JSON strings read) to compare runs and score fidelity, and the last `timings`
//! object (llama-server's drafting figures).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::BenchError;
use crate::sse::{parse_payload, Payload, SseDecoder};
use crate::Client;

/// What one call gave.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Streamed {
    /// Since the request was sent.
    pub first_token: Option<Duration>,
    pub last_token: Option<Duration>,
    /// From `usage`, else the chunks that carried a token.
    pub completion_tokens: u32,
    /// The answer text followed by each tool call's name and arguments (see [`Streamed::reply`]).
    pub content: String,
    /// Each tool call's name and its argument fragments joined, by index.
    pub tool_calls: Vec<(String, String)>,
    /// The last `timings` object seen.
    pub timings: Option<Value>,
}

impl Streamed {
    /// Completion tokens after the first over the time from the first to the last token chunk;
    /// NaN for fewer than two tokens or no time between them.
    pub fn decode_tokens_per_second(&self) -> f64 {
        let (Some(first), Some(last)) = (self.first_token, self.last_token) else {
            return f64::NAN;
        };
        let seconds = last.saturating_sub(first).as_secs_f64();
        if self.completion_tokens < 2 || seconds <= 0.0 {
            return f64::NAN;
        }
        f64::from(self.completion_tokens - 1) / seconds
    }

    /// The answer as text: the content, then per tool call its name and each argument on its
    /// own lines (JSON strings unescaped, so a quoted snippet reads as the source it copies).
    pub fn reply(&self) -> String {
        let mut out = self.content.clone();
        for (name, arguments) in &self.tool_calls {
            out.push('\n');
            out.push_str(name);
            match serde_json::from_str::<Value>(arguments) {
                Ok(Value::Object(fields)) => {
                    for value in fields.values() {
                        out.push('\n');
                        match value {
                            Value::String(s) => out.push_str(s),
                            other => out.push_str(&other.to_string()),
                        }
                    }
                }
                _ => {
                    out.push('\n');
                    out.push_str(arguments);
                }
            }
        }
        out
    }

    /// Takes one `data:` payload that arrived `at` after the request; `Ok(true)` at `[DONE]`.
    pub fn on_payload(&mut self, payload: &str, at: Duration) -> Result<bool, BenchError> {
        let chunk = match parse_payload(payload)? {
            Payload::Done => return Ok(true),
            Payload::Chunk(chunk) => chunk,
        };
        if chunk.token {
            self.first_token.get_or_insert(at);
            self.last_token = Some(at);
            self.completion_tokens += 1;
        }
        if let Some(usage) = chunk.usage {
            // Counted chunks stand in only until the server says.
            self.completion_tokens = usage.completion_tokens;
        }
        self.content.push_str(&chunk.content);
        // parse_payload read it already; what it does not keep is read here.
        let value: Value = serde_json::from_str(payload).unwrap_or_default();
        if value.get("timings").is_some_and(Value::is_object) {
            self.timings = Some(value["timings"].clone());
        }
        for choice in value["choices"].as_array().into_iter().flatten() {
            for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().unwrap_or(0) as usize;
                if self.tool_calls.len() <= index {
                    self.tool_calls.resize(index + 1, Default::default());
                }
                let (name, arguments) = &mut self.tool_calls[index];
                name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        Ok(false)
    }
}

/// Sends `body` (the model added, streaming with usage asked for) and reads the whole stream.
pub async fn streamed_chat(client: &Client, body: Value) -> Result<Streamed, BenchError> {
    let mut body = client.with_model(body);
    body["stream"] = Value::Bool(true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let start = Instant::now();
    let mut response =
        client.request(reqwest::Method::POST, "/v1/chat/completions").json(&body).send().await?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(BenchError::Status { status: status.as_u16(), body });
    }
    let (mut decoder, mut streamed, mut done) = (SseDecoder::default(), Streamed::default(), false);
    while let Some(bytes) = response.chunk().await? {
        let at = start.elapsed();
        for payload in decoder.push(&bytes) {
            done |= streamed.on_payload(&payload, at)?;
        }
    }
    if let Some(payload) = decoder.finish() {
        done |= streamed.on_payload(&payload, start.elapsed())?;
    }
    if !done && streamed.first_token.is_none() {
        return Err(BenchError::Truncated);
    }
    Ok(streamed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn decode_speed_runs_from_the_first_to_the_last_token() {
        let mut s = Streamed::default();
        let feed = [
            (r#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#, 10),
            (r#"{"choices":[{"delta":{"content":"fn"}}]}"#, 500),
            (r#"{"choices":[{"delta":{"content":" main"}}]}"#, 600),
            (r#"{"choices":[{"delta":{"content":"()"}}]}"#, 1500),
            (r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#, 1600),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":10,"total_tokens":19},
                "timings":{"predicted_n":10,"draft_n":12,"draft_n_accepted":7}}"#,
                1700,
            ),
        ];
        for (payload, at) in feed {
            assert!(!s.on_payload(payload, ms(at)).unwrap());
        }
        assert!(s.on_payload("[DONE]", ms(1800)).unwrap());
        assert_eq!(
            (s.first_token, s.last_token, s.completion_tokens),
            (Some(ms(500)), Some(ms(1500)), 10)
        );
        // Nine tokens after the first in one second; the closing chunks do not count.
        assert_eq!(s.decode_tokens_per_second(), 9.0);
        assert_eq!(s.reply(), "fn main()");
        assert_eq!(s.timings.as_ref().unwrap()["draft_n_accepted"], 7);
    }

    #[test]
    fn tool_call_fragments_join_and_their_strings_read_as_source() {
        let mut s = Streamed::default();
        let parts = [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"edit_file","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"src/a.rs\", "}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"old_string\": \"let x = 1;\\nlet y = 2;\"}"}}]}}]}"#,
        ];
        for (i, p) in parts.iter().enumerate() {
            s.on_payload(p, ms(i as u64)).unwrap();
        }
        assert_eq!(s.tool_calls.len(), 1);
        let mut lines: Vec<String> = s.reply().lines().map(String::from).collect();
        lines.sort();
        assert_eq!(lines, ["", "edit_file", "let x = 1;", "let y = 2;", "src/a.rs"]);
        // Without usage, the token chunks count.
        assert_eq!(s.completion_tokens, 3);
        s.tool_calls[0].1.truncate(10);
        assert!(s.reply().ends_with("{\"path\": \""), "unparsed arguments stay as they are");
    }

    #[test]
    fn too_few_tokens_have_no_speed() {
        let mut s = Streamed::default();
        s.on_payload(r#"{"choices":[{"delta":{"content":"a"}}]}"#, ms(5)).unwrap();
        assert!(s.decode_tokens_per_second().is_nan());
        assert!(Streamed::default().decode_tokens_per_second().is_nan());
        assert!(s.on_payload(r#"{"error":{"message":"boom"}}"#, ms(6)).is_err());
    }
}
