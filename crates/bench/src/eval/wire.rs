//! The requests the eval sends and what it reads back: raw replies (status, headers, body) for
//! the protocol checks, and whole streamed chat completions gathered into one [`Streamed`]
//! (text, reasoning, tool calls assembled from their deltas, usage, token count).

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::Client;
use crate::error::BenchError;
use crate::sse::SseDecoder;

pub(crate) const CHAT: &str = "/v1/chat/completions";

/// A reply as it came: status and body text.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// `None` when the body is OpenAI's error shape (`{"error": {"message": "…", "type": …}}`
    /// with a non-empty message), else what is wrong with it.
    pub fn error_shape_problem(&self) -> Option<String> {
        let Some(body) = self.json() else {
            return Some(format!("body is not JSON: {}", clip(&self.body)));
        };
        let error = &body["error"];
        let message = error["message"].as_str().unwrap_or_default();
        if !error.is_object() || message.is_empty() || !error["type"].is_string() {
            return Some(format!("not {{\"error\": {{message, type}}}}: {}", clip(&self.body)));
        }
        None
    }

    /// `status N` plus the error shape's problem, if any.
    pub fn describe(&self) -> String {
        match self.error_shape_problem() {
            None => format!("status {}, OpenAI error shape", self.status),
            Some(problem) => format!("status {}, {problem}", self.status),
        }
    }
}

/// The first 160 characters of `text`, for messages.
pub(crate) fn clip(text: &str) -> String {
    let clipped: String = text.chars().take(160).collect();
    if clipped.len() < text.len() {
        clipped + "…"
    } else {
        clipped
    }
}

/// Sends `body` (raw bytes, sent as JSON) with the client's key, or with `key` when given.
pub(crate) async fn send(
    client: &Client,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    key: Option<&str>,
) -> Result<Reply, BenchError> {
    let mut request = match key {
        Some(key) => client.request_with_key(method, path, Some(key)),
        None => client.request(method, path),
    };
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok(Reply { status, body: response.text().await? })
}

/// Longest the huge-body exchange may take.
const RAW_TIMEOUT: Duration = Duration::from_secs(120);

/// POSTs `body` over a plain socket while reading the reply at the same time. A server that
/// refuses a body part-way (413) answers and closes before the body is all sent; an HTTP client
/// that stops at the failed write (reqwest does) then misses that answer, now and then, as the
/// close races the write. `https://` servers go through the client, race and all.
pub(crate) async fn send_while_reading(
    client: &Client,
    path: &str,
    body: Vec<u8>,
) -> Result<Reply, BenchError> {
    let url = reqwest::Url::parse(client.base_url())
        .map_err(|e| BenchError::BadPayload(format!("base URL: {e}")))?;
    let (Some(host), Some(port), "http") =
        (url.host_str(), url.port_or_known_default(), url.scheme())
    else {
        return send(client, Method::POST, path, Some(body), None).await;
    };
    let (mut reader, mut writer) = TcpStream::connect((host, port)).await?.into_split();
    let mut head = format!(
        "POST {}{path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n",
        url.path().trim_end_matches('/'),
        body.len()
    );
    if let Some(key) = client.api_key() {
        head += &format!("authorization: Bearer {key}\r\n");
    }
    head += "\r\n";
    let writing = tokio::spawn(async move {
        // A write cut short by the server's answer and close is what this is for.
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&body).await;
    });
    let mut data = Vec::new();
    let read = tokio::time::timeout(RAW_TIMEOUT, async {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => data.extend_from_slice(&buf[..n]),
                // A reset after the answer arrived ends it; before, it is the failure.
                Err(_) if !data.is_empty() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    writing.abort();
    match read {
        Ok(result) => result?,
        Err(_) => {
            let timeout = format!("no answer in {RAW_TIMEOUT:?}");
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, timeout).into());
        }
    }
    parse_reply(&data).ok_or_else(|| BenchError::BadPayload(clip(&String::from_utf8_lossy(&data))))
}

/// Status and body of a raw HTTP/1.1 reply (body by Content-Length, chunked, or to the end).
fn parse_reply(data: &[u8]) -> Option<Reply> {
    let split = data.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&data[..split]).to_ascii_lowercase();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let rest = &data[split + 4..];
    let header =
        |name: &str| head.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()));
    let body = if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        dechunk(rest)
    } else {
        let length = header("content-length:").and_then(|v| v.parse().ok());
        rest[..length.unwrap_or(rest.len()).min(rest.len())].to_vec()
    };
    Some(Reply { status, body: String::from_utf8_lossy(&body).into_owned() })
}

/// The payload of a chunked body (as much as arrived).
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&rest[..end]);
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16);
        let Ok(size @ 1..) = size else { break };
        let chunk = &rest[end + 2..];
        body.extend_from_slice(&chunk[..size.min(chunk.len())]);
        rest = chunk.get(size + 2..).unwrap_or_default();
    }
    body
}

/// One user message at temperature 0 with at most `max_tokens` tokens.
pub(crate) fn user_request(user: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// The first choice's message content of a non-streamed answer ("" when null).
pub(crate) fn content(answer: &Value) -> String {
    answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string()
}

pub(crate) fn finish_reason(answer: &Value) -> String {
    answer["choices"][0]["finish_reason"].as_str().unwrap_or("(none)").to_string()
}

/// One tool call put together from its streamed deltas.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StreamedCall {
    pub name: String,
    /// Every `arguments` fragment, concatenated in order.
    pub arguments: String,
}

/// A streamed chat completion, gathered.
#[derive(Debug, Default)]
pub(crate) struct Streamed {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<StreamedCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Value>,
    /// Chunks that carried content or reasoning text.
    pub text_chunks: usize,
    /// Chunks that carried reasoning text.
    pub reasoning_chunks: usize,
    /// Entries of `logprobs.content` over all chunks, when any chunk had logprobs: one per
    /// generated token.
    pub logprob_tokens: Option<usize>,
}

impl Streamed {
    /// Tokens the stream delivered: logprob entries when sent, else text chunks.
    pub fn token_count(&self) -> usize {
        self.logprob_tokens.unwrap_or(self.text_chunks)
    }

    fn take(&mut self, chunk: &Value) {
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = chunk["choices"].get(0) else { return };
        let delta = &choice["delta"];
        let text = |key: &str| delta[key].as_str().unwrap_or_default().to_string();
        let (content, reasoning) = (text("content"), text("reasoning_content"));
        self.text_chunks += usize::from(!content.is_empty() || !reasoning.is_empty());
        self.reasoning_chunks += usize::from(!reasoning.is_empty());
        self.content += &content;
        self.reasoning += &reasoning;
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if self.calls.len() <= index {
                self.calls.resize(index + 1, StreamedCall::default());
            }
            let function = &call["function"];
            self.calls[index].name += function["name"].as_str().unwrap_or_default();
            self.calls[index].arguments += function["arguments"].as_str().unwrap_or_default();
        }
        if let Some(entries) = choice["logprobs"]["content"].as_array() {
            *self.logprob_tokens.get_or_insert(0) += entries.len();
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_string());
        }
    }
}

/// A streamed chat call of `body` (stream and usage turned on, the model added), gathered.
pub(crate) async fn stream(client: &Client, body: Value) -> Result<Streamed, BenchError> {
    let mut body = client.with_model(body);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let mut response = client.request(Method::POST, CHAT).json(&body).send().await?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(BenchError::Status { status: status.as_u16(), body });
    }
    let (mut decoder, mut streamed, mut done) = (SseDecoder::default(), Streamed::default(), false);
    let mut take = |payload: String, streamed: &mut Streamed| -> Result<(), BenchError> {
        if payload.trim() == "[DONE]" {
            done = true;
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(&payload)
            .map_err(|e| BenchError::BadPayload(format!("{e}: {}", clip(&payload))))?;
        if let Some(error) = chunk.get("error") {
            return Err(BenchError::StreamError(error.to_string()));
        }
        streamed.take(&chunk);
        Ok(())
    };
    while let Some(bytes) = response.chunk().await? {
        for payload in decoder.push(&bytes) {
            take(payload, &mut streamed)?;
        }
    }
    if let Some(payload) = decoder.finish() {
        take(payload, &mut streamed)?;
    }
    if !done && streamed.finish_reason.is_none() {
        return Err(BenchError::Truncated);
    }
    Ok(streamed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_tool_calls_concatenate_their_fragments() {
        let mut s = Streamed::default();
        let call = |v: Value| json!({"choices": [{"index": 0, "delta": {"tool_calls": [v]}}]});
        s.take(&call(json!({"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}})));
        s.take(&call(json!({"index": 0, "function": {"arguments": "{\"x\":"}})));
        s.take(&call(json!({"index": 0, "function": {"arguments": "1}"}})));
        s.take(&call(json!({"index": 1, "function": {"name": "g", "arguments": "{}"}})));
        s.take(&json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}));
        assert_eq!(s.calls.len(), 2);
        assert_eq!((s.calls[0].name.as_str(), s.calls[0].arguments.as_str()), ("f", "{\"x\":1}"));
        assert_eq!(s.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn token_count_prefers_logprob_entries() {
        let mut s = Streamed::default();
        let lp = json!({"content": [{"token": "a"}, {"token": "b"}]});
        s.take(&json!({"choices": [{"delta": {"content": "ab"}, "logprobs": lp}]}));
        s.take(&json!({"choices": [{"delta": {"reasoning_content": "r"}}]}));
        assert_eq!((s.text_chunks, s.reasoning_chunks, s.token_count()), (2, 1, 2));
        assert_eq!((s.content.as_str(), s.reasoning.as_str()), ("ab", "r"));
    }

    #[test]
    fn raw_replies_by_length_chunks_or_to_the_end() {
        let by_length = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\n{\"a\"}extra";
        let reply = parse_reply(by_length).unwrap();
        assert_eq!((reply.status, reply.body.as_str()), (413, "{\"a\""));
        let chunked = b"HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_reply(chunked).unwrap().body, "abcde");
        let to_end = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        assert_eq!(parse_reply(to_end).unwrap().body, "all of it");
        assert!(parse_reply(b"HTTP/1.1 200 OK\r\n").is_none());
    }

    #[test]
    fn error_shapes() {
        let reply = |body: &str| Reply { status: 400, body: body.into() };
        assert_eq!(
            reply(r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#)
                .error_shape_problem(),
            None
        );
        assert!(reply(r#"{"error":"bad"}"#).error_shape_problem().is_some());
        assert!(reply(r#"{"error":{"message":"","type":"x"}}"#).error_shape_problem().is_some());
        assert!(reply("Bad Request")
            .error_shape_problem()
            .unwrap()
            .starts_with("body is not JSON"));
    }
}
