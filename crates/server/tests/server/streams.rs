//! Streams show life at once: the first event goes out when the request is admitted, before
//! its prompt is read, and keep-alive comments follow while the prompt is read, so a client
//! that abandons silent streams keeps waiting. No client reads a keep-alive as content.

use crate::common;

use std::time::{Duration, Instant};

use common::{client, parse_chat_stream, server, sse_data, Setup, KEEP_ALIVE};
use futures_util::StreamExt;
use serde_json::json;

/// A user message of about 1,800 tokens: seconds of prefill on 2 cores.
fn long_message() -> String {
    (0..115).map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog. ")).collect()
}

#[tokio::test]
async fn the_first_event_precedes_the_prompt_and_keep_alives_fill_the_wait() {
    let base = server(Setup::KeepAlive);
    let body = json!({
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": long_message()}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": true,
    });
    let sent = Instant::now();
    let response =
        client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    if response.status() != 200 {
        panic!("{}: {}", response.status(), response.text().await.unwrap());
    }
    let mut bytes = response.bytes_stream();
    let mut text = String::new();
    let mut first_event = None;
    let mut first_content = None;
    let mut keep_alives_before_content = 0;
    let mut seen = 0;
    while let Some(piece) = bytes.next().await {
        text.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        // Look at whole events only.
        while let Some(end) = text[seen..].find("\n\n") {
            let event = &text[seen..seen + end];
            seen += end + 2;
            if event.starts_with(": keep-alive") {
                keep_alives_before_content += usize::from(first_content.is_none());
            } else if event.starts_with("data:") {
                first_event.get_or_insert_with(|| sent.elapsed());
                if event.contains("\"content\":\"") && !event.contains("\"content\":\"\"") {
                    first_content.get_or_insert_with(|| sent.elapsed());
                }
            }
        }
    }
    let (first_event, first_content) = (first_event.unwrap(), first_content.expect("some content"));
    assert!(
        first_content > first_event + 4 * KEEP_ALIVE,
        "the prompt took a while to read ({first_content:?}), so the role chunk ({first_event:?}) came first"
    );
    assert!(first_event < Duration::from_secs(1), "the first event waited {first_event:?}");
    let expected =
        ((first_content - first_event).as_secs_f64() / KEEP_ALIVE.as_secs_f64()) as usize;
    assert!(
        keep_alives_before_content >= expected / 2,
        "{keep_alives_before_content} keep-alives in {first_content:?}"
    );
    // Parsed as a client parses it: the comments are not events.
    let streamed = parse_chat_stream(&sse_data(&text));
    assert!(!streamed.content.contains("keep-alive"));
    assert_eq!(streamed.finish_reason, "length");
}

#[tokio::test]
async fn return_progress_streams_how_far_the_prompt_is_read() {
    let base = server(Setup::KeepAlive);
    let mut body = json!({
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": format!("Progress check. {}", long_message())}],
        "max_tokens": 2,
        "temperature": 0,
        "stream": true,
        "return_progress": true,
    });
    let data = common::post_stream(&base, "/v1/chat/completions", &body).await;
    let streamed = parse_chat_stream(&data);
    let progress: Vec<_> =
        streamed.chunks.iter().filter_map(|c| c.get("prompt_progress").cloned()).collect();
    assert!(progress.len() >= 2, "one per prefill chunk of a long prompt: {progress:?}");
    let processed: Vec<u64> = progress.iter().map(|p| p["processed"].as_u64().unwrap()).collect();
    assert!(processed.windows(2).all(|w| w[0] < w[1]), "{processed:?}");
    let total = progress[0]["total"].as_u64().unwrap();
    assert_eq!(processed.last(), Some(&total), "the last report is the whole prompt");
    // Progress chunks come before any content and carry none.
    let first_content = streamed
        .chunks
        .iter()
        .position(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()));
    let last_progress =
        streamed.chunks.iter().rposition(|c| c.get("prompt_progress").is_some()).unwrap();
    assert!(first_content.is_none_or(|i| i > last_progress));
    // Without the flag there are none.
    body["return_progress"] = json!(false);
    let plain = parse_chat_stream(&common::post_stream(&base, "/v1/chat/completions", &body).await);
    assert!(plain.chunks.iter().all(|c| c.get("prompt_progress").is_none()));
    assert_eq!(plain.content, streamed.content);
}
