//! An SSE response read event by event (`GET /api/query/{id}/events`).

use serde_json::Value;

use super::GENEROUS;

/// Each `data:` payload of an SSE response as JSON, until the stream ends.
pub struct Sse {
    resp: reqwest::Response,
    buf: String,
}

impl Sse {
    pub fn new(resp: reqwest::Response) -> Sse {
        Sse {
            resp,
            buf: String::new(),
        }
    }

    /// The next state the stream sends (keep-alives left out); `None` when
    /// it ended. Panics past [`GENEROUS`].
    pub async fn next(&mut self) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + GENEROUS;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(serde_json::from_str(&data.join("\n")).unwrap());
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .expect("an SSE chunk within the deadline")
                .ok()??;
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}
