//! A follower: the states (and the answer's pieces) of the requests a
//! subscription follows, read from the table when the hub's queue could not
//! say them, in order and each once; and the one wait to a request's end.

#[allow(clippy::wildcard_imports, reason = "the parent's imports and items, as a part of it")]
use super::*;

/// Follows one target for a stream: the current state first, then each
/// change, skipping repeats; re-reads from the database when told to or
/// when pushes were dropped.
pub struct Follower {
    pool: Pool,
    sub: Subscription,
    last: HashMap<Uuid, Status>,
    /// For a user: re-reads show requests changed since then.
    since: DateTime<Utc>,
    /// A re-read was asked for and not yet done (cancel safety).
    resync: bool,
    /// Reads a request only if it is this tenant's (a user target is a
    /// stored user id, the tenant's by construction).
    tenant: Option<Uuid>,
    /// Reads a request only if it is this (stored) user's: a token bound
    /// to one user (`maasctl tokens create … --user`).
    user: Option<Uuid>,
    /// What was shown of each streamed answer (`None`: pieces are not
    /// followed).
    cursors: Option<deltas::Cursors>,
}

impl Follower {
    pub fn new(pool: Pool, sub: Subscription) -> Follower {
        Follower {
            pool,
            sub,
            last: HashMap::new(),
            since: Utc::now(),
            resync: false,
            tenant: None,
            user: None,
            cursors: None,
        }
    }

    /// Shows the pieces of streamed answers too (the subscription must
    /// take them: [`Hub::subscribe_streaming`]); for a request, `after` is
    /// the last piece the client has (a reconnect), whose successors
    /// [`Follower::catch_up`] reads.
    pub fn with_deltas(mut self, after: Option<Cursor>) -> Follower {
        let mut cursors = deltas::Cursors::default();
        if let (Target::Request(id), Some(after)) = (self.sub.target(), after) {
            cursors.set(id, after);
        }
        self.cursors = Some(cursors);
        self
    }

    /// Shows a request only to tenant `tenant`: another tenant's reads as
    /// absent.
    pub fn for_tenant(mut self, tenant: Uuid) -> Follower {
        self.tenant = Some(tenant);
        self
    }

    /// Shows a request only when it is stored user `user`'s (when given):
    /// another user's reads as absent.
    pub fn for_user(mut self, user: Option<Uuid>) -> Follower {
        self.user = user;
        self
    }

    pub fn target(&self) -> Target {
        self.sub.target()
    }

    /// Reads the current state: the request (none if it does not exist) or
    /// the user's unfinished requests.
    pub async fn current(&mut self) -> Result<Vec<RequestState>, crate::db::Error> {
        let now = Utc::now();
        let client = self.pool.get().await?;
        let rows = match self.sub.target() {
            Target::Request(id) => match self.tenant {
                Some(t) => request_state_of_tenant(&client, id, t).await?,
                None => request_states(&client, &[id]).await?,
            },
            Target::User(u) => {
                // Requests changed since the last read (a margin covers clock
                // skew with the database); repeats are skipped below.
                let since = if self.last.is_empty() && !self.resync {
                    None
                } else {
                    Some(self.since - chrono::Duration::seconds(5))
                };
                let mut rows = user_states(&client, u, since, USER_STATES_LIMIT).await?;
                rows.reverse(); // oldest first
                rows
            }
        };
        self.since = now;
        self.resync = false;
        let user = self.user;
        Ok(rows
            .into_iter()
            .filter(|r| user.is_none_or(|u| r.user_id == u))
            .map(Change::from)
            .filter_map(|c| self.fresh(&c))
            .collect())
    }

    /// Remembers `c` and returns its state unless it repeats the last one
    /// pushed for that request.
    fn fresh(&mut self, c: &Change) -> Option<RequestState> {
        if self.last.get(&c.id) == Some(&c.status) {
            return None;
        }
        if self.last.len() > 10_000 {
            self.last.clear();
        }
        self.last.insert(c.id, c.status);
        Some(RequestState::of(c))
    }

    /// Waits for the next changes and pieces (never an empty list); `None`
    /// when the hub stopped. Cancel-safe: a re-read interrupted is done
    /// next time (a piece lost so is read with the next one).
    pub async fn next(&mut self) -> Option<Result<Vec<Frame>, crate::db::Error>> {
        loop {
            if self.resync || self.sub.take_lagged() {
                self.resync = true;
                crate::metrics::live_resync("subscriber");
                match self.current().await {
                    Ok(v) => {
                        let mut frames: Vec<Frame> = v.into_iter().map(Frame::State).collect();
                        frames.extend(self.catch_up().await);
                        if !frames.is_empty() {
                            return Some(Ok(frames));
                        }
                    }
                    Err(e) => return Some(Err(e)),
                }
            }
            match self.sub.recv().await? {
                Push::Change(c) => {
                    if let Some(state) = self.fresh(&c) {
                        return Some(Ok(vec![Frame::State(state)]));
                    }
                }
                Push::Resync => self.resync = true,
                Push::Delta(note) => {
                    let frames = self.delta(&note).await;
                    if !frames.is_empty() {
                        return Some(Ok(frames));
                    }
                }
            }
        }
    }

    /// Whether `id` was shown in its terminal state.
    fn finished(&self, id: Uuid) -> bool {
        self.last.get(&id).is_some_and(|s| s.is_terminal())
    }

    /// What a piece shows: nothing once its request was shown finished or
    /// when pieces are not followed; what was missed before it is read.
    async fn delta(&mut self, note: &DeltaNote) -> Vec<Frame> {
        if self.finished(note.id) {
            return Vec::new();
        }
        let Some(cursors) = self.cursors.as_mut() else {
            return Vec::new();
        };
        match cursors.take(note) {
            Ok(frames) => frames,
            Err(after) => {
                let rows = deltas::read(&self.pool, note.id, after).await;
                cursors.apply(note.id, rows)
            }
        }
    }

    /// The pieces of the followed request's answer after the last one
    /// shown, read from the table (after a reconnect or a re-read); none
    /// for a user, or once the request was shown finished.
    pub async fn catch_up(&mut self) -> Vec<Frame> {
        let Target::Request(id) = self.sub.target() else {
            return Vec::new();
        };
        if self.finished(id) {
            return Vec::new();
        }
        let Some(cursors) = self.cursors.as_mut() else {
            return Vec::new();
        };
        let rows = deltas::read(&self.pool, id, cursors.get(id)).await;
        cursors.apply(id, rows)
    }
}

/// Follows until the request is terminal or waits for its user's reply
/// ([`RequestState::needs_caller`]), `deadline` passes or the daemon
/// shuts down (`shutdown`), from `state`: the newest state seen. The one
/// wait of a long-poll and of a chat completion that is not streamed.
pub async fn until_end(
    follower: &mut Follower,
    mut state: RequestState,
    deadline: tokio::time::Instant,
    shutdown: &CancellationToken,
) -> Result<RequestState, crate::db::Error> {
    while !state.needs_caller() {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            _ = shutdown.cancelled() => break,
            next = follower.next() => match next {
                None => break,
                Some(Err(e)) => return Err(e),
                Some(Ok(frames)) => {
                    if let Some(last) = frames.into_iter().rev().find_map(|f| match f {
                        Frame::State(s) => Some(s),
                        _ => None,
                    }) {
                        state = last;
                    }
                }
            },
        }
    }
    Ok(state)
}
