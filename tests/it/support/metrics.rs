//! Prometheus text as the tests read it: every sample by series, or one.

use std::collections::BTreeMap;

/// Every sample of a Prometheus text page: `name{labels}` → value.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            Some((series.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The value of one series (`name{labels}` exactly as rendered, or a bare
/// name) in Prometheus text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}
