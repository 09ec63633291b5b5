//! The server's log as an operator ships it: written to a file it holds no terminal escapes,
//! `--log-format json` writes one parseable object a line, and every request's line names its
//! endpoint and HTTP status.

use crate::common::{model_id, LoggedServer};

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
    "temperature": 0}"#;
const UNKNOWN_MODEL: &str = r#"{"model": "no-such-model", "messages": [{"role": "user",
    "content": "Hi"}]}"#;

#[test]
fn a_log_written_to_a_file_has_no_escapes_and_names_status_and_endpoint() {
    let server = LoggedServer::start(&[]);
    assert!(server.post("/v1/chat/completions", CHAT).starts_with("HTTP/1.1 200"));
    assert!(server.post("/v1/chat/completions", UNKNOWN_MODEL).starts_with("HTTP/1.1 404"));
    let log = server.stop();
    assert!(!log.contains(&0x1b), "an escape byte in:\n{}", String::from_utf8_lossy(&log));
    let log = String::from_utf8(log).unwrap();
    let line_with = |needle: &str| {
        log.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle:?} in:\n{log}"))
    };
    let done = line_with("request done");
    let model = format!("model={}", model_id());
    for field in ["endpoint=\"/v1/chat/completions\"", "status=200", &model] {
        assert!(done.contains(field), "{field} not in {done}");
    }
    let refused = line_with("request refused");
    for field in ["endpoint=\"/v1/chat/completions\"", "status=404"] {
        assert!(refused.contains(field), "{field} not in {refused}");
    }
}

#[test]
fn json_logs_are_one_object_a_line_with_the_request_fields() {
    let server = LoggedServer::start(&["--log-format", "json"]);
    assert!(server.post("/v1/chat/completions", CHAT).starts_with("HTTP/1.1 200"));
    let log = String::from_utf8(server.stop()).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for event in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(event.get(key).is_some(), "no {key} in {event}");
        }
    }
    let done = events.iter().find(|e| e["message"] == "request done").expect("a request line");
    assert_eq!(done["endpoint"], "/v1/chat/completions");
    assert_eq!(done["status"], 200);
    assert_eq!(done["model"], model_id().as_str());
    assert_eq!(done["generated"], 2);
    assert!(done["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl")), "{done}");
    for number in ["prompt", "cached", "prefill_tok_s", "decode_tok_s"] {
        assert!(done[number].is_number(), "{number} in {done}");
    }
    let summary = events.iter().find(|e| e["target"] == "spindle::startup");
    assert!(summary.is_some_and(|e| e["message"].as_str().unwrap().contains("KV cache")), "{log}");
}
