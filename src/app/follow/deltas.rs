//! The pieces of streamed answers as a follower shows them: in order per
//! request, each once, never two attempts interleaved.
//!
//! - A piece is shown when it is the next one of the request's newest
//!   attempt shown so far; an older attempt's piece (a daemon that lost its
//!   lease and has not noticed) is dropped.
//! - A gap (a notification missed, the follower joined mid-answer, the
//!   client reconnected) or a piece sent without its text is filled from
//!   `answer_deltas`: the rows after the last piece shown, of the newest
//!   attempt only.
//! - When a newer attempt than the one shown writes, a `restart` frame
//!   with its number comes first: what the client has of the answer is
//!   void. A restart inside an attempt (the model call began again) is a
//!   `restart` frame of its own.
//! - The position of a piece is its [`Cursor`] `attempt.seq`: the SSE
//!   event id (`Last-Event-ID` on a reconnect) and the WebSocket's `id`
//!   field (`?after=` on a reconnect).

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use super::RequestState;
use crate::db::Pool;
use crate::listener::DeltaNote;
use crate::repo::deltas::DeltaRow;

/// Most pieces read from the table at once.
const READ_LIMIT: usize = 10_000;
/// Most requests whose position a follower (by user) remembers.
const CURSORS_LIMIT: usize = 10_000;

/// The position of a piece: attempt, then `seq` within it. `0.0` is before
/// every piece.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub attempt: i32,
    pub seq: i32,
}

impl Cursor {
    /// Parses `ATTEMPT.SEQ` (or a plain `SEQ`, of attempt 1).
    pub fn parse(raw: &str) -> Option<Cursor> {
        let raw = raw.trim();
        let (attempt, seq) = raw.split_once('.').unwrap_or(("1", raw));
        let cursor = Cursor {
            attempt: attempt.parse().ok()?,
            seq: seq.parse().ok()?,
        };
        (cursor.attempt >= 0 && cursor.seq >= 0).then_some(cursor)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.attempt, self.seq)
    }
}

/// A piece of a streamed answer, as sent: `text` follows the text of the
/// piece before (since the last restart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeltaFrame {
    pub request_id: Uuid,
    pub attempt: i32,
    pub seq: i32,
    pub text: String,
}

/// What the client has of the answer is void: attempt `attempt` writes it
/// anew. `seq` is set when the restart is a piece of its own (inside an
/// attempt), not for a new attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestartFrame {
    pub request_id: Uuid,
    pub attempt: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<i32>,
}

/// What a stream sends: a request's state, or a piece of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    State(RequestState),
    Delta(DeltaFrame),
    Restart(RestartFrame),
}

impl Frame {
    pub fn is_terminal(&self) -> bool {
        matches!(self, Frame::State(s) if s.is_terminal())
    }

    /// The frame's position, for a piece stored as a row.
    pub fn cursor(&self) -> Option<Cursor> {
        match self {
            Frame::Delta(d) => Some(Cursor {
                attempt: d.attempt,
                seq: d.seq,
            }),
            Frame::Restart(RestartFrame {
                attempt,
                seq: Some(seq),
                ..
            }) => Some(Cursor {
                attempt: *attempt,
                seq: *seq,
            }),
            _ => None,
        }
    }

    /// As a WebSocket text message: a state's JSON as it is; a piece or a
    /// restart with `"event"` (`delta`, `restart`) and its position `id`.
    pub fn json(&self) -> Option<String> {
        let (event, body) = match self {
            Frame::State(s) => return serde_json::to_string(s).ok(),
            Frame::Delta(d) => ("delta", serde_json::to_value(d).ok()?),
            Frame::Restart(r) => ("restart", serde_json::to_value(r).ok()?),
        };
        let serde_json::Value::Object(mut fields) = body else {
            return None;
        };
        fields.insert("event".into(), event.into());
        if let Some(c) = self.cursor() {
            fields.insert("id".into(), c.to_string().into());
        }
        serde_json::to_string(&fields).ok()
    }
}

/// The last piece shown of each streamed answer a follower follows.
#[derive(Debug, Default)]
pub struct Cursors {
    at: HashMap<Uuid, Cursor>,
}

impl Cursors {
    pub fn set(&mut self, id: Uuid, at: Cursor) {
        if self.at.len() >= CURSORS_LIMIT && !self.at.contains_key(&id) {
            self.at.clear();
        }
        self.at.insert(id, at);
    }

    /// The last piece of `id` shown (`0.0`: none).
    pub fn get(&self, id: Uuid) -> Cursor {
        self.at.get(&id).copied().unwrap_or_default()
    }

    /// What `note` shows at once: the next piece with its text (or
    /// nothing, for one already shown or of an older attempt); else
    /// `Err(after)`: read the rows after `after` and [`Cursors::apply`]
    /// them.
    pub fn take(&mut self, note: &DeltaNote) -> Result<Vec<Frame>, Cursor> {
        let at = self.get(note.id);
        let this = Cursor {
            attempt: note.attempt,
            seq: note.seq,
        };
        if this <= at {
            return Ok(Vec::new());
        }
        let next = if note.attempt == at.attempt {
            note.seq == at.seq + 1
        } else {
            note.seq == 1
        };
        if !next || (!note.restart && note.text.is_none()) {
            return Err(at);
        }
        let text = if note.restart { None } else { note.text.clone() };
        let row = DeltaRow {
            attempt: note.attempt,
            seq: note.seq,
            text,
        };
        Ok(self.apply(note.id, vec![row]))
    }

    /// Shows `rows` (in order) of request `id`: only those of their newest
    /// attempt, only after the last piece shown, a restart first when that
    /// attempt is newer than the one shown.
    pub fn apply(&mut self, id: Uuid, rows: Vec<DeltaRow>) -> Vec<Frame> {
        let Some(newest) = rows.iter().map(|r| r.attempt).max() else {
            return Vec::new();
        };
        let mut at = self.get(id);
        let mut frames = Vec::new();
        for row in rows.into_iter().filter(|r| r.attempt == newest) {
            if (Cursor {
                attempt: row.attempt,
                seq: row.seq,
            }) <= at
            {
                continue;
            }
            if row.attempt > at.attempt {
                if at.attempt > 0 {
                    frames.push(Frame::Restart(RestartFrame {
                        request_id: id,
                        attempt: row.attempt,
                        seq: None,
                    }));
                }
                at = Cursor {
                    attempt: row.attempt,
                    seq: 0,
                };
            }
            at.seq = row.seq;
            frames.push(match row.text {
                Some(text) => Frame::Delta(DeltaFrame {
                    request_id: id,
                    attempt: row.attempt,
                    seq: row.seq,
                    text,
                }),
                None => Frame::Restart(RestartFrame {
                    request_id: id,
                    attempt: row.attempt,
                    seq: Some(row.seq),
                }),
            });
        }
        self.set(id, at);
        frames
    }
}

/// The pieces of request `id` after `after`; none when they cannot be read
/// (the terminal state carries the whole answer).
pub async fn read(pool: &Pool, id: Uuid, after: Cursor) -> Vec<DeltaRow> {
    let rows = async {
        let client = pool.get().await?;
        crate::repo::deltas::after(&client, id, after.attempt, after.seq, READ_LIMIT).await
    };
    rows.await.unwrap_or_else(|e| {
        tracing::warn!(request.id = %id, error = %e, "live: could not read an answer's pieces");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(id: Uuid, attempt: i32, seq: i32, text: Option<&str>) -> DeltaNote {
        DeltaNote {
            id,
            attempt,
            seq,
            restart: text.is_none(),
            text: text.map(str::to_owned),
        }
    }

    fn row(attempt: i32, seq: i32, text: &str) -> DeltaRow {
        DeltaRow {
            attempt,
            seq,
            text: Some(text.into()),
        }
    }

    fn texts(frames: &[Frame]) -> Vec<String> {
        frames
            .iter()
            .map(|f| match f {
                Frame::Delta(d) => format!("{}.{}:{}", d.attempt, d.seq, d.text),
                Frame::Restart(r) => format!("restart {}", r.attempt),
                Frame::State(s) => format!("state {}", s.stage),
            })
            .collect()
    }

    #[test]
    fn pieces_show_in_order_once_and_a_gap_asks_for_a_read() {
        let id = Uuid::new_v4();
        let mut c = Cursors::default();
        assert_eq!(
            c.take(&note(id, 1, 1, Some("Hel"))).map(|f| texts(&f)),
            Ok(vec!["1.1:Hel".to_string()])
        );
        assert_eq!(c.take(&note(id, 1, 1, Some("Hel"))), Ok(Vec::new()), "a repeat");
        assert_eq!(
            c.take(&note(id, 1, 3, Some("x"))),
            Err(Cursor { attempt: 1, seq: 1 }),
            "a gap"
        );
        let mut pointer = note(id, 1, 2, None);
        pointer.restart = false;
        assert_eq!(c.take(&pointer), Err(Cursor { attempt: 1, seq: 1 }), "no text inline");
        let rows = vec![row(1, 2, "lo"), row(1, 3, "x")];
        assert_eq!(texts(&c.apply(id, rows)), vec!["1.2:lo", "1.3:x"]);
        assert_eq!(c.get(id), Cursor { attempt: 1, seq: 3 });
    }

    #[test]
    fn a_new_attempt_restarts_and_an_old_one_is_dropped() {
        let id = Uuid::new_v4();
        let mut c = Cursors::default();
        c.set(id, Cursor { attempt: 1, seq: 4 });
        assert_eq!(
            c.take(&note(id, 2, 1, Some("Hi"))).map(|f| texts(&f)),
            Ok(vec!["restart 2".into(), "2.1:Hi".into()])
        );
        assert_eq!(c.take(&note(id, 1, 5, Some("late"))), Ok(Vec::new()), "the old attempt");
        assert_eq!(
            c.take(&note(id, 2, 2, None)).map(|f| texts(&f)),
            Ok(vec!["restart 2".into()])
        );
        // A read across attempts shows only the newest one.
        let mut fresh = Cursors::default();
        let rows = vec![row(1, 1, "old"), row(2, 1, "new")];
        assert_eq!(texts(&fresh.apply(id, rows)), vec!["2.1:new"]);
    }

    #[test]
    fn cursors_parse_and_print_as_attempt_dot_seq() {
        assert_eq!(Cursor::parse("2.17"), Some(Cursor { attempt: 2, seq: 17 }));
        assert_eq!(Cursor::parse("5"), Some(Cursor { attempt: 1, seq: 5 }));
        for bad in ["", "x", "1.", "-1.2", "1.2.3"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
        assert_eq!(Cursor { attempt: 3, seq: 9 }.to_string(), "3.9");
    }

    #[test]
    fn a_websocket_frame_names_its_event_and_position() {
        let id = Uuid::nil();
        let f = Frame::Delta(DeltaFrame {
            request_id: id,
            attempt: 1,
            seq: 2,
            text: "a".into(),
        });
        let v: serde_json::Value = serde_json::from_str(&f.json().unwrap_or_default()).unwrap_or_default();
        assert_eq!(
            (v["event"].as_str(), v["id"].as_str(), v["text"].as_str()),
            (Some("delta"), Some("1.2"), Some("a"))
        );
    }
}
