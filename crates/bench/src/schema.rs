//! A JSON Schema check for tool-call arguments: the subset tool definitions use (`type`,
//! `properties`, `required`, `additionalProperties: false`, `items`, `minItems`, `enum`). A
//! failure names the first offending path, e.g. `edits: 0 items, at least 1`.

use serde_json::Value;

/// Checks `value` against `schema`; `Err` says where and why it fails.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    check(schema, value, "arguments")
}

fn check(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(ty) = schema.get("type").and_then(Value::as_str) {
        if !has_type(value, ty) {
            return Err(format!("{at}: expected {ty}, got {}", kind(value)));
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            return Err(format!("{at}: {value} is not one of {}", Value::Array(options.clone())));
        }
    }
    if let Value::Object(fields) = value {
        let properties = schema.get("properties").and_then(Value::as_object);
        for name in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            let name = name.as_str().unwrap_or_default();
            if !fields.contains_key(name) {
                return Err(format!("{}: missing", join(at, name)));
            }
        }
        for (name, field) in fields {
            match properties.and_then(|p| p.get(name)) {
                Some(sub) => check(sub, field, &join(at, name))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{}: not in the schema", join(at, name)));
                }
                None => {}
            }
        }
    }
    if let Value::Array(items) = value {
        let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        if (items.len() as u64) < min {
            return Err(format!("{at}: {} items, at least {min}", items.len()));
        }
        if let Some(sub) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                check(sub, item, &format!("{at}[{i}]"))?;
            }
        }
    }
    Ok(())
}

fn join(at: &str, name: &str) -> String {
    if at == "arguments" {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}

fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => true,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn edit_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "edits": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "properties": {"old_text": {"type": "string"}, "new_text": {"type": "string"}},
                    "required": ["old_text", "new_text"],
                    "additionalProperties": false
                }},
                "mode": {"type": "string", "enum": ["replace", "append"]},
                "line": {"type": "integer"}
            },
            "required": ["path", "edits"],
            "additionalProperties": false
        })
    }

    #[test]
    fn a_good_call_passes() {
        let args =
            json!({"path": "a.py", "edits": [{"old_text": "x", "new_text": "y"}], "line": 3});
        assert_eq!(validate(&edit_schema(), &args), Ok(()));
    }

    #[test]
    fn each_failure_names_its_place() {
        let cases = [
            (json!({"path": "a.py", "edits": {}}), "edits: expected array, got object"),
            (json!({"path": "a.py", "edits": []}), "edits: 0 items, at least 1"),
            (json!({"path": "a.py"}), "edits: missing"),
            (json!({"path": 1, "edits": []}), "path: expected string, got number"),
            (json!({"path": "a", "edits": [{"old_text": "x"}]}), "edits[0].new_text: missing"),
            (
                json!({"path": "a", "edits": [{"old_text": "x", "new_text": "y"}], "force": true}),
                "force: not in the schema",
            ),
            (
                json!({"path": "a", "edits": [{"old_text": "x", "new_text": "y"}], "mode": "m"}),
                "mode: \"m\" is not one of [\"replace\",\"append\"]",
            ),
            (
                json!({"path": "a", "edits": [{"old_text": "x", "new_text": "y"}], "line": 1.5}),
                "line: expected integer, got number",
            ),
            (json!("text"), "arguments: expected object, got string"),
        ];
        for (args, error) in cases {
            assert_eq!(validate(&edit_schema(), &args), Err(error.to_string()), "{args}");
        }
    }
}
