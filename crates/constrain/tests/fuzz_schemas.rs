//! Fuzzing grammar compilation (issue #20): the JSON schemas clients send (`response_format`,
//! tool parameters) and the tool names they choose, mutated (keywords of the wrong type,
//! extreme bounds, deep nesting, odd strings), compiled to each grammar Spindle builds and
//! followed for a few tokens. A schema may be refused with an error; none may panic or hang,
//! and what compiles must give a mask that allows at least one token.
//!
//! Uses SmolLM2's vocabulary (49k tokens, pulled on first use). `SPINDLE_FUZZ_CASES=100000`
//! runs a long campaign; the default is CI's fixed subset.

use serde_json::{json, Value};
use spindle_chat::{Tokenizer, ToolCallFormat};
use spindle_constrain::{grammar, CallMode, Grammars, ToolRule, TopLevelGrammar};
use spindle_fuzz::{mutate_json, Rng};

#[global_allocator]
static ALLOC: spindle_fuzz::CappedAlloc = spindle_fuzz::CappedAlloc;

const CI_CASES: u64 = 300;

/// Tokens each compiled grammar is followed for.
const STEPS: usize = 6;

fn tokenizer() -> Tokenizer {
    let home = spindle_hub::spindle_home();
    let path =
        spindle_hub::pull("smollm2-135m", &home).unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    Tokenizer::from_gguf(spindle_chat::read_tokenizer_metadata(&path).unwrap()).unwrap()
}

/// Schemas of the kinds clients send.
fn corpus() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city"],
            "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1,
            "maxItems": 3}),
        json!({"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "when": {"type": "string", "format": "date-time"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}),
        // pydantic's shape: definitions under `$defs`, named by `$ref` from the properties.
        json!({"type": "object", "properties": {"at": {"$ref": "#/$defs/point"},
            "or": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/point"}]}}, "required": ["at"],
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"},
            "y": {"type": "number"}}, "required": ["x", "y"]}}}),
        json!({"type": "object", "properties": {"nested": {"type": "object", "properties":
            {"deeper": {"type": "array", "items": {"oneOf": [{"type": "boolean"},
            {"const": 3}]}}}}}}),
    ]
}

/// Schema keywords, for the mutations that add fields.
const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "prefixItems",
    "additionalProperties",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minItems",
    "maxItems",
    "minProperties",
    "x-guidance",
];

/// One grammar's inputs: the schema, and the tools it is offered beside.
#[derive(Debug)]
struct Case {
    schema: Value,
    tools: Vec<ToolRule>,
    format: ToolCallFormat,
    kind: usize,
}

fn generate(rng: &mut Rng, corpus: &[Value]) -> Case {
    let mut schema = rng.pick(corpus).clone();
    mutate_json(rng, &mut schema, KEYWORDS);
    // What a request body can carry: nesting beyond serde_json's limit is refused there.
    let text = serde_json::to_vec(&schema).unwrap();
    let schema: Value = serde_json::from_slice(&text).unwrap_or_else(|_| rng.pick(corpus).clone());
    let tools = (0..1 + rng.below(3))
        .map(|i| {
            let name = match rng.below(4) {
                0 => "say \"hi\"\n<tool_call>\\".to_string(),
                1 => "日本🦀".to_string(),
                _ => format!("tool_{i}"),
            };
            let parameters = match rng.below(3) {
                0 => None,
                1 => Some(schema.clone()),
                _ => Some(rng.pick(corpus).clone()),
            };
            ToolRule { name, parameters }
        })
        .collect();
    Case { schema, tools, format: *rng.pick(&ToolCallFormat::ALL), kind: rng.below(4) }
}

fn grammar_of(case: &Case) -> TopLevelGrammar {
    match case.kind {
        0 => grammar::json_schema(&case.schema),
        1 => grammar::tool_calls(case.format, &case.tools, CallMode::Required, true),
        2 => grammar::tool_calls(case.format, &case.tools, CallMode::Optional, false),
        _ => grammar::tool_calls_or_json(case.format, &case.tools, true, &case.schema),
    }
}

/// Compiles `case`'s grammar and, if it compiles, follows it for [`STEPS`] tokens, taking the
/// lowest allowed id each time; returns whether it compiled.
fn follow(grammars: &Grammars, vocab_size: usize, case: &Case) -> bool {
    let Ok(mut constraint) = grammars.compile(grammar_of(case)) else { return false };
    for _ in 0..STEPS {
        let mut logits = vec![0.0; vocab_size];
        if constraint.mask(&mut logits).is_err() || constraint.is_finished() {
            break;
        }
        let allowed = logits.iter().position(|l| l.is_finite());
        let token = allowed.expect("a grammar that is not finished allows some token");
        if constraint.advance(token as u32).is_err() {
            break;
        }
    }
    true
}

/// Also the regression test of a bug this target found: tools whose parameters name `$defs`
/// by `$ref` (as pydantic writes them) failed to compile in every tool grammar, the references
/// resolving against the call object's root (or the XML form's lone parameter) instead.
#[test]
fn every_corpus_schema_compiles_in_every_grammar() {
    let tokenizer = tokenizer();
    let grammars = Grammars::new(&tokenizer).unwrap();
    for schema in corpus() {
        for format in ToolCallFormat::ALL {
            for kind in 0..4 {
                let tools = vec![
                    ToolRule { name: "a".into(), parameters: Some(schema.clone()) },
                    ToolRule { name: "b".into(), parameters: None },
                ];
                let case = Case { schema: schema.clone(), tools, format, kind };
                if let Err(error) = grammars.compile(grammar_of(&case)) {
                    panic!("{format:?}, grammar {kind}: {error}\n{case:?}");
                }
            }
        }
    }
}

#[test]
fn mutated_schemas_compile_or_are_refused_without_panicking() {
    let tokenizer = tokenizer();
    let grammars = Grammars::new(&tokenizer).unwrap();
    let corpus = corpus();
    let mut compiled = 0u64;
    let cases = spindle_fuzz::run(
        "schemas",
        CI_CASES,
        |rng| generate(rng, &corpus),
        |case| compiled += u64::from(follow(&grammars, tokenizer.vocab_size(), case)),
    );
    if cases >= 100 {
        assert!(compiled > cases / 4, "only {compiled} of {cases} grammars compiled");
    }
}
