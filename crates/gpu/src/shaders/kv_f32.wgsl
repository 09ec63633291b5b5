// Keys and values stored as f32, one to a word.
@group(0) @binding(1) var<storage, read_write> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;

const PER_WORD: u32 = 1u;

fn key_at(i: u32) -> f32 {
    return k[i];
}

fn value_at(i: u32) -> f32 {
    return v[i];
}

// The word that stores `a` (and, in formats of two a word, `b` after it).
fn word(a: f32, b: f32) -> f32 {
    return a;
}
