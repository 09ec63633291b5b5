//! The grammars hold whatever the model prefers: random logits stand in for a model, every
//! token is the best one the mask allows, and every walk must end in text that parses and
//! follows the schema. Uses the real Qwen2.5 vocabulary (151k tokens, `<tool_call>` an added
//! token) so tokens that span grammar boundaries occur as they do in serving.

use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use spindle_chat::{parse_message, Tokenizer, ToolCallFormat, ToolSchema};
use spindle_constrain::{grammar, CallMode, Constraint, Grammars, ToolRule, TopLevelGrammar};

/// Steps a walk may take; every walk here must end well before.
const MAX_STEPS: usize = 400;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = spindle_hub::pull("qwen2.5-coder-0.5b", &spindle_hub::spindle_home())
            .unwrap_or_else(|e| panic!("qwen2.5-coder-0.5b: {e}"));
        Tokenizer::from_gguf(spindle_chat::read_tokenizer_metadata(&path).unwrap()).unwrap()
    })
}

fn grammars() -> &'static Grammars {
    static GRAMMARS: OnceLock<Grammars> = OnceLock::new();
    GRAMMARS.get_or_init(|| Grammars::new(tokenizer()).unwrap())
}

/// Follows `grammar` from random logits (a model's vocabulary rows beyond the tokenizer's
/// included) until a stop token; returns the text.
fn walk(grammar: TopLevelGrammar, seed: u64) -> String {
    let tok = tokenizer();
    let mut constraint: Constraint = grammars().compile(grammar).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ids = Vec::new();
    let rows = tok.vocab_size() + 64;
    for _ in 0..MAX_STEPS {
        let mut logits: Vec<f32> = (0..rows).map(|_| rng.random_range(-4.0..4.0)).collect();
        constraint.mask(&mut logits).unwrap();
        let (best, _) = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap();
        assert!(
            logits[best].is_finite(),
            "seed {seed}: the mask allowed nothing after {:?}",
            tok.decode(&ids, false)
        );
        let id = best as u32;
        if tok.eos_token_ids().contains(&id) {
            return tok.decode(&ids, false).unwrap();
        }
        constraint.advance(id).unwrap();
        ids.push(id);
    }
    panic!("seed {seed}: no end after {MAX_STEPS} tokens: {:?}", tok.decode(&ids, false));
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "manager": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
            "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 3},
            "active": {"type": "boolean"}
        },
        "required": ["name", "age", "role", "manager", "scores", "active"],
        "additionalProperties": false
    })
}

/// Checks `value` against [`person_schema`] field by field.
fn assert_person(value: &Value, text: &str) {
    let object = value.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    assert_eq!(object.len(), 6, "{text}");
    assert!(object["name"].as_str().is_some_and(|s| s.chars().count() <= 12), "{text}");
    assert!(object["age"].as_u64().is_some_and(|n| n <= 150), "{text}");
    assert!(["admin", "user", "guest"].contains(&object["role"].as_str().unwrap_or("")), "{text}");
    assert!(
        object["manager"].is_null()
            || object["manager"].as_str().is_some_and(|s| s.chars().count() <= 8),
        "{text}"
    );
    let scores = object["scores"].as_array().unwrap_or_else(|| panic!("{text}"));
    assert!(
        scores.len() <= 3
            && scores.iter().all(|s| s.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x))),
        "{text}"
    );
    assert!(object["active"].is_boolean(), "{text}");
}

#[test]
fn json_schema_walks_always_give_valid_documents() {
    for seed in 0..12 {
        let text = walk(grammar::json_schema(&person_schema()), seed);
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        assert_person(&value, &text);
    }
}

fn tools() -> (Vec<ToolRule>, Vec<ToolSchema>) {
    let weather = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "metric": {"type": "boolean"}
        },
        "required": ["city", "days"],
        "additionalProperties": false
    });
    let person = person_schema();
    let rules = vec![
        ToolRule { name: "get_weather".into(), parameters: Some(weather.clone()) },
        ToolRule { name: "add_person".into(), parameters: Some(person.clone()) },
    ];
    let schemas = vec![
        ToolSchema { name: "get_weather".into(), parameters: weather },
        ToolSchema { name: "add_person".into(), parameters: person },
    ];
    (rules, schemas)
}

fn assert_call_valid(name: &str, arguments: &str, text: &str) {
    let args: Value =
        serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{e}: {arguments} in {text}"));
    match name {
        "get_weather" => {
            let city = args["city"].as_str().unwrap_or_else(|| panic!("{text}"));
            assert!(city.chars().count() <= 10 || text.contains("<parameter=city>"), "{text}");
            assert!(args["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)), "{text}");
            assert!(args.get("metric").is_none_or(Value::is_boolean), "{text}");
        }
        "add_person" => assert_person(&args, text),
        other => panic!("unknown tool {other}: {text}"),
    }
}

#[test]
fn required_tool_calls_always_parse_and_validate_in_every_format() {
    let (rules, schemas) = tools();
    for format in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json] {
        for seed in 0..6 {
            let text = walk(grammar::tool_calls(format, &rules, CallMode::Required, true), seed);
            let message = parse_message(format, &schemas, &text);
            assert!(!message.calls.is_empty(), "{format:?} seed {seed}: no call in {text:?}");
            assert!(
                message.content.trim().is_empty(),
                "{format:?} seed {seed}: text beside the calls: {text:?}"
            );
            for call in &message.calls {
                assert_call_valid(&call.name, &call.arguments, &text);
            }
        }
    }
}

/// Parameters in pydantic's shape, whose properties name `$defs` by `$ref`: the references
/// must resolve to the tool's own definitions wherever the grammar embeds its parameters (#20:
/// they failed to compile in every format).
#[test]
fn tool_parameters_that_reference_their_definitions_are_enforced_in_every_format() {
    let parameters = json!({
        "type": "object",
        "properties": {"person": {"$ref": "#/$defs/person"}},
        "required": ["person"],
        "additionalProperties": false,
        "$defs": {"person": person_schema()}
    });
    let rules = [ToolRule { name: "add".into(), parameters: Some(parameters.clone()) }];
    let schemas = [ToolSchema { name: "add".into(), parameters }];
    for format in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::QwenXml] {
        for seed in 0..3 {
            let text = walk(grammar::tool_calls(format, &rules, CallMode::Required, false), seed);
            let message = parse_message(format, &schemas, &text);
            assert_eq!(message.calls.len(), 1, "{format:?} seed {seed}: {text:?}");
            let arguments: Value = serde_json::from_str(&message.calls[0].arguments).unwrap();
            assert_person(&arguments["person"], &text);
        }
    }
}

/// XML string values are free text up to their closing tag, which random logits never find;
/// typed values follow their schema, so this tool has only those.
#[test]
fn xml_calls_always_parse_with_values_typed_by_schema() {
    let volume = json!({
        "type": "object",
        "properties": {
            "level": {"type": "integer", "minimum": 0, "maximum": 10},
            "muted": {"type": "boolean"},
            "mode": {"enum": ["quiet", "loud"]},
            "channels": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 8}, "maxItems": 2}
        },
        "required": ["level", "muted", "mode"]
    });
    let rules = [ToolRule { name: "set_volume".into(), parameters: Some(volume.clone()) }];
    let schemas = [ToolSchema { name: "set_volume".into(), parameters: volume }];
    for seed in 0..8 {
        let text = walk(
            grammar::tool_calls(ToolCallFormat::QwenXml, &rules, CallMode::Required, true),
            seed,
        );
        let message = parse_message(ToolCallFormat::QwenXml, &schemas, &text);
        assert!(
            !message.calls.is_empty() && message.content.trim().is_empty(),
            "seed {seed}: {text:?}"
        );
        for call in &message.calls {
            let args: Value = serde_json::from_str(&call.arguments).unwrap();
            assert!(args["level"].as_u64().is_some_and(|l| l <= 10), "{text}");
            assert!(args["muted"].is_boolean(), "{text}");
            assert!(args["mode"] == "quiet" || args["mode"] == "loud", "{text}");
            assert!(
                args.get("channels").is_none_or(|c| c
                    .as_array()
                    .is_some_and(|c| c.len() <= 2 && c.iter().all(Value::is_u64))),
                "{text}"
            );
        }
    }
}

#[test]
fn a_named_tool_is_the_only_one_called() {
    let (rules, schemas) = tools();
    let named: Vec<ToolRule> = rules.into_iter().filter(|r| r.name == "get_weather").collect();
    for seed in 0..6 {
        let text = walk(
            grammar::tool_calls(ToolCallFormat::Hermes, &named, CallMode::Required, false),
            seed,
        );
        let message = parse_message(ToolCallFormat::Hermes, &schemas, &text);
        assert_eq!(message.calls.len(), 1, "{text}");
        assert_eq!(message.calls[0].name, "get_weather", "{text}");
        assert_call_valid("get_weather", &message.calls[0].arguments, &text);
    }
}

#[test]
fn calls_or_a_document_is_one_or_the_other() {
    let (rules, schemas) = tools();
    for seed in 0..6 {
        let text = walk(
            grammar::tool_calls_or_json(ToolCallFormat::Hermes, &rules, true, &person_schema()),
            seed,
        );
        let message = parse_message(ToolCallFormat::Hermes, &schemas, &text);
        if message.calls.is_empty() {
            assert_person(
                &serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
                &text,
            );
        } else {
            message.calls.iter().for_each(|c| assert_call_valid(&c.name, &c.arguments, &text));
        }
    }
}

#[test]
fn a_schema_that_cannot_be_enforced_is_refused_with_its_reason() {
    let contradiction = json!({"type": "integer", "minimum": 5, "maximum": 1});
    let error = grammars()
        .compile(grammar::json_schema(&contradiction))
        .err()
        .expect("a contradictory schema compiles");
    assert!(!error.to_string().is_empty());
    let unknown_type = json!({"type": "object", "properties": {"a": {"type": "decimal"}}});
    let error = grammars()
        .compile(grammar::json_schema(&unknown_type))
        .err()
        .expect("an unknown type compiles");
    assert!(error.to_string().contains("decimal"), "{error}");
}
