//! Serving many requests: the prefix cache serves a repeated system prompt
//! (`usage.prompt_tokens_details.cached_tokens` > 0), concurrent requests never see each
//! other's text (plain, and streamed in the full tier), and the same seed gives the same text
//! when the calls run together.

use serde_json::{json, Value};

use super::checks_sampling::{distinct, seeded_request};
use super::wire::{self, clip, content};
use super::{Check, CheckResult, EvalContext, Tier};
use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::system_prompt;

const SECTION: &str = "serving";
/// Tokens of the shared system prompt of the cache check: several blocks of any cache.
const SYSTEM_TOKENS: usize = 600;

pub(super) async fn run(context: &EvalContext) -> Vec<CheckResult> {
    let client = &context.client;
    let mut out = vec![prefix_cache(client, context.salt).await];
    if context.runs(Tier::Standard) {
        let n = context.tier.concurrency();
        out.extend(isolation(client, context.salt, n, Mode::Plain).await);
        if context.runs(Tier::Full) {
            out.extend(isolation(client, context.salt, n, Mode::Streamed).await);
        }
        out.push(seed_parity_concurrent(client, n / 2).await);
    }
    out
}

fn with_system(system: &str, user: &str) -> Value {
    json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0,
    })
}

async fn prefix_cache(client: &Client, salt: u64) -> CheckResult {
    let check = Check::server(
        SECTION,
        "prefix-cache-hit",
        "a second call with the same ~600-token system prompt and a new user message reports \
         usage.prompt_tokens_details.cached_tokens > 0",
    );
    let system = system_prompt(salt, SYSTEM_TOKENS, 4.0);
    let cached =
        |answer: &Value| answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let first = client.chat_completion(with_system(&system, "Which crates are listed?")).await;
    let second = match first {
        Ok(_) => client.chat_completion(with_system(&system, "Name one tool.")).await,
        Err(e) => return check.error(e),
    };
    check.judge_result(second.map(|answer| {
        let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        match cached(&answer) {
            Some(n) => (n > 0, format!("cached_tokens {n} of {prompt} prompt tokens")),
            None => (false, format!("no cached_tokens in usage: {}", answer["usage"])),
        }
    }))
}

/// How the concurrent calls are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Streamed,
}

/// Runs `bodies` as concurrent chat calls; their texts in order, or the first failure.
async fn concurrently(
    client: &Client,
    bodies: Vec<Value>,
    mode: Mode,
) -> Result<Vec<String>, BenchError> {
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let client = client.clone();
            tokio::spawn(async move {
                match mode {
                    Mode::Plain => client.chat_completion(body).await.map(|a| content(&a)),
                    Mode::Streamed => wire::stream(&client, body).await.map(|s| s.content),
                }
            })
        })
        .collect();
    let mut texts = Vec::new();
    for task in tasks {
        texts.push(task.await.map_err(|e| BenchError::StreamError(e.to_string()))??);
    }
    Ok(texts)
}

/// A code no other request of the run carries: letters only, so no tokenizer splits it into
/// something another code shares by chance.
pub(crate) fn nonce(salt: u64, i: usize) -> String {
    let mut x = salt ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let letters: String = (0..8)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            char::from(b'A' + ((x >> 33) % 26) as u8)
        })
        .collect();
    format!("QZ{letters}{i}")
}

/// Which other requests' nonces appear in each answer, as `(answer, leaked nonce)`.
pub(crate) fn leaks(nonces: &[String], answers: &[String]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, answer) in answers.iter().enumerate() {
        for (j, other) in nonces.iter().enumerate() {
            if i != j && answer.contains(other.as_str()) {
                found.push((i, other.clone()));
            }
        }
    }
    found
}

/// The isolation check with `mode`'s calls, and (plain calls only) whether each answer
/// repeated its own code.
async fn isolation(client: &Client, salt: u64, n: usize, mode: Mode) -> Vec<CheckResult> {
    let (name, calls) = match mode {
        Mode::Plain => ("concurrency-isolation", "calls"),
        Mode::Streamed => ("concurrency-isolation-streamed", "streamed calls"),
    };
    let leak = Check::server(
        SECTION,
        name,
        &format!(
            "{n} concurrent {calls}, each asked to repeat its own code: no answer holds another \
             call's code"
        ),
    );
    let echo = Check::model(SECTION, "nonce-echo", "each concurrent answer repeats its own code");
    let nonces: Vec<String> = (0..n).map(|i| nonce(salt, i)).collect();
    let bodies = nonces
        .iter()
        .map(|code| {
            let user = format!("Repeat this code exactly, and nothing else: {code}");
            json!({"messages": [{"role": "user", "content": user}], "max_tokens": 24,
                "temperature": 0})
        })
        .collect();
    let answers = match concurrently(client, bodies, mode).await {
        Ok(answers) => answers,
        Err(e) if mode == Mode::Plain => {
            return vec![leak.error(e), echo.error("a concurrent call failed")]
        }
        Err(e) => return vec![leak.error(e)],
    };
    let found = leaks(&nonces, &answers);
    let leak = leak.judge(
        found.is_empty(),
        match found.first() {
            None => format!("{n} answers, no foreign code"),
            Some((i, code)) => {
                format!("{} leaks; answer {i} holds {code}: {:?}", found.len(), clip(&answers[*i]))
            }
        },
    );
    if mode == Mode::Streamed {
        return vec![leak];
    }
    let echoed = nonces.iter().zip(&answers).filter(|(code, a)| a.contains(code.as_str())).count();
    vec![leak, echo.judge(echoed == n, format!("{echoed} of {n} repeated their code"))]
}

async fn seed_parity_concurrent(client: &Client, n: usize) -> CheckResult {
    let check = Check::server(
        SECTION,
        "seed-parity-concurrent",
        &format!("temperature 0.9, seed 7: {n} concurrent calls and a lone one give one text"),
    );
    let lone = match client.chat_completion(seeded_request(7)).await {
        Ok(answer) => content(&answer),
        Err(e) => return check.error(e),
    };
    let mut texts = vec![lone];
    match concurrently(client, vec![seeded_request(7); n], Mode::Plain).await {
        Ok(answers) => texts.extend(answers),
        Err(e) => return check.error(e),
    }
    let distinct = distinct(&texts);
    check.judge(distinct.len() == 1, format!("{} distinct: {distinct:?}", distinct.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_distinct_and_not_contained_in_each_other() {
        let nonces: Vec<String> = (0..16).map(|i| nonce(99, i)).collect();
        for (i, a) in nonces.iter().enumerate() {
            for (j, b) in nonces.iter().enumerate() {
                assert!(i == j || !a.contains(b.as_str()), "{a} {b}");
            }
        }
        assert_ne!(nonce(1, 0), nonce(2, 0));
    }

    #[test]
    fn leaks_name_the_foreign_code() {
        let nonces = ["QZA0".to_string(), "QZB1".to_string()];
        let answers = ["QZA0".to_string(), "QZB1 and QZA0".to_string()];
        assert_eq!(leaks(&nonces, &answers), [(1, "QZA0".to_string())]);
        assert!(leaks(&nonces, &["QZA0".into(), "QZB1".into()]).is_empty());
    }
}
