//! Chat templates, rendered with minijinja the way transformers' `apply_chat_template` renders
//! them with Jinja2: `trim_blocks` and `lstrip_blocks` on, no trailing newline kept, Python
//! string methods (minijinja-contrib's pycompat), and transformers' `tojson`,
//! `raise_exception` and `strftime_now` (see `jinja_compat`).

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::Environment;
use serde_json::Value as Json;

use crate::error::ChatError;
use crate::gguf_meta::GgufMetadata;
use crate::{jinja_compat, Tokenizer};

/// Used when a model ships no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template plus the special-token strings it is rendered with.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// What a template is rendered with.
pub struct TemplateInput<'a> {
    /// OpenAI-style messages (`role`, `content`, `tool_calls`, ...), passed through as they are.
    pub messages: &'a [Json],
    /// Tool definitions; `None` renders as Python's `None`.
    pub tools: Option<&'a [Json]>,
    /// End with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra variables (`chat_template_kwargs`), e.g. `enable_thinking`.
    pub extra: &'a serde_json::Map<String, Json>,
}

/// The GGUF header key of the chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

impl ChatTemplate {
    /// Compiles `source`; a syntax error names the problem and its line.
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(ChatError::from)?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        jinja_compat::install(&mut env);
        env.add_template_owned("chat_template", source.to_string())?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// The template text, e.g. to see whether it knows `<think>` blocks.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The ChatML template, for models that ship none.
    pub fn chatml() -> Self {
        Self::new(CHATML, None, None).expect("the built-in ChatML template compiles")
    }

    /// The template stored in a GGUF header (`tokenizer.chat_template`), if any.
    pub fn from_gguf(metadata: &GgufMetadata, tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        match metadata.get(CHAT_TEMPLATE_KEY).and_then(|v| v.as_str()) {
            Some(source) => Ok(Some(Self::new(source, tok.bos_token(), tok.eos_token())?)),
            None => Ok(None),
        }
    }

    /// The `chat_template` of a `tokenizer_config.json`: a string, or a list of named templates
    /// of which "default" is taken. `None` when the file or the key is absent.
    pub fn from_tokenizer_config(path: &Path, tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ChatError::Io { path: path.to_path_buf(), source }),
        };
        let config: Json = serde_json::from_str(&text)
            .map_err(|e| ChatError::Template(format!("{}: {e}", path.display())))?;
        let source = match &config["chat_template"] {
            Json::String(s) => Some(s.as_str()),
            Json::Array(list) => {
                list.iter().find(|t| t["name"] == "default").and_then(|t| t["template"].as_str())
            }
            _ => None,
        };
        source.map(|s| Self::new(s, tok.bos_token(), tok.eos_token())).transpose()
    }

    /// Renders the prompt. Variables are those transformers passes: `messages`, `tools`,
    /// `add_generation_prompt`, `bos_token`, `eos_token`, plus `extra`.
    pub fn render(&self, input: &TemplateInput) -> Result<String, ChatError> {
        let mut ctx = serde_json::Map::new();
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), Json::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), Json::from(eos.as_str()));
        }
        ctx.extend(input.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        ctx.insert("messages".into(), Json::from(input.messages.to_vec()));
        ctx.insert("tools".into(), input.tools.map_or(Json::Null, |t| Json::from(t.to_vec())));
        ctx.insert("add_generation_prompt".into(), Json::from(input.add_generation_prompt));
        let template = self.env.get_template("chat_template")?;
        Ok(template.render(minijinja::value::Serde(&ctx))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(
        t: &ChatTemplate,
        messages: &[Json],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        t.render(&TemplateInput {
            messages,
            tools: None,
            add_generation_prompt,
            extra: &Default::default(),
        })
    }

    #[test]
    fn chatml_renders_roles_and_generation_prompt() {
        let msgs = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
        ];
        let t = ChatTemplate::chatml();
        assert_eq!(
            render(&t, &msgs, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(&t, &msgs, false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        let t = ChatTemplate::new("{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n", None, None)
            .unwrap();
        let msgs =
            [json!({"role": "user", "content": "a"}), json!({"role": "user", "content": "b"})];
        assert_eq!(render(&t, &msgs, false).unwrap(), "[a]\n[b]\n");
    }

    #[test]
    fn special_tokens_extra_kwargs_and_null_tools_are_visible() {
        let t = ChatTemplate::new(
            "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{% if enable_thinking is false %}no-think{% endif %}|{{ 'a,b'.split(',') | length }}|{{ ' x '.strip() }}",
            Some("<s>"),
            Some("</s>"),
        )
        .unwrap();
        let extra = json!({"enable_thinking": false}).as_object().unwrap().clone();
        let out = t
            .render(&TemplateInput {
                messages: &[],
                tools: None,
                add_generation_prompt: false,
                extra: &extra,
            })
            .unwrap();
        assert_eq!(out, "<s>|</s>|True|no-think|2|x");
    }

    #[test]
    fn compile_errors_name_the_problem() {
        let err = ChatTemplate::new("{% for m in messages %}{{ m }", None, None).err().unwrap();
        assert!(matches!(err, ChatError::Template(_)));
        assert!(err.to_string().contains("syntax error"), "{err}");
    }

    #[test]
    fn raise_exception_surfaces_as_the_templates_refusal() {
        let t = ChatTemplate::new("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}", None, None)
            .unwrap();
        let err = render(&t, &[json!({"role": "assistant", "content": "x"})], false).unwrap_err();
        assert!(
            matches!(&err, ChatError::TemplateRaised(m) if m == "first message must be from the user"),
            "{err:?}"
        );
        assert!(render(&t, &[json!({"role": "user", "content": "x"})], false).is_ok());
    }

    #[test]
    fn a_template_failing_by_itself_is_no_refusal() {
        let t =
            ChatTemplate::new("{{ messages[0].content | int + none_such() }}", None, None).unwrap();
        let err = render(&t, &[json!({"role": "user", "content": "1"})], false).unwrap_err();
        assert!(matches!(err, ChatError::Template(_)), "{err:?}");
    }
}
