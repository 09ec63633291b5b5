//! The small endpoints (models, health, metrics, tokenize, detokenize) and the legacy
//! completions endpoint.

use serde_json::{json, Value};

use crate::common::{chat_body, replying, MODEL};

/// The value of the series `name` of the served model.
fn gauge(metrics: &str, name: &str) -> f64 {
    let series = format!("{name}{{model_name=\"{MODEL}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("{series} missing from\n{metrics}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn models_and_health_name_the_served_model() {
    let server = replying("Hello.");
    let (status, models) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");
    let (status, health) = server.get("/health").await;
    assert_eq!((status, &health["status"]), (200, &json!("ok")));
}

#[tokio::test]
async fn metrics_count_requests_and_tokens() {
    let server = replying("One two three four.");
    let (status, _) = server.post("/v1/chat/completions", &chat_body("Hi there", 3)).await;
    assert_eq!(status, 200);
    let response =
        server.send(axum::http::Request::get("/metrics").body(Default::default()).unwrap()).await;
    assert_eq!(response.status(), 200);
    let text = crate::common::body_text(response).await;
    for name in [
        "spindle_requests_total",
        "spindle_queue_depth",
        "spindle_prompt_tokens_total",
        "spindle_generated_tokens_total",
        "spindle_cached_prompt_tokens_total",
        "spindle_time_to_first_token_seconds_bucket",
        "spindle_inter_token_latency_seconds_bucket",
        "spindle_prefill_tokens_per_second_bucket",
        "spindle_prefix_cache_snapshot_bytes",
        "spindle_kv_window_released_blocks",
        "spindle_orphan_prefill_tokens_total",
        "spindle_orphan_prefill_reused_tokens_total",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    assert_eq!(gauge(&text, "spindle_generated_tokens_total"), 3.0);
    assert_eq!(
        gauge(&text, "vllm:prefix_cache_queries_total"),
        gauge(&text, "spindle_prompt_tokens_total")
    );
    assert_eq!(gauge(&text, "spindle_time_to_first_token_seconds_count"), 1.0);
    assert!(text.contains("endpoint=\"/v1/chat/completions\",status=\"200\""), "{text}");
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let server = replying("");
    let text = "Grüße, 世界! 🦀 fn main() {}";
    let (status, tokens) =
        server.post("/v1/tokenize", &json!({"prompt": text, "add_special_tokens": false})).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(
        tokens["count"].as_u64().unwrap() as usize,
        tokens["tokens"].as_array().unwrap().len()
    );
    assert_eq!(tokens["max_model_len"], 2048);
    let (_, back) = server.post("/v1/detokenize", &json!({"tokens": tokens["tokens"]})).await;
    assert_eq!(back["prompt"], text);
    let (status, bad) = server.post("/v1/detokenize", &json!({"tokens": [999999999]})).await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["param"], "tokens");
}

#[tokio::test]
async fn tokenize_renders_messages_through_the_template() {
    let server = replying("");
    let body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let (status, tokens) = server.post("/v1/tokenize", &body).await;
    assert_eq!(status, 200, "{tokens}");
    let (_, back) = server.post("/v1/detokenize", &json!({"tokens": tokens["tokens"]})).await;
    let prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_eq!(back["prompt"], prompt);
}

#[tokio::test]
async fn the_root_paths_tokenize_as_vllm_and_llama_server_serve_them() {
    let server = replying("");
    let body = json!({"prompt": "fn main() {}", "add_special_tokens": false});
    let (status, root) = server.post("/tokenize", &body).await;
    assert_eq!(status, 200, "{root}");
    assert_eq!(root, server.post("/v1/tokenize", &body).await.1);
    let (status, back) = server.post("/detokenize", &json!({"tokens": root["tokens"]})).await;
    assert_eq!((status, back["prompt"].as_str()), (200, Some("fn main() {}")));
}

/// What a router reads before placing a request: the render gives the ids the chat request
/// itself then runs on (its tools rendered into the prompt), and a bad request the same 400.
#[tokio::test]
async fn chat_render_gives_the_ids_the_same_request_then_runs_on() {
    let server = replying("Sunny.");
    let mut body = chat_body("What is the weather in Paris?", 8);
    body["tools"] = crate::chat::weather_tools();
    let (status, rendered) = server.post("/v1/chat/completions/render", &body).await;
    assert_eq!(status, 200, "{rendered}");
    assert_eq!(rendered["model"], MODEL);
    assert!(rendered["request_id"].as_str().unwrap().starts_with("chatcmpl-"));
    let ids = rendered["token_ids"].clone();
    assert!(server.engine.seen().is_empty(), "rendering runs nothing");

    let (status, _) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let ran = server.engine.last();
    assert_eq!(ids.as_array().unwrap().len(), ran.prompt_tokens);
    let (_, text) = server.post("/v1/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(text["prompt"].as_str(), Some(ran.prompt.as_str()));
    assert!(ran.prompt.contains("get_weather"), "the tools are in the rendered prompt");

    let (status, bad) = server.post("/v1/chat/completions/render", &json!({"messages": []})).await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["param"], "messages");
}

#[tokio::test]
async fn completion_render_lists_the_prompt_s_ids_as_the_completion_runs_them() {
    let server = replying(" Paris.");
    let body = json!({"prompt": "The capital of France is", "max_tokens": 4});
    let (status, rendered) = server.post("/v1/completions/render", &body).await;
    assert_eq!(status, 200, "{rendered}");
    let rendered = rendered.as_array().expect("a list, one per prompt");
    assert_eq!(rendered.len(), 1);
    let (status, _) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200);
    let ran = server.engine.last();
    let ids = &rendered[0]["token_ids"];
    assert_eq!(ids.as_array().unwrap().len(), ran.prompt_tokens);
    let (_, text) = server.post("/v1/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(text["prompt"].as_str(), Some(ran.prompt.as_str()));
    let (status, bad) = server.post("/v1/completions/render", &json!({"prompt": ""})).await;
    assert_eq!((status, &bad["error"]["param"]), (400, &json!("prompt")), "{bad}");
}

fn completion_text(body: &Value) -> String {
    body["choices"][0]["text"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn legacy_completions_answer_whole_and_streamed_with_logprobs() {
    let server = replying(" Paris, of course.");
    let body = json!({"prompt": "The capital of France is", "max_tokens": 8, "logprobs": 2});
    let (status, whole) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(completion_text(&whole), " Paris, of course.");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let logprobs = &whole["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.iter().map(|t| t.as_str().unwrap()).collect::<String>(),
        " Paris, of course."
    );
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(server.engine.last().top_logprobs, Some(2));
    assert_eq!(whole["usage"]["completion_tokens"], tokens.len());

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let data = server.post_stream("/v1/completions", &streamed_body).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| completion_text(&serde_json::from_str::<Value>(d).unwrap()))
        .collect();
    assert_eq!(streamed, completion_text(&whole));

    let echo = json!({"prompt": "The capital of France is", "max_tokens": 8, "echo": true});
    let (_, echoed) = server.post("/v1/completions", &echo).await;
    assert_eq!(completion_text(&echoed), "The capital of France is Paris, of course.");
}

#[tokio::test]
async fn legacy_completions_stop_at_max_tokens_and_stop_strings() {
    let server = replying(" one, two, three, four");
    let (_, cut) =
        server.post("/v1/completions", &json!({"prompt": "Count:", "max_tokens": 2})).await;
    assert_eq!(cut["choices"][0]["finish_reason"], "length");
    assert_eq!(cut["usage"]["completion_tokens"], 2);
    let body = json!({"prompt": "Count:", "max_tokens": 50, "stop": [", three"]});
    let (_, stopped) = server.post("/v1/completions", &body).await;
    assert_eq!(completion_text(&stopped), " one, two");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert_eq!(server.engine.last().stop_strings, vec![", three".to_owned()]);
}

#[tokio::test]
async fn legacy_completions_refuse_bad_prompts() {
    let server = replying("x");
    let cases = [
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": [999999999]}), "prompt"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": "hi", "echo": true, "logprobs": 1}), "echo"),
    ];
    for (body, param) in cases {
        let (status, answer) = server.post("/v1/completions", &body).await;
        assert_eq!((status, &answer["error"]["param"]), (400, &json!(param)), "{body}: {answer}");
    }
}

#[tokio::test]
async fn health_is_503_and_serve_ends_in_an_error_once_the_engine_has_stopped() {
    let server = replying("x");
    server.engine.fail_for_good("a fault while recovering from a fault");
    let (status, health) = server.get("/health").await;
    assert_eq!((status, &health["status"]), (503, &json!("error")), "{health}");
    // The serving loop ends with an error, so the process exits non-zero and is restarted.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served =
        spindle_server::serve(listener, server.state.clone(), std::future::pending()).await;
    let error = served.expect_err("serving ends when the engine has stopped");
    assert!(error.to_string().contains("a fault while recovering from a fault"), "{error}");
}

#[tokio::test]
async fn get_load_counts_running_and_waiting_and_the_pool_shape_is_a_metric() {
    use std::sync::atomic::Ordering;
    let server = replying("x");
    let (status, load) = server.get("/get_load").await;
    assert_eq!((status, load), (200, json!({"load": 0})));
    let engine_load = spindle_server::GenerationEngine::load(server.engine.as_ref());
    engine_load.active.store(3, Ordering::Relaxed);
    engine_load.waiting.store(2, Ordering::Relaxed);
    engine_load.kv_blocks_total.store(977, Ordering::Relaxed);
    let (_, load) = server.get("/get_load").await;
    assert_eq!(load, json!({"load": 5}));
    let response =
        server.send(axum::http::Request::get("/metrics").body(Default::default()).unwrap()).await;
    let text = crate::common::body_text(response).await;
    let info = format!(
        "vllm:cache_config_info{{model_name=\"{MODEL}\",block_size=\"16\",num_gpu_blocks=\"977\"}} 1"
    );
    assert!(text.lines().any(|l| l == info), "{info} missing from\n{text}");
    // The existing gauges keep their meaning beside it.
    assert_eq!(gauge(&text, "vllm:num_requests_running"), 3.0);
    assert_eq!(gauge(&text, "vllm:num_requests_waiting"), 2.0);
}
