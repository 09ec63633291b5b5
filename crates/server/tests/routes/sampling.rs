//! Sampling defaults through the HTTP API: a field the request leaves out takes the server's
//! flag, else the model's own setting (its thinking preset when the answer thinks), else the
//! built-in default; a field the request sets always wins. `/v1/models` shows what applies.

use serde_json::json;
use spindle_runner::model_sampling::{ModelSampling, SamplingPreset};

use crate::common::{chat_body, server, server_with, Reply, TestServer, MODEL};

/// A model publishing Qwen3.5-style presets (general values, a thinking preset over them),
/// served with `--top-k 40`.
fn server_with_model_defaults() -> TestServer {
    server_with(
        |_| Reply::text("Fine."),
        |config, model| {
            model.sampling = ModelSampling {
                general: SamplingPreset {
                    temperature: Some(0.7),
                    top_k: Some(20),
                    top_p: Some(0.8),
                    min_p: Some(0.05),
                    repetition_penalty: Some(1.05),
                },
                thinking: SamplingPreset {
                    temperature: Some(0.6),
                    top_p: Some(0.95),
                    ..Default::default()
                },
                source: Some("generation_config.json"),
                ..Default::default()
            };
            config.sampling = SamplingPreset { top_k: Some(40), ..Default::default() };
        },
    )
}

#[tokio::test]
async fn omitted_fields_take_the_flag_then_the_model_and_request_fields_win() {
    let server = server_with_model_defaults();
    let (status, _) = server.post("/v1/chat/completions", &chat_body("Hi", 8)).await;
    assert_eq!(status, 200);
    let seen = server.engine.last();
    assert_eq!((seen.temperature, seen.top_p, seen.min_p), (0.7, 0.8, 0.05));
    assert_eq!(seen.repetition_penalty, 1.05);
    assert_eq!(seen.top_k, 40, "the flag beats the model's 20");

    let mut body = chat_body("Hi", 8);
    body["temperature"] = json!(0.2);
    body["top_k"] = json!(5);
    body["repetition_penalty"] = json!(1.0);
    assert_eq!(server.post("/v1/chat/completions", &body).await.0, 200);
    let seen = server.engine.last();
    assert_eq!((seen.temperature, seen.top_k, seen.repetition_penalty), (0.2, 5, 1.0));
    assert_eq!(seen.top_p, 0.8, "fields the request leaves out still default");
}

#[tokio::test]
async fn a_thinking_answer_takes_the_thinking_preset_over_the_general_values() {
    let server = server_with_model_defaults();
    let mut body = chat_body("Hi", 64);
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    assert_eq!(server.post("/v1/chat/completions", &body).await.0, 200);
    let seen = server.engine.last();
    assert_eq!((seen.temperature, seen.top_p), (0.6, 0.95));
    assert_eq!((seen.top_k, seen.min_p), (40, 0.05), "the flag, then the general value");
}

#[tokio::test]
async fn every_protocol_takes_the_defaults() {
    let server = server_with_model_defaults();
    let messages = json!({"model": MODEL, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hi"}]});
    assert_eq!(server.post("/v1/messages", &messages).await.0, 200);
    assert_eq!(server.engine.last().temperature, 0.7);
    let completion = json!({"model": MODEL, "prompt": "Once", "max_tokens": 4});
    assert_eq!(server.post("/v1/completions", &completion).await.0, 200);
    assert_eq!((server.engine.last().temperature, server.engine.last().top_k), (0.7, 40));
    let response = json!({"model": MODEL, "input": "Hi", "max_output_tokens": 8,
        "temperature": 0.3});
    assert_eq!(server.post("/v1/responses", &response).await.0, 200);
    assert_eq!(server.engine.last().temperature, 0.3);
}

#[tokio::test]
async fn the_model_list_shows_each_default_and_its_source() {
    let server = server_with_model_defaults();
    let (status, models) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let defaults = &models["data"][0]["sampling_defaults"];
    assert_eq!(
        defaults["non_thinking"]["temperature"],
        json!({"value": 0.7f32, "source": "model"})
    );
    assert_eq!(defaults["non_thinking"]["top_k"], json!({"value": 40, "source": "flag"}));
    assert_eq!(defaults["thinking"]["temperature"], json!({"value": 0.6f32, "source": "model"}));
    assert_eq!(defaults["thinking"]["min_p"], json!({"value": 0.05f32, "source": "model"}));
}

#[tokio::test]
async fn without_flags_or_model_settings_the_built_in_defaults_hold() {
    let server = server(|_| Reply::text("Fine."));
    assert_eq!(server.post("/v1/chat/completions", &chat_body("Hi", 8)).await.0, 200);
    let seen = server.engine.last();
    assert_eq!((seen.temperature, seen.top_p, seen.top_k, seen.min_p), (1.0, 1.0, 0, 0.0));
    let (_, models) = server.get("/v1/models").await;
    let temperature = &models["data"][0]["sampling_defaults"]["non_thinking"]["temperature"];
    assert_eq!(temperature, &json!({"value": 1.0, "source": "built_in"}));
}
