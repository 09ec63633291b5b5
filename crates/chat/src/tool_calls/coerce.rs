//! Types argument values by the tool's JSON schema. Formats that write values as bare text
//! (the XML one) cannot say whether `3` is a number or a string, and models sometimes quote
//! numbers in JSON formats; the property's declared types settle it.
//!
//! Types are tried in a fixed order among those the schema allows: null, boolean, integer,
//! number, object/array, string. Text that fits none stays a string.

use std::collections::HashMap;

use serde_json::Value;

use super::ToolSchema;

/// Schemas one property's types are gathered from, at most (see [`Allowed::gather`]).
const MAX_SCHEMAS_GATHERED: usize = 256;
/// References followed one inside another, at most: a recursive definition is a cycle.
const MAX_NESTED_REFS: usize = 8;

/// The `parameters` schema of each tool, by tool name.
#[derive(Debug, Default)]
pub(super) struct ToolSchemas {
    by_name: HashMap<String, Value>,
}

impl ToolSchemas {
    pub(super) fn new(tools: &[ToolSchema]) -> Self {
        let mut by_name = HashMap::new();
        for tool in tools {
            // Two tools with one name: the first is the one a lookup by name finds.
            by_name.entry(tool.name.clone()).or_insert_with(|| tool.parameters.clone());
        }
        Self { by_name }
    }

    /// The value of argument `key` of `tool`, written by the model as `text`.
    pub(super) fn coerce_text(&self, tool: &str, key: &str, text: &str) -> Value {
        match self.property(tool, key) {
            Some((schema, root)) => Allowed::from_schema(schema, root).coerce(text),
            None => Value::String(text.to_string()),
        }
    }

    /// A value the model wrote as JSON: a string where the schema does not allow one is read
    /// as text; anything else is kept.
    pub(super) fn coerce_value(&self, tool: &str, key: &str, value: Value) -> Value {
        let (Value::String(text), Some((schema, root))) = (&value, self.property(tool, key)) else {
            return value;
        };
        let allowed = Allowed::from_schema(schema, root);
        if allowed.keeps_strings() {
            value
        } else {
            allowed.coerce(text)
        }
    }

    /// Property `key`'s schema, and the tool's whole schema its `$ref`s point into.
    fn property(&self, tool: &str, key: &str) -> Option<(&Value, &Value)> {
        let root = self.by_name.get(tool)?;
        Some((root.get("properties")?.get(key)?, root))
    }
}

/// What one property's schema allows, gathered from `type`, `anyOf`/`oneOf` and `enum`.
#[derive(Debug, Default)]
struct Allowed {
    null: bool,
    boolean: bool,
    integer: bool,
    number: bool,
    object: bool,
    array: bool,
    string: bool,
    /// The non-string members of an `enum`.
    members: Vec<Value>,
}

impl Allowed {
    /// What `schema` allows, following its local `$ref`s (`#/$defs/...`, pydantic's shape)
    /// into `root`.
    fn from_schema(schema: &Value, root: &Value) -> Self {
        let (mut allowed, mut budget) = (Self::default(), MAX_SCHEMAS_GATHERED);
        allowed.gather(schema, root, 0, &mut budget);
        allowed
    }

    /// Gathers `schema` and what it names (`refs` references deep), visiting at most `budget`
    /// schemas: references may form cycles (recursive definitions) or fan out, and the schema
    /// comes from a request.
    fn gather(&mut self, schema: &Value, root: &Value, refs: usize, budget: &mut usize) {
        let Some(left) = budget.checked_sub(1) else { return };
        *budget = left;
        let target = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#'));
        let definition = target.and_then(|pointer| root.pointer(pointer));
        if let Some(definition) = definition.filter(|_| refs < MAX_NESTED_REFS) {
            self.gather(definition, root, refs + 1, budget);
        }
        match schema.get("type") {
            Some(Value::String(name)) => self.allow(name),
            Some(Value::Array(names)) => {
                names.iter().filter_map(Value::as_str).for_each(|name| self.allow(name))
            }
            _ => {}
        }
        for union in ["anyOf", "oneOf"] {
            if let Some(Value::Array(members)) = schema.get(union) {
                members.iter().for_each(|member| self.gather(member, root, refs, budget));
            }
        }
        if let Some(Value::Array(members)) = schema.get("enum") {
            for member in members {
                match member {
                    Value::String(_) => self.string = true,
                    other => self.members.push(other.clone()),
                }
            }
        }
    }

    fn allow(&mut self, type_name: &str) {
        match type_name {
            "null" => self.null = true,
            "boolean" => self.boolean = true,
            "integer" => self.integer = true,
            "number" => self.number = true,
            "object" => self.object = true,
            "array" => self.array = true,
            "string" => self.string = true,
            _ => {}
        }
    }

    /// Strings are fine here: the schema allows them, or declares no type at all.
    fn keeps_strings(&self) -> bool {
        let declares_other =
            self.null || self.boolean || self.integer || self.number || self.object || self.array;
        self.string || (!declares_other && self.members.is_empty())
    }

    fn coerce(&self, text: &str) -> Value {
        let trimmed = text.trim();
        // Parsed once: null, numbers, objects, arrays and enum members are all JSON literals.
        let json = serde_json::from_str::<Value>(trimmed).ok();
        let fits = |accept: fn(&Value) -> bool| json.as_ref().filter(|v| accept(v)).cloned();
        let chosen = json.as_ref().filter(|v| self.members.contains(v)).cloned();
        let chosen = chosen
            .or_else(|| (self.null && trimmed == "null").then_some(Value::Null))
            .or_else(|| self.boolean.then(|| parse_bool(trimmed)).flatten())
            .or_else(|| self.integer.then(|| fits(|v| v.is_i64() || v.is_u64())).flatten())
            .or_else(|| {
                self.number
                    .then(|| fits(Value::is_number).or_else(|| parse_float(trimmed)))
                    .flatten()
            })
            .or_else(|| self.object.then(|| fits(Value::is_object)).flatten())
            .or_else(|| self.array.then(|| fits(Value::is_array)).flatten());
        chosen.unwrap_or_else(|| Value::String(text.to_string()))
    }
}

/// Float spellings JSON lacks but models write, like `.5` or `+1`; never NaN or infinity.
fn parse_float(text: &str) -> Option<Value> {
    let number = text.parse::<f64>().ok().and_then(serde_json::Number::from_f64)?;
    Some(Value::Number(number))
}

fn parse_bool(text: &str) -> Option<Value> {
    if text.eq_ignore_ascii_case("true") {
        Some(Value::Bool(true))
    } else if text.eq_ignore_ascii_case("false") {
        Some(Value::Bool(false))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Pydantic's shape: the property names a definition. A recursive definition (a cycle of
    /// references) ends when the budget does, with what was gathered.
    #[test]
    fn references_to_definitions_are_followed_and_cycles_end() {
        let tools = ToolSchemas::new(&[ToolSchema {
            name: "f".into(),
            parameters: json!({
                "properties": {"n": {"$ref": "#/$defs/count"}, "tree": {"$ref": "#/$defs/tree"}},
                "$defs": {
                    "count": {"type": "integer"},
                    "tree": {"anyOf": [{"$ref": "#/$defs/tree"}, {"type": "object"}]}
                }
            }),
        }]);
        assert_eq!(tools.coerce_text("f", "n", "3"), json!(3));
        assert_eq!(tools.coerce_text("f", "tree", "{\"a\": 1}"), json!({"a": 1}));
        assert_eq!(tools.coerce_text("f", "tree", "x"), json!("x"));
    }

    fn schemas(properties: Value) -> ToolSchemas {
        ToolSchemas::new(&[ToolSchema {
            name: "f".into(),
            parameters: json!({"type": "object", "properties": properties}),
        }])
    }

    /// `text` written for a property with schema `property`.
    fn coerce(property: Value, text: &str) -> Value {
        schemas(json!({ "p": property })).coerce_text("f", "p", text)
    }

    #[test]
    fn integers_fit_i64_or_u64() {
        let integer = json!({"type": "integer"});
        assert_eq!(coerce(integer.clone(), "42"), json!(42));
        assert_eq!(coerce(integer.clone(), " -7\n"), json!(-7));
        assert_eq!(coerce(integer.clone(), "18446744073709551615"), json!(u64::MAX));
        assert_eq!(coerce(integer.clone(), "18446744073709551616"), json!("18446744073709551616"));
        assert_eq!(coerce(integer.clone(), "4.5"), json!("4.5"));
        assert_eq!(coerce(integer, "forty"), json!("forty"));
    }

    #[test]
    fn numbers_keep_integers_as_integers() {
        let number = json!({"type": "number"});
        assert_eq!(coerce(number.clone(), "2.5"), json!(2.5));
        assert_eq!(coerce(number.clone(), "3"), json!(3));
        assert!(coerce(number.clone(), "3").is_i64());
        assert_eq!(coerce(number.clone(), "1e3"), json!(1000.0));
        assert_eq!(coerce(number.clone(), ".5"), json!(0.5));
        assert_eq!(coerce(number.clone(), "+1"), json!(1.0));
        assert_eq!(coerce(number.clone(), "NaN"), json!("NaN"));
        assert_eq!(coerce(number.clone(), "inf"), json!("inf"));
        assert_eq!(coerce(number.clone(), "1e400"), json!("1e400"));
        assert_eq!(coerce(number, "3 apples"), json!("3 apples"));
    }

    #[test]
    fn booleans_ignore_case() {
        let boolean = json!({"type": "boolean"});
        assert_eq!(coerce(boolean.clone(), "true"), json!(true));
        assert_eq!(coerce(boolean.clone(), "False"), json!(false));
        assert_eq!(coerce(boolean, "yes"), json!("yes"));
    }

    #[test]
    fn null_only_where_allowed() {
        assert_eq!(coerce(json!({"type": "null"}), "null"), Value::Null);
        assert_eq!(coerce(json!({"type": "integer"}), "null"), json!("null"));
    }

    #[test]
    fn objects_and_arrays_parse_as_their_kind() {
        assert_eq!(coerce(json!({"type": "object"}), r#"{"a": [1, 2]}"#), json!({"a": [1, 2]}));
        assert_eq!(coerce(json!({"type": "object"}), "[1]"), json!("[1]"));
        assert_eq!(coerce(json!({"type": "array"}), "[\"x\", 2]"), json!(["x", 2]));
        assert_eq!(coerce(json!({"type": "array"}), "[1,"), json!("[1,"));
    }

    #[test]
    fn nullable_through_type_array_and_any_of() {
        let by_array = json!({"type": ["integer", "null"]});
        assert_eq!(coerce(by_array.clone(), "null"), Value::Null);
        assert_eq!(coerce(by_array, "5"), json!(5));
        let by_any_of = json!({"anyOf": [{"type": "number"}, {"type": "null"}]});
        assert_eq!(coerce(by_any_of.clone(), "null"), Value::Null);
        assert_eq!(coerce(by_any_of, "0.5"), json!(0.5));
        let by_one_of = json!({"oneOf": [{"type": "boolean"}, {"type": "array"}]});
        assert_eq!(coerce(by_one_of.clone(), "TRUE"), json!(true));
        assert_eq!(coerce(by_one_of, "[]"), json!([]));
    }

    #[test]
    fn enum_of_ints_parses_members() {
        let levels = json!({"enum": [1, 2, 3]});
        assert_eq!(coerce(levels.clone(), "2"), json!(2));
        assert_eq!(coerce(levels, "4"), json!("4"));
        assert_eq!(coerce(json!({"enum": ["1", "2"]}), "1"), json!("1"));
        assert_eq!(coerce(json!({"enum": [null, "auto"]}), "null"), Value::Null);
    }

    #[test]
    fn string_schema_keeps_json_looking_text() {
        let string = json!({"type": "string"});
        assert_eq!(coerce(string.clone(), r#"{"a":1}"#), json!(r#"{"a":1}"#));
        assert_eq!(coerce(string.clone(), "12"), json!("12"));
        assert_eq!(coerce(string, " null "), json!(" null "));
    }

    #[test]
    fn order_prefers_the_more_specific_type() {
        assert_eq!(coerce(json!({"type": ["string", "integer"]}), "3"), json!(3));
        assert_eq!(coerce(json!({"type": ["string", "boolean"]}), "maybe"), json!("maybe"));
    }

    #[test]
    fn no_schema_keeps_text() {
        let tools = schemas(json!({"n": {"type": "integer"}}));
        assert_eq!(tools.coerce_text("f", "other", "3"), json!("3"));
        assert_eq!(tools.coerce_text("g", "n", "3"), json!("3"));
        assert_eq!(coerce(json!({"description": "untyped"}), "3"), json!("3"));
        let no_parameters =
            ToolSchemas::new(&[ToolSchema { name: "f".into(), parameters: Value::Null }]);
        assert_eq!(no_parameters.coerce_text("f", "n", "3"), json!("3"));
    }

    #[test]
    fn json_strings_are_read_only_where_strings_are_not_allowed() {
        let tools = schemas(
            json!({"n": {"type": "integer"}, "s": {"type": ["string", "integer"]}, "u": {}}),
        );
        assert_eq!(tools.coerce_value("f", "n", json!("3")), json!(3));
        assert_eq!(tools.coerce_value("f", "n", json!("x")), json!("x"));
        assert_eq!(tools.coerce_value("f", "s", json!("3")), json!("3"));
        assert_eq!(tools.coerce_value("f", "u", json!("3")), json!("3"));
        assert_eq!(tools.coerce_value("f", "n", json!([1])), json!([1]));
    }
}
