//! Chat templates, rendered with minijinja the way transformers' `apply_chat_template` renders
//! them with Jinja2: `trim_blocks` and `lstrip_blocks` on, Python string methods available,
//! `tojson` without HTML escaping, `raise_exception` and `strftime_now` defined.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value as Json;

use crate::error::ChatError;
use crate::Tokenizer;

/// Used when a model ships no template.
const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// What a template is rendered with.
pub struct TemplateInput<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a [Json]>,
    pub add_generation_prompt: bool,
    /// Extra variables (`chat_template_kwargs`), e.g. `enable_thinking`.
    pub extra: &'a serde_json::Map<String, Json>,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned("chat", source.to_string())?;
        Ok(Self { env, bos_token, eos_token })
    }

    pub fn chatml() -> Self {
        Self::new(CHATML, None, None).expect("the built-in ChatML template compiles")
    }

    /// The template stored in a GGUF header, if any.
    pub fn from_gguf(meta: &HashMap<String, Value>, tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        match meta.get("tokenizer.chat_template") {
            Some(Value::String(source)) => Ok(Some(Self::new(source, tok.bos_token(), tok.eos_token())?)),
            _ => Ok(None),
        }
    }

    /// The template of a `tokenizer_config.json` (a string, or a list of named templates).
    pub fn from_tokenizer_config(path: &Path, tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        let Ok(text) = std::fs::read_to_string(path) else { return Ok(None) };
        let config: Json = serde_json::from_str(&text).map_err(|e| ChatError::Template(format!("{}: {e}", path.display())))?;
        let source = match &config["chat_template"] {
            Json::String(s) => Some(s.clone()),
            Json::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str().map(str::to_string)),
            _ => None,
        };
        source.map(|s| Self::new(&s, tok.bos_token(), tok.eos_token())).transpose()
    }

    pub fn render(&self, input: &TemplateInput) -> Result<String, ChatError> {
        let mut ctx = input.extra.clone();
        ctx.insert("messages".into(), Json::from(input.messages.to_vec()));
        ctx.insert("add_generation_prompt".into(), Json::from(input.add_generation_prompt));
        if let Some(tools) = input.tools {
            ctx.insert("tools".into(), Json::from(tools.to_vec()));
        }
        ctx.insert("bos_token".into(), Json::from(self.bos_token.clone().unwrap_or_default()));
        ctx.insert("eos_token".into(), Json::from(self.eos_token.clone().unwrap_or_default()));
        Ok(self.env.get_template("chat")?.render(minijinja::Value::from(minijinja::value::Serde(&ctx)))?)
    }
}

/// Jinja2's `tojson` as transformers configures it: no HTML escaping, optional `indent`.
fn tojson(value: minijinja::Value, kwargs: minijinja::value::Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = match indent {
        Some(n) => {
            let indent = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
            let mut out = Vec::new();
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            serde::Serialize::serialize(&json, &mut ser).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            String::from_utf8(out).unwrap_or_default()
        }
        // Python's json.dumps separators: ", " and ": ".
        None => python_json(&json),
    };
    Ok(text)
}

fn python_json(v: &Json) -> String {
    match v {
        Json::Array(items) => format!("[{}]", items.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        Json::Object(map) => format!(
            "{{{}}}",
            map.iter().map(|(k, v)| format!("{}: {}", Json::from(k.as_str()), python_json(v))).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// `strftime_now` for the formats templates use (date only; the clock is UTC).
fn strftime_now(fmt: &str) -> String {
    let days = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() / 86_400).unwrap_or(0) as i64;
    let (y, m, d) = civil_from_days(days);
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", MONTHS[(m - 1) as usize])
        .replace("%b", &MONTHS[(m - 1) as usize][..3])
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(t: &ChatTemplate, messages: &[Json], gen: bool) -> String {
        t.render(&TemplateInput { messages, tools: None, add_generation_prompt: gen, extra: &Default::default() }).unwrap()
    }

    #[test]
    fn chatml_renders_roles_and_generation_prompt() {
        let msgs = [json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": "Hi"})];
        assert_eq!(
            render(&ChatTemplate::chatml(), &msgs, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!render(&ChatTemplate::chatml(), &msgs, false).ends_with("assistant\n"));
    }

    #[test]
    fn tojson_does_not_escape_html_and_uses_python_separators() {
        let t = ChatTemplate::new("{{ x | tojson }}", None, None).unwrap();
        let extra = json!({"x": {"a": "<b>&'", "n": [1, 2]}}).as_object().unwrap().clone();
        let out = t.render(&TemplateInput { messages: &[], tools: None, add_generation_prompt: false, extra: &extra }).unwrap();
        assert_eq!(out, r#"{"a": "<b>&'", "n": [1, 2]}"#);
    }

    #[test]
    fn raise_exception_becomes_an_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", None, None).unwrap();
        let err = t.render(&TemplateInput { messages: &[], tools: None, add_generation_prompt: false, extra: &Default::default() });
        assert!(err.unwrap_err().to_string().contains("roles must alternate"));
    }

    #[test]
    fn python_string_methods_and_kwargs_work() {
        let t = ChatTemplate::new("{% if enable_thinking is defined and not enable_thinking %}off{% endif %}{{ 'a,b'.split(',') | length }}{{ ' x '.strip() }}", None, None).unwrap();
        let extra = json!({"enable_thinking": false}).as_object().unwrap().clone();
        let out = t.render(&TemplateInput { messages: &[], tools: None, add_generation_prompt: false, extra: &extra }).unwrap();
        assert_eq!(out, "off2x");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_415), (2025, 11, 23));
    }
}
