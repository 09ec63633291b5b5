//! The pieces of transformers' Jinja2 chat-template environment that minijinja lacks or does
//! differently: `tojson` (Python `json.dumps` output, no HTML escaping), `raise_exception` and
//! `strftime_now` (see `transformers/utils/chat_template_utils.py`).

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::Value as Json;

/// Registers `tojson`, `raise_exception` and `strftime_now` on `env`.
pub fn install(env: &mut minijinja::Environment<'_>) {
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |fmt: String| strftime(&fmt, now_unix_secs()));
}

/// The message of a template's `raise_exception`: the template refusing its input (e.g.
/// "Conversation roles must alternate"), unlike a template that fails by itself.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TemplateException(pub String);

/// `raise_exception(msg)`: the template's own error, surfaced with its message and marked as
/// raised (its source is a [`TemplateException`]).
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(TemplateException(msg)))
}

/// `json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)`, as
/// transformers defines `tojson`: unlike Jinja2's and minijinja's own, it does not escape
/// `<`, `>`, `&` or `'`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    // Python's defaults: ", " between items, or "," when indenting (the newline separates).
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle { indent, item_sep, key_sep, sort_keys: sort_keys.unwrap_or(false) };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(if ensure_ascii == Some(true) { escape_non_ascii(&out) } else { out })
}

/// How Python's `json.dumps` lays a value out.
struct JsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, v: &Json, depth: usize, out: &mut String) {
        match v {
            Json::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Json::Object(map) if !map.is_empty() => {
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    out.push_str(&Json::from(k.as_str()).to_string());
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    fn separate(&self, index: usize, depth: usize, out: &mut String) {
        if index > 0 {
            out.push_str(&self.item_sep);
        }
        self.newline(depth, out);
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }
}

/// `ensure_ascii=True`: everything outside ASCII as `\uXXXX` (UTF-16 units, as Python writes).
fn escape_non_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

fn now_unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] =
    ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// Python's `strftime` for the directives chat templates use, in UTC. Unknown directives are
/// kept as written, as glibc does.
fn strftime(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hour, min, sec) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month = MONTHS[(m - 1) as usize];
    let weekday = WEEKDAYS[(days + 4).rem_euclid(7) as usize]; // 1970-01-01 was a Thursday
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('M') => out.push_str(&format!("{min:02}")),
            Some('S') => out.push_str(&format!("{sec:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
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

    fn render(source: &str, ctx: Json) -> Result<String, Error> {
        let mut env = minijinja::Environment::new();
        install(&mut env);
        env.render_str(source, minijinja::value::Serde(ctx))
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let ctx = json!({"x": {"b": "<a href='x'>&</a>", "a": [1, 2.5, null, true], "é": "日本", "e": {}}});
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()).unwrap(),
            r#"{"b": "<a href='x'>&</a>", "a": [1, 2.5, null, true], "é": "日本", "e": {}}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", ctx.clone()).unwrap(),
            "{\n  \"b\": \"<a href='x'>&</a>\",\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"é\": \"日本\",\n  \"e\": {}\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(sort_keys=true, separators=[',', ':'], ensure_ascii=true) }}",
                ctx
            )
            .unwrap(),
            r#"{"a":[1,2.5,null,true],"b":"<a href='x'>&</a>","e":{},"\u00e9":"\u65e5\u672c"}"#
        );
    }

    #[test]
    fn tojson_rejects_unknown_arguments() {
        assert!(render("{{ 1 | tojson(colour=1) }}", json!({})).is_err());
    }

    #[test]
    fn raise_exception_fails_with_the_message() {
        let err = render("{{ raise_exception('Conversation roles must alternate') }}", json!({}))
            .unwrap_err();
        assert!(err.to_string().contains("Conversation roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %B %Y", t), "29 February 2024");
        assert_eq!(strftime("%a %b %y %H:%M:%S %%", t), "Thu Feb 24 13:05:09 %");
        assert_eq!(strftime("%A %Q", t), "Thursday %Q");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert!(render("{{ strftime_now('%Y') }}", json!({})).unwrap().starts_with("20"));
    }
}
