//! Finished responses kept in memory for `GET /v1/responses/{id}` and `previous_response_id`,
//! each with the conversation that led to it. Bounded by count and by bytes; the oldest go
//! first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use spindle_api::{InputItem, Response as ResponseObject};

/// Responses kept at most.
const MAX_RESPONSES: usize = 1024;
/// Bytes (as JSON) kept at most.
const MAX_BYTES: usize = 64 << 20;

pub struct StoredResponse {
    pub response: ResponseObject,
    /// Every item up to and including the response's output, as the next request's input.
    pub conversation: Vec<InputItem>,
    bytes: usize,
}

pub struct ResponseStore {
    max_responses: usize,
    max_bytes: usize,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_id: HashMap<String, Arc<StoredResponse>>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(MAX_RESPONSES, MAX_BYTES)
    }
}

impl ResponseStore {
    pub fn new(max_responses: usize, max_bytes: usize) -> Self {
        Self { max_responses, max_bytes, entries: Mutex::default() }
    }

    /// Keeps `response`, reached by `conversation` (its input) plus its own output; evicts
    /// the oldest entries past the limits. A response larger than the whole store is not kept.
    pub fn insert(&self, response: ResponseObject, mut conversation: Vec<InputItem>) {
        conversation.extend(response.output.iter().filter_map(|item| item.to_input()));
        let bytes = json_len(&response) + json_len(&conversation);
        if bytes > self.max_bytes {
            return;
        }
        let id = response.id.clone();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.remove(&id);
        entries.bytes += bytes;
        entries.order.push_back(id.clone());
        entries.by_id.insert(id, Arc::new(StoredResponse { response, conversation, bytes }));
        while entries.by_id.len() > self.max_responses || entries.bytes > self.max_bytes {
            let Some(oldest) = entries.order.front().cloned() else { break };
            entries.remove(&oldest);
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).by_id.get(id).cloned()
    }

    /// Forgets `id`; false when it was not kept.
    pub fn remove(&self, id: &str) -> bool {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(id)
    }
}

impl Entries {
    fn remove(&mut self, id: &str) -> bool {
        let Some(entry) = self.by_id.remove(id) else { return false };
        self.bytes -= entry.bytes;
        self.order.retain(|kept| kept != id);
        true
    }
}

fn json_len(value: &impl serde::Serialize) -> usize {
    serde_json::to_vec(value).map_or(0, |v| v.len())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn response(id: &str, text: &str) -> ResponseObject {
        serde_json::from_value(json!({
            "object": "response", "id": id, "created_at": 0, "status": "completed", "error": null,
            "incomplete_details": null, "instructions": null, "max_output_tokens": null, "model": "m",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": true, "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
            "store": true, "temperature": null, "text": {}, "tool_choice": "auto", "tools": [], "top_p": null,
            "truncation": "disabled", "usage": null, "user": null, "metadata": {},
        }))
        .unwrap()
    }

    fn user(text: &str) -> Vec<InputItem> {
        vec![InputItem::Message { role: "user".into(), content: text.into() }]
    }

    #[test]
    fn keeps_the_conversation_with_the_output_appended() {
        let store = ResponseStore::default();
        store.insert(response("resp_a", "Paris."), user("Capital of France?"));
        let kept = store.get("resp_a").unwrap();
        assert_eq!(kept.conversation[0], user("Capital of France?")[0]);
        assert_eq!(
            kept.conversation[1],
            InputItem::Message { role: "assistant".into(), content: "Paris.".into() }
        );
        assert!(store.remove("resp_a") && store.get("resp_a").is_none() && !store.remove("resp_a"));
    }

    #[test]
    fn evicts_the_oldest_past_the_count_or_byte_limit() {
        let by_count = ResponseStore::new(2, MAX_BYTES);
        for id in ["resp_1", "resp_2", "resp_3"] {
            by_count.insert(response(id, "x"), user("q"));
        }
        assert!(
            by_count.get("resp_1").is_none()
                && by_count.get("resp_2").is_some()
                && by_count.get("resp_3").is_some()
        );

        let probe = ResponseStore::default();
        probe.insert(response("resp_0", "x"), user("q"));
        let one = probe.get("resp_0").unwrap().bytes;
        let by_bytes = ResponseStore::new(100, 2 * one + one / 2);
        for id in ["resp_1", "resp_2", "resp_3"] {
            by_bytes.insert(response(id, "x"), user("q"));
        }
        assert!(by_bytes.get("resp_1").is_none() && by_bytes.get("resp_3").is_some());
        assert_eq!(by_bytes.entries.lock().unwrap().bytes, 2 * one);

        let tiny = ResponseStore::new(100, 10);
        tiny.insert(response("resp_big", "x"), user("q"));
        assert!(tiny.get("resp_big").is_none());
    }
}
