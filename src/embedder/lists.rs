//! A large user's inverted lists (sql/0028_embedding_lists.sql): the
//! embedder trains centroids from a sample of the user's own embeddings
//! (spherical k-means, here in Rust), stores them, and assigns the user's
//! existing embeddings to their nearest centroid in batches; new
//! embeddings get theirs when they are stored (`embed_store.sql`). The
//! memory search reads only the lists nearest the query once a user's
//! lists are complete (docs/memory.md, "At size").
//!
//! When: a user is trained when it has [`TRAIN_TURNS`] embeddings of a
//! model, and again when its count has grown fourfold or halved since
//! (the lists stay about √n turns each); below half of [`TRAIN_TURNS`]
//! its lists are dropped (its search is exact). Checked after a batch of
//! the user's turns is embedded, and only for users with that many logged
//! turns, so a small user costs nothing here.

use uuid::Uuid;

use crate::db::Error;
use crate::repo::{self, GenericClient};

/// Embeddings a user has when its lists are first trained (below the
/// search's `maas.memory_exact_turns`, 3,000 by default, so that a user is
/// searched through lists from the size its exact search stops).
pub const TRAIN_TURNS: i64 = 2_000;
/// Fewest and most lists: about √n of a user of n embeddings.
pub const MIN_LISTS: usize = 16;
pub const MAX_LISTS: usize = 256;
/// Sample size per list: the k-means sees at most this many embeddings
/// per centroid.
const SAMPLE_PER_LIST: usize = 24;
/// Lloyd iterations.
const ITERATIONS: usize = 8;
/// Turns one assignment batch reads.
pub const ASSIGN_BATCH: usize = 2_000;
/// Lists one pass assigns a batch of.
const ASSIGN_LISTS: usize = 4;

/// The number of lists for a user of `turns` embeddings.
pub fn lists_for(turns: i64) -> usize {
    // (the integer square root, rounded to the nearest)
    let n = u64::try_from(turns).unwrap_or(0);
    let root = n.isqrt() + u64::from(n - n.isqrt() * n.isqrt() > n.isqrt());
    usize::try_from(root).unwrap_or(MAX_LISTS).clamp(MIN_LISTS, MAX_LISTS)
}

/// What [`keep`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Nothing to do.
    Unchanged,
    /// Trained: this many centroids.
    Trained(i64),
    /// The lists were dropped (the user is small again).
    Dropped,
}

/// After `user`'s embeddings of `model` (`dims` components) were stored:
/// trains, retrains or drops its lists as its size says (see the module's
/// docs). `logged` (the user's logged turns, never fewer than its
/// embeddings) spares small users the count.
pub async fn keep(client: &impl GenericClient, user: Uuid, model: &str, dims: i32, logged: i64) -> Result<Kept, Error> {
    if logged < TRAIN_TURNS / 2 {
        return Ok(Kept::Unchanged);
    }
    let s = repo::embeddings::lists_state(client, user, model, dims).await?;
    match s.trained_turns {
        None if s.turns >= TRAIN_TURNS => Ok(Kept::Trained(train(client, user, model, dims).await?)),
        Some(_) if s.turns < TRAIN_TURNS / 2 => {
            repo::embeddings::lists_drop(client, user, model, dims).await?;
            Ok(Kept::Dropped)
        }
        Some(t) if s.turns >= 4 * t || 2 * s.turns < t => Ok(Kept::Trained(train(client, user, model, dims).await?)),
        _ => Ok(Kept::Unchanged),
    }
}

/// Trains `user`'s lists of `model` and `dims` from a sample of its
/// embeddings, whatever its size (the bench and the recall measurement
/// call it directly); the number of centroids (0: no embedding).
pub async fn train(client: &impl GenericClient, user: Uuid, model: &str, dims: i32) -> Result<i64, Error> {
    let turns = repo::embeddings::lists_state(client, user, model, dims).await?.turns;
    if turns == 0 {
        return Ok(0);
    }
    let k = lists_for(turns);
    // `want` of the user's embeddings, drawn at random (by a hash of the
    // turn id, so the same for the same turns).
    let want = k * SAMPLE_PER_LIST;
    let sample = repo::embeddings::lists_sample(client, user, model, dims, want).await?;
    let seed = user.as_u64_pair().0;
    let centroids = tokio::task::spawn_blocking(move || kmeans(&sample, k, ITERATIONS, seed))
        .await
        .map_err(|e| Error::Unexpected(format!("training lists: {e}")))?;
    if centroids.is_empty() {
        return Ok(0);
    }
    repo::embeddings::lists_train(client, user, model, &centroids, turns).await
}

/// One batch of assignment for up to a few users' incomplete lists of
/// `model`; the embeddings assigned, and whether any list is still
/// incomplete. The nearest centroid of each embedding is found here (a
/// comparison in SQL costs about 20 µs a centroid), and written only
/// while the lists are those it was found with.
pub async fn assign(client: &impl GenericClient, model: &str) -> Result<(i64, bool), Error> {
    let todo = repo::embeddings::lists_incomplete(client, model, ASSIGN_LISTS).await?;
    let (mut assigned, mut left) = (0, todo.len() == ASSIGN_LISTS);
    for l in todo {
        let centroids = repo::embeddings::lists_centroids(client, l.user_id, model, l.dims).await?;
        let Some(trained_at) = centroids.first().map(|c| c.trained_at) else {
            continue;
        };
        let vectors = centroids
            .iter()
            .map(|c| repo::embeddings::parse_parts(&c.parts))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = repo::embeddings::lists_batch(client, l.user_id, model, l.dims, ASSIGN_BATCH).await?;
        let mut lists = Vec::with_capacity(batch.len());
        for t in &batch {
            let v = repo::embeddings::parse_parts(&t.parts)?;
            lists.push(i32::try_from(nearest(&vectors, &v)).unwrap_or(i32::MAX));
        }
        let ids: Vec<i64> = batch.iter().map(|t| t.id).collect();
        let complete = batch.len() < ASSIGN_BATCH;
        let a = repo::embeddings::Assignment {
            user_id: l.user_id,
            model,
            dims: l.dims,
            ids: &ids,
            lists: &lists,
            trained_at,
            assigned_seq: batch.iter().map(|t| t.user_seq).max().unwrap_or(0),
            complete,
        };
        let (n, current) = repo::embeddings::lists_assign(client, &a).await?;
        assigned += n;
        left |= !complete || !current;
    }
    Ok((assigned, left))
}

/// Assigns every incomplete list of `model` to the end.
pub async fn assign_all(client: &impl GenericClient, model: &str) -> Result<i64, Error> {
    let mut total = 0;
    loop {
        let (n, left) = assign(client, model).await?;
        total += n;
        if !left {
            return Ok(total);
        }
    }
}

/// A small deterministic generator (splitmix64): the sample's order and
/// the first centroids.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `v` scaled to unit length (a zero vector stays).
fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let norm = dot(&v, &v).sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// The index of the centroid nearest `v` (largest dot product: both of
/// unit length).
fn nearest(centroids: &[Vec<f32>], v: &[f32]) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, c) in centroids.iter().enumerate() {
        let d = dot(c, v);
        if d > best.1 {
            best = (i, d);
        }
    }
    best.0
}

/// Spherical k-means: `k` unit centroids of `points` (unit vectors of one
/// length), started by k-means++ (each next first centroid a point drawn
/// with probability ∝ its squared distance to the nearest one chosen,
/// with `seed`), after `iterations` rounds of Lloyd's algorithm. A
/// centroid that loses all its points keeps its place. Fewer points than
/// `k`: one centroid each.
pub fn kmeans(points: &[Vec<f32>], k: usize, iterations: usize, seed: u64) -> Vec<Vec<f32>> {
    let dims = points.first().map_or(0, Vec::len);
    if dims == 0 || k == 0 {
        return Vec::new();
    }
    let k = k.min(points.len());
    let mut state = seed;
    let first = usize::try_from(splitmix(&mut state) % points.len() as u64).unwrap_or(0);
    let mut centroids: Vec<Vec<f32>> = vec![points[first].clone()];
    // Squared distance of each point to its nearest chosen centroid.
    let mut far: Vec<f64> = points
        .iter()
        .map(|p| f64::from(2.0 - 2.0 * dot(p, &points[first])).max(0.0))
        .collect();
    while centroids.len() < k {
        let total: f64 = far.iter().sum();
        let mut at = (splitmix(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut pick = points.len() - 1;
        for (i, d) in far.iter().enumerate() {
            if at < *d {
                pick = i;
                break;
            }
            at -= d;
        }
        let c = points[pick].clone();
        for (f, p) in far.iter_mut().zip(points) {
            *f = f.min(f64::from(2.0 - 2.0 * dot(p, &c)).max(0.0));
        }
        centroids.push(c);
    }
    for _ in 0..iterations {
        let mut sums = vec![vec![0f32; dims]; k];
        let mut counts = vec![0usize; k];
        for p in points {
            let c = nearest(&centroids, p);
            counts[c] += 1;
            sums[c].iter_mut().zip(p).for_each(|(s, x)| *s += x);
        }
        for ((c, sum), n) in centroids.iter_mut().zip(sums).zip(counts) {
            if n > 0 {
                *c = unit(sum);
            }
        }
    }
    centroids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmeans_finds_separated_clusters() {
        // Three clusters around the axes of a 4-dimensional space.
        let mut state = 7;
        let mut points = Vec::new();
        for axis in 0..3 {
            for _ in 0..50 {
                let v: Vec<f32> = (0..4)
                    .map(|d| {
                        let noise = (splitmix(&mut state) % 1000) as f32 / 10_000.0;
                        if d == axis { 1.0 } else { noise }
                    })
                    .collect();
                points.push(unit(v));
            }
        }
        let c = kmeans(&points, 3, 8, 1);
        assert_eq!(c.len(), 3);
        // Each cluster's points share a centroid, and no two clusters do.
        let of: Vec<usize> = (0..3).map(|a| nearest(&c, &points[a * 50])).collect();
        for a in 0..3 {
            assert!(points[a * 50..(a + 1) * 50].iter().all(|p| nearest(&c, p) == of[a]));
        }
        assert!(of[0] != of[1] && of[1] != of[2] && of[0] != of[2], "{of:?}");
        assert!(c.iter().all(|v| (dot(v, v) - 1.0).abs() < 1e-4));
    }

    #[test]
    fn the_lists_grow_as_the_root_of_the_size() {
        assert_eq!(lists_for(100), MIN_LISTS);
        assert_eq!(lists_for(10_000), 100);
        assert_eq!(lists_for(10_000_000), MAX_LISTS);
        assert!(kmeans(&[], 4, 8, 1).is_empty());
        assert_eq!(kmeans(&[vec![1.0, 0.0]], 4, 8, 1).len(), 1);
    }
}
