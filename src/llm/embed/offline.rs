//! The offline provider's embedding: deterministic, in-process, no model.
//!
//! Each word (a run of letters and digits, lowercased) and each letter
//! trigram of the word framed as `#word#` is hashed (FNV-1a, the same on
//! every machine, mixed) to one of [`DIMENSIONS`] components, with a sign from
//! another bit of the hash; words weigh 1, trigrams 0.5. Texts that share
//! words or spellings ("Lisbon", "Lisboa") come out close; meaning plays no
//! part. It exists so tests and a fresh install exercise the whole semantic
//! path; the `local` provider is the one that finds meaning.

/// The model name stored with its embeddings.
pub const MODEL: &str = "offline-hash-384";
/// Components of a vector.
pub const DIMENSIONS: usize = 384;

/// FNV-1a over `parts`, then splitmix64's finalizer: FNV alone leaves the
/// low bits of short inputs poorly spread, and the component is taken from
/// them (unrelated texts came out with a cosine of 0.3 without it).
fn hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn add(v: &mut [f32], parts: &[&[u8]], weight: f32) {
    let h = hash(parts);
    let slot = usize::try_from(h % DIMENSIONS as u64).unwrap_or(0);
    let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
    v[slot] += sign * weight;
}

/// The (not yet normalised) vector of `text`; never all zero (a text
/// without a word gets the first unit vector).
pub fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; DIMENSIONS];
    let lower = text.to_lowercase();
    for word in lower.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        add(&mut v, &[b"w:", word.as_bytes()], 1.0);
        let framed: Vec<char> = std::iter::once('#')
            .chain(word.chars())
            .chain(std::iter::once('#'))
            .collect();
        for tri in framed.windows(3) {
            let s: String = tri.iter().collect();
            add(&mut v, &[b"t:", s.as_bytes()], 0.5);
        }
    }
    if v.iter().all(|x| *x == 0.0) {
        v[0] = 1.0;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &str, b: &str) -> f32 {
        let (a, b) = (embed(a), embed(b));
        let dot: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (n(&a) * n(&b))
    }

    #[test]
    fn shared_spelling_is_closer_than_none() {
        let near = cos("my sister moves to Lisbon", "Lisboa");
        let far = cos("my sister moves to Lisbon", "quarterly tax");
        assert!(near > far + 0.1, "near {near}, far {far}");
        assert!((cos("Same words", "same, WORDS!") - 1.0).abs() < 1e-5);
    }

    #[test]
    fn every_text_has_a_vector_of_the_same_size() {
        for t in ["", "…", "ёлка", "a"] {
            let v = embed(t);
            assert_eq!(v.len(), DIMENSIONS);
            assert!(v.iter().any(|x| *x != 0.0), "{t:?}");
        }
    }
}
