//! The overview's last-hour charts and model lines: throughput, failure
//! rate and stage latency (p50/p99) as server-rendered inline SVG (no
//! script, no chart library), and LLM calls, tokens and rate-limit hits.
//!
//! Guarantees:
//! - The figures come from the tables, for every daemon of the cluster:
//!   finished requests from `pipeline_runs` and stage latency and model
//!   calls from `pipeline_steps`, each over the last [`WINDOW`] through an
//!   index that bounds the read ([`crate::repo::stats`]).
//! - Per provider, the figures are this daemon's own counters since it
//!   started (`maas_llm_*` of its `/metrics`; the steps do not record the
//!   provider), and the page says so.
//! - Cost: the three statements read only the last hour, but they read
//!   all of it, and the latency percentiles sort it per stage and bucket;
//!   measured 1.0 ms (throughput), 8.0 ms (latency) and 1.4 ms (models)
//!   with 1 M requests and 3 M steps in the tables and about 1,400
//!   requests and 4,100 steps in the last hour. They grow with the last
//!   hour's traffic, not with the tables.
//! - An SVG holds only numbers and fixed words that this file writes; each
//!   chart carries `data-points` (the points drawn) for tests and scripts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::repo::stats::{self, FinishedBucket, LatencyBucket};

/// What the charts cover.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// Buckets of the window (5 minutes each).
pub const BUCKETS: i32 = 12;

/// The width of one bucket.
pub fn bucket_width() -> Duration {
    WINDOW / u32::try_from(BUCKETS).unwrap_or(1)
}

/// One line of a chart: a name, a colour, a value per bucket (none: no data).
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub values: Vec<Option<f64>>,
}

const W: f64 = 380.0;
const H: f64 = 150.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 20.0;

fn num(x: f64) -> String {
    if x >= 100.0 || x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// A chart: its SVG and its legend (name, colour) for the page to show.
#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    pub svg: String,
    pub legend: Vec<(String, &'static str)>,
}

/// A line chart of `series` over the window's buckets, oldest left; `unit`
/// follows every value. Empty buckets break a line.
pub fn line_chart(id: &str, title: &str, unit: &str, series: &[Series]) -> Chart {
    let n = usize::try_from(BUCKETS).unwrap_or(1);
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0_f64, |m, v| m.max(*v));
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let step = (W - LEFT - RIGHT) / (n.max(2) - 1) as f64;
    let x = |i: usize| LEFT + step * i as f64;
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - v / top);
    let points: usize = series.iter().map(|s| s.values.iter().flatten().count()).sum();
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg class="chart" id="{id}" data-points="{points}" data-max="{max}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{title}" xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" font-size="10">"##
    );
    let _ = write!(
        svg,
        r##"<text x="{LEFT}" y="12" font-size="11" font-weight="600" fill="#1d2330">{title}</text>"##
    );
    // Axes, the top value and the time labels.
    let (x0, x1, yb, yt) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
    let _ = write!(
        svg,
        r##"<line x1="{x0}" y1="{yb}" x2="{x1}" y2="{yb}" stroke="#c9ced8"/><line x1="{x0}" y1="{yt}" x2="{x1}" y2="{yt}" stroke="#eceef2"/>"##
    );
    let _ = write!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#7a8294">{}{unit}</text><text x="{}" y="{yb}" text-anchor="end" fill="#7a8294">0</text>"##,
        LEFT - 4.0,
        yt + 4.0,
        num(top),
        LEFT - 4.0
    );
    let _ = write!(
        svg,
        r##"<text x="{x0}" y="{}" fill="#7a8294">−60 min</text><text x="{x1}" y="{}" text-anchor="end" fill="#7a8294">now</text>"##,
        H - 6.0,
        H - 6.0
    );
    for s in series {
        let mut run: Vec<(f64, f64)> = Vec::new();
        let flush = |run: &mut Vec<(f64, f64)>, svg: &mut String| {
            if run.len() > 1 {
                let pts: Vec<String> = run.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
                let _ = write!(
                    svg,
                    r##"<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}"/>"##,
                    s.color,
                    pts.join(" ")
                );
            }
            run.clear();
        };
        for (i, v) in s.values.iter().enumerate() {
            match v {
                Some(v) => {
                    let (px, py) = (x(i), y(*v));
                    run.push((px, py));
                    let _ = write!(
                        svg,
                        r##"<circle cx="{px:.1}" cy="{py:.1}" r="2.2" fill="{}"><title>{}: {}{unit}</title></circle>"##,
                        s.color,
                        s.name,
                        num(*v)
                    );
                }
                None => flush(&mut run, &mut svg),
            }
        }
        flush(&mut run, &mut svg);
    }
    svg.push_str("</svg>");
    Chart {
        svg,
        legend: series.iter().map(|s| (s.name.clone(), s.color)).collect(),
    }
}

fn per_bucket(rows: impl Iterator<Item = (i32, f64)>) -> Vec<Option<f64>> {
    let mut v = vec![None; usize::try_from(BUCKETS).unwrap_or(0)];
    for (b, x) in rows {
        if let Some(slot) = usize::try_from(b).ok().and_then(|b| v.get_mut(b)) {
            *slot = Some(x);
        }
    }
    v
}

/// Requests finished per minute, completed and failed (a bucket without
/// any is zero: the table says nothing finished).
pub fn throughput_chart(rows: &[FinishedBucket]) -> Chart {
    let per_min = 60.0 / bucket_width().as_secs_f64();
    let zeros = |f: &dyn Fn(&FinishedBucket) -> i64| {
        let mut v = vec![Some(0.0); usize::try_from(BUCKETS).unwrap_or(0)];
        for (b, x) in per_bucket(rows.iter().map(|r| (r.bucket, f(r) as f64 * per_min)))
            .into_iter()
            .enumerate()
        {
            if x.is_some() {
                v[b] = x;
            }
        }
        v
    };
    line_chart(
        "chart-throughput",
        "Finished per minute",
        "",
        &[
            Series {
                name: "completed".into(),
                color: "#2e8b57",
                values: zeros(&|r| r.completed),
            },
            Series {
                name: "failed".into(),
                color: "#c0392b",
                values: zeros(&|r| r.failed),
            },
        ],
    )
}

/// Failed share of the finished (completed + failed), per bucket.
pub fn failure_chart(rows: &[FinishedBucket]) -> Chart {
    let values = per_bucket(rows.iter().filter_map(|r| {
        let done = r.completed + r.failed;
        (done > 0).then(|| (r.bucket, 100.0 * r.failed as f64 / done as f64))
    }));
    line_chart(
        "chart-failures",
        "Failure rate",
        " %",
        &[Series {
            name: "failed".into(),
            color: "#c0392b",
            values,
        }],
    )
}

/// p50 and p99 of each stage's attempts, in milliseconds.
pub fn latency_chart(rows: &[LatencyBucket]) -> Chart {
    let colors = [
        ("analyze", "#1f5fbf", "#8fb0e6"),
        ("assemble", "#8e44ad", "#c9a3dc"),
        ("respond", "#d35400", "#efb38a"),
    ];
    let mut series = Vec::new();
    for (stage, dark, light) in colors {
        let of = rows.iter().filter(|r| r.stage == stage);
        if of.clone().next().is_none() {
            continue;
        }
        series.push(Series {
            name: format!("{stage} p50"),
            color: dark,
            values: per_bucket(of.clone().map(|r| (r.bucket, r.p50))),
        });
        series.push(Series {
            name: format!("{stage} p99"),
            color: light,
            values: per_bucket(of.map(|r| (r.bucket, r.p99))),
        });
    }
    line_chart("chart-latency", "Stage latency p50 / p99", " ms", &series)
}

/// This daemon's LLM counters of one provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProviderCounters {
    pub provider: String,
    pub calls: u64,
    pub failed: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub rate_limited: u64,
    pub timeouts: u64,
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = labels.find(&key)? + key.len();
    let end = labels[start..].find('"')?;
    Some(&labels[start..start + end])
}

/// The `maas_llm_*` counters per provider from a Prometheus text
/// exposition (the daemon's own `/metrics`).
pub fn provider_counters(exposition: &str) -> Vec<ProviderCounters> {
    let mut by: BTreeMap<String, ProviderCounters> = BTreeMap::new();
    for line in exposition.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        if !name.starts_with("maas_llm_") {
            continue;
        }
        let Some(provider) = label(labels, "provider") else {
            continue;
        };
        // Counters are rendered as integers.
        let Ok(n) = value.trim().parse::<u64>() else { continue };
        let e = by.entry(provider.to_owned()).or_insert_with(|| ProviderCounters {
            provider: provider.to_owned(),
            ..ProviderCounters::default()
        });
        match name {
            "maas_llm_calls_total" => {
                e.calls += n;
                if label(labels, "outcome") != Some("ok") {
                    e.failed += n;
                }
            }
            "maas_llm_tokens_total" => match label(labels, "kind") {
                Some("prompt") => e.prompt_tokens += n,
                Some("completion") => e.completion_tokens += n,
                _ => {}
            },
            "maas_llm_rate_limited_total" => e.rate_limited += n,
            "maas_llm_timeouts_total" => e.timeouts += n,
            _ => {}
        }
    }
    by.into_values().collect()
}

/// The overview's charts and model lines, read on `c`.
pub async fn data(app: &crate::http::AppState, c: &deadpool_postgres::Object) -> Result<minijinja::Value, super::Fail> {
    use super::pages::{db_fail, v};
    let finished = stats::throughput(c, BUCKETS, bucket_width())
        .await
        .map_err(|e| db_fail("throughput", e))?;
    let latency = stats::stage_latency(c, BUCKETS, bucket_width())
        .await
        .map_err(|e| db_fail("stage latency", e))?;
    let models = stats::model_calls(c, WINDOW)
        .await
        .map_err(|e| db_fail("model calls", e))?;
    let providers = provider_counters(&app.metrics.render());
    Ok(minijinja::context! {
        throughput => v(&throughput_chart(&finished)),
        failures => v(&failure_chart(&finished)),
        latency => v(&latency_chart(&latency)),
        models => v(&models),
        providers => v(&providers),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_per_provider() {
        let text = "\
# TYPE maas_llm_calls_total counter
maas_llm_calls_total{provider=\"openai\",role=\"analyzer\",outcome=\"ok\"} 3
maas_llm_calls_total{provider=\"openai\",role=\"responder\",outcome=\"rate_limited\"} 2
maas_llm_calls_total{provider=\"offline\",role=\"analyzer\",outcome=\"ok\"} 0
maas_llm_tokens_total{provider=\"openai\",role=\"analyzer\",kind=\"prompt\"} 120
maas_llm_tokens_total{provider=\"openai\",role=\"analyzer\",kind=\"completion\"} 30
maas_llm_rate_limited_total{provider=\"openai\",role=\"responder\"} 2
maas_runs_total{status=\"x\"} 9
";
        let got = provider_counters(text);
        assert_eq!(got.len(), 2);
        let o = &got[1];
        assert_eq!(
            (
                o.provider.as_str(),
                o.calls,
                o.failed,
                o.prompt_tokens,
                o.completion_tokens,
                o.rate_limited
            ),
            ("openai", 5, 2, 120, 30, 2)
        );
        assert_eq!(got[0].provider, "offline");
    }

    #[test]
    fn a_chart_draws_a_point_per_value_and_breaks_at_gaps() {
        let mut values = vec![None; 12];
        values[3] = Some(10.0);
        values[4] = Some(20.0);
        values[9] = Some(5.0);
        let svg = line_chart(
            "c",
            "T",
            " ms",
            &[Series {
                name: "a".into(),
                color: "#000",
                values,
            }],
        );
        let svg = svg.svg;
        assert!(svg.contains("data-points=\"3\""), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches("<polyline").count(), 1, "a lone point draws no line");
    }

    #[test]
    fn the_failure_rate_is_failed_over_finished() {
        let rows = [FinishedBucket {
            bucket: 11,
            completed: 3,
            failed: 1,
            cancelled: 5,
        }];
        assert!(failure_chart(&rows).svg.contains("failed: 25 %"));
    }
}
