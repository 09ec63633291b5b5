//! Sampling controls: stop strings (an array, streamed, a bare string, an empty array), the
//! output limit (`max_tokens`, `max_completion_tokens`), logprobs (shape and `top_logprobs`
//! bounds), exact replay at temperature 0 and same-seed parity between a streamed and a plain
//! call.
//!
//! The stop string is cut from the model's own greedy answer, so any model has one to hit: the
//! answer with the stop must be the greedy answer up to the stop's first occurrence.

use reqwest::Method;
use serde_json::{json, Value};

use super::wire::{self, clip, content, finish_reason, user_request, CHAT};
use super::{Check, CheckResult, EvalContext, Tier};
use crate::client::Client;
use crate::error::BenchError;

const SECTION: &str = "sampling";
/// A prompt small and large models answer with a long, varied, greedy text.
pub(crate) const COUNT_PROMPT: &str = "Count from 1 to 40, separated by commas.";
/// Tokens of the greedy answer the stop string is taken from.
const ANSWER_TOKENS: u32 = 32;
/// A prompt whose sampled answers differ from seed to seed.
const STORY_PROMPT: &str = "Write a short story about a fox who finds a key.";

pub(super) async fn run(context: &EvalContext) -> Vec<CheckResult> {
    let client = &context.client;
    let mut out = Vec::new();
    let greedy = client.chat_completion(user_request(COUNT_PROMPT, ANSWER_TOKENS)).await;
    let greedy = greedy.as_ref().map(content).map_err(|e| e.to_string());
    out.push(stop(client, &greedy, StopForm::Array).await);
    if context.runs(Tier::Standard) {
        out.push(stop(client, &greedy, StopForm::Streamed).await);
        out.push(stop(client, &greedy, StopForm::BareString).await);
        out.push(empty_stop_array(client, &greedy).await);
    }
    out.push(limit(client, "max_tokens").await);
    if context.runs(Tier::Standard) {
        out.push(limit(client, "max_completion_tokens").await);
    }
    out.push(exact_replay(client, context.tier.replays()).await);
    if context.runs(Tier::Standard) {
        out.push(logprobs_shape(client).await);
        out.push(top_logprobs_bounds(client).await);
        out.push(seed_parity_streaming(client).await);
    }
    out
}

/// Characters of the stop string cut from the greedy answer.
const STOP_CHARS: usize = 3;

/// A stop string from the middle of `text` (no whitespace at its ends) and the text before its
/// first occurrence, never empty, so a server that stops at once is caught; `None` for a text
/// too short to have one.
pub(crate) fn pick_stop(text: &str) -> Option<(String, String)> {
    let chars: Vec<char> = text.chars().collect();
    let last = chars.len().checked_sub(STOP_CHARS)?;
    (chars.len() / 2..=last).find_map(|start| {
        let stop: String = chars[start..start + STOP_CHARS].iter().collect();
        if stop.trim() != stop {
            return None;
        }
        let at = text.find(&stop).filter(|&at| at > 0)?;
        Some((stop, text[..at].to_string()))
    })
}

/// How the stop check sends its stop string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopForm {
    /// `"stop": ["…"]`, not streamed.
    Array,
    /// `"stop": ["…"]`, streamed.
    Streamed,
    /// `"stop": "…"` (OpenAI takes one string as well as an array), not streamed.
    BareString,
}

async fn stop(client: &Client, greedy: &Result<String, String>, form: StopForm) -> CheckResult {
    let name = match form {
        StopForm::Array => "stop",
        StopForm::Streamed => "stop-streamed",
        StopForm::BareString => "stop-bare-string",
    };
    let check = Check::server(
        SECTION,
        name,
        "the greedy answer cut before the stop string's first occurrence, finish_reason stop",
    );
    let greedy = match greedy {
        Ok(text) => text,
        Err(e) => return check.error(e),
    };
    let Some((stop, before)) = pick_stop(greedy) else {
        return check.skip(format!("the greedy answer has no stop string to take: {greedy:?}"));
    };
    let expected = format!("{before:?} (the greedy answer up to {stop:?}), finish_reason stop");
    let check = Check { expected, ..check };
    let mut body = user_request(COUNT_PROMPT, ANSWER_TOKENS);
    body["stop"] = if form == StopForm::BareString { json!(stop) } else { json!([stop]) };
    let answer = if form == StopForm::Streamed {
        wire::stream(client, body).await.map(|s| (s.content, s.finish_reason.unwrap_or_default()))
    } else {
        client.chat_completion(body).await.map(|a| (content(&a), finish_reason(&a)))
    };
    check.judge_result(answer.map(|(text, reason)| {
        let passed = text == before && reason == "stop";
        (passed, format!("{text:?}, finish_reason {reason} (stop {stop:?})"))
    }))
}

async fn empty_stop_array(client: &Client, greedy: &Result<String, String>) -> CheckResult {
    let check = Check::server(SECTION, "empty-stop-array", "`stop: []` accepted, answer unchanged");
    let greedy = match greedy {
        Ok(text) => text,
        Err(e) => return check.error(e),
    };
    let mut body = user_request(COUNT_PROMPT, ANSWER_TOKENS);
    body["stop"] = json!([]);
    check.judge_result(client.chat_completion(body).await.map(|answer| {
        let text = content(&answer);
        (text == *greedy, format!("{} (greedy without stop: {})", clip(&text), clip(greedy)))
    }))
}

/// The output limit `field` (`max_tokens`, or `max_completion_tokens` that replaces it) is
/// honoured.
async fn limit(client: &Client, field: &'static str) -> CheckResult {
    const LIMIT: u64 = 7;
    let name = if field == "max_tokens" { "max-tokens" } else { "max-completion-tokens" };
    let check = Check::server(
        SECTION,
        name,
        &format!(
            "{field} {LIMIT}: completion_tokens <= {LIMIT}; finish_reason length exactly when \
             {LIMIT} were generated"
        ),
    );
    let mut body = user_request(COUNT_PROMPT, 1);
    if let Some(fields) = body.as_object_mut() {
        fields.remove("max_tokens");
        fields.insert(field.to_string(), json!(LIMIT));
    }
    check.judge_result(client.chat_completion(body).await.map(|a| {
        let tokens = a["usage"]["completion_tokens"].as_u64().unwrap_or(u64::MAX);
        let reason = finish_reason(&a);
        let passed = tokens <= LIMIT && (reason == "length") == (tokens == LIMIT);
        (passed, format!("completion_tokens {tokens}, finish_reason {reason}"))
    }))
}

async fn exact_replay(client: &Client, times: usize) -> CheckResult {
    let check = Check::server(
        SECTION,
        "exact-replay",
        &format!("the same temperature-0 request {times} times: one text"),
    );
    let mut texts = Vec::new();
    for _ in 0..times {
        match client.chat_completion(user_request(STORY_PROMPT, 24)).await {
            Ok(answer) => texts.push(content(&answer)),
            Err(e) => return check.error(e),
        }
    }
    let distinct = distinct(&texts);
    check.judge(distinct.len() == 1, format!("{} distinct: {distinct:?}", distinct.len()))
}

/// The distinct texts of `texts`, in order of first appearance, clipped.
pub(crate) fn distinct(texts: &[String]) -> Vec<String> {
    let mut seen: Vec<&String> = Vec::new();
    for t in texts {
        if !seen.contains(&t) {
            seen.push(t);
        }
    }
    seen.into_iter().map(|t| clip(t)).collect()
}

async fn logprobs_shape(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "logprobs-shape",
        "one logprobs.content entry per completion token, each with a token, a logprob <= 0 and \
         3 top_logprobs in descending order led by the sampled token",
    );
    let mut body = user_request(COUNT_PROMPT, 6);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    check.judge_result(client.chat_completion(body).await.map(|answer| {
        let tokens = answer["usage"]["completion_tokens"].as_u64();
        let entries = answer["choices"][0]["logprobs"]["content"].as_array().cloned();
        let Some(entries) = entries else {
            return (false, format!("no logprobs.content: {}", clip(&answer.to_string())));
        };
        if Some(entries.len() as u64) != tokens {
            return (false, format!("{} entries for completion_tokens {tokens:?}", entries.len()));
        }
        match entries.iter().enumerate().find_map(|(i, e)| entry_problem(e).map(|p| (i, p))) {
            Some((i, problem)) => (false, format!("entry {i}: {problem}")),
            None => (true, format!("{} well-formed entries", entries.len())),
        }
    }))
}

/// What is wrong with one `logprobs.content` entry of a greedy answer with 3 alternatives.
fn entry_problem(entry: &Value) -> Option<String> {
    let logprob = entry["logprob"].as_f64().filter(|l| *l <= 0.0);
    let (Some(token), Some(logprob)) = (entry["token"].as_str(), logprob) else {
        return Some(format!("no token or a logprob above 0: {entry}"));
    };
    let top = entry["top_logprobs"].as_array().map(Vec::as_slice).unwrap_or_default();
    let values: Vec<f64> = top.iter().filter_map(|t| t["logprob"].as_f64()).collect();
    if top.len() != 3 || values.len() != 3 || values.windows(2).any(|w| w[0] < w[1]) {
        return Some(format!("top_logprobs not 3 in descending order: {}", entry["top_logprobs"]));
    }
    // Greedy: the sampled token is the most likely one.
    let leads = top[0]["token"] == token || (values[0] - logprob).abs() < 1e-4;
    (!leads).then(|| format!("sampled {token:?} ({logprob}) is not the top alternative {}", top[0]))
}

async fn top_logprobs_bounds(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "top-logprobs-bounds",
        "top_logprobs 21 and -1 each refused with 400 in OpenAI's error shape",
    );
    let mut seen = Vec::new();
    let mut passed = true;
    for bad in [21, -1] {
        let mut body = client.with_model(user_request(COUNT_PROMPT, 4));
        body["logprobs"] = json!(true);
        body["top_logprobs"] = json!(bad);
        let reply = wire::send(client, Method::POST, CHAT, Some(body.to_string().into()), None);
        match reply.await {
            Ok(reply) => {
                passed &= reply.status == 400 && reply.error_shape_problem().is_none();
                seen.push(format!("{bad}: {}", reply.describe()));
            }
            Err(e) => return check.error(e),
        }
    }
    check.judge(passed, seen.join("; "))
}

/// A sampled (temperature 0.9) request with a fixed seed.
pub(crate) fn seeded_request(seed: i64) -> Value {
    let mut body = user_request(STORY_PROMPT, 24);
    body["temperature"] = json!(0.9);
    body["seed"] = json!(seed);
    body
}

async fn seed_parity_streaming(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "seed-parity-streaming",
        "temperature 0.9, seed 4242: the streamed text equals the plain call's",
    );
    let plain = client.chat_completion(seeded_request(4242)).await.map(|a| content(&a));
    let streamed = wire::stream(client, seeded_request(4242)).await.map(|s| s.content);
    let both: Result<_, BenchError> = plain.and_then(|p| Ok((p, streamed?)));
    check.judge_result(both.map(|(plain, streamed)| {
        (plain == streamed, format!("plain {:?}, streamed {:?}", clip(&plain), clip(&streamed)))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_string_from_the_middle() {
        // "4, " ends in a space: the next start is taken.
        assert_eq!(pick_stop("1, 2, 3, 4, 5, 6, 7"), Some((", 5".into(), "1, 2, 3, 4".into())));
        // The first occurrence decides what comes before.
        assert_eq!(pick_stop("1234567890123456"), Some(("901".into(), "12345678".into())));
        // A middle piece that opens the text would stop at once: a later one is taken.
        assert_eq!(pick_stop("abcabcd"), Some(("bcd".into(), "abca".into())));
        assert_eq!(pick_stop("ab"), None);
        assert_eq!(pick_stop("   "), None);
    }

    #[test]
    fn logprob_entries() {
        let top = |a: f64, b: f64, c: f64| {
            json!([{"token": "x", "logprob": a}, {"token": "y", "logprob": b},
                {"token": "z", "logprob": c}])
        };
        let good = json!({"token": "x", "logprob": -0.1, "top_logprobs": top(-0.1, -2.0, -3.0)});
        assert_eq!(entry_problem(&good), None);
        let unsorted =
            json!({"token": "x", "logprob": -0.1, "top_logprobs": top(-0.1, -3.0, -2.0)});
        assert!(entry_problem(&unsorted).unwrap().contains("descending"));
        let not_greedy =
            json!({"token": "q", "logprob": -1.0, "top_logprobs": top(-0.1, -2.0, -3.0)});
        assert!(entry_problem(&not_greedy).unwrap().contains("not the top"));
        let positive = json!({"token": "x", "logprob": 0.5, "top_logprobs": top(0.5, -2.0, -3.0)});
        assert!(entry_problem(&positive).is_some());
    }

    #[test]
    fn distinct_texts_in_order() {
        let texts = ["a", "b", "a"].map(String::from);
        assert_eq!(distinct(&texts), ["a", "b"]);
    }
}
