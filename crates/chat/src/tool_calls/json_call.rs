//! A call written as one JSON object, `{"name": ..., "arguments": {...}}`, as the Hermes and
//! Llama-3 formats write it. Models vary the spelling, so `parameters` stands for `arguments`,
//! and arguments given as a string holding an object are read from the string.

use serde_json::{Map, Value};

use super::coerce::ToolSchemas;

#[derive(Debug, Clone, PartialEq)]
pub(super) struct JsonCall {
    pub(super) name: String,
    pub(super) arguments: Map<String, Value>,
}

impl JsonCall {
    /// The call `value` describes, with string arguments typed by the tool's schema; `None`
    /// when it is not an object with a string `name` and object arguments.
    pub(super) fn from_value(value: Value, schemas: &ToolSchemas) -> Option<Self> {
        let Value::Object(mut object) = value else {
            return None;
        };
        let Some(Value::String(name)) = object.remove("name") else {
            return None;
        };
        let arguments = match object.remove("arguments").or_else(|| object.remove("parameters")) {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(arguments)) => arguments,
            Some(Value::String(text)) if text.trim().is_empty() => Map::new(),
            Some(Value::String(text)) => match serde_json::from_str(&text) {
                Ok(Value::Object(arguments)) => arguments,
                _ => return None,
            },
            Some(_) => return None,
        };
        let arguments = arguments
            .into_iter()
            .map(|(key, value)| {
                let value = schemas.coerce_value(&name, &key, value);
                (key, value)
            })
            .collect();
        Some(Self { name, arguments })
    }

    /// `text` as one call, surrounding whitespace aside.
    pub(super) fn parse(text: &str, schemas: &ToolSchemas) -> Option<Self> {
        Self::from_value(serde_json::from_str(text.trim()).ok()?, schemas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolSchema;
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        let parameters =
            json!({"properties": {"days": {"type": "integer"}, "city": {"type": "string"}}});
        ToolSchemas::new(&[ToolSchema { name: "get_weather".into(), parameters }])
    }

    fn call(text: &str) -> Option<(String, Value)> {
        JsonCall::parse(text, &schemas()).map(|call| (call.name, Value::Object(call.arguments)))
    }

    #[test]
    fn reads_arguments_under_either_key() {
        let expected = Some(("get_weather".to_string(), json!({"city": "Paris"})));
        assert_eq!(call(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#), expected);
        assert_eq!(call(r#" {"name": "get_weather", "parameters": {"city": "Paris"}} "#), expected);
        assert_eq!(
            call(r#"{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}"#),
            expected
        );
    }

    #[test]
    fn missing_arguments_are_empty() {
        for text in [
            r#"{"name": "f"}"#,
            r#"{"name": "f", "arguments": null}"#,
            r#"{"name": "f", "arguments": " "}"#,
        ] {
            assert_eq!(call(text), Some(("f".to_string(), json!({}))), "{text}");
        }
    }

    #[test]
    fn quoted_values_are_typed_by_schema() {
        let parsed = call(
            r#"{"name": "get_weather", "arguments": {"city": "75001", "days": "3", "extra": "4"}}"#,
        );
        assert_eq!(
            parsed,
            Some(("get_weather".to_string(), json!({"city": "75001", "days": 3, "extra": "4"})))
        );
    }

    #[test]
    fn rejects_what_is_not_a_call() {
        for text in [
            r#"{"name": 3, "arguments": {}}"#,
            r#"{"arguments": {}}"#,
            r#"{"name": "f", "arguments": [1]}"#,
            r#"{"name": "f", "arguments": "not json"}"#,
            r#"["f"]"#,
            r#"{"name": "f""#,
        ] {
            assert_eq!(call(text), None, "{text}");
        }
    }
}
