//! Two catalogue models behind one `spindle serve`: each loads on its first request (the
//! other keeps answering meanwhile), requests to both interleave and run at once, and every
//! answer is byte for byte the one a server of that model alone gives. With room for one model
//! only, the idle one is unloaded for the other.

use serde_json::{json, Value};

use crate::common::LoggedServer;

const SMOLLM2: &str = "smollm2-135m";
const QWEN: &str = "qwen2.5-coder-0.5b";

/// Small snapshot memory (the KV pools are 64 MiB), so three servers fit beside the other
/// tests.
const MEMORY: [&str; 2] = ["--snapshot-memory", "16MiB"];

/// Greedy and seeded requests to `model`.
fn requests(model: &str) -> Vec<String> {
    let ask = |user: &str, sampling: Value| {
        let mut body = json!({"model": model, "max_tokens": 12,
            "messages": [{"role": "user", "content": user}]});
        body.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
        body.to_string()
    };
    vec![
        ask("Name three colours.", json!({"temperature": 0})),
        ask("Write a haiku about rivers.", json!({"temperature": 0.8, "seed": 7})),
    ]
}

/// What must not differ between servers: the answer and its usage (ids and times do, and so
/// does how much of the prompt a second asking finds cached).
fn answer(body: &Value) -> Value {
    let mut usage = body["usage"].clone();
    usage.as_object_mut().unwrap().remove("prompt_tokens_details");
    json!({"model": body["model"], "choices": body["choices"], "usage": usage})
}

fn answers(server: &LoggedServer, requests: &[String]) -> Vec<Value> {
    requests.iter().map(|r| answer(&server.post_ok("/v1/chat/completions", r))).collect()
}

#[test]
fn two_models_served_at_once_answer_as_each_alone() {
    let alone: Vec<Vec<Value>> = [SMOLLM2, QWEN]
        .iter()
        .map(|model| {
            let mut args = vec!["--model", model];
            args.extend(MEMORY);
            let server = LoggedServer::with_args(&args);
            let answers = answers(&server, &requests(model));
            server.stop();
            answers
        })
        .collect();
    let mut args = vec!["--model", SMOLLM2, "--model", QWEN];
    args.extend(MEMORY);
    let both = LoggedServer::with_args(&args);
    // Interleaved, one at a time: SmolLM2 loads first, Qwen on its first request.
    let interleaved = (0..2).flat_map(|i| [(0, SMOLLM2, i), (1, QWEN, i)]);
    for (m, model, i) in interleaved {
        let body = both.post_ok("/v1/chat/completions", &requests(model)[i]);
        assert_eq!(answer(&body), alone[m][i], "{model} request {i}");
    }
    // At once: all four requests in flight together.
    std::thread::scope(|scope| {
        let running: Vec<_> = [SMOLLM2, QWEN]
            .iter()
            .enumerate()
            .flat_map(|(m, model)| (0..2).map(move |i| (m, i, requests(model)[i].clone())))
            .map(|(m, i, request)| {
                let both = &both;
                scope.spawn(move || (m, i, answer(&both.post_ok("/v1/chat/completions", &request))))
            })
            .collect();
        for thread in running {
            let (m, i, got) = thread.join().unwrap();
            assert_eq!(got, alone[m][i], "concurrent request {i} of model {m}");
        }
    });
    let log = String::from_utf8(both.stop()).unwrap();
    for model in [SMOLLM2, QWEN] {
        let named = format!("model={model} ");
        let lines = log.lines().filter(|l| l.contains("request done") && l.contains(&named));
        let answered = lines.count();
        assert_eq!(answered, 4, "{model}'s request lines in\n{log}");
    }
}

#[test]
fn with_room_for_one_model_the_idle_one_is_unloaded_for_the_other() {
    // Counting weights and pools, SmolLM2 takes 182 MB and Qwen 575 MB: 650 MiB holds either,
    // not both.
    let mut args = vec!["--model", SMOLLM2, "--model", QWEN, "--models-memory", "650MiB"];
    args.extend(MEMORY);
    let server = LoggedServer::with_args(&args);
    for model in [SMOLLM2, QWEN] {
        server.post_ok("/v1/chat/completions", &requests(model)[0]);
    }
    let models = server.get_json("/v1/models");
    let status: Vec<(&str, &str)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["status"].as_str().unwrap()))
        .collect();
    assert_eq!(status, [(SMOLLM2, "not-loaded"), (QWEN, "loaded")]);
    let log = String::from_utf8(server.stop()).unwrap();
    assert!(log.contains("unloading the least recently used idle model"), "{log}");
}
