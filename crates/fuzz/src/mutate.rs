//! Mutations of valid examples: the shapes of damage that real inputs show (cut-off files and
//! streams, flipped bits, a length field set to an absurd value) and that a parser's authors
//! rarely test (values of the wrong type, extreme numbers, deep nesting, long or odd strings).

use serde_json::{Map, Number, Value};

use crate::Rng;

/// Numbers at the edges where code tends to break: zero, signs, the integer type limits, and
/// values past `f32`'s range or below its precision.
pub const INTERESTING_NUMBERS: &[f64] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    255.0,
    256.0,
    65_536.0,
    2_147_483_647.0,
    2_147_483_648.0,
    4_294_967_296.0,
    9_007_199_254_740_993.0,
    1e20,
    -1e20,
    1e39,
    1e308,
    -1e308,
    1e-45,
    5e-324,
];

/// Integers that are sizes or counts when read as one: the limits of each width, and powers of
/// two a length field could claim.
const INTERESTING_U64: &[u64] = &[
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 60,
    i64::MAX as u64,
    u64::MAX,
];

/// Applies one to four byte-level mutations to `bytes`: truncation, bit flips, an extreme
/// little-endian integer written over 4 or 8 bytes, and inserted, deleted or repeated runs.
pub fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        mutate_bytes_once(rng, bytes);
    }
}

fn mutate_bytes_once(rng: &mut Rng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        bytes.push(rng.next_u64() as u8);
        return;
    }
    let at = rng.below(bytes.len());
    match rng.below(7) {
        0 => bytes.truncate(at),
        1 => bytes[at] ^= 1 << rng.below(8),
        2 => bytes[at] = *rng.pick(&[0, 0x7f, 0x80, 0xff]),
        3 => {
            let value = *rng.pick(INTERESTING_U64);
            let width = *rng.pick(&[4, 8]);
            let end = (at + width).min(bytes.len());
            bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
        }
        4 => {
            let run: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next_u64() as u8).collect();
            bytes.splice(at..at, run);
        }
        5 => {
            let end = (at + 1 + rng.below(32)).min(bytes.len());
            bytes.drain(at..end);
        }
        _ => {
            let end = (at + 1 + rng.below(64)).min(bytes.len());
            let run = bytes[at..end].to_vec();
            bytes.splice(end..end, run);
        }
    }
}

/// Applies one to four mutations to a JSON value: a node replaced by a value of another type
/// (or an extreme one), a key removed, a key from `keys` added with a random value, an element
/// repeated, or the node buried under deep nesting.
pub fn mutate_json(rng: &mut Rng, value: &mut Value, keys: &[&str]) {
    for _ in 0..1 + rng.below(4) {
        let nodes = count_nodes(value);
        let target = rng.below(nodes);
        let node = nth_node(value, target).expect("target is below the node count");
        mutate_node(rng, node, keys);
    }
}

fn mutate_node(rng: &mut Rng, node: &mut Value, keys: &[&str]) {
    match rng.below(6) {
        0 | 1 => *node = random_value(rng, keys, 2),
        2 => {
            if let Value::Object(map) = node {
                if !map.is_empty() {
                    let key = map.keys().nth(rng.below(map.len())).cloned();
                    map.shift_remove(&key.expect("index is below the length"));
                    return;
                }
            }
            *node = random_value(rng, keys, 2);
        }
        3 => {
            if let (Value::Object(map), false) = (&mut *node, keys.is_empty()) {
                map.insert(rng.pick(keys).to_string(), random_value(rng, keys, 2));
            } else {
                *node = random_value(rng, keys, 2);
            }
        }
        4 => match node {
            Value::Array(items) if !items.is_empty() => {
                let item = items[rng.below(items.len())].clone();
                let copies = *rng.pick(&[1, 2, 100]);
                items.extend(std::iter::repeat_n(item, copies));
            }
            _ => *node = Value::Array(vec![node.clone(), random_value(rng, keys, 1)]),
        },
        _ => {
            let depth = *rng.pick(&[10, 100, 127, 129, 1_000]);
            for _ in 0..depth {
                *node = if rng.one_in(2) {
                    Value::Array(vec![node.take()])
                } else {
                    let key = if keys.is_empty() { "k" } else { rng.pick(keys) };
                    Value::Object(Map::from_iter([(key.to_string(), node.take())]))
                };
            }
        }
    }
}

/// A random value of any JSON type; objects take their keys from `keys`.
fn random_value(rng: &mut Rng, keys: &[&str], depth: usize) -> Value {
    let kinds = if depth == 0 { 4 } else { 6 };
    match rng.below(kinds) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => random_number(rng),
        3 => Value::String(random_string(rng)),
        4 => Value::Array((0..rng.below(4)).map(|_| random_value(rng, keys, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.below(4))
                .filter(|_| !keys.is_empty())
                .map(|_| (rng.pick(keys).to_string(), random_value(rng, keys, depth - 1)))
                .collect(),
        ),
    }
}

fn random_number(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => Value::Number(Number::from(*rng.pick(INTERESTING_U64))),
        1 => Value::Number(Number::from(-(rng.below(1_000) as i64) - 1)),
        2 => Value::Number(Number::from(i64::MIN)),
        _ => Number::from_f64(*rng.pick(INTERESTING_NUMBERS)).map_or(Value::Null, Value::Number),
    }
}

/// Strings that stress text handling: empty, control characters, multi-byte and combining
/// characters, markup and template syntax, and long runs.
fn random_string(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 => String::new(),
        1 => "\u{0}\u{1}\t\r\n\u{7f}".into(),
        2 => "héllo 世界 🦀 \u{200d}\u{fe0f} e\u{301}".into(),
        3 => "{{ raise_exception('x') }}{% for %}<|im_end|><tool_call>".into(),
        4 => "x".repeat(*rng.pick(&[1_000, 100_000])),
        5 => "🦀".repeat(10_000),
        6 => ["system", "user", "assistant", "tool", "function", "developer"][rng.below(6)].into(),
        _ => (0..rng.below(24)).map(|_| char::from(b' ' + rng.below(95) as u8)).collect(),
    }
}

/// Nodes in `value`, itself included.
fn count_nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// The `n`th node of `value` in pre-order (0 is `value` itself).
fn nth_node(value: &mut Value, mut n: usize) -> Option<&mut Value> {
    if n == 0 {
        return Some(value);
    }
    n -= 1;
    let children: Vec<&mut Value> = match value {
        Value::Array(items) => items.iter_mut().collect(),
        Value::Object(map) => map.values_mut().collect(),
        _ => return None,
    };
    for child in children {
        let size = count_nodes(child);
        if n < size {
            return nth_node(child, n);
        }
        n -= size;
    }
    None
}

/// Applies one to four mutations to model text: a piece of `dictionary` (the format's markers
/// and JSON punctuation) inserted, a span deleted or repeated, a cut, or byte damage that is
/// then read back as (lossy) UTF-8. Cuts and splices land on any byte, so a multi-byte
/// character may be broken into U+FFFD.
pub fn mutate_text(rng: &mut Rng, text: &str, dictionary: &[&str]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        match rng.below(5) {
            0 | 1 if !dictionary.is_empty() => {
                let piece = rng.pick(dictionary).as_bytes().to_vec();
                bytes.splice(at..at, piece);
            }
            2 => bytes.truncate(at),
            3 => {
                let end = (at + 1 + rng.below(16)).min(bytes.len());
                let run = bytes[at..end].to_vec();
                bytes.splice(end..end, run);
            }
            _ => mutate_bytes_once(rng, &mut bytes),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_mutation() {
        let base = serde_json::json!({"a": [1, 2, {"b": "c"}], "d": null});
        let mutated = |seed| {
            let mut value = base.clone();
            mutate_json(&mut Rng::new(seed), &mut value, &["a", "e"]);
            value
        };
        assert_eq!(mutated(7), mutated(7));
        assert!((0..20).any(|seed| mutated(seed) != base), "mutations must change the value");
    }

    #[test]
    fn nth_node_visits_every_node_once() {
        let mut value = serde_json::json!({"a": [1, {"b": 2}], "c": 3});
        let total = count_nodes(&value);
        assert_eq!(total, 6);
        let seen: Vec<String> =
            (0..total).map(|n| nth_node(&mut value, n).unwrap().to_string()).collect();
        assert_eq!(seen[3], r#"{"b":2}"#);
        assert_eq!(seen[5], "3");
        assert!(nth_node(&mut value, total).is_none());
    }

    #[test]
    fn byte_mutations_change_the_input() {
        let base = b"GGUF\x03\0\0\0 some header bytes".to_vec();
        let changed = (0..50)
            .filter(|&seed| {
                let mut bytes = base.clone();
                mutate_bytes(&mut Rng::new(seed), &mut bytes);
                bytes != base
            })
            .count();
        assert!(changed > 40, "{changed} of 50 mutations changed the bytes");
    }
}
