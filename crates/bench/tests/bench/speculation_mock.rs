//! The speculation panel against scripted servers on a local socket: Spindle-like (drafting
//! counters in /metrics, `"speculative"` per request) and llama-server-like (no counters,
//! `timings` in the last chunk). Checks the request bodies, the rows and where acceptance came
//! from; no figure depends on the clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use spindle_bench::speculation::acceptance::Source;
use spindle_bench::speculation::workloads::Kind;
use spindle_bench::speculation::{run_speculation, Mode, SpeculationOptions};
use spindle_bench::Client;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::mock_server::{read_request, reply};

/// Tokens every answer streams, one chunk each.
const TOKENS: u64 = 5;

#[derive(Clone, Copy, PartialEq)]
enum Flavour {
    Spindle,
    Llama,
}

struct Mock {
    kind: Flavour,
    /// Drafted and accepted tokens so far (Spindle's counters).
    drafted: AtomicU64,
    accepted: AtomicU64,
    bodies: Mutex<Vec<Value>>,
}

async fn start(kind: Flavour) -> (String, Arc<Mock>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mock = Arc::new(Mock {
        kind,
        drafted: AtomicU64::new(100),
        accepted: AtomicU64::new(50),
        bodies: Mutex::default(),
    });
    let state = mock.clone();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(answer(socket, state.clone()));
        }
    });
    (url, mock)
}

async fn answer(mut socket: TcpStream, mock: Arc<Mock>) {
    let (line, body) = read_request(&mut socket).await;
    match (line.split(' ').nth(1).unwrap(), mock.kind) {
        ("/metrics", Flavour::Spindle) => {
            let text = format!(
                "vllm:spec_decode_num_drafts_total{{model_name=\"m\"}} {}\n\
                 vllm:spec_decode_num_draft_tokens_total{{model_name=\"m\"}} {}\n\
                 vllm:spec_decode_num_accepted_tokens_total{{model_name=\"m\"}} {}\n",
                mock.drafted.load(Ordering::SeqCst) / 4,
                mock.drafted.load(Ordering::SeqCst),
                mock.accepted.load(Ordering::SeqCst)
            );
            reply(&mut socket, "200 OK", "text/plain", &text).await
        }
        ("/metrics", Flavour::Llama) => {
            reply(&mut socket, "501 Not Implemented", "text/plain", "").await
        }
        ("/v1/chat/completions", _) => {
            mock.bodies.lock().unwrap().push(body.clone());
            if body["speculative"] == true {
                mock.drafted.fetch_add(8, Ordering::SeqCst);
                mock.accepted.fetch_add(6, Ordering::SeqCst);
            }
            stream(&mut socket, &body, mock.kind).await
        }
        (other, _) => panic!("unexpected path {other}"),
    }
}

/// Echoes the prose topic's first word, token by token; a tool request gets an edit_file call.
async fn stream(socket: &mut TcpStream, body: &Value, kind: Flavour) {
    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut events = vec![];
    if body.get("tools").is_some() {
        let args = json!({"path": "src/config/loader.rs", "old_string": "a", "new_string": "b"});
        let parts = [json!({"index": 0, "function": {"name": "edit_file", "arguments": ""}})]
            .into_iter()
            .chain((0..TOKENS - 1).map(|i| {
                let text = args.to_string();
                let (from, to) = (i as usize * text.len() / 4, (i as usize + 1) * text.len() / 4);
                json!({"index": 0, "function": {"arguments": &text[from..to]}})
            }));
        events.extend(parts.map(|p| json!({"choices": [{"delta": {"tool_calls": [p]}}]})));
    } else {
        events.extend(
            (0..TOKENS).map(|i| json!({"choices": [{"delta": {"content": format!("w{i} ")}}]})),
        );
    }
    events.push(json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}));
    let mut last = json!({"choices": [], "usage": {"prompt_tokens": 10,
        "completion_tokens": TOKENS, "total_tokens": 10 + TOKENS}});
    if kind == Flavour::Llama {
        last["timings"] = json!({"predicted_n": TOKENS, "draft_n": 4, "draft_n_accepted": 3});
    }
    events.push(last);
    for event in events {
        let text = format!("data: {event}\n\n");
        socket.write_all(text.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    socket.write_all(b"data: [DONE]\n\n").await.unwrap();
}

fn options(modes: Vec<Mode>) -> SpeculationOptions {
    SpeculationOptions { kinds: Kind::ALL.to_vec(), modes, rounds: 2, max_tokens: 64, salt: 5 }
}

#[tokio::test]
async fn spindle_rows_with_and_without_speculation_from_metric_deltas() {
    let (url, mock) = start(Flavour::Spindle).await;
    let client = Client::new(&url, None).unwrap();
    let mut heard = vec![];
    let panel = run_speculation(&client, &options(vec![Mode::On, Mode::Off]), &mut |t: &str| {
        heard.push(t.to_string())
    })
    .await
    .unwrap();
    assert_eq!(heard.len(), 12);
    assert_eq!(heard[0], "round 1/2: code-edit [spec] (call 1 of 6)");
    let shape: Vec<(Kind, Mode, usize)> =
        panel.rows.iter().map(|r| (r.kind, r.mode, r.calls.len())).collect();
    assert_eq!(
        shape,
        [
            (Kind::CodeEdit, Mode::On, 2),
            (Kind::CodeEdit, Mode::Off, 2),
            (Kind::ToolCall, Mode::On, 2),
            (Kind::ToolCall, Mode::Off, 2),
            (Kind::Prose, Mode::On, 2),
            (Kind::Prose, Mode::Off, 2)
        ]
    );
    for row in &panel.rows {
        let a = row.acceptance().unwrap();
        let expected = if row.mode == Mode::On { (16, 12) } else { (0, 0) };
        assert_eq!((a.drafted, a.accepted), expected, "{:?} {:?}", row.kind, row.mode);
        assert!(row.calls.iter().all(|c| c.acceptance.unwrap().1 == Source::Metrics));
        assert!(row.calls.iter().all(|c| c.completion_tokens == 5 && c.decode_seconds > 0.0));
        // Rounds take versions salt + round, the same in both modes.
        assert_eq!(
            row.calls.iter().map(|c| (c.round, c.variant)).collect::<Vec<_>>(),
            [(0, 5), (1, 6)]
        );
    }
    assert!(panel.row(Kind::ToolCall, Mode::On).unwrap().calls[0]
        .reply
        .contains("src/config/loader.rs"));
    assert!(panel.kinds().iter().all(|&k| panel.outputs_agree(k) == Some(true)));
    let bodies = mock.bodies.lock().unwrap();
    // Each workload's calls in a round follow one call of a single token with the same prompt,
    // without the field, that puts the prompt in the server's cache.
    assert_eq!(bodies.len(), 2 * 3 * 3);
    for calls in bodies.chunks(3) {
        let (warm, measured) = (&calls[0], &calls[1..]);
        assert_eq!((warm["max_tokens"].clone(), warm.get("speculative")), (json!(1), None));
        assert!(measured.iter().all(|b| b["messages"] == warm["messages"]));
        let flags: Vec<&Value> = measured.iter().map(|b| &b["speculative"]).collect();
        assert_eq!(flags, [&json!(true), &json!(false)], "on before off");
    }
    let prose = |b: &Value| b["messages"].to_string().contains("short story");
    for body in bodies.iter() {
        let (temperature, penalty) =
            if prose(body) { (json!(0.8), json!(0.5)) } else { (json!(0.0), Value::Null) };
        assert_eq!((body["temperature"].clone(), body["seed"].clone()), (temperature, json!(1234)));
        assert_eq!(body["frequency_penalty"], penalty);
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"]["include_usage"], true);
    }
    assert!(bodies
        .iter()
        .filter(|b| b.get("speculative").is_some())
        .all(|b| b["max_tokens"] == 64));
    assert_eq!(bodies.iter().filter(|b| b.get("tools").is_some()).count(), 6);
}

#[tokio::test]
async fn llama_server_rows_take_acceptance_from_timings_and_send_no_flag() {
    let (url, mock) = start(Flavour::Llama).await;
    let client = Client::new(&url, None).unwrap();
    let panel =
        run_speculation(&client, &options(vec![Mode::Server]), &mut |_: &str| {}).await.unwrap();
    assert_eq!(panel.rows.len(), 3);
    for row in &panel.rows {
        assert_eq!(row.mode, Mode::Server);
        let a = row.acceptance().unwrap();
        assert_eq!((a.rounds, a.drafted, a.accepted), (None, 8, 6));
        assert!(row.calls.iter().all(|c| c.acceptance.unwrap().1 == Source::Timings));
        assert!(row.decode().is_some());
    }
    assert_eq!(panel.speedup(Kind::Prose), None, "one mode: no ratio");
    let bodies = mock.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 2 * 3 * 2, "a warming call and a measured one per workload and round");
    assert!(bodies.iter().all(|b| b.get("speculative").is_none()));
}
