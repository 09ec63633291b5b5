//! What both test binaries of the server read, the in-process routes and the real engine: the
//! `data:` payloads of a server-sent-event body, and a Chat Completions stream parsed with its
//! framing checked. Included by each binary's `common` module.

use serde_json::Value;

/// The `data:` payloads of a server-sent-event body, in order (`[DONE]` included).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            event.lines().find_map(|l| l.strip_prefix("data:")).map(|d| d.trim_start().to_string())
        })
        .collect()
}

/// Content, reasoning and finish reason of a streamed chat response, checking the framing:
/// a role chunk first, `[DONE]` last, one finish reason.
pub struct Streamed {
    pub content: String,
    pub reasoning: String,
    pub finish_reason: String,
    pub chunks: Vec<Value>,
    pub usage: Option<Value>,
}

pub fn parse_chat_stream(data: &[String]) -> Streamed {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut out = Streamed {
        content: String::new(),
        reasoning: String::new(),
        finish_reason: String::new(),
        chunks: chunks.clone(),
        usage: None,
    };
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            out.usage = Some(usage.clone());
        }
        let Some(choice) = chunk["choices"].get(0) else { continue };
        out.content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        out.reasoning.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
        if let Some(reason) = choice["finish_reason"].as_str() {
            assert!(out.finish_reason.is_empty(), "two finish reasons");
            out.finish_reason = reason.to_string();
        }
    }
    out
}
