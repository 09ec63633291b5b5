//! Reading a streamed chat completion: server-sent events split into `data:` payloads, each
//! payload classified, and the timings of one call gathered from them.
//!
//! Time to first token is the arrival of the first chunk that carries text (`content` or
//! `reasoning_content`) or a tool call; a call that produces none (an immediate end of
//! sequence) takes the time of its finish chunk instead.

use std::time::Duration;

use spindle_api::Usage;

use crate::error::BenchError;

/// Splits a byte stream into the `data` of each event (WHATWG server-sent events: lines end
/// in `\n` or `\r\n`, a blank line ends an event, `:` starts a comment, several `data:` lines
/// are joined with `\n`).
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes as they arrive; returns the events they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            if line.is_empty() {
                events.extend(self.data.take());
            } else if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_string()),
                }
            }
            // Comments (`:`) and other fields (`event:`, `id:`, `retry:`) carry nothing we use.
        }
        events
    }

    /// The event left open when the stream ended without a final blank line.
    pub fn finish(&mut self) -> Option<String> {
        if !self.line.is_empty() {
            self.push(b"\n");
        }
        self.data.take()
    }
}

/// What one `data:` payload of a chat completion stream says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// It carries generated text or a tool call.
    pub token: bool,
    /// A choice finished in it.
    pub finished: bool,
    pub usage: Option<Usage>,
    /// The answer text it carries (`content` deltas).
    pub content: String,
}

/// One payload: `[DONE]`, or a chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Done,
    Chunk(ChunkInfo),
}

/// Classifies a payload. Only the fields used are read, so any OpenAI-compatible server's
/// extras pass; an `{"error": …}` payload becomes [`BenchError::StreamError`].
pub fn parse_payload(payload: &str) -> Result<Payload, BenchError> {
    if payload.trim() == "[DONE]" {
        return Ok(Payload::Done);
    }
    let value: serde_json::Value = serde_json::from_str(payload)
        .map_err(|e| BenchError::BadPayload(format!("{e}: {payload}")))?;
    if let Some(error) = value.get("error") {
        let message = error
            .get("message")
            .and_then(|m| m.as_str())
            .map_or_else(|| error.to_string(), str::to_string);
        return Err(BenchError::StreamError(message));
    }
    let mut info = ChunkInfo::default();
    for choice in value.get("choices").and_then(|c| c.as_array()).into_iter().flatten() {
        let delta = &choice["delta"];
        let text =
            |key: &str| delta.get(key).and_then(|t| t.as_str()).is_some_and(|t| !t.is_empty());
        let tools =
            delta.get("tool_calls").and_then(|t| t.as_array()).is_some_and(|t| !t.is_empty());
        info.token |= text("content") || text("reasoning_content") || tools;
        info.content.extend(delta.get("content").and_then(|t| t.as_str()));
        info.finished |= choice.get("finish_reason").is_some_and(|r| !r.is_null());
    }
    if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
        let usage = serde_json::from_value(usage.clone())
            .map_err(|e| BenchError::BadPayload(format!("usage: {e}")))?;
        info.usage = Some(usage);
    }
    Ok(Payload::Chunk(info))
}

/// The measurements of one finished call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Time to the first token (see the module docs).
    pub ttft: Duration,
    /// Time to the end of the stream.
    pub latency: Duration,
    pub prompt_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens`; 0 when the server does not say.
    pub cached_tokens: u32,
    /// From `usage`, else the number of chunks that carried a token.
    pub completion_tokens: u32,
}

impl Measurement {
    /// Prompt tokens the server read rather than took from its cache.
    pub fn read_tokens(&self) -> u32 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }

    /// Prompt tokens read over the time to first token (NaN without them).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        match self.read_tokens() {
            0 => f64::NAN,
            n => f64::from(n) / self.ttft.as_secs_f64(),
        }
    }

    /// Completion tokens after the first over the time they took (NaN for fewer than two).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let decode = self.latency.saturating_sub(self.ttft).as_secs_f64();
        match self.completion_tokens {
            0 | 1 => f64::NAN,
            _ if decode <= 0.0 => f64::NAN,
            n => f64::from(n - 1) / decode,
        }
    }
}

/// Gathers a [`Measurement`] from payloads and the times they arrived (since the request was
/// sent).
#[derive(Debug, Default)]
pub struct CallTracker {
    first_token: Option<Duration>,
    finish: Option<Duration>,
    token_chunks: u32,
    usage: Option<Usage>,
    done: bool,
    reply: String,
}

impl CallTracker {
    /// The answer text so far.
    pub fn reply(&self) -> &str {
        &self.reply
    }

    pub fn on_payload(&mut self, payload: &str, at: Duration) -> Result<(), BenchError> {
        match parse_payload(payload)? {
            Payload::Done => self.done = true,
            Payload::Chunk(chunk) => {
                if chunk.token {
                    self.token_chunks += 1;
                    self.first_token.get_or_insert(at);
                }
                if chunk.finished {
                    self.finish.get_or_insert(at);
                }
                if chunk.usage.is_some() {
                    self.usage = chunk.usage;
                }
                self.reply += &chunk.content;
            }
        }
        Ok(())
    }

    /// The measurement of a stream that ended at `end`; an error if it never finished.
    pub fn finish(self, end: Duration) -> Result<Measurement, BenchError> {
        let first = self.first_token.or(self.finish).ok_or(BenchError::Truncated)?;
        if !self.done && self.finish.is_none() {
            return Err(BenchError::Truncated);
        }
        let usage = self.usage.unwrap_or_default();
        Ok(Measurement {
            ttft: first,
            latency: end,
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.prompt_tokens_details.cached_tokens,
            completion_tokens: if self.usage.is_some() {
                usage.completion_tokens
            } else {
                self.token_chunks
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_splits_events_across_pushes_and_line_endings() {
        let mut d = SseDecoder::default();
        assert_eq!(d.push(b"data: {\"a\":1}\n"), Vec::<String>::new());
        assert_eq!(d.push(b"\ndata: x"), vec!["{\"a\":1}".to_string()]);
        assert_eq!(
            d.push(b"y\r\n\r\n: keep-alive\n\ndata:[DONE]\n\n"),
            vec!["xy".to_string(), "[DONE]".to_string()]
        );
        assert_eq!(d.finish(), None);
    }

    #[test]
    fn decoder_joins_data_lines_and_ignores_other_fields() {
        let mut d = SseDecoder::default();
        let events = d.push(b"event: message\nid: 7\ndata: one\ndata:  two\n\n");
        assert_eq!(events, vec!["one\n two".to_string()]);
    }

    #[test]
    fn decoder_finish_returns_an_unterminated_event() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: last").is_empty());
        assert_eq!(d.finish(), Some("last".to_string()));
    }

    #[test]
    fn payload_kinds() {
        assert_eq!(parse_payload("[DONE]").unwrap(), Payload::Done);
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(parse_payload(role).unwrap(), Payload::Chunk(ChunkInfo::default()));
        let text = r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
        assert_eq!(
            parse_payload(text).unwrap(),
            Payload::Chunk(ChunkInfo { token: true, content: "Hi".into(), ..Default::default() })
        );
        let think = r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#;
        assert_eq!(
            parse_payload(think).unwrap(),
            Payload::Chunk(ChunkInfo { token: true, ..Default::default() })
        );
        let tool = r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#;
        assert_eq!(
            parse_payload(tool).unwrap(),
            Payload::Chunk(ChunkInfo { token: true, ..Default::default() })
        );
        let end = r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#;
        assert_eq!(
            parse_payload(end).unwrap(),
            Payload::Chunk(ChunkInfo { finished: true, ..Default::default() })
        );
    }

    #[test]
    fn usage_with_and_without_details() {
        let full = r#"{"choices":[],"usage":{"prompt_tokens":600,"completion_tokens":16,"total_tokens":616,
            "prompt_tokens_details":{"cached_tokens":512}}}"#;
        let Payload::Chunk(info) = parse_payload(full).unwrap() else { panic!("a chunk") };
        let usage = info.usage.unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.prompt_tokens_details.cached_tokens
            ),
            (600, 16, 512)
        );
        let bare =
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
        let Payload::Chunk(info) = parse_payload(bare).unwrap() else { panic!("a chunk") };
        assert_eq!(info.usage.unwrap().prompt_tokens_details.cached_tokens, 0);
        let null = r#"{"choices":[],"usage":null}"#;
        assert_eq!(parse_payload(null).unwrap(), Payload::Chunk(ChunkInfo::default()));
    }

    #[test]
    fn error_and_garbage_payloads() {
        let err = r#"{"error":{"message":"out of memory","type":"server_error"}}"#;
        assert_eq!(
            parse_payload(err).unwrap_err().to_string(),
            "error event in the stream: out of memory"
        );
        assert!(matches!(parse_payload("not json"), Err(BenchError::BadPayload(_))));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn tracker_takes_the_first_token_and_usage() {
        let mut t = CallTracker::default();
        t.on_payload(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#, ms(5))
            .unwrap();
        t.on_payload(r#"{"choices":[{"delta":{"content":"a"}}]}"#, ms(40)).unwrap();
        t.on_payload(r#"{"choices":[{"delta":{"content":"b"}}]}"#, ms(50)).unwrap();
        t.on_payload(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#, ms(51)).unwrap();
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":700,"completion_tokens":2,"total_tokens":702,
            "prompt_tokens_details":{"cached_tokens":650}}}"#;
        t.on_payload(usage, ms(52)).unwrap();
        t.on_payload("[DONE]", ms(53)).unwrap();
        let m = t.finish(ms(54)).unwrap();
        assert_eq!(
            m,
            Measurement {
                ttft: ms(40),
                latency: ms(54),
                prompt_tokens: 700,
                cached_tokens: 650,
                completion_tokens: 2
            }
        );
    }

    #[test]
    fn speeds_of_a_measurement() {
        let m = Measurement {
            ttft: ms(500),
            latency: ms(1500),
            prompt_tokens: 700,
            cached_tokens: 600,
            completion_tokens: 11,
        };
        assert_eq!(m.read_tokens(), 100);
        assert_eq!(m.prefill_tokens_per_second(), 200.0);
        assert_eq!(m.decode_tokens_per_second(), 10.0);
        let all_cached = Measurement { cached_tokens: 700, completion_tokens: 1, ..m };
        assert!(all_cached.prefill_tokens_per_second().is_nan());
        assert!(all_cached.decode_tokens_per_second().is_nan());
    }

    #[test]
    fn tracker_without_tokens_or_usage() {
        let mut t = CallTracker::default();
        t.on_payload(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, ms(5)).unwrap();
        t.on_payload(r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#, ms(30)).unwrap();
        let m = t.finish(ms(31)).unwrap();
        assert_eq!(
            (m.ttft, m.latency, m.prompt_tokens, m.completion_tokens),
            (ms(30), ms(31), 0, 0)
        );
    }

    #[test]
    fn tracker_rejects_a_stream_that_stopped_mid_way() {
        let mut t = CallTracker::default();
        t.on_payload(r#"{"choices":[{"delta":{"content":"a"}}]}"#, ms(5)).unwrap();
        assert!(matches!(t.finish(ms(6)), Err(BenchError::Truncated)));
        assert!(matches!(CallTracker::default().finish(ms(1)), Err(BenchError::Truncated)));
    }
}
