//! Streams show life at once and end when their client does: the first event goes out before
//! the engine has produced anything, keep-alive comments fill a wait, prompt progress is
//! streamed on request, a client that leaves or cancels ends its generation and frees its
//! place, and one that reads slowly holds its generation back.

use axum::body::BodyDataStream;
use serde_json::{json, Value};
use spindle_runner::{FinishReason, EVENT_CAPACITY};

use crate::common::{
    chat_body, next_chunk, parse_chat_stream, post_json, replying, server_with, sse_data, Gate,
    Reply, TestServer,
};

/// A server that answers `text` once `gate` opens, with keep-alives after 1 ms of quiet and
/// room for `running` requests and no queue.
fn held_server(gate: &Gate, text: &'static str, running: usize) -> TestServer {
    let gate = gate.clone();
    server_with(
        move |_| Reply::Held { text: text.into(), gate: gate.clone() },
        move |config, _| {
            config.keep_alive = std::time::Duration::from_millis(1);
            (config.max_concurrent, config.max_queue) = (running, 0);
        },
    )
}

/// A streamed chat request's body, once the response has started.
async fn open_stream(server: &TestServer, body: &Value) -> BodyDataStream {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let response = server.send(post_json("/v1/chat/completions", &body)).await;
    assert_eq!(response.status(), 200);
    response.into_body().into_data_stream()
}

/// Reads whole events until one satisfies `done`; returns all the text read.
async fn read_until(body: &mut BodyDataStream, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    loop {
        let chunk = next_chunk(body).await.expect("the stream ended early");
        text.push_str(&chunk);
        if text.split("\n\n").any(&done) {
            return text;
        }
    }
}

async fn read_to_end(body: &mut BodyDataStream) -> String {
    let mut text = String::new();
    while let Some(chunk) = next_chunk(body).await {
        text.push_str(&chunk);
    }
    text
}

#[tokio::test]
async fn the_role_chunk_comes_first_and_keep_alives_fill_the_wait() {
    let gate = Gate::default();
    let server = held_server(&gate, "Hello there.", 4);
    let mut body = open_stream(&server, &chat_body("Hi", 16)).await;
    // Before the engine sent a token: the role chunk, then keep-alive comments.
    let before = read_until(&mut body, |event| event.starts_with(": keep-alive")).await;
    let first: Value = serde_json::from_str(&sse_data(&before)[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert!(!before.contains("Hello"), "{before}");
    gate.open();
    let text = before + &read_to_end(&mut body).await;
    // Parsed as a client parses it: the comments are not events.
    let streamed = parse_chat_stream(&sse_data(&text));
    assert_eq!(streamed.content, "Hello there.");
    assert_eq!(streamed.finish_reason, "stop");
}

#[tokio::test]
async fn return_progress_streams_how_far_the_prompt_is_read() {
    let server = replying("Done.");
    let mut body = chat_body("Progress check.", 8);
    body["stream"] = json!(true);
    body["return_progress"] = json!(true);
    let streamed = parse_chat_stream(&server.post_stream("/v1/chat/completions", &body).await);
    let progress: Vec<_> =
        streamed.chunks.iter().filter_map(|c| c.get("prompt_progress").cloned()).collect();
    let total = server.engine.last().prompt_tokens;
    assert_eq!(progress.len(), 1, "{progress:?}");
    assert_eq!(
        (progress[0]["total"].as_u64(), progress[0]["processed"].as_u64()),
        (Some(total as u64), Some(total as u64))
    );
    let first_content = streamed
        .chunks
        .iter()
        .position(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()));
    let last_progress =
        streamed.chunks.iter().rposition(|c| c.get("prompt_progress").is_some()).unwrap();
    assert!(first_content.unwrap() > last_progress);
    body["return_progress"] = json!(false);
    let plain = parse_chat_stream(&server.post_stream("/v1/chat/completions", &body).await);
    assert!(plain.chunks.iter().all(|c| c.get("prompt_progress").is_none()));
    assert_eq!(plain.content, streamed.content);
}

#[tokio::test]
async fn a_client_that_leaves_cancels_its_generation_and_frees_its_place() {
    let gate = Gate::default();
    let server = held_server(&gate, "A long story.", 1);
    let mut body = open_stream(&server, &chat_body("Tell a story", 100)).await;
    read_until(&mut body, |event| event.starts_with("data:")).await;
    drop(body);
    let engine = server.engine.clone();
    let ends = tokio::task::spawn_blocking(move || engine.wait_for_ends(1)).await.unwrap();
    assert_eq!(ends, [Some(FinishReason::Cancelled)]);
    // Its place is free: the only slot takes the next request.
    gate.open();
    let (status, answer) = server.post("/v1/chat/completions", &chat_body("Hi", 4)).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn the_cancel_endpoint_ends_a_running_request() {
    let gate = Gate::default();
    let server = held_server(&gate, "A long story.", 1);
    let mut body = open_stream(&server, &chat_body("Tell a story", 100)).await;
    let first = read_until(&mut body, |event| event.starts_with("data:")).await;
    let first: Value = serde_json::from_str(&sse_data(&first)[0]).unwrap();
    let id = first["id"].as_str().unwrap();
    let (status, cancelled) =
        server.post(&format!("/v1/chat/completions/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!((&cancelled["id"], &cancelled["cancelled"]), (&json!(id), &json!(true)));
    // The stream ends without the held text, with OpenAI's `stop`.
    let rest = read_to_end(&mut body).await;
    assert!(!rest.contains("story"), "{rest}");
    assert!(rest.contains("\"finish_reason\":\"stop\""), "{rest}");
    assert_eq!(server.engine.wait_for_ends(1), [Some(FinishReason::Cancelled)]);
    let (status, missing) =
        server.post("/v1/chat/completions/chatcmpl-unknown/cancel", &json!({})).await;
    assert_eq!(status, 404, "{missing}");
}

/// A client that reads slowly holds its request back rather than letting its tokens pile up:
/// the engine sends a token only while the request's channel has room, and the server reads
/// that channel only as fast as the client takes the stream. Every token still arrives.
#[tokio::test]
async fn a_slow_reader_holds_its_request_back_instead_of_piling_up_tokens() {
    let reply = "word ".repeat(300);
    let text = reply.clone();
    let server = crate::common::server(move |_| Reply::text(text.clone()));
    let mut body = open_stream(&server, &chat_body("Write a lot.", 1000)).await;
    // Nothing read yet: the engine fills the channel, then waits.
    let engine = server.engine.clone();
    let counts = tokio::task::spawn_blocking(move || {
        engine.wait_for_flow(|c| c.held_back > 0 || c.tokens_sent > 2 * EVENT_CAPACITY)
    })
    .await
    .unwrap();
    assert!(counts.held_back == 1 && counts.tokens_sent < EVENT_CAPACITY, "{counts:?}");
    // Read one chunk at a time: what the engine sent ahead of the client stays bounded.
    let mut data = Vec::new();
    while let Some(chunk) = next_chunk(&mut body).await {
        data.extend(sse_data(&chunk));
        let counts = server.engine.flow();
        assert!(counts.tokens_sent <= data.len() + EVENT_CAPACITY, "{counts:?}, {}", data.len());
    }
    let streamed = parse_chat_stream(&data);
    assert_eq!(streamed.content, reply);
    assert_eq!(streamed.finish_reason, "stop");
}
