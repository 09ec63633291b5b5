//! Turns what a format parser recognised into [`ToolEvent`]s: numbers the calls, writes
//! argument fragments, and decides where whitespace around calls goes.
//!
//! Trailing whitespace of content is held back, because a call may follow and the whitespace
//! before a call is dropped. It is released in front of the next content, and at the end of
//! the message unless a call came last. This depends only on the text, never on how it was cut
//! into pushes.

use serde_json::{Map, Value};

use super::ToolEvent;

#[derive(Debug, Default)]
pub(super) struct Emitter {
    events: Vec<ToolEvent>,
    /// Whitespace at the end of the content so far, not yet released.
    held_space: String,
    /// No content has come since the last call closed.
    after_call: bool,
    /// Calls closed so far; the open call, if any, has this index.
    calls: usize,
    /// The open call has written its first argument (so the next one starts with `, `).
    has_arguments: bool,
}

impl Emitter {
    /// Plain text outside calls.
    pub(super) fn content(&mut self, text: &str) {
        let body = text.trim_end();
        if body.is_empty() {
            self.held_space.push_str(text);
            return;
        }
        let mut released = std::mem::take(&mut self.held_space);
        released.push_str(body);
        self.held_space.push_str(&text[body.len()..]);
        self.after_call = false;
        match self.events.last_mut() {
            Some(ToolEvent::Content(last)) => last.push_str(&released),
            _ => self.events.push(ToolEvent::Content(released)),
        }
    }

    /// A call named `name` begins; its arguments follow with [`argument`](Self::argument).
    pub(super) fn open_call(&mut self, name: &str) {
        self.held_space.clear();
        self.has_arguments = false;
        self.events.push(ToolEvent::CallStart { index: self.calls, name: name.to_string() });
    }

    /// One argument of the open call.
    pub(super) fn argument(&mut self, key: &str, value: &Value) {
        let separator = if self.has_arguments { ", " } else { "{" };
        self.has_arguments = true;
        let fragment = format!("{separator}{}: {value}", Value::from(key));
        self.events.push(ToolEvent::Arguments { index: self.calls, fragment });
    }

    /// Ends the open call's arguments.
    pub(super) fn close_call(&mut self) {
        let fragment = if self.has_arguments { "}" } else { "{}" };
        self.events
            .push(ToolEvent::Arguments { index: self.calls, fragment: fragment.to_string() });
        self.calls += 1;
        self.after_call = true;
    }

    /// A call known whole at once: its arguments go out as one compact JSON fragment.
    pub(super) fn whole_call(&mut self, name: &str, arguments: Map<String, Value>) {
        self.open_call(name);
        let fragment = Value::Object(arguments).to_string();
        self.events.push(ToolEvent::Arguments { index: self.calls, fragment });
        self.calls += 1;
        self.after_call = true;
    }

    /// End of the message: whitespace after the last content is kept, after a call dropped.
    pub(super) fn finish(&mut self) {
        let space = std::mem::take(&mut self.held_space);
        if !self.after_call && !space.is_empty() {
            self.events.push(ToolEvent::Content(space));
        }
    }

    pub(super) fn take_events(&mut self) -> Vec<ToolEvent> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn content(text: &str) -> ToolEvent {
        ToolEvent::Content(text.into())
    }

    fn args(index: usize, fragment: &str) -> ToolEvent {
        ToolEvent::Arguments { index, fragment: fragment.into() }
    }

    #[test]
    fn trailing_space_waits_for_what_follows() {
        let mut out = Emitter::default();
        out.content("Hi \n");
        assert_eq!(out.take_events(), [content("Hi")]);
        out.content("there\n");
        assert_eq!(out.take_events(), [content(" \nthere")]);
        out.finish();
        assert_eq!(out.take_events(), [content("\n")]);
    }

    #[test]
    fn space_before_and_after_calls_is_dropped() {
        let mut out = Emitter::default();
        out.content("Checking.\n\n");
        out.open_call("a");
        out.close_call();
        out.content("\n");
        out.whole_call("b", Map::new());
        out.content("\n");
        out.finish();
        assert_eq!(
            out.take_events(),
            [
                content("Checking."),
                ToolEvent::CallStart { index: 0, name: "a".into() },
                args(0, "{}"),
                ToolEvent::CallStart { index: 1, name: "b".into() },
                args(1, "{}"),
            ]
        );
    }

    #[test]
    fn text_after_a_call_keeps_its_leading_space() {
        let mut out = Emitter::default();
        out.open_call("a");
        out.close_call();
        out.content("\n\nDone.");
        assert_eq!(out.take_events()[2..], [content("\n\nDone.")]);
    }

    #[test]
    fn arguments_are_written_as_one_object() {
        let mut out = Emitter::default();
        out.open_call("f");
        out.argument("city", &json!("Paris \"Nord\""));
        out.argument("days", &json!(3));
        out.close_call();
        let events = out.take_events();
        assert_eq!(
            events[1..],
            [args(0, r#"{"city": "Paris \"Nord\"""#), args(0, r#", "days": 3"#), args(0, "}")]
        );
    }
}
