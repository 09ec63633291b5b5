//! Tool calls and structured output: a forced call's arguments are a JSON string that parses
//! and fits the tool's schema (types included: an integer stays an integer), the streamed call
//! assembles to the same arguments once (no fragment sent twice), `tool_choice` none / required
//! / named is obeyed, and a strict `json_schema` answer parses and validates, streamed or not.

use serde_json::{json, Value};

use super::wire::{self, clip, content, finish_reason, user_request};
use super::{Check, CheckResult, EvalContext, Tier};
use crate::client::Client;
use crate::error::BenchError;
use crate::schema::validate;

const SECTION: &str = "tools";
const WEATHER_PROMPT: &str = "What will the weather be in Paris over the next 3 days?";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"], "additionalProperties": false}}}
    ])
}

fn tool_request(choice: Value) -> Value {
    let mut body = user_request(WEATHER_PROMPT, 96);
    body["tools"] = tools();
    body["tool_choice"] = choice;
    body
}

fn person_schema() -> Value {
    json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false})
}

const PERSON_PROMPT: &str = "Describe a person named Ann who is 31 years old as a JSON object \
                             with the fields name and age.";

pub(super) async fn run(context: &EvalContext) -> Vec<CheckResult> {
    if !context.runs(Tier::Standard) {
        return Vec::new();
    }
    let client = &context.client;
    let forced = client.chat_completion(tool_request(json!("required"))).await;
    let mut out = vec![required_call(&forced)];
    out.push(streamed_call(client, &forced).await);
    out.push(choice_none(client).await);
    out.push(named_call(client).await);
    out.push(auto_call(client).await);
    out.push(strict_schema(client, Delivery::Whole).await);
    out.push(strict_schema(client, Delivery::Streamed).await);
    out.push(unconstrained_schema(client).await);
    out
}

/// What is wrong with one call (`name`, `arguments` as sent), judged by the tools' schemas.
fn call_problem(name: &str, arguments: &Value) -> Option<String> {
    let Some(text) = arguments.as_str() else {
        return Some(format!("{name}: arguments are not a JSON string: {arguments}"));
    };
    let parsed: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Some(format!("{name}: arguments do not parse ({e}): {}", clip(text))),
    };
    let tools = tools();
    let tool = tools.as_array()?.iter().find(|t| t["function"]["name"] == name);
    let Some(tool) = tool else { return Some(format!("{name}: not one of the tools")) };
    validate(&tool["function"]["parameters"], &parsed).err().map(|e| format!("{name}: {e}"))
}

/// The calls of a non-streamed answer as `(name, arguments)`.
fn calls(answer: &Value) -> Vec<(String, Value)> {
    let calls = answer["choices"][0]["message"]["tool_calls"].as_array().cloned();
    calls
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let name = c["function"]["name"].as_str().unwrap_or_default().to_string();
            (name, c["function"]["arguments"].clone())
        })
        .collect()
}

fn describe(calls: &[(String, Value)]) -> String {
    let text: Vec<String> =
        calls.iter().map(|(n, a)| format!("{n}({})", clip(&a.to_string()))).collect();
    format!("{} call(s): {}", calls.len(), text.join(", "))
}

fn required_call(forced: &Result<Value, BenchError>) -> CheckResult {
    let check = Check::server(
        SECTION,
        "tool-call-required",
        "tool_choice required: at least one call; arguments a JSON string that parses and fits \
         the tool's schema (days an integer)",
    );
    let answer = match forced {
        Ok(answer) => answer,
        Err(e) => return check.error(e),
    };
    let calls = calls(answer);
    let problem = calls.iter().find_map(|(name, args)| call_problem(name, args));
    match (calls.is_empty(), problem) {
        (true, _) => check.judge(false, format!("no tool call: {}", clip(&answer.to_string()))),
        (false, Some(problem)) => check.judge(false, problem),
        (false, None) => check.judge(true, describe(&calls)),
    }
}

async fn streamed_call(client: &Client, forced: &Result<Value, BenchError>) -> CheckResult {
    let check = Check::server(
        SECTION,
        "tool-call-streamed",
        "the streamed call's argument fragments join into one JSON object equal to the plain \
         call's (no fragment repeated)",
    );
    let plain = match forced {
        Ok(answer) => calls(answer),
        Err(e) => return check.error(e),
    };
    let streamed = match wire::stream(client, tool_request(json!("required"))).await {
        Ok(s) => s,
        Err(e) => return check.error(e),
    };
    let parse = |a: &str| serde_json::from_str::<Value>(a).ok();
    let joined: Vec<(String, Option<Value>)> =
        streamed.calls.iter().map(|c| (c.name.clone(), parse(&c.arguments))).collect();
    let expected: Vec<(String, Option<Value>)> =
        plain.iter().map(|(n, a)| (n.clone(), a.as_str().and_then(parse))).collect();
    let broken = streamed.calls.iter().find(|c| parse(&c.arguments).is_none());
    if let Some(call) = broken {
        let actual =
            format!("{}: joined arguments do not parse: {}", call.name, clip(&call.arguments));
        return check.judge(false, actual);
    }
    let actual: Vec<String> =
        streamed.calls.iter().map(|c| format!("{}({})", c.name, clip(&c.arguments))).collect();
    let passed = !joined.is_empty() && joined == expected;
    check.judge(passed, format!("streamed {}; plain {}", actual.join(", "), describe(&plain)))
}

async fn choice_none(client: &Client) -> CheckResult {
    let check = Check::server(SECTION, "tool-choice-none", "tool_choice none: no tool call");
    check.judge_result(client.chat_completion(tool_request(json!("none"))).await.map(|answer| {
        let calls = calls(&answer);
        let text = content(&answer);
        (calls.is_empty(), format!("{}; content {:?}", describe(&calls), clip(&text)))
    }))
}

async fn named_call(client: &Client) -> CheckResult {
    let check = Check::server(
        SECTION,
        "tool-choice-named",
        "tool_choice get_time (asked about the weather): only get_time calls, valid arguments",
    );
    let choice = json!({"type": "function", "function": {"name": "get_time"}});
    check.judge_result(client.chat_completion(tool_request(choice)).await.map(|answer| {
        let calls = calls(&answer);
        let problem = calls.iter().find_map(|(name, args)| call_problem(name, args));
        let only_named = calls.iter().all(|(name, _)| name == "get_time");
        let passed = !calls.is_empty() && only_named && problem.is_none();
        (passed, problem.unwrap_or_else(|| describe(&calls)))
    }))
}

async fn auto_call(client: &Client) -> CheckResult {
    let check = Check::model(
        SECTION,
        "tool-choice-auto",
        "tool_choice auto on a weather question: a valid get_weather call",
    );
    check.judge_result(client.chat_completion(tool_request(json!("auto"))).await.map(|answer| {
        let calls = calls(&answer);
        let problem = calls.iter().find_map(|(name, args)| call_problem(name, args));
        let passed = calls.iter().any(|(n, _)| n == "get_weather") && problem.is_none();
        (
            passed,
            problem.unwrap_or_else(|| {
                format!("{}; content {:?}", describe(&calls), clip(&content(&answer)))
            }),
        )
    }))
}

/// How a check asks for its answer.
#[derive(Clone, Copy)]
enum Delivery {
    Whole,
    Streamed,
}

async fn strict_schema(client: &Client, delivery: Delivery) -> CheckResult {
    let name = match delivery {
        Delivery::Whole => "json-schema",
        Delivery::Streamed => "json-schema-streamed",
    };
    let check = Check::server(
        SECTION,
        name,
        "response_format json_schema (strict): the answer parses and fits the schema",
    );
    let mut body = user_request(PERSON_PROMPT, 160);
    body["response_format"] = json!({"type": "json_schema",
        "json_schema": {"name": "person", "strict": true, "schema": person_schema()}});
    let answer = match delivery {
        Delivery::Streamed => wire::stream(client, body)
            .await
            .map(|s| (s.content, s.finish_reason.unwrap_or_default())),
        Delivery::Whole => {
            client.chat_completion(body).await.map(|a| (content(&a), finish_reason(&a)))
        }
    };
    let (text, reason) = match answer {
        Ok(answer) => answer,
        Err(e) => return check.error(e),
    };
    if reason == "length" {
        // The model spent max_tokens inside the object (a long string): not the server's doing.
        return check.skip(format!("cut by max_tokens before the object closed: {}", clip(&text)));
    }
    let verdict = schema_verdict(&text);
    check.judge(verdict.is_ok(), verdict.unwrap_or_else(|e| e))
}

/// `Ok` with the text when it parses and fits [`person_schema`], else what is wrong.
fn schema_verdict(text: &str) -> Result<String, String> {
    let value: Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("does not parse ({e}): {}", clip(text)))?;
    validate(&person_schema(), &value).map_err(|e| format!("{e}: {}", clip(text)))?;
    Ok(clip(text))
}

async fn unconstrained_schema(client: &Client) -> CheckResult {
    let check = Check::model(
        SECTION,
        "json-unconstrained",
        "asked in words only (no response_format): the answer is a JSON object with name and age",
    );
    let prompt = format!("{PERSON_PROMPT} Answer with the JSON object only.");
    check.judge_result(client.chat_completion(user_request(&prompt, 160)).await.map(|answer| {
        let verdict = schema_verdict(&content(&answer));
        (verdict.is_ok(), verdict.unwrap_or_else(|e| e))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_problems() {
        assert_eq!(call_problem("get_weather", &json!("{\"city\":\"Paris\",\"days\":3}")), None);
        let coerced = call_problem("get_weather", &json!("{\"city\":\"Paris\",\"days\":\"3\"}"));
        assert_eq!(coerced.unwrap(), "get_weather: days: expected integer, got string");
        let object = call_problem("get_weather", &json!({"city": "Paris", "days": 3}));
        assert!(object.unwrap().contains("not a JSON string"));
        let doubled =
            call_problem("get_time", &json!("{\"timezone\":\"UTC\"}{\"timezone\":\"UTC\"}"));
        assert!(doubled.unwrap().contains("do not parse"));
        assert!(call_problem("rm_rf", &json!("{}")).unwrap().contains("not one of the tools"));
    }

    #[test]
    fn schema_verdicts() {
        assert!(schema_verdict(" {\"name\":\"Ann\",\"age\":31}\n").is_ok());
        assert!(schema_verdict("{\"name\":\"Ann\"}").unwrap_err().contains("age: missing"));
        assert!(schema_verdict("Ann is 31").unwrap_err().starts_with("does not parse"));
    }
}
