//! The HTTP protocol around generation: error statuses (400 bad body, 401 wrong key, 404
//! unknown route or model, 413 huge body, 429 full queue) with bodies in OpenAI's error shape,
//! the CORS preflight, and usage that adds up (prompt + completion = total, completion equal to
//! the tokens streamed).

use reqwest::Method;
use serde_json::{json, Value};

use super::checks_sampling::COUNT_PROMPT;
use super::wire::{self, clip, user_request, Reply, CHAT};
use super::{Check, CheckResult, EvalContext, Tier};
use crate::client::Client;
use crate::error::BenchError;

const SECTION: &str = "protocol";
/// Bytes of the huge-body check: above the default limits of the servers we know (Spindle
/// 16 MiB, llama-server and vLLM take more only when configured to).
const HUGE_BODY_BYTES: usize = 24 << 20;
/// Calls the queue-full check sends beyond the server's capacity.
const QUEUE_OVERFLOW: usize = 8;

pub(super) async fn run(context: &EvalContext) -> Vec<CheckResult> {
    let client = &context.client;
    let mut out = vec![usage_sum(client).await];
    if context.runs(Tier::Standard) {
        out.push(usage_streamed(client).await);
    }
    out.push(bad_body(client, "bad-body-400", b"{\"messages\": [".to_vec()).await);
    if context.runs(Tier::Standard) {
        let wrong_type = client.with_model(json!({"messages": "hello"})).to_string();
        out.push(bad_body(client, "wrong-type-400", wrong_type.into_bytes()).await);
    }
    out.push(unknown_route(client).await);
    out.push(cors_preflight(client).await);
    if context.runs(Tier::Standard) {
        out.push(unknown_model(client, context.salt).await);
        out.push(wrong_key(client, context.salt).await);
        out.push(huge_body(client).await);
        out.push(queue_full(client, context.queue_capacity).await);
    }
    out
}

/// `prompt + completion == total` and both counted, else what is wrong.
fn usage_problem(usage: &Value) -> Option<String> {
    let field = |k: &str| usage[k].as_u64();
    match (field("prompt_tokens"), field("completion_tokens"), field("total_tokens")) {
        (Some(p), Some(c), Some(t)) if p > 0 && p + c == t => None,
        _ => Some(format!("usage does not add up: {usage}")),
    }
}

async fn usage_sum(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "usage-sum",
        "prompt_tokens > 0, prompt_tokens + completion_tokens = total_tokens, completion <= 12",
    );
    check.judge_result(client.chat_completion(user_request(COUNT_PROMPT, 12)).await.map(|a| {
        let usage = &a["usage"];
        let within = usage["completion_tokens"].as_u64().is_some_and(|c| c <= 12);
        let problem = usage_problem(usage);
        (problem.is_none() && within, problem.unwrap_or_else(|| usage.to_string()))
    }))
}

async fn usage_streamed(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "usage-streamed",
        "streamed with include_usage: a usage chunk that adds up, completion_tokens equal to the \
         tokens streamed (logprob entries, else text chunks)",
    );
    let mut body = user_request(COUNT_PROMPT, 12);
    body["logprobs"] = json!(true);
    check.judge_result(wire::stream(client, body).await.map(|s| {
        let Some(usage) = &s.usage else { return (false, "no usage chunk".to_string()) };
        let completion = usage["completion_tokens"].as_u64();
        let streamed = s.token_count() as u64;
        let problem = usage_problem(usage).or_else(|| {
            (completion != Some(streamed)).then(|| format!("{streamed} tokens streamed"))
        });
        (
            problem.is_none(),
            format!("{usage}; {streamed} tokens streamed; {}", problem.unwrap_or_default()),
        )
    }))
}

/// Judges `reply`: status `status` and OpenAI's error shape.
fn expect_error(check: Check, reply: Result<Reply, BenchError>, status: u16) -> CheckResult {
    check.judge_result(reply.map(|reply| {
        (reply.status == status && reply.error_shape_problem().is_none(), reply.describe())
    }))
}

async fn bad_body(client: &Client, name: &'static str, body: Vec<u8>) -> CheckResult {
    let shown = clip(&String::from_utf8_lossy(&body));
    let check =
        Check::server(SECTION, name, &format!("400 in OpenAI's error shape for the body {shown}"));
    expect_error(check, wire::send(client, Method::POST, CHAT, Some(body), None).await, 400)
}

async fn unknown_route(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "unknown-route-404",
        "GET /v1/no-such-route: 404 in OpenAI's error shape",
    );
    expect_error(check, wire::send(client, Method::GET, "/v1/no-such-route", None, None).await, 404)
}

async fn unknown_model(client: &Client, salt: u64) -> CheckResult {
    let check = Check::server(
        SECTION,
        "unknown-model-404",
        "a model the server lacks: 404 in OpenAI's error shape",
    );
    let mut body = user_request(COUNT_PROMPT, 4);
    body["model"] = json!(format!("no-such-model-{salt:x}"));
    let reply = wire::send(client, Method::POST, CHAT, Some(body.to_string().into()), None).await;
    expect_error(check, reply, 404)
}

async fn wrong_key(client: &Client, salt: u64) -> CheckResult {
    let check =
        Check::server(SECTION, "wrong-key-401", "a wrong API key: 401 in OpenAI's error shape");
    let key = format!("wrong-key-{salt:x}");
    let reply = match wire::send(client, Method::GET, "/v1/models", None, Some(&key)).await {
        Ok(reply) => reply,
        Err(e) => return check.error(e),
    };
    if (200..300).contains(&reply.status) && client.api_key().is_none() {
        return check
            .skip("the server takes any key (none configured; pass --api-key to test one)");
    }
    expect_error(check, Ok(reply), 401)
}

async fn huge_body(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "huge-body-413",
        &format!("a {} MiB body: 413 in OpenAI's error shape", HUGE_BODY_BYTES >> 20),
    );
    let filler = "a".repeat(HUGE_BODY_BYTES);
    let body = client.with_model(user_request(&filler, 1)).to_string().into_bytes();
    let reply = match wire::send_while_reading(client, CHAT, body).await {
        Ok(reply) => reply,
        Err(e) => return check.error(e),
    };
    if reply.status == 400 {
        // The server read the whole body and refused the prompt as too long instead.
        return check.skip(format!("the server accepts bodies this large: {}", reply.describe()));
    }
    expect_error(check, Ok(reply), 413)
}

async fn queue_full(client: &Client, capacity: Option<usize>) -> CheckResult {
    let Some(capacity) = capacity else {
        let check = Check::server(SECTION, "queue-full-429", "429 once the queue is full");
        return check.skip("the server's queue capacity is not known (--queue-capacity)");
    };
    let n = capacity + QUEUE_OVERFLOW;
    let check = Check::server(
        SECTION,
        "queue-full-429",
        &format!(
            "{n} calls at once against a capacity of {capacity}: some 429 in OpenAI's error \
                  shape, the rest 200"
        ),
    );
    let body = client.with_model(user_request(COUNT_PROMPT, 48)).to_string();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, body) = (client.clone(), body.clone().into_bytes());
            tokio::spawn(
                async move { wire::send(&client, Method::POST, CHAT, Some(body), None).await },
            )
        })
        .collect();
    let (mut ok, mut refused, mut other) = (0, 0, Vec::new());
    for task in tasks {
        match task.await {
            Ok(Ok(reply)) if reply.status == 200 => ok += 1,
            Ok(Ok(reply)) if reply.status == 429 && reply.error_shape_problem().is_none() => {
                refused += 1
            }
            Ok(Ok(reply)) => other.push(reply.describe()),
            Ok(Err(e)) => other.push(e.to_string()),
            Err(e) => other.push(e.to_string()),
        }
    }
    let actual = format!("{ok} × 200, {refused} × 429, others: {other:?}");
    check.judge(refused > 0 && other.is_empty(), actual)
}

async fn cors_preflight(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "cors-preflight",
        "OPTIONS preflight: 2xx with Access-Control-Allow-Origin, -Methods (POST) and -Headers \
         (authorization, content-type)",
    );
    let request = client
        .request_with_key(Method::OPTIONS, CHAT, None)
        .header("origin", "http://example.test")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization,content-type");
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) => return check.error(e),
    };
    let headers = response.headers();
    let header = |name: &str| {
        headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase()
    };
    let allows = |name: &str, wanted: &[&str]| {
        let value = header(name);
        value == "*" || wanted.iter().all(|w| value.contains(w))
    };
    let origin = header("access-control-allow-origin");
    let passed = response.status().is_success()
        && (origin == "*" || origin == "http://example.test")
        && allows("access-control-allow-methods", &["post"])
        && allows("access-control-allow-headers", &["authorization", "content-type"]);
    let actual = format!(
        "status {}, allow-origin {origin:?}, allow-methods {:?}, allow-headers {:?}",
        response.status().as_u16(),
        header("access-control-allow-methods"),
        header("access-control-allow-headers")
    );
    check.judge(passed, actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_must_add_up() {
        let good = json!({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12});
        assert_eq!(usage_problem(&good), None);
        let off = json!({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 13});
        assert!(usage_problem(&off).is_some());
        assert!(usage_problem(
            &json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
        )
        .is_some());
        assert!(usage_problem(&Value::Null).is_some());
    }
}
