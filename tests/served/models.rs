//! Two catalogue models behind one `spindle serve`: each loads on its first request (the
//! other keeps answering meanwhile), requests to both interleave and run at once, and every
//! answer is byte for byte the one a server of that model alone gives. With room for one model
//! only, the idle one is unloaded for the other. Three models at once are the tiny random model
//! served under three names: the same, and with room for two of three the least recently used
//! idle one goes.

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
    let expected = [format!("{SMOLLM2}: not-loaded"), format!("{QWEN}: loaded")];
    assert_eq!(statuses(&server), expected);
    let log = String::from_utf8(server.stop()).unwrap();
    assert!(log.contains("unloading the least recently used idle model"), "{log}");
}

/// The tiny random model under three names, each a link to its folder in `dir`.
fn three_tiny_models(dir: &std::path::Path) -> Vec<String> {
    let spindle_hub::ModelFiles::Safetensors { dir: tiny } = spindle_testkit::tiny_model() else {
        panic!("the tiny model is a safetensors folder")
    };
    ["tiny-a", "tiny-b", "tiny-c"]
        .iter()
        .map(|name| {
            let link = dir.join(name);
            std::os::unix::fs::symlink(&tiny, &link).unwrap();
            link.display().to_string()
        })
        .collect()
}

/// What the server counts for one tiny model: its weights, its KV pool (64 MiB, as
/// `LoggedServer` sets) and its snapshots (`MEMORY`).
fn tiny_model_bytes(path: &str) -> u64 {
    let weights = std::fs::metadata(std::path::Path::new(path).join("model.safetensors")).unwrap();
    weights.len() + (64 + 16) * (1 << 20)
}

/// `spindle serve --model` each of `paths`, with `extra` and `MEMORY`.
fn serving(paths: &[&String], extra: &[&str]) -> LoggedServer {
    let mut args: Vec<&str> = paths.iter().flat_map(|p| ["--model", p.as_str()]).collect();
    args.extend(extra);
    args.extend(MEMORY);
    LoggedServer::with_args(&args)
}

#[test]
fn three_models_served_at_once_answer_as_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three_tiny_models(dir.path());
    let names = ["tiny-a", "tiny-b", "tiny-c"];
    let alone: Vec<Vec<Value>> = paths
        .iter()
        .zip(names)
        .map(|(path, name)| {
            let server = serving(&[path], &[]);
            let answers = answers(&server, &requests(name));
            server.stop();
            answers
        })
        .collect();
    let all = serving(&paths.iter().collect::<Vec<_>>(), &[]);
    std::thread::scope(|scope| {
        let running: Vec<_> = names
            .iter()
            .enumerate()
            .flat_map(|(m, name)| (0..2).map(move |i| (m, i, requests(name)[i].clone())))
            .map(|(m, i, request)| {
                let all = &all;
                scope.spawn(move || (m, i, answer(&all.post_ok("/v1/chat/completions", &request))))
            })
            .collect();
        for thread in running {
            let (m, i, got) = thread.join().unwrap();
            assert_eq!(got, alone[m][i], "concurrent request {i} of {}", names[m]);
        }
    });
    assert_eq!(statuses(&all), ["tiny-a: loaded", "tiny-b: loaded", "tiny-c: loaded"]);
    all.stop();
}

#[test]
fn with_room_for_two_of_three_the_least_recently_used_idle_one_is_unloaded() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three_tiny_models(dir.path());
    let budget = (tiny_model_bytes(&paths[0]) * 5 / 2).to_string();
    let server = serving(&paths.iter().collect::<Vec<_>>(), &["--models-memory", &budget]);
    // `tiny-a` (loaded at start), `tiny-b`, then `tiny-a` again: `tiny-b` is the least
    // recently used when `tiny-c` loads.
    for name in ["tiny-a", "tiny-b", "tiny-a", "tiny-c"] {
        server.post_ok("/v1/chat/completions", &requests(name)[0]);
    }
    let status = statuses(&server);
    assert_eq!(status, ["tiny-a: loaded", "tiny-b: not-loaded", "tiny-c: loaded"]);
    let log = String::from_utf8(server.stop()).unwrap();
    let evicted = log.lines().find(|l| l.contains("unloading the least recently used idle model"));
    assert!(evicted.is_some_and(|l| l.contains("model=tiny-b")), "{log}");
}

/// Each served model's `id: status` in `/v1/models`.
fn statuses(server: &LoggedServer) -> Vec<String> {
    let models = server.get_json("/v1/models");
    let cards = models["data"].as_array().unwrap().iter();
    cards
        .map(|m| format!("{}: {}", m["id"].as_str().unwrap(), m["status"].as_str().unwrap()))
        .collect()
}
