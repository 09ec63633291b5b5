//! A growing conversation through the chat API, as coding agents send it: every call repeats
//! the previous prompt, the model's reply and a new message. Each call reads only what is new:
//! `cached_tokens` covers the previous call's whole prompt and, on this attention-only model,
//! the reply as far as the template renders it back token for token.

use crate::common;

use common::{post, server, Setup};
use serde_json::{json, Value};

const TURNS: usize = 10;

#[tokio::test]
async fn each_call_of_a_growing_conversation_resumes_where_the_last_prompt_ended() {
    let base = server(Setup::Default);
    let mut messages = vec![
        json!({"role": "system", "content": "You are Fennel, the assistant of a seed shop in Ghent. Answer in one short sentence."}),
        json!({"role": "user", "content": "Which herbs grow well on a north-facing balcony?"}),
    ];
    let mut previous_prompt = None;
    let mut replies_reused = 0;
    for turn in 0..TURNS {
        let body = json!({"model": common::TINY, "messages": messages, "max_tokens": 12, "temperature": 0});
        let (status, reply) = post(&base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{reply}");
        let usage = &reply["usage"];
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        if let Some(previous) = previous_prompt {
            assert!(
                cached >= previous,
                "turn {turn}: the previous prompt ({previous} tokens) is reused whole, not {cached}"
            );
            replies_reused += usize::from(cached > previous);
        }
        assert!(cached < prompt);
        previous_prompt = Some(prompt);
        let answer: &Value = &reply["choices"][0]["message"]["content"];
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("Thanks. And what about question {turn}: mint, basil or thyme?")}));
    }
    assert!(replies_reused >= TURNS / 2, "the reply was read again in most turns");
}
