// Keys and values stored as f16, two to a word (the even value in the low half), as the host
// pool's f16 keeps them: half the memory of f32, and each value rounded once as it is stored.
@group(0) @binding(1) var<storage, read_write> k: array<u32>;
@group(0) @binding(2) var<storage, read_write> v: array<u32>;

const PER_WORD: u32 = 2u;

fn key_at(i: u32) -> f32 {
    return unpack2x16float(k[i / 2u])[i % 2u];
}

fn value_at(i: u32) -> f32 {
    return unpack2x16float(v[i / 2u])[i % 2u];
}

// The word that stores `a` and `b` after it.
fn word(a: f32, b: f32) -> u32 {
    return pack2x16float(vec2<f32>(a, b));
}
