//! The tuple space (docs/tuples.md): write, read and take tuples by template, and follow
//! what is written and taken. Every tuple whose first field is `v` lives on the home server
//! of `bytes_hash(v.key_bytes())`, so each call goes to one server, named by the template's
//! first field (`server/src/ops/tuples.rs` keeps them).

use crate::client::{unexpected, Client, To};
use crate::error::{Error, Result};
use bytes::Bytes;
use shoal_proto::msg::{Op, Reply};
use shoal_proto::tuple::{Template, Trigger, Tuple, TupleEvent, TupleEvents, Value};
use shoal_proto::{Errno, Ino};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// Longest wait of one request; a longer wait is several requests (the server's bound,
/// `WAIT_MAX`, so that no call comes near the client's call timeout).
const WAIT_STEP: Duration = Duration::from_secs(10);

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFrom {
    /// Events after the watch starts.
    Now,
    /// Events after this one (a cursor kept from [`TupleWatch::cursor`]; 0: every event the
    /// server still keeps).
    After(u64),
}

impl Client {
    /// Store `tuple`; returns the number of the event that recorded it on its server.
    pub async fn tuple_write(&self, tuple: &Tuple) -> Result<u64> {
        self.tuple_write_then(tuple, None).await
    }

    /// As [`Client::tuple_write`], with an action the server runs in the same step: it
    /// writes `then.write` too once `then.count` matches `then.reaches` tuples or more and no
    /// tuple equal to `then.write` is there (once, and never split from the write by a
    /// crash).
    pub async fn tuple_write_then(&self, tuple: &Tuple, then: Option<&Trigger>) -> Result<u64> {
        tuple.check().map_err(|e| Error::new(Errno::EINVAL, e))?;
        if let Some(t) = then {
            t.check(tuple).map_err(|e| Error::new(Errno::EINVAL, e))?;
        }
        let first = tuple.first().expect("checked");
        let to = self.tuple_server(first).await?;
        let op = Op::TupleWrite { tuple: tuple.clone(), then: then.cloned() };
        match self.call(to, op, Bytes::new()).await? {
            (Reply::Tuple { seq, .. }, _) => Ok(seq),
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// The oldest tuple matching `template`, left in place. `wait`: how long to wait for
    /// one (`None`: until there is one; zero: look once). `Ok(None)`: none in time.
    pub async fn tuple_read(&self, template: &Template, wait: Option<Duration>) -> Result<Option<Tuple>> {
        self.tuple_get(template, false, false, wait).await
    }

    /// As [`Client::tuple_read`], the newest matching tuple instead of the oldest.
    pub async fn tuple_read_newest(&self, template: &Template, wait: Option<Duration>) -> Result<Option<Tuple>> {
        self.tuple_get(template, false, true, wait).await
    }

    /// As [`Client::tuple_read`], and the tuple is taken away: of several callers taking
    /// at once, each tuple goes to one.
    pub async fn tuple_take(&self, template: &Template, wait: Option<Duration>) -> Result<Option<Tuple>> {
        self.tuple_get(template, true, false, wait).await
    }

    async fn tuple_get(
        &self,
        template: &Template,
        take: bool,
        newest: bool,
        wait: Option<Duration>,
    ) -> Result<Option<Tuple>> {
        template.check().map_err(|e| Error::new(Errno::EINVAL, e))?;
        let to = self.tuple_server(template.first().expect("checked")).await?;
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            let step = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_STEP),
                None => WAIT_STEP,
            };
            let op = Op::TupleRead { template: template.clone(), take, newest, wait_ms: step.as_millis() as u32 };
            match self.call(to, op, Bytes::new()).await? {
                (Reply::Tuple { tuple: Some(t), .. }, _) => return Ok(Some(t)),
                (Reply::Tuple { tuple: None, .. }, _) => {}
                (other, _) => return Err(unexpected(&other)),
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Follow the events (`kinds`: `tuple::WATCH_WRITTEN`, `WATCH_TAKEN`, or both) of tuples
    /// matching `template`, from `from`.
    pub async fn tuple_watch(&self, template: &Template, kinds: u8, from: WatchFrom) -> Result<TupleWatch> {
        template.check().map_err(|e| Error::new(Errno::EINVAL, e))?;
        if kinds == 0 {
            return Err(Error::new(Errno::EINVAL, "a watch needs at least one kind of event"));
        }
        let to = self.tuple_server(template.first().expect("checked")).await?;
        let mut w = TupleWatch {
            client: self.clone(),
            to,
            template: template.clone(),
            kinds,
            cursor: 0,
            queue: VecDeque::new(),
            page_end: 0,
            lost: 0,
        };
        match from {
            WatchFrom::After(n) => w.cursor = n,
            // The server's last event now, so that nothing written from here on is missed.
            WatchFrom::Now => w.cursor = w.fetch(None, Duration::ZERO).await?.next,
        }
        Ok(w)
    }

    /// The server keeping tuples whose first field is `first`, if it offers the tuple space.
    async fn tuple_server(&self, first: &Value) -> Result<To> {
        let home = Ino(shoal_placement::bytes_hash(&first.key_bytes()));
        let server = self.home_of(home);
        if !self.server_has(server, shoal_proto::hello::FEATURE_TUPLES).await? {
            return Err(Error::new(Errno::ENOTSUP, format!("server {server} predates the tuple space (protocol 11)")));
        }
        Ok(To::Home(home))
    }
}

/// A running watch: events in order, one at a time, from a cursor that can be kept and
/// given back to [`Client::tuple_watch`] to go on after a restart with nothing missed or
/// repeated (of the events the server still keeps).
pub struct TupleWatch {
    client: Client,
    to: To,
    template: Template,
    kinds: u8,
    /// The last event handed out (or looked at and not matching).
    cursor: u64,
    queue: VecDeque<TupleEvent>,
    /// The last event the page in `queue` looked at.
    page_end: u64,
    lost: u64,
}

impl TupleWatch {
    /// The next matching event, waiting up to `wait` for one (`None`: until there is one).
    /// `Ok(None)`: none in time.
    pub async fn next(&mut self, wait: Option<Duration>) -> Result<Option<TupleEvent>> {
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            if let Some(e) = self.queue.pop_front() {
                // The last of a page: the events after it that did not match are passed too.
                self.cursor = if self.queue.is_empty() { self.page_end.max(e.seq) } else { e.seq };
                return Ok(Some(e));
            }
            let step = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_STEP),
                None => WAIT_STEP,
            };
            let page = self.fetch(Some(self.cursor), step).await?;
            self.lost += page.lost;
            self.page_end = page.next;
            if page.events.is_empty() {
                self.cursor = self.cursor.max(page.next);
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
            }
            self.queue.extend(page.events);
        }
    }

    /// Where this watch stands: every event up to this one was handed out or did not match.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Events the server dropped from its log before this watch read them (it keeps the
    /// newest 65,536).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    async fn fetch(&self, after: Option<u64>, wait: Duration) -> Result<TupleEvents> {
        let op = Op::TupleWatch {
            template: self.template.clone(),
            kinds: self.kinds,
            after,
            limit: 0,
            wait_ms: wait.as_millis() as u32,
        };
        match self.client.call(self.to, op, Bytes::new()).await? {
            (Reply::TupleEvents(p), _) => Ok(p),
            (other, _) => Err(unexpected(&other)),
        }
    }
}
